"""An idle WebSocket holds no sans-I/O core: it is dropped at every frame boundary and a fresh one
parses the next read. These show that nothing a peer sends can tell the difference: the same bytes,
cut anywhere, get the same answers as from a core kept for the whole connection."""

from __future__ import annotations

import asyncio
import struct

from hypothesis import given, settings
from hypothesis import strategies as st
from upf_pusher_fakes import FakeHub, FakeTransport
from upf_ws_frames import client_frame, pieces, server_frames
from websockets.frames import Opcode

from upf_pusher import transports
from upf_pusher.session import Session, SessionConfig
from upf_pusher.transports import WsSubscriber

PING = client_frame(0x9, b"ping", True, b"abcd")


class KeptCore(WsSubscriber):
    """The reference: the same subscriber, but its core is never dropped (nor lent to another)."""

    __slots__ = ()

    def data_received(self, data: bytes) -> None:
        ws = self._core()
        super().data_received(data)
        if self.ws is None:
            self.ws = transports._SPARE_CORES.pop()
            assert self.ws is ws


def make(cls: type[WsSubscriber] = WsSubscriber) -> tuple[WsSubscriber, FakeTransport]:
    t = FakeTransport()
    sub = cls(FakeHub(), Session(("a",), "a", SessionConfig()), t, b"")  # type: ignore[arg-type]
    sub.accept()
    return sub, t


def close_code(t: FakeTransport) -> int | None:
    closes = [f for f in server_frames(t.data) if f.opcode is Opcode.CLOSE]
    return struct.unpack("!H", closes[0].data[:2])[0] if closes and closes[0].data else None


async def test_an_idle_connection_holds_no_core() -> None:
    sub, t = make()
    assert sub.ws is None
    sub.data_received(PING)
    assert sub.ws is None and [f.opcode for f in server_frames(t.data)] == [Opcode.PONG]


async def test_an_idle_connection_reads_a_pong_without_a_core() -> None:
    """The answer to each keepalive ping: nothing to write, no core taken from the spare list."""
    sub, t = make()
    spares = list(transports._SPARE_CORES)
    for mask in (b"abcd", b"\0\0\0\0"):
        sub.data_received(client_frame(0xA, b"", True, mask))
        sub.data_received(client_frame(0xA, b"keepalive", True, mask))
    assert sub.ws is None and not t.data and not t.closed and spares == transports._SPARE_CORES


async def test_pongs_past_the_frame_budget_close_the_connection_as_other_frames_do() -> None:
    pong = client_frame(0xA, b"", True, b"abcd")
    sub, t = make()
    for _ in range(transports.FRAME_BURST):
        sub.data_received(pong)
    assert not t.closed
    sub.data_received(pong)
    assert t.closed and close_code(t) == 1008


async def test_a_frame_cut_anywhere_keeps_its_core_until_its_last_byte() -> None:
    for cut in range(1, len(PING)):
        sub, t = make()
        sub.data_received(PING[:cut])
        assert sub.ws is not None and not t.data, cut
        sub.data_received(PING[cut:])
        assert sub.ws is None and [f.opcode for f in server_frames(t.data)] == [Opcode.PONG], cut


async def test_a_fragmented_message_keeps_its_core_until_it_ends() -> None:
    sub, t = make()
    sub.data_received(client_frame(0x1, "é".encode()[:1], False, b"abcd"))
    assert sub.ws is not None
    sub.data_received(PING)  # a control frame inside the message: the message is still open
    assert sub.ws is not None
    sub.data_received(client_frame(0x0, "é".encode()[1:], True, b"efgh"))
    assert sub.ws is None and not t.closed


async def test_fragments_cannot_pass_the_size_limit_across_reads() -> None:
    half = b"a" * (transports.WS_MAX_FRAME // 2 + 10)
    sub, t = make()
    sub.data_received(client_frame(0x2, half, False, b"abcd"))
    sub.data_received(client_frame(0x0, half, True, b"abcd"))
    assert t.closed and close_code(t) == 1009  # message too big, as with one core throughout


async def test_the_server_closes_an_idle_connection_cleanly() -> None:
    sub, t = make()
    sub.data_received(PING)
    sub.close("shutdown")
    assert t.closed and close_code(t) == 1001


@settings(max_examples=400, deadline=None)
@given(parts=pieces, cuts=st.lists(st.integers(0, 10_000), max_size=8), joins=st.lists(st.booleans(), max_size=12))
def test_any_byte_stream_read_in_any_pieces_gets_the_answers_of_a_kept_core(
    parts: list[bytes], cuts: list[int], joins: list[bool]
) -> None:
    """Reads end at frame boundaries (a piece, or several joined) and anywhere inside (a cut)."""
    reads: list[bytes] = []
    for i, part in enumerate(parts):
        if reads and i < len(joins) and joins[i]:
            reads[-1] += part
        else:
            reads.append(part)
    stream = b"".join(reads)
    ends = {c % (len(stream) + 1) for c in cuts}
    at = 0
    for r in reads:
        at += len(r)
        ends.add(at)

    async def run(cls: type[WsSubscriber]) -> tuple[bytes, bool]:
        sub, t = make(cls)
        last = 0
        for end in sorted(ends):
            if t.closed:
                break
            if end > last:
                sub.data_received(stream[last:end])
                last = end
        return bytes(t.data), t.closed

    assert asyncio.run(run(WsSubscriber)) == asyncio.run(run(KeptCore))
