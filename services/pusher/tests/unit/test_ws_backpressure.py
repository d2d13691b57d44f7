"""WsSubscriber against a fake transport and hub: pongs beyond one pending are owed, not buffered; reading
stops while the peer does not read; a peer over the frame budget is closed with 1008.

No socket can make the kernel's buffers fill in a unit test's time, so the transport here reports its
own user-space buffer size; the hub records what the connection told it."""

from __future__ import annotations

import asyncio

from upf_pusher_fakes import FakeHub, FakeTransport

from upf_pusher import transports
from upf_pusher.session import Session, SessionConfig
from upf_pusher.transports import WsSubscriber

PING = bytes([0x89, 0x84]) + b"\0\0\0\0" + b"ping"
PONG = bytes([0x8A, 0x04]) + b"ping"
PONG_FROM_CLIENT = bytes([0x8A, 0x80]) + b"\0\0\0\0"  # a masked empty pong: the answer to our keepalive


def make() -> tuple[WsSubscriber, FakeTransport, FakeHub]:
    t, hub = FakeTransport(drains=False), FakeHub()
    session = Session(("a",), "a", SessionConfig())
    sub = WsSubscriber(hub, session, t, b"HEAD")  # type: ignore[arg-type]
    sub.accept()
    t.unsent = 0  # the head left
    return sub, t, hub


async def test_pings_in_one_read_get_one_pong() -> None:
    sub, t, hub = make()
    sub.data_received(PING * 5)
    assert t.written[1:] == [PONG] and t.reading and hub.events == []


async def test_a_pong_pending_holds_the_next_and_stops_reading_until_it_left() -> None:
    sub, t, hub = make()
    sub.data_received(PING)
    assert t.written[1:] == [PONG]  # the kernel took nothing: this pong is pending
    sub.data_received(PING)
    assert t.written[1:] == [PONG] and not t.reading and hub.events == ["paused"]
    await asyncio.sleep(transports.PONG_CHECK_SECS * 2)
    assert t.written[1:] == [PONG] and not t.reading  # still pending: still owed, still not reading
    t.unsent = 0  # the peer read
    await asyncio.sleep(transports.PONG_CHECK_SECS * 2)
    assert t.written[1:] == [PONG, PONG] and t.reading and hub.events == ["paused", "resumed"]


async def test_above_the_high_water_mark_reading_stops_until_below_the_low() -> None:
    sub, t, hub = make()
    sub.pause_writing()
    assert not t.reading and hub.events == ["paused"]
    sub.resume_writing()
    assert t.reading and hub.events == ["paused", "resumed"]


async def test_both_holds_release_reading_only_when_both_end() -> None:
    sub, t, hub = make()
    sub.data_received(PING)
    sub.data_received(PING)  # owed
    sub.pause_writing()
    sub.resume_writing()
    assert not t.reading and hub.events == ["paused"]  # the pong is still owed
    t.unsent = 0
    await asyncio.sleep(transports.PONG_CHECK_SECS * 2)
    assert t.reading and hub.events == ["paused", "resumed"]


async def test_more_frames_than_the_budget_close_with_1008() -> None:
    sub, t, hub = make()
    sub.data_received(PING * (transports.FRAME_BURST + 1))
    close = [w for w in t.written if w[:1] == b"\x88"]
    assert close and close[0][2:4] == (1008).to_bytes(2, "big") and t.closed


async def test_the_budget_refills() -> None:
    sub, t, hub = make()
    sub.data_received(PING * transports.FRAME_BURST)
    assert not t.closed
    sub.budget_at -= 10  # ten seconds later
    t.unsent = 0
    sub.data_received(PING * 10)
    assert not t.closed


async def test_a_client_answering_every_keepalive_ping_keeps_its_budget() -> None:
    """At a keepalive under 0.5 s a client that answers each ping sends more than FRAME_REFILL_PER_SEC
    frames a second; the pongs our pings ask for refill the budget too, so it is never closed."""
    sub, t, hub = make()
    keepalive = 0.1
    hub.frame_refill = transports.frame_refill(keepalive)
    for _ in range(3 * transports.FRAME_BURST):  # three bursts' worth: past the bucket at 2 a second
        sub.budget_at -= keepalive  # one keepalive later
        t.unsent = 0
        sub.data_received(PONG_FROM_CLIENT)
        assert not t.closed
    sub.budget_at -= keepalive
    sub.data_received(PING * (transports.FRAME_BURST + 2))  # a flood is still cut
    assert t.closed


async def test_a_revoked_subscriber_closes_with_1008_or_is_reset_when_it_does_not_read() -> None:
    """Revoked (``denied``): a reading peer gets a close frame with 1008 (policy violation); one whose
    buffer is full is reset, as a slow one is, since a graceful close would wait on it forever."""
    sub, t, _ = make()
    sub.close("denied")
    assert t.written[-1][:4] == bytes([0x88, 0x02, 0x03, 0xF0]) and not t.aborted  # close, 2 bytes, 1008
    sub, t, _ = make()
    sub.session.write_paused(0.0)
    sub.close("denied")
    assert t.aborted and len(t.written) == 1  # only the head: no close frame queued behind a full buffer
