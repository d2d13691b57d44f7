"""A read round's sends to one multi-topic connection go out in stamp order across topics
(``hub.in_stamp_order``): a client resumes every topic from its last id, so a later row written before
an earlier one could make a cut connection's resume skip the earlier one."""

from __future__ import annotations

from upf_keyspace import Envelope, Message, Stored
from upf_pusher.hub import BELL, SAFETY, in_stamp_order
from upf_pusher.session import Send


def row(n: int) -> Stored:
    return Stored(n.to_bytes(10, "big") + b"\x00\x00", Envelope(time=1, expires=2, message=f"m{n}"))


def sent(sends: list[tuple[Send, str]]) -> list[tuple[str, str, str]]:
    return [
        (t, r.envelope.message, trigger) for cmd, trigger in sends for t, r in zip(cmd.topics, cmd.rows, strict=True)
    ]


def test_rows_of_several_topics_are_merged_by_stamp_and_keep_their_trigger() -> None:
    a = Send(rows=[row(3), row(5)], topics=["a", "a"])
    b = Send(rows=[row(1), row(4)], topics=["b", "b"])
    c = Send(rows=[row(2)], topics=["c"])
    out = in_stamp_order([(a, BELL), (b, BELL), (c, SAFETY)])
    assert sent(out) == [
        ("b", "m1", BELL),
        ("c", "m2", SAFETY),
        ("a", "m3", BELL),
        ("b", "m4", BELL),
        ("a", "m5", BELL),
    ]
    assert sum(len(cmd.rows) for cmd, trigger in out if trigger == SAFETY) == 1  # counted as before


def test_sends_already_in_order_or_with_events_are_left_as_they_are() -> None:
    in_order = [(Send(rows=[row(1)], topics=["a"]), BELL), (Send(rows=[row(2)], topics=["b"]), BELL)]
    assert in_stamp_order(in_order) is in_order
    event = Message(id="x", time=1, event="keepalive", topic="a")
    with_events = [(Send(rows=[row(2)], topics=["a"]), BELL), (Send(events=[event]), BELL)]
    assert in_stamp_order(with_events) is with_events
