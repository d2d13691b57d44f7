"""Makes the pusher's test kit importable (pytest runs with --import-mode=importlib) and its fixtures visible."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

from upf_pusher_testkit import clients, pusher, start_pusher, store  # noqa: F401
