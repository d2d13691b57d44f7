"""ntfy's request parameters as its ``readParam`` reads them, for every role that reads them (the
writer's publish, the pusher's subscribe filters): each name as a header first (RFC 2047 encoded-words
decoded, trimmed as Go trims, an RFC 9218 ``Priority`` header ignored), then each as a lower-case query
key. Pure: no I/O."""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping

__all__ = ["GO_SPACE", "PRIORITIES", "RFC9218_RE", "go_trim", "decode_header_value", "header_param", "read_param"]

GO_SPACE = "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
"""Go's unicode.IsSpace, what strings.TrimSpace trims (Python's str.strip() also strips \\x1c-\\x1f)."""

PRIORITIES = {
    "1": 1, "min": 1,
    "2": 2, "low": 2,
    "3": 3, "default": 3,
    "4": 4, "high": 4,
    "5": 5, "max": 5, "urgent": 5,
}  # fmt: skip
"""ntfy's priority names and numbers (lower-case)."""

_RFC9218_MEMBER = r"(?:u=[0-7]|i(?:=\?[01])?)"
RFC9218_RE = re.compile(
    r"u=[0-9](?:,[ \t\n\f\r]*(?:i|[0-9]))?"  # ntfy's priorityHeaderIgnoreRegex
    rf"|{_RFC9218_MEMBER}(?:[ \t]*,[ \t]*{_RFC9218_MEMBER})*"  # and the rest of RFC 9218's members
)
"""RFC 9218's ``Priority`` request header (``u=3, i``), which browsers and proxies such as Cloudflare
send: it is no ntfy priority, so the header is ignored (a query ``priority=`` still counts)."""

_EWORD_RE = re.compile(r"=\?([^?\s]+)\?([BbQq])\?([^?\s]*)\?=")
_Q_HEX_RE = re.compile(rb"=([0-9A-Fa-f]{2})")


def go_trim(text: str) -> str:
    return text.strip(GO_SPACE)


def _decode_word(charset: str, kind: str, text: str) -> str | None:
    try:
        if kind in "Bb":
            raw = base64.b64decode(text, validate=True)
        else:
            raw = _Q_HEX_RE.sub(lambda m: bytes.fromhex(m.group(1).decode()), text.replace("_", " ").encode("ascii"))
    except (binascii.Error, ValueError, UnicodeEncodeError):
        return None
    charset = charset.lower()
    if charset == "utf-8":
        return raw.decode("utf-8", "replace")
    if charset == "iso-8859-1":
        return raw.decode("latin-1")
    if charset == "us-ascii":
        return raw.decode("ascii", "replace")
    return None


def decode_header_value(value: str) -> str:
    """RFC 2047 encoded-words (``=?UTF-8?B?...?=``) decoded as Go's mime.WordDecoder does: charsets
    utf-8, iso-8859-1 and us-ascii; whitespace between two encoded words dropped; a word that does
    not decode is kept as it came."""
    if "=?" not in value:
        return value
    out: list[str] = []
    pos = 0
    previous_was_word = False
    for m in _EWORD_RE.finditer(value):
        between = value[pos : m.start()]
        if not (previous_was_word and between.strip(" \t") == ""):
            out.append(between)
        decoded = _decode_word(m.group(1), m.group(2), m.group(3))
        out.append(m.group(0) if decoded is None else decoded)
        previous_was_word = decoded is not None
        pos = m.end()
    out.append(value[pos:])
    return "".join(out)


def header_param(headers: Mapping[str, str], name: str) -> str:
    """Header ``name`` as a parameter: decoded and trimmed; "" when absent, blank, or an RFC 9218
    ``Priority``."""
    raw = headers.get(name)
    if not raw:
        return ""
    value = go_trim(decode_header_value(raw))
    if name == "priority" and RFC9218_RE.fullmatch(value):
        return ""
    return value


def read_param(headers: Mapping[str, str], query: Mapping[str, str], names: tuple[str, ...]) -> str:
    """ntfy's readParam: every name as a header, then every name as a lower-case query key; the first
    that is not blank."""
    for name in names:
        value = header_param(headers, name)
        if value:
            return value
    for name in names:
        raw = query.get(name)
        if raw:
            value = go_trim(raw)
            if value:
                return value
    return ""
