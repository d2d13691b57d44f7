"""WebSocket frames for the pusher's tests: client frames built by hand (so invalid ones are possible),
hypothesis strategies for byte streams mixing them with noise, and a parser for what the server wrote."""

from __future__ import annotations

import struct

from hypothesis import strategies as st
from websockets.frames import Frame
from websockets.streams import StreamReader


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
pieces = st.lists(st.one_of(frames, frames, frames, st.binary(max_size=30)), max_size=12)
"""Frames and noise, apart: reads that end exactly where a frame does are likely, not a coincidence."""
streams = pieces.map(b"".join)


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
