"""The request-head parser, response builders and the chunked body decoder, including bad input."""

from __future__ import annotations

import json

import pytest

from upf_pusher.http11 import (
    MAX_HEAD,
    ChunkedDecoder,
    HttpError,
    chunk,
    error_response,
    find_head_end,
    parse_head,
)


def head(text: str) -> bytes:
    return text.replace("\n", "\r\n").encode() + b"\r\n\r\n"


def test_parses_method_path_query_and_headers() -> None:
    """A normal GET yields its decoded path, raw query and lower-cased headers."""
    h = parse_head(head("GET /up%41b/json?since=all&poll=1 HTTP/1.1\nHost: x\nX-Since:  10m "))
    assert (h.method, h.path, h.raw_path, h.query_string, h.version) == ("GET", "/upAb/json", b"/up%41b/json", b"since=all&poll=1", "1.1")
    assert h.header(b"x-since") == b"10m"
    assert h.query() == {"since": "all", "poll": "1"}
    assert h.keep_alive


def test_find_head_end_waits_for_the_blank_line() -> None:
    """Until CRLF CRLF arrives there is no head; then it ends just after it."""
    assert find_head_end(b"GET / HTTP/1.1\r\nHost: x\r\n") == -1
    data = head("GET / HTTP/1.1") + b"rest"
    assert data[find_head_end(data) :] == b"rest"


def test_oversized_head_is_431() -> None:
    """A head beyond 16 KB is refused with 431, whether or not it has ended."""
    big = b"GET / HTTP/1.1\r\nX: " + b"a" * MAX_HEAD
    with pytest.raises(HttpError) as e:
        find_head_end(big)
    assert e.value.http == 431
    with pytest.raises(HttpError) as e:
        find_head_end(big + b"\r\n\r\n")
    assert e.value.http == 431


@pytest.mark.parametrize(
    "raw",
    [
        b"GET /\r\n\r\n",
        b"GET  / HTTP/1.1\r\n\r\n",
        b"GET / HTTP/2.0\r\n\r\n",
        b"G(T / HTTP/1.1\r\n\r\n",
        b"GET relative HTTP/1.1\r\n\r\n",
        b"GET / HTTP/1.1\r\nno colon\r\n\r\n",
        b"GET / HTTP/1.1\r\nbad name: v\r\n\r\n",
        b"GET /a\x01b HTTP/1.1\r\n\r\n",
    ],
)
def test_bad_request_line_or_header_is_400(raw: bytes) -> None:
    """Malformed request lines and header lines are 400."""
    with pytest.raises(HttpError) as e:
        parse_head(raw)
    assert e.value.http == 400


def test_path_that_is_not_utf8_is_400() -> None:
    """A percent-encoded path that does not decode as UTF-8 is 400."""
    with pytest.raises(HttpError) as e:
        parse_head(head("GET /%ff%fe/json HTTP/1.1"))
    assert e.value.http == 400


def test_http10_is_not_keep_alive_by_default() -> None:
    """HTTP/1.0 closes unless it asks for keep-alive; 1.1 stays open unless it asks to close."""
    assert not parse_head(head("GET / HTTP/1.0")).keep_alive
    assert parse_head(head("GET / HTTP/1.0\nConnection: keep-alive")).keep_alive
    assert not parse_head(head("GET / HTTP/1.1\nConnection: close")).keep_alive


def test_error_response_is_ntfy_json() -> None:
    """Errors carry ntfy's body shape, a newline and Content-Type application/json."""
    raw = error_response(400, 40009, "invalid request: topic invalid")
    head_, _, body = raw.partition(b"\r\n\r\n")
    assert head_.startswith(b"HTTP/1.1 400 Bad Request\r\n") and b"Content-Type: application/json" in head_
    assert json.loads(body) == {"code": 40009, "http": 400, "error": "invalid request: topic invalid"}
    assert body.endswith(b"\n")


def test_chunk_framing() -> None:
    """A chunk is hex length, CRLF, data, CRLF."""
    assert chunk(b"hello") == b"5\r\nhello\r\n"


def test_chunked_decoder_in_pieces() -> None:
    """A chunked body split across reads decodes whole and returns what follows it."""
    d = ChunkedDecoder(100)
    data = b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\nNEXT"
    out = None
    for i in range(len(data)):
        out = d.feed(data[i : i + 1])
        if out is not None:
            out += data[i + 1 :]
            break
    assert bytes(d.body) == b"hello world" and out == b"NEXT"


def test_chunked_decoder_limits_and_framing() -> None:
    """Over the limit is 413; bad sizes and framing are 400."""
    with pytest.raises(HttpError) as e:
        ChunkedDecoder(4).feed(b"5\r\nhello\r\n")
    assert e.value.http == 413
    for bad in (b"zz\r\n", b"5\r\nhelloXX"):
        with pytest.raises(HttpError) as e:
            ChunkedDecoder(100).feed(bad)
        assert e.value.http == 400
