"""ntfy's subscribe filters: parsing (names, aliases, headers, 40007) and matching (queryFilter.Pass),
and a session that applies them to its backlog and its live rows. Pure: no I/O."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from upf_edge.errors import NtfyError
from upf_keyspace import Envelope, Stored, encode_id
from upf_pusher.filters import Filter
from upf_pusher.query import PRIORITY_INVALID, parse_filter, parse_subscribe
from upf_pusher.session import FilteredSession, Phase, Send, Session, SessionConfig, new_session

NOW = 1_700_000_000


def stamp(n: int) -> bytes:
    return n.to_bytes(10, "big") + b"\x00\x00"


def env(text: str = "m", **kw) -> Envelope:
    return Envelope(time=NOW, expires=NOW + 60, message=text, **kw)


def passes(f: Filter, e: Envelope, n: int = 1) -> bool:
    return f.passes(stamp(n), e)


# --- matching ---------------------------------------------------------------------------------------
def test_an_empty_filter_passes_everything() -> None:
    assert passes(Filter(), env(priority=1, tags=("x",), title="t"))


def test_id_message_and_title_match_exactly() -> None:
    assert passes(Filter(id=encode_id(stamp(7))), env(), 7)
    assert not passes(Filter(id=encode_id(stamp(7))), env(), 8)
    assert passes(Filter(id="origin-id"), env(origin_id="origin-id"), 8)  # a released scheduled message's id
    assert passes(Filter(message="two"), env("two"))
    assert not passes(Filter(message="two"), env("two "))
    assert not passes(Filter(message="two"), env("Two"))
    assert passes(Filter(title="T1"), env(title="T1"))
    assert not passes(Filter(title="T1"), env(title="T10"))
    assert not passes(Filter(title="T1"), env())


def test_priority_is_an_or_and_no_priority_counts_as_default() -> None:
    f = Filter(priorities=(1, 5))
    assert passes(f, env(priority=5)) and passes(f, env(priority=1))
    assert not passes(f, env(priority=4)) and not passes(f, env())
    default = Filter(priorities=(3,))
    assert passes(default, env()) and passes(default, env(priority=3))
    assert not passes(default, env(priority=4))


def test_tags_must_all_be_present() -> None:
    f = Filter(tags=("a", "b"))
    assert passes(f, env(tags=("b", "c", "a")))
    assert not passes(f, env(tags=("a",)))
    assert not passes(f, env())
    assert passes(Filter(tags=("b",)), env(tags=("a", "b")))


def test_all_filters_together() -> None:
    f = Filter(message="one", title="T1", priorities=(4,), tags=("a",))
    assert passes(f, env("one", title="T1", priority=4, tags=("a", "b")))
    assert not passes(f, env("one", title="T1", priority=4, tags=("b",)))
    assert not passes(f, env("one", title="T2", priority=4, tags=("a",)))


@pytest.mark.parametrize("event", ["poll_request", "message_clear", "message_delete"])
def test_other_events_pass_every_filter(event: str) -> None:
    """ntfy: filters only apply to ``message`` events."""
    f = Filter(id="nope", message="nope", title="nope", priorities=(5,), tags=("nope",))
    assert passes(f, env("New message", event=event, sequence_id="s1", poll_id="p"))
    assert not passes(f, env("New message", event="message"))


def test_rows_and_topics_keep_order_and_pairing() -> None:
    rows = [Stored(stamp(i), env(f"m{i}", priority=5 if i % 2 else 2)) for i in range(6)]
    kept, topics = Filter(priorities=(5,)).rows_and_topics(rows, ["a", "b", "c", "d", "e", "f"])
    assert [r.envelope.message for r in kept] == ["m1", "m3", "m5"] and topics == ["b", "d", "f"]
    assert Filter(priorities=(5,)).rows(rows) == kept


# --- parsing ----------------------------------------------------------------------------------------
def flt(query: dict[str, str] | None = None, headers: dict[str, str] | None = None) -> Filter | None:
    return parse_filter(headers or {}, query or {})


def test_no_filter_is_none() -> None:
    assert flt() is None
    assert flt({"since": "all", "poll": "1"}) is None
    assert flt({"priority": "", "tags": ",,", "title": "  "}) is None  # blank values ask for nothing
    assert parse_subscribe("t", "json", {}, {"poll": "1"}, NOW).filter is None


@pytest.mark.parametrize(
    ("value", "want"),
    [
        ("high", {4}),
        ("5,1", {5, 1}),
        ("min,low,default,high,max,urgent", {1, 2, 3, 4, 5}),
        (" HIGH , 2 ", {4, 2}),
        ("3,,", {3}),
        ("1, ,5", {1, 0, 5}),  # ntfy's ParsePriority: a blank item is 0, which no message has
    ],
)
def test_priority_names_and_numbers(value: str, want: set[int]) -> None:
    f = flt({"priority": value})
    assert f is not None and f.priorities == tuple(sorted(want))


@pytest.mark.parametrize("value", ["garbage", "0", "6", "-1", "high,nope", "1.0", "very high"])
def test_an_invalid_priority_is_40007(value: str) -> None:
    with pytest.raises(NtfyError) as exc:
        flt({"priority": value})
    assert exc.value.problem is PRIORITY_INVALID
    assert (PRIORITY_INVALID.code, PRIORITY_INVALID.http) == (40007, 400)
    assert PRIORITY_INVALID.link == "https://ntfy.sh/docs/publish/#message-priority"
    with pytest.raises(NtfyError):
        parse_subscribe("t", "json", {"x-priority": value}, {}, NOW)


@pytest.mark.parametrize(
    ("names", "field", "value", "want"),
    [
        (("x-id", "id"), "id", "abc", "abc"),
        (("x-message", "message", "m"), "message", "two", "two"),
        (("x-title", "title", "t"), "title", "T1", "T1"),
        (("x-tags", "tags", "tag", "ta"), "tags", "a,b", ("a", "b")),
        (("x-priority", "priority", "prio", "p"), "priorities", "max", (5,)),
    ],
)
def test_every_alias_as_query_key_and_header(names: tuple[str, ...], field: str, value: str, want: object) -> None:
    for name in names:
        for f in (flt({name: value}), flt(headers={name: value})):
            assert f is not None and getattr(f, field) == want, name


def test_headers_win_over_query_and_blank_headers_do_not() -> None:
    f = flt({"title": "from-query"}, {"x-title": "from-header"})
    assert f is not None and f.title == "from-header"
    f = flt({"title": "from-query"}, {"x-title": "  "})
    assert f is not None and f.title == "from-query"
    f = flt({"t": "short"}, {})
    assert f is not None and f.title == "short"


def test_values_are_trimmed_and_list_items_are_not() -> None:
    f = flt({"message": "  two  ", "tags": " a, b "})
    assert f is not None and f.message == "two" and f.tags == ("a", " b")


def test_rfc9218_priority_header_is_not_a_filter() -> None:
    """Browsers and proxies send ``Priority: u=1, i`` (RFC 9218): ntfy ignores it."""
    for value in ("u=1, i", "u=0", "u=3,i", "i"):
        assert flt(headers={"priority": value}) is None, value
    f = flt({"priority": "high"}, {"priority": "u=1, i"})
    assert f is not None and f.priorities == (4,)
    with pytest.raises(NtfyError):
        flt(headers={"x-priority": "u=1, i"})  # only the Priority header is special


def test_header_values_are_utf8_and_rfc2047() -> None:
    """The request head decodes latin-1: a header's UTF-8 octets are read back as UTF-8."""
    f = flt(headers={"x-title": "Grüße".encode().decode("latin-1")})
    assert f is not None and f.title == "Grüße"
    f = flt(headers={"x-title": "=?UTF-8?B?R3LDvMOfZQ==?="})
    assert f is not None and f.title == "Grüße"


# --- sessions ---------------------------------------------------------------------------------------
def messages(cmds: list) -> list[str]:
    return [m.message for c in cmds if isinstance(c, Send) for m in c.messages]


def test_only_a_filtered_subscribe_gets_a_filtered_session() -> None:
    config = SessionConfig(batch=10, clock=lambda: NOW)
    plain = new_session(("a",), "a", config)
    assert type(plain) is Session and plain.filter is None
    filtered = new_session(("a",), "a", config, filter=Filter(title="x"))
    assert type(filtered) is FilteredSession and filtered.filter == Filter(title="x")
    assert not hasattr(plain, "__dict__")  # the filter is no per-instance attribute of a plain session


def test_a_filtered_session_skips_rows_in_catch_up_live_and_held_and_moves_its_cursor() -> None:
    s = new_session(("a", "b"), "a,b", SessionConfig(batch=10, clock=lambda: NOW), filter=Filter(priorities=(5,)))
    s.subscribed({"a": None, "b": None}, NOW, {"a": stamp(9), "b": stamp(9)})
    cmds = s.batch_read_many(
        [
            [Stored(stamp(1), env("a1", priority=5)), Stored(stamp(3), env("a3"))],
            [Stored(stamp(2), env("b2")), Stored(stamp(4), env("b4", priority=5))],
        ]
    )
    assert messages(cmds) == ["a1", "b4"]
    assert s.cursor("a") == stamp(3) and s.cursor("b") == stamp(4)
    assert s.phase is Phase.LIVE
    s.poke("a")
    cmds = s.batch_read_many(
        [[Stored(stamp(10), env("a10")), Stored(stamp(11), env("clear", event="message_clear"))], []]
    )
    assert messages(cmds) == ["clear"] and s.cursor("a") == stamp(11)
    s.poke("a")
    s.write_paused(NOW)
    held = [[Stored(stamp(12), env("a12")), Stored(stamp(13), env("a13", priority=5))], []]
    assert s.batch_read_many(held) == []
    assert messages(s.write_resumed()) == ["a13"] and s.cursor("a") == stamp(13)
    s.poke("a")
    assert [c for c in s.batch_read_many([[Stored(stamp(14), env("a14"))], []]) if isinstance(c, Send)] == []
    assert s.cursor("a") == stamp(14)


# --- fuzz -------------------------------------------------------------------------------------------
_NAMES = ["x-id", "id", "x-message", "message", "m", "x-title", "title", "t", "x-tags", "tags", "tag", "ta"]
_PRIORITY_NAMES = ["x-priority", "priority", "prio", "p"]
_PRIORITY_ITEMS = ["1", "2", "3", "4", "5", "min", "low", "default", "high", "max", "urgent", " HIGH ", ""]


@given(
    st.dictionaries(st.sampled_from(_NAMES + _PRIORITY_NAMES), st.text(max_size=30), max_size=4),
    st.dictionaries(st.sampled_from(_NAMES + _PRIORITY_NAMES), st.text(max_size=30), max_size=4),
)
def test_any_filter_input_is_a_filter_none_or_40007(headers: dict[str, str], query: dict[str, str]) -> None:
    latin = {k: v.encode("utf-8").decode("latin-1") for k, v in headers.items()}  # as the request head decodes
    try:
        f = parse_filter(latin, query)
    except NtfyError as e:
        assert e.problem is PRIORITY_INVALID
        return
    assert f is None or f != Filter()
    if f is not None:
        assert f.passes(stamp(1), env("x", event="message_clear"))


@given(st.lists(st.sampled_from(_PRIORITY_ITEMS), min_size=1, max_size=5), st.integers(0, 5))
def test_valid_priority_lists_match_as_an_or(items: list[str], priority: int) -> None:
    f = flt({"priority": ",".join(items)})
    want = {_PRIORITY_VALUES[i.strip().lower()] for i in items if i}
    if not want:
        assert f is None
        return
    assert f is not None and f.passes(stamp(1), env(priority=priority)) == ((priority or 3) in want)


_PRIORITY_VALUES = dict(zip(_PRIORITY_ITEMS, [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 5, 4, 0], strict=True))
