"""Frames for each transport, byte for byte as ntfy writes them (ntfy-protocol.md 2.3)."""

from __future__ import annotations

import json
import string

from hypothesis import given
from upf_ws_frames import client_frame, streams
from websockets.frames import Frame, Opcode
from websockets.streams import StreamReader

from upf_keyspace import Message
from upf_pusher import framing

MSG = Message(id="AAAAAAAAAAEAAAAA", time=1700000000, expires=1700000060, event="message", topic="t1", message="a\nb")
OPEN = Message(id="abcdefABCDEF", time=1700000000, event="open", topic="t1,t2")


def test_json_is_one_object_and_a_newline() -> None:
    """/json: the object then exactly one newline, never a blank line."""
    out = framing.encode_json(MSG)
    assert out.endswith(b"}\n") and out.count(b"\n") == 1
    assert json.loads(out) == {
        "id": "AAAAAAAAAAEAAAAA",
        "time": 1700000000,
        "expires": 1700000060,
        "event": "message",
        "topic": "t1",
        "message": "a\nb",
    }


def test_json_keeps_ntfy_field_order_and_omits_empty_fields() -> None:
    """Keys come in ntfy's order; open events carry no expires/message."""
    assert framing.encode_json(OPEN) == b'{"id":"abcdefABCDEF","time":1700000000,"event":"open","topic":"t1,t2"}\n'


def test_sse_message_is_a_data_line() -> None:
    """/sse: a message event is `data: {json}` and a blank line, with no event/id/retry lines."""
    out = framing.encode_sse(MSG)
    assert out.startswith(b"data: {") and out.endswith(b"}\n\n") and out.count(b"\n") == 2


def test_sse_other_events_name_their_type() -> None:
    """/sse: open and keepalive are `event: <type>` then `data: {json}`."""
    out = framing.encode_sse(OPEN)
    assert out == b'event: open\ndata: {"id":"abcdefABCDEF","time":1700000000,"event":"open","topic":"t1,t2"}\n\n'


def test_raw_flattens_newlines_and_blanks_other_events() -> None:
    """/raw: message text with newlines as spaces plus a newline; other events are an empty line."""
    assert framing.encode_raw(MSG) == b"a b\n"
    assert framing.encode_raw(OPEN) == b"\n"


def test_ws_frame_is_the_json_object() -> None:
    """/ws: the text frame holds the JSON object (with gorilla's trailing newline)."""
    assert json.loads(framing.encode_ws(MSG))["id"] == MSG.id


def test_events_have_random_alnum_ids_and_integer_time() -> None:
    """open/keepalive get a fresh 12-alphanumeric id, an integer time and the raw topic list."""
    a, b = framing.event("keepalive", "x,y", 1700000000), framing.event("keepalive", "x,y", 1700000000)
    assert a.id != b.id and len(a.id) == 12 and a.id.isalnum()
    assert json.loads(framing.encode_json(a))["time"] == 1700000000
    assert a.topic == "x,y"


def test_ws_text_frame_matches_the_websockets_core_at_every_length_class() -> None:
    """The pre-built server frame is byte for byte what websockets' sans-I/O server would send, for
    payloads under 126 bytes, under 64 KiB and above (the three length encodings)."""
    from websockets.protocol import State
    from websockets.server import ServerProtocol

    for n in (0, 125, 126, 4000, 65535, 65536, 70000):
        payload = b"x" * n
        ws = ServerProtocol(state=State.OPEN)
        ws.send_text(payload)
        assert framing.ws_text_frame(payload) == b"".join(ws.data_to_send())


def test_ws_keepalive_is_an_empty_ping_and_other_events_are_text_frames() -> None:
    """/ws: a keepalive is a ping frame with no payload (ntfy's gorilla PingMessage), never JSON; open
    and messages are one text frame of the JSON line."""
    keepalive = Message(id="abcdefABCDEF", time=1700000000, event="keepalive", topic="t1")
    assert framing.ws_frame(keepalive) == b"\x89\x00"
    assert framing.ws_frame(OPEN) == framing.ws_text_frame(framing.encode_json(OPEN))
    assert framing.ws_frame(MSG)[:1] == b"\x81"


def test_a_client_frame_size_is_what_the_frame_takes_on_the_wire() -> None:
    for n in (0, 1, 125, 126, 127, 65535, 65536, 70000):
        assert framing.ws_client_frame_size(n) == len(client_frame(0x2, b"x" * n, True, b"abcd")), n


def _one_pong(data: bytes) -> bool:
    """The reference: websockets' own parser reads exactly one final pong frame from ``data``, with
    nothing left over, and the frame passes its checks."""
    reader = StreamReader()
    reader.feed_data(data)
    parser = Frame.parse(reader.read_exact, mask=True, max_size=125)
    try:
        next(parser)
    except StopIteration as done:
        frame = done.value
    except Exception:  # a protocol error
        return False
    else:
        return False  # incomplete
    return (
        frame.opcode is Opcode.PONG and frame.fin and not (frame.rsv1 or frame.rsv2 or frame.rsv3) and not reader.buffer
    )


def test_a_client_pong_is_told_apart_from_every_other_read() -> None:
    pong = client_frame(0xA, b"", True, b"abcd")
    for n in (0, 1, 125):
        assert framing.is_client_pong(client_frame(0xA, b"p" * n, True, b"\x01\x02\x03\x04")), n
    not_pongs = [
        pong[:-1],  # cut short
        pong + b"\x8a",  # with the start of the next frame
        pong + pong,  # two: the reader must see both
        b"\x8a\x00",  # unmasked: a protocol error for a client
        client_frame(0xA, b"", False, b"abcd"),  # not final
        client_frame(0xA, b"", True, b"abcd", rsv=4),  # a reserved bit
        client_frame(0x9, b"", True, b"abcd"),  # a ping asks for a pong
        client_frame(0x1, b"", True, b"abcd"),
        b"\x8a\xfe\x00\x7c" + b"abcd" + b"p" * 124,  # a 16-bit length for a short payload
        b"\x8a\xff" + (119).to_bytes(8, "big") + b"abcd" + b"p" * 119,  # a 64-bit one
    ]
    for data in not_pongs:
        assert not framing.is_client_pong(data), data[:12]


@given(streams)
def test_is_client_pong_only_where_websockets_reads_one_whole_pong(data: bytes) -> None:
    if framing.is_client_pong(data):
        assert _one_pong(data)


def test_an_event_id_is_twelve_alphanumerics_as_ntfy_makes_them() -> None:
    ids = {framing.random_id() for _ in range(2000)}
    assert len(ids) == 2000  # 72 random bits each
    assert all(len(i) == 12 and i.isascii() and i.isalnum() for i in ids)
    assert set("".join(ids)) == set(string.ascii_letters + string.digits)  # every one of the 62 turns up
