"""The request-head parser, response builders and the chunked body decoder, including bad input."""

from __future__ import annotations

import json

import pytest

from upf_edge import NtfyError, Problem, Reply, error_body
from upf_edge.http11 import (
    MAX_HEAD,
    ChunkedDecoder,
    HttpError,
    RequestBody,
    chunk,
    decode_headers,
    decode_query,
    error_response,
    find_head_end,
    parse_head,
    reply_response,
)


def head(text: str) -> bytes:
    """A head from ``\\n``-separated lines, with the ``Host`` HTTP/1.1 requires when it names none."""
    first, _, rest = text.partition("\n")
    if first.endswith("HTTP/1.1") and "host:" not in rest.lower():
        text = first + "\nHost: x" + ("\n" + rest if rest else "")
    return text.replace("\n", "\r\n").encode() + b"\r\n\r\n"


def test_parses_method_path_query_and_headers() -> None:
    """A normal GET yields its decoded path, raw query and lower-cased headers."""
    h = parse_head(head("GET /up%41b/json?since=all&poll=1 HTTP/1.1\nHost: x\nX-Since:  10m "))
    assert (h.method, h.path, h.raw_path, h.query_string, h.version) == (
        "GET",
        "/upAb/json",
        b"/up%41b/json",
        b"since=all&poll=1",
        "1.1",
    )
    assert h.header(b"x-since") == b"10m"
    assert h.query() == {"since": "all", "poll": "1"}
    assert h.keep_alive


@pytest.mark.parametrize(
    ("target", "path", "query"),
    [("http://push.example/upT?up=1", "/upT", b"up=1"), ("HTTPS://h:8080/a%2Fb", "/a/b", b""),
     ("http://h", "/", b""), ("http://h?x=1", "/", b"x=1"), ("http://user@h/t/json", "/t/json", b"")],
)  # fmt: skip
def test_an_absolute_form_target_is_its_path_and_query(target: str, path: str, query: bytes) -> None:
    """RFC 9112 3.2.2: a server must accept the absolute form (what a request to a proxy carries), as
    Go's does; the route is its path and query."""
    h = parse_head(head(f"POST {target} HTTP/1.1"))
    assert (h.path, h.query_string) == (path, query)


@pytest.mark.parametrize("target", ["ftp://h/t", "http:/t", "push.example/t", "h:80"])
def test_other_targets_are_400(target: str) -> None:
    with pytest.raises(HttpError) as e:
        parse_head(head(f"GET {target} HTTP/1.1"))
    assert e.value.http == 400


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
        b"GET / HTTP/1.1\r\nHost: x\r\nbad name: v\r\nX-A: b\r\n\r\n",  # one bad line among good ones
        b"GET / HTTP/1.1\r\nHost: x\r\nX-A: b\r\n: v\r\n\r\n",
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


def test_connection_is_a_list_over_every_line() -> None:
    """Connection's tokens count on any of its lines (RFC 9110 5.3, as Go's server reads it), and
    whole: a token that merely contains "close" is not one."""
    assert not parse_head(head("GET / HTTP/1.1\nConnection: keep-alive\nConnection: close")).keep_alive
    assert not parse_head(head("GET / HTTP/1.1\nConnection: Upgrade, Close")).keep_alive
    assert parse_head(head("GET / HTTP/1.1\nConnection: x-closed")).keep_alive
    assert parse_head(head("GET / HTTP/1.0\nConnection: close\nConnection: Keep-Alive")).keep_alive


def test_an_expectation_other_than_100_continue_is_417() -> None:
    """RFC 9110 10.1.1, as Go's server answers it (ntfy's): refused before anything runs."""
    with pytest.raises(HttpError) as e:
        parse_head(head("POST /t HTTP/1.1\nExpect: foo\nContent-Length: 1"))
    assert (e.value.http, e.value.code) == (417, 41700)
    for ok in ("100-continue", "100-Continue", "100-continue, x", ""):
        parse_head(head(f"POST /t HTTP/1.1\nExpect: {ok}\nContent-Length: 1"))


def test_100_continue_is_ignored_from_http10_and_without_a_body() -> None:
    """An HTTP/1.0 client may take a 100 for its final reply (RFC 9110 10.1.1): it gets none."""
    expect = "Expect: 100-continue\nContent-Length: 3"
    assert RequestBody(parse_head(head(f"POST /t HTTP/1.1\nHost: x\n{expect}")), 4096).expect_continue
    assert not RequestBody(parse_head(head(f"POST /t HTTP/1.0\n{expect}")), 4096).expect_continue
    no_body = "Expect: 100-continue\nContent-Length: 0"
    assert not RequestBody(parse_head(head(f"POST /t HTTP/1.1\nHost: x\n{no_body}")), 4096).expect_continue


def test_error_response_is_ntfy_json() -> None:
    """Errors carry ntfy's body shape, a newline and Content-Type application/json."""
    raw = error_response(Problem(40009, 400, "invalid request: topic invalid"))
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


# --- what the front doors share: request bodies, field decoding, replies, ntfy errors ----------------


def test_request_body_by_content_length_returns_what_follows() -> None:
    """A Content-Length body fed in pieces completes exactly at its length; the rest is the next request."""
    b = RequestBody(parse_head(head("POST /t HTTP/1.1\nContent-Length: 5")), 100)
    assert b.feed(b"he") is None
    assert b.feed(b"lloGET") == b"GET" and b.body == b"hello"
    assert not b.expect_continue


def test_request_body_chunked_and_expect_continue() -> None:
    """A chunked body decodes whole; Expect: 100-continue is reported only when a body is coming."""
    b = RequestBody(parse_head(head("PUT /t HTTP/1.1\nTransfer-Encoding: chunked\nExpect: 100-continue")), 100)
    assert b.expect_continue
    assert b.feed(b"3\r\nabc\r\n0\r\n\r\n") == b"" and b.body == b"abc"
    assert not RequestBody(parse_head(head("GET /t HTTP/1.1\nExpect: 100-continue")), 100).expect_continue
    assert RequestBody(parse_head(head("GET /t HTTP/1.1")), 100).feed(b"NEXT") == b"NEXT"


@pytest.mark.parametrize(
    ("fields", "http"),
    [
        ("Content-Length: 101", 413),
        ("Content-Length: -1", 400),
        ("Transfer-Encoding: gzip, chunked", 400),
    ],
)
def test_request_body_refusals(fields: str, http: int) -> None:
    """Over the limit is 413, a malformed length or a transfer coding other than chunked 400."""
    with pytest.raises(HttpError) as e:
        RequestBody(parse_head(head(f"POST /t HTTP/1.1\n{fields}")), 100)
    assert e.value.http == http


def test_decode_headers_and_query_take_the_first_value() -> None:
    """Header names lower-cased, values UTF-8 (bad bytes replaced); query percent-decoded; first wins."""
    headers = decode_headers([(b"X-Title", "h\u00e9".encode()), (b"x-title", b"second"), (b"x-bad", b"\xff")])
    assert headers == {"x-title": "h\u00e9", "x-bad": "\ufffd"}
    assert decode_query(b"up=1&t=a%20b&up=2&flag") == {"up": "1", "t": "a b", "flag": ""}
    assert decode_query(b"up=1&m=x&up=2") == {"up": "1", "m": "x"}
    assert decode_query(b"") == {}


def test_reply_response_head_and_keep_alive() -> None:
    """A handler's Reply becomes a full response, allowing any origin (ntfy's CORS default); HEAD keeps
    the length but drops the body."""
    reply = Reply(200, b'{"a":1}\n', ((b"idempotent-replayed", b"true"),))
    raw = reply_response(reply)
    head_part, _, body = raw.partition(b"\r\n\r\n")
    lines = head_part.split(b"\r\n")
    assert lines[0] == b"HTTP/1.1 200 OK" and body == b'{"a":1}\n'
    assert set(lines[1:]) == {
        b"Content-Type: application/json",
        b"Content-Length: 8",
        b"idempotent-replayed: true",
        b"Access-Control-Allow-Origin: *",
        b"Connection: keep-alive",
    }
    only_head = reply_response(reply, keep_alive=False, head_only=True)
    assert only_head.endswith(b"Connection: close\r\n\r\n") and b"Content-Length: 8" in only_head


def test_ntfy_error_body_and_the_one_error_type() -> None:
    """ntfy's error JSON plus newline; HttpError is the shared NtfyError carrying the same Problem."""
    problem = Problem(40009, 400, "invalid request: topic invalid")
    assert error_body(problem) == b'{"code":40009,"http":400,"error":"invalid request: topic invalid"}\n'
    assert problem.body() == error_body(problem)
    e = HttpError(Problem(43100, 431, "request header fields too large"))
    assert isinstance(e, NtfyError) and e.problem == Problem(43100, 431, "request header fields too large")
    assert (e.http, e.code, e.error) == (431, 43100, "request header fields too large")


# --- the strict front door: every head two parsers could read two ways is 400 ------------------------


@pytest.mark.parametrize(
    "raw",
    [
        # Content-Length with Transfer-Encoding (the classic smuggling pair), either order
        b"POST /t HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"POST /t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
        # Content-Length repeated, differing or not, or as a list
        b"POST /t HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
        b"POST /t HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
        b"POST /t HTTP/1.1\r\nHost: x\r\nContent-Length: 5, 5\r\n\r\n",
        b"POST /t HTTP/1.1\r\nHost: x\r\nContent-Length: +5\r\n\r\n",
        # Transfer-Encoding repeated, or anything but chunked
        b"POST /t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"POST /t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n",
        b"POST /t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, chunked\r\n\r\n",
        b"POST /t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: xchunked\r\n\r\n",
        b"POST /t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: \x0bchunked\r\n\r\n",
        # chunked on HTTP/1.0
        b"POST /t HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
        # Host missing on HTTP/1.1, or repeated
        b"GET /t/json HTTP/1.1\r\n\r\n",
        b"GET /t/json HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n",
        # control bytes anywhere: target, query, names, values
        b"GET /t/json?since=a\x00b HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /t/json?since=a\x7fb HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /t/json?a=\xc3\xa9 HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /t/json HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n",
        b"GET /t/json HTTP/1.1\r\nHost: x\r\nX-A: a\x01b\r\n\r\n",
        b"GET /t/json HTTP/1.1\r\nHost: x\r\nX-A: a\x1bb\r\n\r\n",
        b"GET /t/json HTTP/1.1\r\nHost: x\r\nX-A: a\x7fb\r\n\r\n",
        b"GET /t/json HTTP/1.1\r\nHost: x\r\nX-A: a\rb\r\n\r\n",
        b"GET /t/json HTTP/1.1\r\nHost: x\r\nX-A: a\nb\r\n\r\n",
        # obsolete line folding
        b"GET /t/json HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n",
    ],
)
def test_ambiguous_or_dirty_heads_are_400(raw: bytes) -> None:
    """Framing two parsers could read two ways, a missing Host, control bytes and folding: 400."""
    with pytest.raises(HttpError) as e:
        parse_head(raw[: find_head_end(raw)])
    assert (e.value.http, e.value.code) == (400, 40000)


def test_tab_in_a_value_and_case_of_chunked_are_accepted() -> None:
    """HTAB between words of a value is allowed; transfer-coding names are case-insensitive (RFC 9112)."""
    h = parse_head(b"POST /t HTTP/1.1\r\nHost: x\r\nX-Title: a\tb\r\nTransfer-Encoding: Chunked\r\n\r\n")
    assert h.header(b"x-title") == b"a\tb" and h.chunked and h.content_length is None
    assert parse_head(head("POST /t HTTP/1.1\nContent-Length: 007")).content_length == 7


@pytest.mark.parametrize(
    "partial",
    [
        b"GET /t/json HTTP/1.1\nHost: x\n\n",
        b"GET /t/json HTTP/1.1\r\nHost: x\n",
        b"GET /t/json HTTP/1.1\rHost: x",
        b"GET /t/json HTTP/1.1\r\r\n",
    ],
)
def test_bare_line_ends_are_refused_at_once(partial: bytes) -> None:
    """A head with bare LF or CR line ends is 400 as soon as it shows, not left to the head timeout."""
    with pytest.raises(HttpError) as e:
        find_head_end(partial)
    assert e.value.http == 400


def test_a_head_cut_after_cr_is_still_waited_for() -> None:
    """A CR at the very end may be the first half of a CRLF still on its way."""
    assert find_head_end(b"GET /t/json HTTP/1.1\r") == -1
    assert find_head_end(b"GET /t/json HTTP/1.1\r\nHost: x\r\n\r") == -1


@pytest.mark.parametrize(
    "size_line",
    [b" 3", b"3 ", b"3\t", b"+3", b"0x3", b"3 ;ext", b"", b"-1", b"123456789", b"3;a\x00"],
)
def test_chunk_size_with_junk_is_400(size_line: bytes) -> None:
    """Only hex digits (at most 8) and an optional ``;extension`` make a chunk-size line."""
    with pytest.raises(HttpError) as e:
        ChunkedDecoder(100).feed(size_line + b"\r\nabc\r\n0\r\n\r\n")
    assert e.value.http == 400


def test_chunk_extension_is_accepted_and_bare_lf_in_chunk_lines_refused() -> None:
    """``3;name=value`` is a valid size line; a size line or trailer ended by bare LF is 400 at once."""
    d = ChunkedDecoder(100)
    assert d.feed(b"3;name=value\r\nabc\r\n0\r\nX-T: 1\r\n\r\nNEXT") == b"NEXT" and bytes(d.body) == b"abc"
    with pytest.raises(HttpError):
        ChunkedDecoder(100).feed(b"3\n")
    with pytest.raises(HttpError):
        ChunkedDecoder(100).feed(b"0\r\nX-T: 1\n")
    with pytest.raises(HttpError):
        ChunkedDecoder(100).feed(b"0\r\nnot a trailer\r\n\r\n")


@pytest.mark.parametrize(
    "raw",
    [
        # the ntfy Android app (OkHttp)
        b"GET /upABC/json?since=AAAAAcXoizIAAAAA HTTP/1.1\r\nHost: push.example.org\r\nConnection: Keep-Alive\r\n"
        b"Accept-Encoding: gzip\r\nUser-Agent: ntfy/1.16.0 (fdroid; Android 14; SDK 34)\r\n\r\n",
        b"GET /upABC/ws?since=all HTTP/1.1\r\nHost: push.example.org\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nAccept-Encoding: gzip\r\n"
        b"User-Agent: okhttp/4.12.0\r\n\r\n",
        # curl, with a body and 100-continue
        b"POST /upABC?up=1 HTTP/1.1\r\nHost: localhost:8080\r\nUser-Agent: curl/8.5.0\r\nAccept: */*\r\n"
        b"Content-Length: 5000\r\nContent-Type: application/x-www-form-urlencoded\r\nExpect: 100-continue\r\n\r\n",
        # httpx, chunked
        b"PUT /t HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nAccept: */*\r\nAccept-Encoding: gzip, deflate\r\n"
        b"Connection: keep-alive\r\nUser-Agent: python-httpx/0.28.1\r\nTransfer-Encoding: chunked\r\n\r\n",
        # HTTP/1.0 needs no Host
        b"GET /old/json?poll=1 HTTP/1.0\r\n\r\n",
    ],
)
def test_real_clients_heads_are_accepted(raw: bytes) -> None:
    """What the clients UPF serves actually send parses."""
    assert parse_head(raw[: find_head_end(raw)]).method in ("GET", "POST", "PUT")
