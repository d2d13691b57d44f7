"""Differential: wherever h11 (a strict, widely used HTTP/1.1 parser) refuses a request head, ours does too;
wherever both accept one, ours reads the same fields.

Ours is the whole front-door path of a head: ``find_head_end``, ``parse_head``, then the body framing
(``RequestBody``). We are stricter than h11 on purpose (see ``upf_edge.http11``'s docstring): bare-LF
line ends, obsolete line folding, control bytes in values, any repeated Content-Length, Content-Length
with Transfer-Encoding, chunked on HTTP/1.0, HTTP versions other than 1.0/1.1, Content-Length over 18
digits; ``test_where_we_are_stricter`` pins those cases.
"""

from __future__ import annotations

import h11
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from upf_edge.http11 import HttpError, RequestBody, find_head_end, parse_head

# valid parts are drawn more often than junk, so that both accepted and refused heads come up
_METHODS = st.sampled_from([b"GET", b"POST", b"PUT", b"HEAD", b"GET", b"POST", b"G(T", b"", b"get", b"P\x00T"])
_TARGET_BYTES = st.sampled_from(
    [b"/", b"t", b"/json", b"?", b"=", b"%41", b"%ff", b" ", b"\x00", b"\x01", b"\x7f", b"\xc3\xa9", b"\t", b"*"]
)
_CLEAN_TARGETS = st.sampled_from([b"/t/json", b"/t?up=1", b"*", b"/", b"/a,b/ws?since=all", b"/t%20x"])
_TARGETS = st.one_of(
    _CLEAN_TARGETS,
    _CLEAN_TARGETS,
    st.lists(_TARGET_BYTES, max_size=6).map(lambda parts: b"/" + b"".join(parts)),
    st.lists(_TARGET_BYTES, max_size=6).map(b"".join),
)
_VERSIONS = st.sampled_from(
    [
        b"HTTP/1.1",
        b"HTTP/1.0",
        b"HTTP/1.1",
        b"HTTP/1.0",
        b"HTTP/1.1",
        b"HTTP/2.0",
        b"HTTP/1.2",
        b"http/1.1",
        b"HTTP/1.1 ",
        b"HTTP/11",
    ]
)
_NAMES = st.sampled_from(
    [
        b"Host",
        b"host",
        b"Content-Length",
        b"Transfer-Encoding",
        b"X-Title",
        b"Expect",
        b"Connection",
        b"X-Title",
        b"X A",
        b"",
        b"\x00",
    ]
)
_VALUE_BYTES = st.sampled_from(
    [b"chunked", b"Chunked", b"gzip", b",", b" ", b"\t", b"5", b"0", b"-1", b"+", b"x", b"\x00", b"\x01", b"\x7f", b"\xff",
     b"\r", b"\n", b"\x0b", b"100-continue", b"identity"]
)  # fmt: skip
_VALUES = st.one_of(
    st.sampled_from([b"x", b"5", b"chunked", b"", b"5, 5", b"5, 6", b"a b", b"a\tb"]),
    st.lists(_VALUE_BYTES, max_size=5).map(b"".join),
)
_CLEAN_FIELDS = st.sampled_from(
    [(b"X-Title", b": ", b"hi"), (b"Connection", b": ", b"close"), (b"Content-Length", b": ", b"0"),
     (b"Transfer-Encoding", b": ", b"chunked"), (b"Expect", b": ", b"100-continue"), (b"Accept", b":", b"*/*")]
)  # fmt: skip
_FIELD = st.one_of(
    _CLEAN_FIELDS, _CLEAN_FIELDS, st.tuples(_NAMES, st.sampled_from([b":", b": ", b" :", b":\t"]), _VALUES)
)
_FIELDS = st.lists(_FIELD, max_size=4)
_EOLS = st.sampled_from([b"\r\n"] * 9 + [b"\n"])


@st.composite
def heads(draw: st.DrawFn) -> bytes:
    eol = draw(_EOLS)
    if draw(st.booleans()):
        line = draw(_METHODS) + b" " + draw(_TARGETS) + b" " + draw(_VERSIONS)
    else:
        line = (
            draw(st.sampled_from([b"GET", b"POST"]))
            + b" "
            + draw(_CLEAN_TARGETS)
            + b" "
            + draw(st.sampled_from([b"HTTP/1.1", b"HTTP/1.0"]))
        )
    fields = [name + sep + value for name, sep, value in draw(_FIELDS)]
    if draw(st.integers(0, 3)):  # most real heads carry a Host
        fields.insert(0, b"Host: example.org")
    if draw(st.integers(0, 9)) == 0:  # sometimes a continuation line
        fields.append(b" folded")
    return eol.join([line, *fields]) + eol + draw(_EOLS)


def _h11_read(raw: bytes) -> object | None:
    """h11's first event for the head as a server reads it; None when h11 refuses it."""
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(raw)
    try:
        return conn.next_event()
    except h11.RemoteProtocolError:
        return None


def _h11_refuses(raw: bytes) -> bool | None:
    """True when h11 refuses the head, False when it accepts it, None when it wants more bytes."""
    event = _h11_read(raw)
    if event is None:
        return True
    return None if event is h11.NEED_DATA else False


def _we_refuse(raw: bytes) -> bool:
    try:
        end = find_head_end(raw)
        if end < 0:
            return False
        RequestBody(parse_head(raw[:end]), 1 << 20)
    except HttpError:
        return True
    return False


@settings(max_examples=3000, deadline=None)
@given(heads())
def test_what_h11_refuses_we_refuse(raw: bytes) -> None:
    if _h11_refuses(raw):
        assert _we_refuse(raw), raw


@pytest.mark.parametrize(
    "raw",
    [
        b"GET / HTTP/1.1\nHost: x\n\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nX-A: a\x01b\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5, 5\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"GET / HTTP/1.2\r\nHost: x\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0000000000000000001\r\n\r\n",
    ],
)
def test_where_we_are_stricter(raw: bytes) -> None:
    """h11 accepts these; we refuse them (the documented, deliberate differences)."""
    assert _h11_refuses(raw) is False
    assert _we_refuse(raw)


def _h11_fields(raw: bytes) -> list[tuple[bytes, bytes]] | None:
    """The fields h11 read from an accepted head (None: refused, or more bytes wanted)."""
    event = _h11_read(raw)
    return list(event.headers) if isinstance(event, h11.Request) else None


@settings(max_examples=3000, deadline=None)
@given(heads())
def test_where_both_accept_the_fields_are_h11s(raw: bytes) -> None:
    """Each field's name, lowercased, and its value without the spaces and tabs around it, in order:
    what h11 reads (``parse_head`` checks every field line with one match, then splits them). h11 also
    lowercases Transfer-Encoding's value; we keep it as sent and compare coding names ignoring case
    (RFC 9112 7: they are case-insensitive)."""
    theirs = _h11_fields(raw)
    if theirs is None or _we_refuse(raw):
        return
    ours = [
        (n, v.lower() if n == b"transfer-encoding" else v) for n, v in parse_head(raw[: find_head_end(raw)]).headers
    ]
    assert ours == theirs, raw
