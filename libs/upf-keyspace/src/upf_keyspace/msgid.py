"""Message ids are positions: base64url of the 12-byte versionstamp (10 commit bytes + 2 user bytes).

Because the id *is* the Q key's suffix, ``since=<id>`` decodes straight back into a range start, and
an id of one topic is a valid position in every other topic (ntfy's global-row semantics).
"""

from __future__ import annotations

import base64
import binascii

__all__ = ["STAMP_LEN", "ID_LEN", "encode_id", "decode_id"]

STAMP_LEN = 12
ID_LEN = 16


_URLSAFE = bytes.maketrans(b"+/", b"-_")


def encode_id(stamp: bytes) -> str:
    """``base64.urlsafe_b64encode(stamp).decode("ascii")``, without its two Python calls: a pusher
    frames one id per delivery."""
    if len(stamp) != STAMP_LEN:
        raise ValueError("a message id is a 12-byte versionstamp")
    return binascii.b2a_base64(stamp, newline=False).translate(_URLSAFE).decode("ascii")


def decode_id(text: str) -> bytes | None:
    """The 12-byte stamp, or None when ``text`` is not one of our ids (ntfy then means "all")."""
    if len(text) != ID_LEN:
        return None
    try:
        raw = base64.urlsafe_b64decode(text.encode("ascii"))
    except (binascii.Error, UnicodeEncodeError, ValueError):
        return None
    if len(raw) != STAMP_LEN or encode_id(raw) != text:
        return None
    return raw
