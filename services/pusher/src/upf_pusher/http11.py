"""Moved to ``upf_edge.http11`` (the codec every front door shares); re-exported here for the pusher
modules that still import it from their own package."""

from upf_edge.http11 import *  # noqa: F403
from upf_edge.http11 import __all__  # noqa: F401
