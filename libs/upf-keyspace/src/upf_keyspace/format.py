"""The on-disk format version, separate from the package's semver.

Roles check it at start (ops.meta.check_format): a store written by a newer format is refused, an
empty store is stamped with the current one. Raise it only when every running role supports it.
"""

from __future__ import annotations

import enum

__all__ = ["FormatVersion", "CURRENT_FORMAT"]


class FormatVersion(enum.IntEnum):
    INITIAL = 1
    """Q/X/C/CN/IN/SIG/L/ID keys as drawn in keys.py; Envelope as in envelope.py (ENVELOPE_VERSION 1,
    and 2, which only appends a field with a default: readable by version-1 readers)."""


CURRENT_FORMAT = max(FormatVersion)
