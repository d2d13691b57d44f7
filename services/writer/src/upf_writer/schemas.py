"""HTTP request and response bodies of the writer as msgspec Structs, and their one shared JSON encoder.

The ntfy message (``upf_keyspace.wire.Message``) comes from the keyspace library and the error body
from ``upf_edge.errors``, since the pusher emits the same shapes; the rest are writer-only.
"""

from __future__ import annotations

import msgspec

from upf_keyspace import Message

__all__ = [
    "JsonPublish",
    "MatrixDevice",
    "MatrixNotification",
    "MatrixPush",
    "UnifiedPushInfo",
    "UnifiedPushDiscovery",
    "MatrixGatewayInfo",
    "MatrixDiscovery",
    "MatrixResponse",
    "AuthResponse",
    "StatsResponse",
    "encode",
    "UP_DISCOVERY",
    "MATRIX_DISCOVERY",
]


# --- request bodies ---------------------------------------------------------------------------------
class JsonPublish(msgspec.Struct):
    """ntfy's JSON publish (``publishMessage``); keys match without case, as Go's decoder matches them
    (``ingest.decode_json``). ``firebase`` is ignored; ``null`` means unset, as in Go. ``actions`` is kept as raw JSON: ntfy's rules for it (keys
    matched case-insensitively) are ``upf_writer.actions``'s."""

    topic: str | None = None
    message: str | None = None
    title: str | None = None
    priority: int | None = None
    tags: list[str] | None = None
    click: str | None = None
    icon: str | None = None
    markdown: bool | None = None
    cache: str | None = None
    """ntfy's ``cache`` (a string: it defaults to true); "no" is ``X-Cache: no``."""
    delay: str | None = None
    """ntfy's ``delay``: any form ``X-Delay`` takes."""
    sequence_id: str | None = None
    actions: msgspec.Raw = msgspec.Raw()
    """Raw JSON (empty when absent; msgspec takes no ``Raw | None``)."""
    attach: str | None = None
    filename: str | None = None
    email: str | None = None
    call: str | None = None


class MatrixDevice(msgspec.Struct):
    pushkey: str | None = None


class MatrixNotification(msgspec.Struct):
    devices: list[MatrixDevice | None] | None = None


class MatrixPush(msgspec.Struct):
    """The part of a Matrix Push Gateway request the gateway reads: ``notification.devices[].pushkey``."""

    notification: MatrixNotification | None = None


# --- response bodies --------------------------------------------------------------------------------
class UnifiedPushInfo(msgspec.Struct, frozen=True):
    version: int = 1


class UnifiedPushDiscovery(msgspec.Struct, frozen=True):
    """``GET /{topic}?up=1``: ``{"unifiedpush":{"version":1}}``."""

    unifiedpush: UnifiedPushInfo


class MatrixGatewayInfo(msgspec.Struct, frozen=True):
    gateway: str = "matrix"


class MatrixDiscovery(msgspec.Struct, frozen=True):
    """``GET /_matrix/push/v1/notify``: ``{"unifiedpush":{"gateway":"matrix"}}``."""

    unifiedpush: MatrixGatewayInfo


class MatrixResponse(msgspec.Struct, frozen=True):
    """The Matrix push gateway answer: pushkeys the homeserver should drop."""

    rejected: tuple[str, ...] = ()


class AuthResponse(msgspec.Struct, frozen=True):
    success: bool = True


class StatsResponse(msgspec.Struct, frozen=True):
    """``GET /v1/stats`` (ntfy's apiStatsResponse), fleet-wide: messages published, and per second."""

    messages: int
    messages_rate: float


_encoder = msgspec.json.Encoder()


def encode(obj: msgspec.Struct | Message) -> bytes:
    """JSON plus the trailing newline ntfy writes after every object."""
    buf = bytearray()
    _encoder.encode_into(obj, buf)
    buf += b"\n"
    return bytes(buf)


UP_DISCOVERY = encode(UnifiedPushDiscovery(UnifiedPushInfo()))
MATRIX_DISCOVERY = encode(MatrixDiscovery(MatrixGatewayInfo()))
