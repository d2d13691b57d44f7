"""The codec's parts the h11 differential (test_http11_h11.py) and the never-raises fuzz
(services/pusher/tests/unit/test_fuzz.py) do not reach: the chunked decoder and the Content-Length body
must decode exactly what was sent, however the bytes are split, and hand back exactly what follows (the
next pipelined request); a parsed head's accessors never raise but HttpError."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from upf_edge.http11 import HttpError, RequestBody, RequestHead, find_head_end, parse_head

LIMIT = 4096
SETTINGS = settings(max_examples=300, deadline=None)


def pieces(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    out, last = [], 0
    for p in points + [len(data)]:
        out.append(data[last:p])
        last = p
    return out


@st.composite
def chunked_bodies(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """(encoded, body): random chunk sizes, hex case, extensions and trailers."""
    body = draw(st.binary(max_size=600))
    sizes = draw(st.lists(st.integers(1, 200), max_size=20))
    out, pos = b"", 0
    for n in sizes + [len(body)]:
        part = body[pos : pos + n]
        if not part:
            continue
        pos += len(part)
        size = b"%x" % len(part)
        if draw(st.booleans()):
            size = size.upper()
        ext = draw(st.sampled_from([b"", b";a=b", b';name="q"', b"; x"]))
        out += size + ext + b"\r\n" + part + b"\r\n"
    assert pos == len(body)
    out += b"0" + draw(st.sampled_from([b"", b";end"])) + b"\r\n"
    out += b"".join(draw(st.lists(st.sampled_from([b"Trailer-A: 1\r\n", b"X-Y:z\r\n"]), max_size=2)))
    return out + b"\r\n", body


@SETTINGS
@given(enc=chunked_bodies(), after=st.binary(max_size=40), cuts=st.lists(st.integers(0, 2000), max_size=8))
def test_chunked_decodes_exactly_in_any_pieces(enc: tuple[bytes, bytes], after: bytes, cuts: list[int]) -> None:
    encoded, body = enc
    head = parse_head(b"POST /t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    reader = RequestBody(head, LIMIT)
    rest = None
    fed = pieces(encoded + after, cuts)
    for i, p in enumerate(fed):
        rest = reader.feed(p)
        if rest is not None:
            rest += b"".join(fed[i + 1 :])
            break
    assert rest == after
    assert reader.body == body


@SETTINGS
@given(body=st.binary(max_size=LIMIT), after=st.binary(max_size=40), cuts=st.lists(st.integers(0, 5000), max_size=8))
def test_content_length_decodes_exactly_in_any_pieces(body: bytes, after: bytes, cuts: list[int]) -> None:
    head = parse_head(b"POST /t HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body))
    reader = RequestBody(head, LIMIT)
    rest = b"" if not body else None
    fed = pieces(body + after, cuts)
    if body:
        for i, p in enumerate(fed):
            rest = reader.feed(p)
            if rest is not None:
                rest += b"".join(fed[i + 1 :])
                break
    else:
        rest = b"".join(fed)
    assert rest == after and reader.body == body


@SETTINGS
@given(size=st.integers(LIMIT + 1, LIMIT * 4), chunked=st.booleans())
def test_over_the_limit_is_413_before_the_body(size: int, chunked: bool) -> None:
    """A declared length over the limit is refused at once; a chunk size over it at its size line."""
    try:
        if chunked:
            head = parse_head(b"POST /t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
            RequestBody(head, LIMIT).feed(b"%x\r\n" % size)
        else:
            RequestBody(parse_head(b"POST /t HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % size), LIMIT)
    except HttpError as e:
        assert (e.http, e.code) == (413, 41300)
    else:
        raise AssertionError("no 413")


fields = st.lists(
    st.tuples(
        st.sampled_from([b"Connection", b"Upgrade", b"X-Since", b"Authorization", b"Host", b"X-Y", b"connection"]),
        st.lists(st.sampled_from([b"close", b"keep-alive", b"Upgrade", b"websocket", b",", b" ", b"\t", b"\x80", b"\xff", b"%", b"a"]), max_size=6).map(b"".join),
    ),
    max_size=5,
)  # fmt: skip
targets = st.lists(
    st.sampled_from([b"/t", b"/json", b"?", b"&", b"=", b"%ff", b"%c3%a9", b"%00", b"+", b"a", b"%", b"%e2%82"]),
    max_size=8,
).map(b"".join)


@SETTINGS
@given(target=targets, fields=fields, version=st.sampled_from([b"HTTP/1.1", b"HTTP/1.0"]))
def test_head_accessors_never_raise_but_400(target: bytes, fields: list[tuple[bytes, bytes]], version: bytes) -> None:
    raw = (
        b"GET /"
        + target
        + b" "
        + version
        + b"\r\nHost: x\r\n"
        + b"".join(k + b": " + v + b"\r\n" for k, v in fields)
        + b"\r\n"
    )
    try:
        assert find_head_end(raw) == len(raw)
        head = parse_head(raw)
        assert isinstance(head, RequestHead)
        head.header_map()
        head.keep_alive  # noqa: B018 - a property that parses
        head.has_token(b"upgrade", b"websocket")
        head.has_token(b"connection", b"upgrade")
        head.query()
    except HttpError as e:
        assert (e.http, e.code) == (400, 40000), e


def _scan_in_pieces(data: bytes, cuts: list[int]) -> int | str:
    """``find_head_end`` as the front door calls it: on each arrival, told how much it already scanned."""
    buf = b""
    for part in pieces(data, cuts):
        scanned = len(buf)
        buf += part
        try:
            end = find_head_end(buf, scanned)
        except HttpError as e:
            return e.http
        if end >= 0:
            return end
    return -1


def _scan_whole_prefixes(data: bytes, cuts: list[int]) -> int | str:
    """The same arrivals, each time scanned from the start (what the scan resumes must equal)."""
    buf = b""
    for part in pieces(data, cuts):
        buf += part
        try:
            end = find_head_end(buf)
        except HttpError as e:
            return e.http
        if end >= 0:
            return end
    return -1


heads = st.lists(
    st.sampled_from([b"GET / HTTP/1.1", b"\r\n", b"\r", b"\n", b"Host: x", b"\r\n\r\n", b"a", b": ", b"\r\r\n"]),
    max_size=12,
).map(b"".join)


@SETTINGS
@given(data=heads, cuts=st.lists(st.integers(0, 400), max_size=12))
def test_a_resumed_head_scan_finds_what_a_scan_from_the_start_does(data: bytes, cuts: list[int]) -> None:
    """The end of a head, a bare CR or LF, split anywhere between arrivals (a CR ending one and its LF
    starting the next included): resuming where the last scan stopped decides as scanning it all."""
    assert _scan_in_pieces(data, cuts) == _scan_whole_prefixes(data, cuts)
