"""Rule 2b: an X-Cache: no row is sent live, never as replay (since=..., polls)."""

from __future__ import annotations

from upf_keyspace import Envelope, Stored
from upf_pusher.session import Phase, Read, Send, Session, SessionConfig

NOW = 1_700_000_000.0


def stamp(n: int) -> bytes:
    return n.to_bytes(10, "big") + b"\x00\x00"


def row(n: int, nocache: bool = False) -> Stored:
    return Stored(stamp(n), Envelope(time=int(NOW), expires=int(NOW) + 60, message=f"m{n}", nocache=nocache))


def texts(cmds: list) -> list[str]:
    return [m.message for c in cmds if isinstance(c, Send) for m in c.messages if m.event == "message"]


def reads(cmds: list) -> list[tuple[str, bytes | None]]:
    return [(c.topic, c.after) for c in cmds if isinstance(c, Read)]


def session(poll: bool = False) -> Session:
    return Session(("a",), "a", SessionConfig(batch=10, clock=lambda: NOW), poll=poll)


def test_replay_skips_nocache_at_or_below_the_live_mark_then_live_sends_it():
    s = session()
    s.subscribed({"a": None}, NOW, {"a": stamp(3)})  # since=all; newest at subscribe: 3
    cmds = s.batch_read("a", [row(1), row(2, nocache=True), row(3, nocache=True), row(4, nocache=True)])
    assert texts(cmds) == ["m1", "m4"]  # 4 landed after the subscription: live
    assert s.cursor("a") == stamp(4) and s.phase is Phase.LIVE  # the skipped rows are passed, not re-read
    assert reads(cmds) == []
    assert reads(s.poke("a")) == [("a", stamp(4))]
    assert texts(s.batch_read("a", [row(5, nocache=True)])) == ["m5"]


def test_a_poll_never_sends_nocache():
    p = session(poll=True)
    p.subscribed({"a": None}, NOW, {"a": stamp(1)})
    cmds = p.batch_read("a", [row(1), row(2, nocache=True), row(3)])
    assert texts(cmds) == ["m1", "m3"] and p.closed


def test_without_marks_the_cursor_is_the_mark():
    s = session()
    s.subscribed({"a": stamp(2)}, NOW)  # e.g. since=<id 2>, no mark given
    assert texts(s.batch_read("a", [row(3, nocache=True)])) == ["m3"]
    r = session()
    r.subscribed({"a": None}, NOW)  # since=all, empty queue at subscribe: everything is live
    assert texts(r.batch_read("a", [row(1, nocache=True)])) == ["m1"]
