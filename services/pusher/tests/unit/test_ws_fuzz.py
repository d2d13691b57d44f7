"""Arbitrary bytes from a WebSocket client, fed to WsSubscriber in arbitrary pieces: nothing raises out of
the handler; the connection either stays open or ends with a close frame of a legitimate code (or is
simply closed, e.g. after the peer's own close), never with anything else written.

Byte streams mix well-formed masked frames (text, binary, continuation, ping, pong, close, with valid and
invalid UTF-8, oversized and fragmented) with random bytes, so both the frame parser and the handler's
own checks (UTF-8 across fragments, the frame budget, owed pongs) are reached."""

from __future__ import annotations

import asyncio
import struct

from hypothesis import event, given, settings
from hypothesis import strategies as st
from upf_pusher_fakes import FakeHub, FakeTransport
from upf_ws_frames import client_frame, server_frames, streams
from websockets.frames import Opcode

from upf_pusher.session import Session, SessionConfig
from upf_pusher.transports import WsSubscriber

LEGITIMATE_CLOSE = {1000, 1001, 1002, 1003, 1007, 1008, 1009, 1011}


async def feed(stream: bytes, cuts: list[int], eof: bool) -> tuple[FakeTransport, FakeHub, WsSubscriber]:
    t, hub = FakeTransport(), FakeHub()
    sub = WsSubscriber(
        hub,
        Session(("a",), "a", SessionConfig()),
        t,
        b"",
    )  # type: ignore[arg-type]
    sub.accept()
    last = 0
    for cut in sorted(set(c % (len(stream) + 1) for c in cuts)) + [len(stream)]:
        if t.closed:
            break
        if cut > last:
            sub.data_received(stream[last:cut])
            last = cut
    if eof and not t.closed:
        sub.eof_received()
    await asyncio.sleep(0)
    sub.connection_lost(None)
    return t, hub, sub


@settings(max_examples=250, deadline=None)
@given(stream=streams, cuts=st.lists(st.integers(0, 10_000), max_size=6), eof=st.booleans())
def test_any_byte_stream_ends_cleanly_or_not_at_all(stream: bytes, cuts: list[int], eof: bool) -> None:
    t, hub, sub = asyncio.run(feed(stream, cuts, eof))
    assert hub.detached == 1
    sent = server_frames(t.data)
    closes = [f for f in sent if f.opcode is Opcode.CLOSE]
    assert all(f.opcode in (Opcode.PONG, Opcode.CLOSE) for f in sent), sent
    assert len(closes) <= 1 and (not closes or sent[-1] is closes[0])
    event("pong sent" if any(f.opcode is Opcode.PONG for f in sent) else "no pong")
    event(
        f"close {struct.unpack('!H', closes[0].data[:2])[0] if closes[0].data else '(no code)'}"
        if closes
        else "closed"
        if t.closed
        else "open"
    )
    if closes:
        data = closes[0].data
        assert t.closed
        if not data:  # the echo of a client's close without a code (RFC 6455 5.5.1: the body is optional)
            return
        code = struct.unpack("!H", data[:2])[0]
        assert code in LEGITIMATE_CLOSE or 3000 <= code < 5000, code  # 3000-4999: a client's code, echoed
        data[2:].decode("utf-8")


@settings(max_examples=60, deadline=None)
@given(text=st.text(min_size=1, max_size=30), split=st.integers(0, 200))
def test_valid_fragmented_text_is_kept_open(text: str, split: int) -> None:
    """A valid UTF-8 message split anywhere (even inside a code point) over two frames is not refused."""
    raw = text.encode()
    at = split % (len(raw) + 1)
    stream = client_frame(0x1, raw[:at], False, b"abcd") + client_frame(0x0, raw[at:], True, b"efgh")

    async def run() -> FakeTransport:
        t = FakeTransport()
        sub = WsSubscriber(
            FakeHub(),
            Session(("a",), "a", SessionConfig()),
            t,
            b"",
        )  # type: ignore[arg-type]
        sub.accept()
        sub.data_received(stream)
        return t

    t = asyncio.run(run())
    assert not t.closed and not t.data
