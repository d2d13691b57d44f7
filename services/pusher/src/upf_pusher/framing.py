"""Frame encoders, one per transport, exactly as ntfy frames its streams (ntfy-protocol.md 2.3). Pure.

The returned bytes are the event's payload: a WebSocket text frame's data, or the bytes an HTTP
stream writes for it (the stream adapter wraps them in a chunk). One process-wide msgspec Encoder.

Stored events other than messages (``message_clear``, ``message_delete``, ``poll_request``) arrive as
``Message`` values with their ``event``, ``sequence_id`` and ``poll_id`` set (``message_from_envelope``):
json and ws carry them as fields, sse names the event in an ``event:`` line, raw writes an empty line.
"""

from __future__ import annotations

import binascii
import random

import msgspec

from upf_keyspace import Message

__all__ = [
    "CONTENT_TYPES",
    "ENCODERS",
    "encode",
    "encode_json",
    "encode_sse",
    "encode_raw",
    "encode_ws",
    "event",
    "is_client_pong",
    "random_id",
    "ws_client_frame_size",
    "ws_frame",
    "ws_text_frame",
    "WS_PING",
]

_encoder = msgspec.json.Encoder()
_B64_TO_ALNUM = bytes.maketrans(b"+/", b"xY")

CONTENT_TYPES = {
    "json": b"application/x-ndjson; charset=utf-8",
    "sse": b"text/event-stream; charset=utf-8",
    "raw": b"text/plain; charset=utf-8",
}


def random_id() -> str:
    """ntfy's id for open/keepalive events: 12 random alphanumerics. Not a secret (clients ignore
    it), so the cheap PRNG, and 72 random bits in base64 with its two symbols mapped to letters (those
    two letters come up twice as often): a keepalive pass makes one per connection, and
    ``random.choices`` took 2.3 us per id where this takes 0.4 us."""
    return (
        binascii.b2a_base64(random.getrandbits(72).to_bytes(9, "little"), newline=False)
        .translate(_B64_TO_ALNUM)
        .decode()
    )


def event(kind: str, topics_raw: str, now: int) -> Message:
    """An ``open`` or ``keepalive`` event; its topic is the raw comma list of the path, as ntfy sends it."""
    return Message(id=random_id(), time=now, event=kind, topic=topics_raw)


def encode_json(msg: Message) -> bytes:
    """/json: one JSON object and a newline per event, never a blank line."""
    buf = bytearray()
    _encoder.encode_into(msg, buf)
    buf += b"\n"
    return bytes(buf)


def encode_sse(msg: Message) -> bytes:
    """/sse: ``data: {json}`` for messages; ``event: <type>`` first for every other event."""
    body = _encoder.encode(msg)
    if msg.event == "message":
        return b"data: " + body + b"\n\n"
    return b"event: " + msg.event.encode() + b"\ndata: " + body + b"\n\n"


def encode_raw(msg: Message) -> bytes:
    """/raw: the message text with newlines as spaces, then a newline; other events are an empty line."""
    if msg.event == "message":
        return msg.message.replace("\r\n", " ").replace("\n", " ").replace("\r", " ").encode() + b"\n"
    return b"\n"


encode_ws = encode_json
"""/ws: the JSON object with a trailing newline, as gorilla's WriteJSON sends it (the same bytes as
/json: one function, so ``ws_frame`` calls it without a hop)."""


WS_PING = b"\x89\x00"
"""An unmasked WebSocket ping with no payload (RFC 6455 5.5.2): ntfy's keepalive on /ws, which sends
ping frames instead of a ``keepalive`` JSON event (gorilla's ``WriteMessage(PingMessage, nil)``)."""


def ws_frame(msg: Message) -> bytes:
    """What /ws writes for an event: a ping for a keepalive, else the JSON in one text frame."""
    if msg.event == "keepalive":
        return WS_PING
    return ws_text_frame(encode_ws(msg))


def ws_client_frame_size(payload: int) -> int:
    """The bytes a client's frame with a ``payload``-byte payload takes (RFC 6455 5.2): the 2-byte head,
    the minimal length extension, the 4-byte mask, the payload."""
    return 6 + payload + (0 if payload < 126 else 2 if payload < 65536 else 8)


def is_client_pong(data: bytes) -> bool:
    """Whether ``data`` is exactly one whole client pong frame (RFC 6455 5.5.3: final, no reserved
    bits, masked, a payload of at most 125 bytes in the 7-bit length): what every idle ws subscriber
    sends back to each keepalive ping, and a frame that asks nothing of the server."""
    if len(data) < 6 or data[0] != 0x8A or not data[1] & 0x80:
        return False
    n = data[1] & 0x7F
    return n < 126 and len(data) == 6 + n


def ws_text_frame(payload: bytes) -> bytes:
    """A whole unmasked, unfragmented WebSocket text frame (RFC 6455 5.2) carrying ``payload``: what
    a server sends is the same bytes for every connection, so one frame serves a whole fan-out."""
    n = len(payload)
    if n < 126:
        return bytes((0x81, n)) + payload
    if n < 65536:
        return bytes((0x81, 126)) + n.to_bytes(2, "big") + payload
    return bytes((0x81, 127)) + n.to_bytes(8, "big") + payload


ENCODERS = {"json": encode_json, "sse": encode_sse, "raw": encode_raw, "ws": encode_ws}


def encode(transport: str, msg: Message) -> bytes:
    return ENCODERS[transport](msg)
