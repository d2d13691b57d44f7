"""Every network-facing parser, fed arbitrary input: accepted, or rejected with its documented exception."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from upf_edge.errors import NtfyError
from upf_edge.http11 import ChunkedDecoder, HttpError, RequestHead, find_head_end, parse_head
from upf_keyspace import Since
from upf_pusher.query import parse_since, parse_subscribe

_HEADISH = st.lists(
    st.one_of(
        st.binary(max_size=40),
        st.sampled_from([b"GET ", b"/t/json", b"?since=", b" HTTP/1.1", b"\r\n", b":", b"%ff", b"%41"]),
    ),
    max_size=20,
).map(b"".join)


@settings(max_examples=400, deadline=None)
@given(_HEADISH)
def test_request_heads(data: bytes) -> None:
    """parse_head returns a RequestHead or raises HttpError (400/431), nothing else."""
    try:
        end = find_head_end(data + b"\r\n\r\n")
        assert end > 0
        assert isinstance(parse_head((data + b"\r\n\r\n")[:end]), RequestHead)
    except HttpError as e:
        assert e.http in (400, 431)


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=30), st.booleans())
def test_since_values(value: str, poll: bool) -> None:
    """parse_since returns a Since or raises NtfyError 40008."""
    try:
        assert isinstance(parse_since(value, poll=poll, now=1_700_000_000.0), Since)
    except NtfyError as e:
        assert e.code == 40008


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80), st.dictionaries(st.sampled_from(["since", "si", "poll", "po", "x"]), st.text(max_size=20)))
def test_subscribe_requests(topics: str, query: dict[str, str]) -> None:
    """parse_subscribe accepts or raises NtfyError with 40008/40009."""
    try:
        parse_subscribe(topics, "json", {}, query, 1_700_000_000.0)
    except NtfyError as e:
        assert e.code in (40008, 40009)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=30), max_size=10))
def test_chunked_bodies(pieces: list[bytes]) -> None:
    """The chunked decoder consumes pieces, finishing or raising HttpError (400/413/431)."""
    d = ChunkedDecoder(1024)
    try:
        for p in pieces:
            if d.feed(p) is not None:
                assert d.done and len(d.body) <= 1024
                break
    except HttpError as e:
        assert e.http in (400, 413, 431)
