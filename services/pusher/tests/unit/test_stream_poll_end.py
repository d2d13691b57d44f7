"""StreamSubscriber's end of a keep-alive poll against a fake transport and hub: one last chunk however
many closes arrive before the hand-back, and the connection handed back only while it is open."""

from __future__ import annotations

import asyncio

from upf_pusher_fakes import FakeHub, FakeTransport

from upf_pusher.session import Session, SessionConfig
from upf_pusher.transports import KeptAlive, StreamSubscriber

LAST_CHUNK = b"0\r\n\r\n"


def make() -> tuple[StreamSubscriber, FakeTransport, FakeHub, list[tuple[object, bytes]]]:
    t, hub = FakeTransport(), FakeHub()
    taken: list[tuple[object, bytes, bool, bool]] = []
    sub = StreamSubscriber(hub, Session(("a",), "a", SessionConfig(), poll=True), t, "json", chunked=True)  # type: ignore[arg-type]
    sub.kept = KeptAlive(lambda transport, pipelined, paused, eof: taken.append((transport, pipelined, paused, eof)))
    sub.accept()
    return sub, t, hub, taken


async def test_a_finished_poll_ends_its_reply_once_then_hands_the_connection_back() -> None:
    sub, t, hub, taken = make()
    assert b"Connection: close" not in t.data and b"Transfer-Encoding: chunked" in t.data
    sub.data_received(b"GET /v1/health HTTP/1.1\r\n")  # pipelined behind the poll: kept for the front door
    sub.close("done")
    sub.close("done")
    await asyncio.sleep(0)
    assert t.data.count(LAST_CHUNK) == 1 and not t.closed
    assert taken == [(t, b"GET /v1/health HTTP/1.1\r\n", False, False)] and hub.detached == 1


async def test_a_poll_half_closed_by_its_client_ends_its_reply_then_hands_back_the_end() -> None:
    """The peer's FIN during the poll keeps the connection for the rest of the reply (asyncio closes
    it when ``eof_received`` says False); the front door then serves what was pipelined, and closes."""
    sub, t, hub, taken = make()
    sub.data_received(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert sub.eof_received() is True
    sub.close("done")
    await asyncio.sleep(0)
    assert t.data.count(LAST_CHUNK) == 1
    assert taken == [(t, b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n", False, True)]


def test_a_stream_half_closed_by_its_client_ends() -> None:
    t, hub = FakeTransport(), FakeHub()
    sub = StreamSubscriber(hub, Session(("a",), "a", SessionConfig()), t, "json", chunked=True)  # type: ignore[arg-type]
    assert sub.eof_received() is False


async def test_a_shutdown_before_the_hand_back_closes_without_a_second_last_chunk() -> None:
    sub, t, hub, taken = make()
    sub.close("done")
    sub.close("shutdown")  # the pusher stopping, on the same loop turn
    await asyncio.sleep(0)
    assert t.data.count(LAST_CHUNK) == 1 and t.closed
    assert taken == [] and hub.detached == 0  # connection_lost forgets it, as for any closed stream
