"""The subscriber session fed events, asserting the commands it returns (no sockets, no store)."""

from __future__ import annotations

from upf_keyspace import Envelope, Stored
from upf_pusher.session import RULES, Close, Phase, Read, ReadMany, Send, Session, SessionConfig

BATCH = 3
NOW = 1_700_000_000.0


def stamp(n: int) -> bytes:
    return n.to_bytes(10, "big") + b"\x00\x00"


def row(n: int, text: str = "") -> Stored:
    return Stored(stamp(n), Envelope(time=int(NOW), expires=int(NOW) + 60, message=text or f"m{n}"))


def make(topics: tuple[str, ...] = ("a",), *, poll: bool = False, slow_after: float = 10.0) -> Session:
    return Session(
        topics, ",".join(topics), SessionConfig(batch=BATCH, slow_after=slow_after, clock=lambda: NOW), poll=poll
    )


def live(topics: tuple[str, ...] = ("a",), cursor: bytes | None = None) -> Session:
    """A session that subscribed and found an empty backlog on every topic."""
    s = make(topics)
    s.subscribed({t: cursor for t in topics}, NOW)
    if len(topics) > 1:
        s.batch_read_many([[] for _ in topics])
    else:
        s.batch_read(topics[0], [])
    assert s.phase is Phase.LIVE
    return s


# --- behaviour-named assertions ---------------------------------------------------------------------
def events_sent(cmds: list) -> list[str]:
    return [m.event for c in cmds if isinstance(c, Send) for m in c.messages]


def texts_sent(cmds: list) -> list[str]:
    return [m.message for c in cmds if isinstance(c, Send) for m in c.messages if m.event == "message"]


def read_many_of(cmds: list) -> list[tuple[str, bytes | None]]:
    """The (topic, after) pairs of the one ``ReadMany`` among ``cmds``."""
    (many,) = [c for c in cmds if isinstance(c, ReadMany)]
    return list(zip(many.topics, many.afters, strict=True))


def reads_of(cmds: list) -> list[tuple[str, bytes | None]]:
    return [(c.topic, c.after) for c in cmds if isinstance(c, Read)]


def assert_frames_sent(cmds: list, *texts: str) -> None:
    assert texts_sent(cmds) == list(texts)


def assert_reads(cmds: list, *reads: tuple[str, bytes | None]) -> None:
    assert reads_of(cmds) == list(reads)


def assert_closed_with(cmds: list, reason: str) -> None:
    assert [c.reason for c in cmds if isinstance(c, Close)] == [reason]


def assert_nothing(cmds: list) -> None:
    assert cmds == []


# --- tests ------------------------------------------------------------------------------------------
def test_subscribed_sends_open_before_reading_every_topic() -> None:
    """A stream's first output is the open event (topic = the raw list), then one read of every topic
    from its cursor, in one snapshot."""
    s = make(("a", "b"))
    cmds = s.subscribed({"a": None, "b": stamp(5)}, NOW)
    assert isinstance(cmds[0], Send) and cmds[0].messages[0].event == "open"
    assert cmds[0].messages[0].topic == "a,b"
    assert read_many_of(cmds) == [("a", None), ("b", stamp(5))] and reads_of(cmds) == []
    assert s.phase is Phase.CATCHING_UP


def test_poll_sends_no_open_and_closes_once_drained() -> None:
    """poll=1 sends the backlog without an open event, then closes with 'done'."""
    s = make(poll=True)
    cmds = s.subscribed({"a": None}, NOW)
    assert events_sent(cmds) == []
    cmds = s.batch_read("a", [row(1), row(2)])
    assert_frames_sent(cmds, "m1", "m2")
    assert_closed_with(cmds, "done")
    assert s.closed


def test_a_replay_skips_rows_whose_ttl_has_passed_and_rows_that_arrive_live_go_out() -> None:
    """RFC 8030 5.2 (a TTL: 0 Web Push message reaches only a subscriber connected when it came):
    a poll, or a stream's catch-up at or below its live mark, skips rows past ``expires`` and moves
    its cursor past them; a row above the live mark arrived while the stream was connected."""

    def aged(n: int, expires: float) -> Stored:
        return Stored(stamp(n), Envelope(time=int(NOW) - 10, expires=int(expires), message=f"m{n}"))

    poll = make(poll=True)
    poll.subscribed({"a": None}, NOW)
    cmds = poll.batch_read("a", [aged(1, NOW - 1), aged(2, NOW), aged(3, NOW + 1)])
    assert texts_sent(cmds) == ["m2", "m3"]  # the clock reads NOW: a row expiring at NOW is not past it yet
    assert_closed_with(poll.batch_read("a", []), "done")  # a full batch: one more read finds the end

    later = Session(("a",), "a", SessionConfig(batch=BATCH, clock=lambda: NOW + 0.5), poll=True)
    later.subscribed({"a": None}, NOW)
    cmds = later.batch_read("a", [aged(2, NOW), aged(3, NOW + 1)])
    assert texts_sent(cmds) == ["m3"]  # half a second past its expiry: TTL 0, published in that second

    stream = make()
    stream.subscribed({"a": None}, NOW, {"a": stamp(2)})
    cmds = stream.batch_read("a", [aged(1, NOW - 5), aged(2, NOW - 5), aged(3, NOW - 5)])
    assert texts_sent(cmds) == ["m3"] and stream.cursor("a") == stamp(3)


def test_catch_up_merges_topics_in_stamp_order() -> None:
    """The initial drain of a multi-topic connection interleaves topics by stamp."""
    s = make(("a", "b"))
    s.subscribed({"a": None, "b": None}, NOW)
    cmds = s.batch_read_many([[row(1), row(4)], [row(2), row(3), row(6)]])  # b's batch is full: more may follow
    assert_frames_sent(cmds, "m1", "m2", "m3", "m4", "m6")  # a is exhausted in that snapshot: 6 is next overall
    assert read_many_of(cmds) == [("a", stamp(4)), ("b", stamp(6))]
    assert s.cursor("a") == stamp(4) and s.cursor("b") == stamp(6)
    assert_nothing(s.batch_read_many([[], []]))
    assert s.phase is Phase.LIVE


def test_catch_up_rereads_while_a_topics_batch_was_full() -> None:
    """A full batch means more may follow: nothing past its last stamp goes out, of any topic, before
    every topic is read again."""
    s = make(("a", "b"))
    s.subscribed({"a": None, "b": None}, NOW)
    cmds = s.batch_read_many([[row(1), row(2), row(3)], [row(10)]])
    assert_frames_sent(cmds, "m1", "m2", "m3")  # m10 waits: a may hold rows before it
    assert read_many_of(cmds) == [("a", stamp(3)), ("b", stamp(10))]
    cmds = s.batch_read_many([[row(11)], []])
    assert_frames_sent(cmds, "m10", "m11")
    assert s.phase is Phase.LIVE


def test_a_live_topics_later_row_never_goes_out_before_an_earlier_row_of_another() -> None:
    """Rule 2a, live: a poke of one topic reads them all in one snapshot; a burst on another (a full
    batch) holds back what is newer than its last row until it is read again. Reading the poked topic
    alone sent m9 (b) before m4 (a): a client cut between the two resumed from m9 and lost m4."""
    s = live(("a", "b"))
    cmds = s.poke("b")
    assert read_many_of(cmds) == [("a", None), ("b", None)]
    assert_nothing(s.poke("a"))  # a read is in flight: one more follows it
    cmds = s.batch_read_many([[row(1), row(2), row(3)], [row(9)]])
    assert_frames_sent(cmds, "m1", "m2", "m3")
    assert read_many_of(cmds) == [("a", stamp(3)), ("b", stamp(9))]
    cmds = s.batch_read_many([[row(4)], [row(10)]])
    assert_frames_sent(cmds, "m4", "m9", "m10")
    assert s.cursor("a") == stamp(4) and s.cursor("b") == stamp(10)
    assert_nothing(s.batch_read_many([[], []]))


def test_each_connection_only_gets_stamps_after_its_cursor() -> None:
    """Rows at or before the cursor (a racing read) are never sent twice."""
    s = live(cursor=stamp(5))
    cmds = s.poke("a")
    assert_reads(cmds, ("a", stamp(5)))
    cmds = s.batch_read("a", [row(4), row(5), row(6)][-2:])
    assert_frames_sent(cmds, "m6")
    assert s.cursor("a") == stamp(6)


def test_poke_while_reading_is_coalesced_into_one_more_read() -> None:
    """Two pokes during a read give exactly one further read, after the first finishes."""
    s = live()
    assert_reads(s.poke("a"), ("a", None))
    assert_nothing(s.poke("a"))
    assert_nothing(s.poke("a"))
    cmds = s.batch_read("a", [row(1)])
    assert_frames_sent(cmds, "m1")
    assert_reads(cmds, ("a", stamp(1)))
    assert_nothing(s.batch_read("a", []))


def test_full_batch_reads_again_from_the_new_cursor() -> None:
    """A batch of `limit` rows is followed by a read after its last stamp."""
    s = live()
    s.poke("a")
    cmds = s.batch_read("a", [row(1), row(2), row(3)])
    assert_reads(cmds, ("a", stamp(3)))


def test_paused_connection_stops_reading_and_resumes_from_its_cursor() -> None:
    """While paused no read is issued; on resume the drain continues from the cursor."""
    s = live()
    s.poke("a")
    s.write_paused(NOW)
    assert_nothing(s.batch_read("a", [row(1), row(2), row(3)]))  # read in flight: held, not sent
    assert_nothing(s.poke("a"))
    cmds = s.write_resumed()
    assert_frames_sent(cmds, "m1", "m2", "m3")
    assert_reads(cmds, ("a", stamp(3)))


def test_rows_held_for_several_topics_are_sent_in_stamp_order() -> None:
    """On resume, what two topics' reads returned while paused goes out interleaved by stamp, not topic
    by topic: a client that resumes with its last id for every topic must not skip the earlier ones."""
    s = live(("a", "b"))
    s.poke("a")
    s.write_paused(NOW)
    assert_nothing(s.poke("b"))
    assert_nothing(s.batch_read_many([[row(1), row(4)], [row(2), row(3)]]))
    cmds = s.write_resumed()
    assert_frames_sent(cmds, "m1", "m2", "m3", "m4")
    assert read_many_of(cmds) == [("a", stamp(4)), ("b", stamp(3))]  # b was poked meanwhile


def test_paused_during_catch_up_holds_the_buffer() -> None:
    """While catching up, a paused connection keeps what it read buffered and sends it on resume."""
    s = make(("a",))
    s.subscribed({"a": None}, NOW)
    s.write_paused(NOW)
    assert_nothing(s.batch_read("a", [row(1)]))
    cmds = s.write_resumed()
    assert_frames_sent(cmds, "m1")
    assert s.phase is Phase.LIVE


def test_slow_subscriber_is_closed_after_the_timeout() -> None:
    """A connection paused for slow_after seconds is closed at the next tick."""
    s = live()
    s.write_paused(NOW)
    assert_nothing(s.tick(NOW + 5, keepalive=False))
    assert_closed_with(s.tick(NOW + 10, keepalive=True), "slow")
    assert s.closed
    assert_nothing(s.poke("a"))


def test_keepalive_only_when_due_and_writable() -> None:
    """A tick with keepalive due sends one keepalive event; none while paused, none for polls."""
    s = live(("a", "b"))
    assert events_sent(s.tick(NOW, keepalive=True)) == ["keepalive"]
    assert s.tick(NOW, keepalive=True)[0].messages[0].topic == "a,b"  # type: ignore[union-attr]
    assert_nothing(s.tick(NOW, keepalive=False))
    s.write_paused(NOW)
    assert_nothing(s.tick(NOW + 1, keepalive=True))
    p = make(poll=True)
    p.subscribed({"a": None}, NOW)
    assert_nothing(p.tick(NOW, keepalive=True))


def test_poke_before_subscribed_is_covered_by_the_catch_up() -> None:
    """A poke while the store resolves since is dropped: the catch-up reads everything after the cursor."""
    s = make()
    assert_nothing(s.poke("a"))
    assert_reads(s.subscribed({"a": stamp(1)}, NOW), ("a", stamp(1)))


def test_poke_during_catch_up_rereads_a_finished_topic_when_live() -> None:
    """A topic poked after its catch-up read ended is read again once the connection is live."""
    s = make(("a", "b"))
    s.subscribed({"a": None, "b": None}, NOW)
    assert_nothing(s.poke("a"))  # the catch-up's read is in flight
    cmds = s.batch_read_many([[], []])
    assert read_many_of(cmds) == [("a", None), ("b", None)]
    assert s.phase is Phase.CATCHING_UP
    assert_nothing(s.batch_read_many([[], []]))
    assert s.phase is Phase.LIVE


def test_read_failure_waits_for_the_next_poke() -> None:
    """A failed read is not retried at once (no hot loop); the next poke or safety poll retries it."""
    s = live()
    s.poke("a")
    assert_nothing(s.read_failed("a"))
    assert_reads(s.poke_all(), ("a", None))


def test_peer_closed_ignores_everything_after() -> None:
    """After the peer left, reads that complete send nothing."""
    s = live()
    s.poke("a")
    s.peer_closed()
    assert_nothing(s.batch_read("a", [row(1)]))
    assert_nothing(s.tick(NOW, keepalive=True))


def test_shutdown_closes_once() -> None:
    """Shutdown closes with 'shutdown', and only once."""
    s = live()
    assert_closed_with(s.shutdown(), "shutdown")
    assert_nothing(s.shutdown())


def test_revoke_closes_once_in_every_open_phase_and_stops_delivery() -> None:
    """An auth change that takes the access away closes with 'denied' whatever the phase, once; a read
    already in flight then sends nothing."""
    for s in (Session(["a"], "a", SessionConfig()), live()):
        s.poke("a")
        assert_closed_with(s.revoke(), "denied")
        assert s.closed
        assert_nothing(s.revoke())
        assert_nothing(s.batch_read("a", [row(1)]))
        assert_nothing(s.shutdown())


def test_unknown_topic_events_are_ignored() -> None:
    """A poke or batch for a topic the connection does not hold does nothing."""
    s = live()
    assert_nothing(s.poke("zzz"))
    assert_nothing(s.batch_read("zzz", [row(1)]))


def test_rules_table_has_no_exit_from_closed() -> None:
    """CLOSED is terminal: no rule starts from it."""
    assert not [k for k in RULES if k[0] is Phase.CLOSED]


def test_live_stays_live_on_a_poke_and_a_batch_read() -> None:
    """``poke`` and ``batch_read`` skip the table's look-up while LIVE: the table must agree."""
    assert RULES[Phase.LIVE, "poke"] is Phase.LIVE
    assert RULES[Phase.LIVE, "batch_read"] is Phase.LIVE


def test_a_connection_on_many_topics_shares_a_few_batches_among_them() -> None:
    """Each read of a connection on more than 4 topics asks for its share of 4 batches (at least a
    row), and a full share reads again: a merge round writes a few batches, not a batch per topic (a
    connection on 128 topics that never read held 128 batches in its socket buffer)."""
    topics = tuple(f"t{i:02d}" for i in range(16))
    s = Session(topics, ",".join(topics), SessionConfig(batch=8, clock=lambda: NOW))
    assert make(("a", "b", "c", "d")).limit() == BATCH and s.limit() == 2
    cmds = s.subscribed(dict.fromkeys(topics), NOW)
    (many,) = [c for c in cmds if isinstance(c, ReadMany)]
    assert many.topics == topics and many.limit == 2
    cmds = s.batch_read_many([[row(100 * i + 1), row(100 * i + 2)] for i in range(16)])  # every share full
    assert sum(len(c.rows) for c in cmds if isinstance(c, Send)) <= 4 * 8
    assert texts_sent(cmds) == ["m1", "m2"]  # past t00's last row, t00 may hold more
    assert read_many_of(cmds)[0] == ("t00", stamp(2))
    assert s.phase is Phase.CATCHING_UP
