"""The subscribe query and ``since=`` parser, fuzzed beyond test_fuzz.py's free text: generated forms near
every rule (durations with any units and magnitudes, digit runs around int64, our ids and near-ids), and
whole request targets through the real chain (head parser, route match, header/query decoding, parse).
Every input is a Subscribe or a NtfyError (HttpError among them) with ntfy's code; valid forms mean what they say."""

from __future__ import annotations

from urllib.parse import quote

from hypothesis import given, settings
from hypothesis import strategies as st

from upf_edge.errors import NtfyError
from upf_edge.http11 import HttpError, parse_head
from upf_keyspace import SINCE_ALL, SINCE_NONE, Since, decode_id, encode_id
from upf_pusher.query import match_subscribe_path, parse_since, parse_subscribe

NOW = 1_700_000_000.0
INT64_MAX = (1 << 63) - 1
UNITS = ["ns", "us", "µs", "μs", "ms", "s", "m", "h", "d"]

numbers = st.one_of(
    st.integers(0, 10**25).map(str),
    st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)).map(lambda t: f"{t[0]}.{t[1]}"),
    st.integers(0, 999).map(lambda n: f".{n}"),
    st.integers(0, 999).map(lambda n: f"{n}."),
    st.integers(1, 400).map(lambda n: "9" * n),
)
durations = st.lists(st.tuples(numbers, st.sampled_from(UNITS + ["", "x", "D", "sec"])), min_size=1, max_size=3).map(
    lambda parts: "".join(n + u for n, u in parts)
)
digit_runs = st.one_of(st.integers(0, 2**64).map(str), st.integers(1, 5000).map(lambda n: "1" * n))
ids = st.binary(min_size=12, max_size=12).map(encode_id)
near_ids = st.one_of(
    ids.map(lambda i: i[:-1]),
    ids.map(lambda i: i + "A"),
    ids.map(lambda i: i.replace("A", "=").replace("-", "+")),
    st.from_regex(r"[A-Za-z0-9]{12}", fullmatch=True),
    st.from_regex(r"[A-Za-z0-9_\-=]{16}", fullmatch=True),
)
since_values = st.one_of(
    durations,
    digit_runs,
    ids,
    near_ids,
    st.sampled_from(["all", "none", "latest", " all ", "ALL", "", " ", "\t1h"]),
    st.text(max_size=70),
)


@settings(max_examples=400, deadline=None)
@given(value=since_values, poll=st.booleans())
def test_since_forms(value: str, poll: bool) -> None:
    try:
        since = parse_since(value, poll=poll, now=NOW)
    except NtfyError as e:
        assert (e.http, e.code) == (400, 40008)
        return
    assert isinstance(since, Since)
    if since.kind == "time":
        assert 0 <= since.time <= INT64_MAX or since.time <= NOW  # a duration counts back from now


@settings(max_examples=100, deadline=None)
@given(stamp=st.binary(min_size=12, max_size=12), poll=st.booleans())
def test_our_ids_round_trip(stamp: bytes, poll: bool) -> None:
    assert parse_since(encode_id(stamp), poll=poll, now=NOW) == Since("stamp", stamp=stamp)


@settings(max_examples=100, deadline=None)
@given(n=st.one_of(st.integers(0, 2**64), st.just(1), st.integers(10**11, 10**12 - 1), st.integers(10**15, 10**16 - 1)))
def test_unix_times_up_to_int64(n: int) -> None:
    """Digits are a unix time up to int64, except where an id matches first (ntfy's order): 16 digits are
    one of our base64url ids, 12 an ntfy-style id (all)."""
    if len(str(n)) == 16:
        assert parse_since(str(n), poll=False, now=NOW) == Since("stamp", stamp=decode_id(str(n)))
    elif len(str(n)) == 12:
        assert parse_since(str(n), poll=False, now=NOW) == SINCE_ALL
    elif n > INT64_MAX:
        try:
            parse_since(str(n), poll=False, now=NOW)
        except NtfyError as e:
            assert e.code == 40008
        else:
            raise AssertionError("beyond int64 must be refused")
    elif n == 1:
        assert parse_since(str(n), poll=False, now=NOW) == SINCE_NONE
    else:
        assert parse_since(str(n), poll=False, now=NOW) == Since("time", time=n)


@settings(max_examples=100, deadline=None)
@given(amount=st.integers(0, 10**6), unit=st.sampled_from(UNITS))
def test_durations_count_back_from_now(amount: int, unit: str) -> None:
    secs = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600, "d": 86400}[unit]
    if amount * secs * 1e9 > INT64_MAX:  # Go's int64 nanoseconds, as ntfy parses it (~292 years)
        try:
            parse_since(f"{amount}{unit}", poll=False, now=NOW)
        except NtfyError as e:
            assert e.code == 40008
        else:
            raise AssertionError("a duration beyond int64 nanoseconds must be refused")
    else:  # at most 9 characters: never mistaken for an id
        assert parse_since(f"{amount}{unit}", poll=False, now=NOW) == Since("time", time=int(NOW - amount * secs))


topic_lists = st.one_of(
    st.lists(st.from_regex(r"[-_A-Za-z0-9]{1,64}", fullmatch=True), min_size=1, max_size=5).map(",".join),
    st.text(max_size=40),
    st.integers(120, 140).map(lambda n: ",".join(["t"] * n)),
)
keys = st.sampled_from(["since", "si", "poll", "po", "x-since", "auth", "up", "s", "SINCE", ""])
query_values = st.one_of(since_values, st.sampled_from(["1", "0", "yes", "true", "%", "%zz", "%00", "%0d%0a"]))


@settings(max_examples=300, deadline=None)
@given(
    topics=topic_lists,
    transport=st.sampled_from(["ws", "json", "sse", "raw"]),
    query=st.lists(st.tuples(keys, query_values), max_size=5),
    headers=st.lists(st.tuples(st.sampled_from(["X-Since", "X-Poll", "Since", "Poll"]), since_values), max_size=2),
    encode=st.booleans(),
)
def test_whole_subscribe_requests(topics: str, transport: str, query: list, headers: list, encode: bool) -> None:
    """From bytes on the wire to a Subscribe: only the documented refusals, never another exception."""
    qs = "&".join(f"{k}={quote(v, safe='') if encode else v}" for k, v in query)
    path = "/" + quote(topics, safe=",") + "/" + transport
    fields = "".join(f"{k}: {v}\r\n" for k, v in headers)
    raw = f"GET {path}{'?' + qs if qs else ''} HTTP/1.1\r\nHost: x\r\n{fields}\r\n".encode()
    try:
        head = parse_head(raw)
        match = match_subscribe_path(head.path)
        if match is None:
            return  # a topic with "/" in it: not a subscribe route (404 upstream)
        req = parse_subscribe(*match, head.header_map(), head.query(), NOW, 128)
    except HttpError as e:
        assert e.http in (400, 431)
        return
    except NtfyError as e:
        assert (e.http, e.code) in ((400, 40008), (400, 40009), (400, 40093))
        return
    assert req.transport == transport and 1 <= len(req.topics) <= 128
    assert isinstance(req.since, Since)
    if not headers and not any(k in ("since", "si", "x-since") for k, _ in query) and req.poll:
        assert req.since == SINCE_ALL  # a poll without since= is everything
