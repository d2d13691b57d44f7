"""Subscribe paths and parameters: every since form, poll, topics, aliases (pure parsing)."""

from __future__ import annotations

import math

import pytest

from upf_edge.errors import NtfyError
from upf_keyspace import SINCE_ALL, SINCE_NONE, Since, encode_id
from upf_pusher.query import match_subscribe_path, parse_since, parse_subscribe, parse_topics

NOW = 1_700_000_000.0
STAMP = bytes(range(12))


def since(value: str, poll: bool = False) -> Since:
    return parse_since(value, poll=poll, now=NOW)


def test_empty_since_is_none_for_streams_and_all_for_polls() -> None:
    """No since means 'none' on a stream and 'all' on a poll."""
    assert since("") == SINCE_NONE
    assert since("", poll=True) == SINCE_ALL


def test_keywords() -> None:
    """all, none and latest are keywords; latest carries when it was asked (whole seconds, rounded up:
    a message expiring before it is no subscriber's newest)."""
    assert (since("all"), since("none")) == (SINCE_ALL, SINCE_NONE)
    assert since("latest") == Since("latest", time=math.ceil(NOW))


def test_our_message_id_is_a_stamp() -> None:
    """A 16-char base64url id decodes to its 12-byte stamp."""
    assert since(encode_id(STAMP)) == Since("stamp", stamp=STAMP)


@pytest.mark.parametrize("value", ["hwQ2YpKdmgAB", "123456789012"])
def test_twelve_alphanumerics_mean_all(value: str) -> None:
    """An ntfy-style 12-char id (even all digits, as ntfy checks ids first) means everything."""
    assert since(value) == SINCE_ALL


def test_unix_timestamp_is_inclusive_time() -> None:
    """A plain integer is a unix timestamp."""
    assert since("1699999000") == Since("time", time=1699999000)
    assert since("0") == Since("time", time=0)


@pytest.mark.parametrize("value", ["1", "+1", "01"])
def test_unix_time_one_is_none_as_in_ntfy(value: str) -> None:
    """ntfy's 'none' is the since-marker of unix time 1 and markers compare by value, so since=1
    delivers nothing there, on a poll too (not every message since 1970)."""
    assert since(value) == SINCE_NONE
    assert since(value, poll=True) == SINCE_NONE


def test_signed_unix_time_and_duration_as_go_parses_them() -> None:
    """ntfy's ParseInt/ParseDuration take a sign: a negative unix time is before everything (all
    messages), "+5" is 5, and "-1h" is an hour ahead (nothing cached yet)."""
    assert since("-5") == Since("time", time=-5)
    assert since("+5") == Since("time", time=5)
    assert since(str(-(1 << 63))) == Since("time", time=-(1 << 63))
    assert since("-1h") == Since("time", time=int(NOW + 3600))
    assert since("+1h") == Since("time", time=int(NOW - 3600))
    with pytest.raises(NtfyError):
        since(str(-(1 << 63) - 1))


def test_disallowed_topics_are_40009_on_subscribe() -> None:
    """ntfy's reserved names (docs, settings, v1...) cannot be subscribed: 400 40009, as ntfy answers."""
    for raw in ("settings", "a,docs", "v1"):
        with pytest.raises(NtfyError) as e:
            parse_topics(raw)
        assert (e.value.http, e.value.code) == (400, 40009)
    assert parse_topics("Settings,v2") == ("Settings", "v2")  # exact and case-sensitive, as ntfy's


@pytest.mark.parametrize(
    ("value", "secs"),
    [("30s", 30), ("10m", 600), ("1h", 3600), ("1d", 86400), ("1h30m", 5400), ("1.5h", 5400), ("100ms", 0.1)],
)
def test_durations_mean_now_minus(value: str, secs: float) -> None:
    """A Go-style duration (days too) means now minus that."""
    assert since(value) == Since("time", time=int(NOW - secs))


@pytest.mark.parametrize("value", ["yesterday", "10x", "--5", "-", "+-1h", "1h-", "h", "abc!", "12345678901$", "1 h"])
def test_anything_else_is_40008(value: str) -> None:
    """A since that is no id, timestamp or duration is 400 with code 40008."""
    with pytest.raises(NtfyError) as e:
        since(value)
    assert (e.value.http, e.value.code) == (400, 40008)


def test_subscribe_route_matching() -> None:
    """Only /{topics}/ws|json|sse|raw is a subscribe route."""
    assert match_subscribe_path("/a,b/json") == ("a,b", "json")
    assert match_subscribe_path("/a/ws") == ("a", "ws")
    assert match_subscribe_path("/a/auth") is None
    assert match_subscribe_path("/a/b/json") is None
    assert match_subscribe_path("/a") is None


def test_topics_are_validated_and_deduplicated() -> None:
    """Each topic must match ntfy's regex (else 40009); repeats collapse in order."""
    assert parse_topics("b,a,b") == ("b", "a")
    for bad in ("a,,b", "a b", "x" * 65, "ä", ""):
        with pytest.raises(NtfyError) as e:
            parse_topics(bad)
        assert e.value.code == 40009


def test_parameter_aliases_and_header_precedence() -> None:
    """X-Since/X-Poll headers win over since/si and poll/po query params."""
    sid = encode_id(STAMP)
    r = parse_subscribe("a,b", "json", {}, {"si": sid, "po": "1"}, NOW)
    assert r.since == Since("stamp", stamp=STAMP) and r.poll and r.topics == ("a", "b") and r.topics_raw == "a,b"
    r = parse_subscribe("a", "sse", {"x-since": "all", "x-poll": "0"}, {"since": "none", "poll": "1"}, NOW)
    assert r.since == SINCE_ALL and not r.poll
    r = parse_subscribe("a", "raw", {}, {"poll": "true"}, NOW)
    assert r.poll and r.since == SINCE_ALL


def test_a_blank_header_gives_way_to_the_query_as_in_ntfys_read_param() -> None:
    """ntfy's readParam skips a blank header and trims what it reads: the query's since/poll then count."""
    r = parse_subscribe("a", "json", {"x-since": " ", "x-poll": ""}, {"since": " all ", "poll": "1"}, NOW)
    assert r.since == SINCE_ALL and r.poll


@pytest.mark.parametrize(
    "value",
    ["9" * 400 + "d", "9" * 5000, "9" * 20, "1" * 30 + "h", "106751d" * 2, "9" * 63 + "s"],
)
def test_since_that_overflows_is_40008_not_an_exception(value: str) -> None:
    """Huge numbers and durations (ntfy: Go's int64 parse fails) are 40008, never OverflowError or
    Python's digit-limit ValueError escaping the handler."""
    with pytest.raises(NtfyError) as err:
        since(value)
    assert (err.value.http, err.value.code) == (400, 40008)


def test_largest_valid_unix_time_and_duration_still_parse() -> None:
    """The bounds are ntfy's, not tighter: int64's largest unix time and 106,751 days still parse."""
    assert since(str((1 << 63) - 1)) == Since("time", time=(1 << 63) - 1)
    assert since("106751d") == Since("time", time=int(NOW - 106751 * 86400))


def test_topic_count_is_capped() -> None:
    """At most ``max_topics`` names per subscribe (duplicates count: the cap is checked before any
    per-name work), else 400 40093; the cap also reaches parse_subscribe."""
    assert len(parse_topics(",".join(f"t{i}" for i in range(128)))) == 128
    for raw in (",".join(f"t{i}" for i in range(129)), ",".join(["t"] * 129)):
        with pytest.raises(NtfyError) as e:
            parse_topics(raw)
        assert (e.value.http, e.value.code) == (400, 40093)
    with pytest.raises(NtfyError) as e:
        parse_subscribe("a,b,c", "json", {}, {}, 0.0, max_topics=2)
    assert e.value.code == 40093
    assert parse_subscribe("a,b", "json", {}, {}, 0.0, max_topics=2).topics == ("a", "b")
