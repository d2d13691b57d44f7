"""loadgen's own view of the ntfy wire format.

Kept separate from the server's types on purpose: loadgen is a black box, so a server-side change to
the message object must show up here as a decode failure or a violation, not be silently shared.
It also defines the load payload (sequence number + send timestamp) and how to recover it from a
delivered frame.
"""

from __future__ import annotations

import base64
import binascii
import struct

import msgspec

__all__ = [
    "Message",
    "Payload",
    "decode_message",
    "encode_payload",
    "decode_payload",
    "body_bytes",
    "PayloadError",
]


class Message(msgspec.Struct, omit_defaults=True, kw_only=True):
    """An ntfy message object (also the open/keepalive frames and the publish reply)."""

    id: str = ""
    time: int = 0
    expires: int = 0
    event: str = ""
    topic: str = ""
    title: str = ""
    message: str = ""
    priority: int = 0
    tags: list[str] = []
    click: str = ""
    icon: str = ""
    content_type: str = ""
    encoding: str = ""


class Payload(msgspec.Struct, frozen=True):
    seq: int
    sent_ns: int


class PayloadError(ValueError):
    """The delivered body is not one loadgen sent (corrupted, truncated or foreign)."""


_decoder = msgspec.json.Decoder(Message)


def decode_message(raw: bytes | str) -> Message:
    # ws frames and NDJSON lines end with "\n"; msgspec accepts trailing whitespace.
    return _decoder.decode(raw)


# Binary bodies start with 0xFF, which never occurs in UTF-8, so the server must base64 them.
_BIN_MAGIC = b"\xff\x00LG"
_BIN_HEAD = struct.Struct(">QQ")
_TEXT_PAD = "abcdefghijklmnopqrstuvwxyz0123456789"
_BIN_PAD = bytes(range(256))


def _text_pad(seq: int, n: int) -> str:
    # The pad depends on seq so a body delivered under the wrong seq does not compare equal.
    if n <= 0:
        return ""
    start = seq % len(_TEXT_PAD)
    reps = (start + n) // len(_TEXT_PAD) + 1
    return (_TEXT_PAD * reps)[start : start + n]


def _bin_pad(seq: int, n: int) -> bytes:
    if n <= 0:
        return b""
    start = seq % 256
    reps = (start + n) // 256 + 1
    return (_BIN_PAD * reps)[start : start + n]


def encode_payload(seq: int, sent_ns: int, size: int, binary: bool) -> bytes:
    """The POST body: seq and send time, padded to ``size`` bytes (never truncated below the header)."""
    if binary:
        head = _BIN_MAGIC + _BIN_HEAD.pack(seq, sent_ns)
        return head + _bin_pad(seq, size - len(head))
    text = f"lg:{seq}:{sent_ns}:"
    return (text + _text_pad(seq, size - len(text))).encode("ascii")


def body_bytes(msg: Message) -> bytes:
    """The bytes the app server posted, as a distributor recovers them (ntfy's decodeBytesMessage)."""
    if msg.encoding == "base64":
        try:
            return base64.b64decode(msg.message, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise PayloadError("invalid base64 body") from exc
    if msg.encoding:
        raise PayloadError("unknown encoding")
    return msg.message.encode("utf-8")


def decode_payload(body: bytes, size: int, binary: bool) -> Payload:
    """Recover seq and send time, and check the whole body is exactly what was sent."""
    if binary:
        if not body.startswith(_BIN_MAGIC) or len(body) < len(_BIN_MAGIC) + _BIN_HEAD.size:
            raise PayloadError("not a loadgen binary body")
        seq, sent_ns = _BIN_HEAD.unpack_from(body, len(_BIN_MAGIC))
    else:
        parts = body.split(b":", 3)
        if len(parts) != 4 or parts[0] != b"lg":
            raise PayloadError("not a loadgen text body")
        try:
            seq, sent_ns = int(parts[1]), int(parts[2])
        except ValueError as exc:
            raise PayloadError("bad loadgen header") from exc
    if body != encode_payload(seq, sent_ns, size, binary):
        raise PayloadError("body differs from what was sent")
    return Payload(seq, sent_ns)
