"""Any stored envelope, framed for any transport, is a valid frame that decodes back to the message the
hub would send: JSON lines are one object and never a blank line, SSE events are whole ``data:`` events,
raw is one line, WebSocket frames parse (with the websockets core) to the JSON payload."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.frames import Frame, Opcode
from websockets.streams import StreamReader

from upf_keyspace import Envelope, Message, message_from_envelope
from upf_pusher import framing

texts = st.text(max_size=60)  # any code point, including lone surrogates' neighbours, NUL, CR/LF, U+2028
ints = st.integers(-(2**63), 2**63 - 1)
envelopes = st.builds(
    Envelope,
    time=ints,
    expires=ints,
    message=st.one_of(texts, st.text(min_size=3000, max_size=4096)),
    encoding=st.sampled_from(["", "base64"]),
    title=texts,
    priority=st.integers(0, 5),
    tags=st.lists(texts, max_size=4).map(tuple),
    click=texts,
    icon=texts,
    content_type=texts,
    event=st.sampled_from(["", "message", "message_clear", "message_delete", "poll_request"]),
    sequence_id=texts,
    nocache=st.booleans(),
    origin_id=st.one_of(st.just(""), texts),
    poll_id=texts,
)
stamps = st.binary(min_size=12, max_size=12)


def as_message(obj: dict) -> Message:
    return Message(**{k: tuple(v) if k == "tags" else v for k, v in obj.items()})


def ws_payload(frame: bytes) -> bytes:
    reader = StreamReader()
    reader.feed_data(frame)
    reader.feed_eof()
    parser = Frame.parse(reader.read_exact, mask=False)
    try:
        next(parser)
    except StopIteration as done:
        f = done.value
    assert f.opcode is Opcode.TEXT and f.fin
    return f.data


@settings(max_examples=150, deadline=None)
@given(env=envelopes, stamp=stamps, topic=st.from_regex(r"[-_A-Za-z0-9]{1,64}", fullmatch=True))
def test_every_envelope_frames_validly_for_every_transport(env: Envelope, stamp: bytes, topic: str) -> None:
    msg = message_from_envelope(stamp, topic, env)

    line = framing.encode_json(msg)
    assert line.endswith(b"\n") and line.count(b"\n") == 1  # JSON escapes CR/LF/U+2028 inside strings
    assert as_message(json.loads(line)) == msg

    sse = framing.encode_sse(msg)
    assert sse.endswith(b"\n\n") and sse.count(b"\n\n") == 1
    lines = sse[:-2].split(b"\n")
    data = [x for x in lines if x.startswith(b"data: ")]
    assert len(data) == 1 and as_message(json.loads(data[0][6:])) == msg
    if msg.event != "message":
        assert lines[0] == b"event: " + msg.event.encode()

    raw = framing.encode_raw(msg)
    assert raw.endswith(b"\n") and b"\n" not in raw[:-1] and b"\r" not in raw
    raw.decode("utf-8")

    payload = ws_payload(framing.ws_text_frame(framing.encode_ws(msg)))
    assert as_message(json.loads(payload)) == msg


@settings(max_examples=100, deadline=None)
@given(size=st.integers(0, 70_000))
def test_ws_frame_lengths(size: int) -> None:
    """Every length class (7-bit, 16-bit, 64-bit) parses to exactly the payload."""
    payload = b"x" * size
    assert ws_payload(framing.ws_text_frame(payload)) == payload
