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
from websockets.frames import Frame, Opcode
from websockets.protocol import State
from websockets.server import ServerProtocol
from websockets.streams import StreamReader

from upf_pusher import transports
from upf_pusher.session import Session, SessionConfig
from upf_pusher.transports import WsSubscriber

LEGITIMATE_CLOSE = {1000, 1001, 1002, 1003, 1007, 1008, 1009, 1011}


def client_frame(opcode: int, payload: bytes, fin: bool, mask: bytes, rsv: int = 0) -> bytes:
    """A client frame as RFC 6455 5.2 lays it out (masked), built by hand so invalid ones are possible."""
    n = len(payload)
    head = bytes([(0x80 if fin else 0) | (rsv << 4) | opcode])
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 65536:
        head += bytes([0x80 | 126]) + struct.pack("!H", n)
    else:
        head += bytes([0x80 | 127]) + struct.pack("!Q", n)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


payloads = st.one_of(
    st.binary(max_size=40),
    st.text(max_size=20).map(str.encode),
    st.sampled_from(
        [b"\xff\xfe", b"\xe2\x82", b"\xac", b"\xc3", b"\xa9", b"\x03\xe8", b"\x03\xe8ok", b"\x00\x01", b"\x0b\xb8"]
    ),
    st.integers(4090, 4200).map(lambda n: b"a" * n),  # around the frame limit
)
frames = st.builds(
    client_frame,
    opcode=st.sampled_from([0x0, 0x1, 0x2, 0x8, 0x9, 0xA, 0x3, 0xB]),
    payload=payloads,
    fin=st.booleans(),
    mask=st.one_of(st.just(b"\0\0\0\0"), st.binary(min_size=4, max_size=4)),
    rsv=st.sampled_from([0, 0, 0, 0, 1, 4]),
)
streams = st.lists(st.one_of(frames, frames, frames, st.binary(max_size=30)), max_size=12).map(b"".join)


def server_frames(data: bytes) -> list[Frame]:
    reader = StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    out = []
    while reader.buffer:
        parser = Frame.parse(reader.read_exact, mask=False)
        try:
            next(parser)
        except StopIteration as done:
            out.append(done.value)
    return out


async def feed(stream: bytes, cuts: list[int], eof: bool) -> tuple[FakeTransport, FakeHub, WsSubscriber]:
    t, hub = FakeTransport(), FakeHub()
    sub = WsSubscriber(
        hub,
        Session(("a",), "a", SessionConfig()),
        t,
        ServerProtocol(state=State.OPEN, max_size=transports.WS_MAX_FRAME),
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
            ServerProtocol(state=State.OPEN, max_size=transports.WS_MAX_FRAME),
            b"",
        )  # type: ignore[arg-type]
        sub.accept()
        sub.data_received(stream)
        return t

    t = asyncio.run(run())
    assert not t.closed and not t.data
