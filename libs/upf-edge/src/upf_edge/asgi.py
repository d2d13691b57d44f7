"""The ASGI side of a front door: serve a :class:`~upf_edge.handler.Handler` under an ASGI server
(granian) with nothing in between -- read the body with a hard cap, await the handler, send the reply.

Why: under granian the ASGI callable is the cheapest layer there is (measurements.md: a bare callable
27k-36k requests/s against ~9.5k for a Litestar route); a role keeps its framework for its cold routes
and puts this in front for its hot ones.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from .handler import NO_BODY, PREFLIGHT, Handler, Reply

__all__ = ["ClientGone", "lazy_app", "read_body", "send_reply", "send_preflight", "serve_asgi", "with_cors"]

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class ClientGone(Exception):
    """The client disconnected before its request body was complete."""


async def read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole body, or ``None`` as soon as it is known to exceed ``limit`` bytes (the rest is not
    read). Never holds more than ``limit + 1`` bytes of it."""
    buf = bytearray()
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise ClientGone
        chunk = message.get("body", b"")
        if chunk:
            room = limit + 1 - len(buf)
            buf += chunk[:room] if len(chunk) > room else chunk
            if len(buf) > limit:
                return None
        if not message.get("more_body", False):
            return bytes(buf)


_ORIGIN = (b"access-control-allow-origin", b"*")
"""``handler.CORS_ORIGIN`` as ASGI carries header names (lower case)."""


async def send_reply(send: Send, reply: Reply) -> None:
    body = reply.body
    headers = [(b"content-type", reply.content_type), (b"content-length", b"%d" % len(body)), _ORIGIN, *reply.headers]
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_preflight(send: Send) -> None:
    """ntfy's answer to any ``OPTIONS`` request (CORS preflight)."""
    await send_reply(send, PREFLIGHT)


def with_cors(send: Send) -> Send:
    """``send`` adding ``Access-Control-Allow-Origin: *`` to a response start that lacks it: for a
    framework's cold routes and its own errors (the hot routes build the header into ``send_reply``)."""

    async def cors_send(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", ()))
            if not any(bytes(k).lower() == _ORIGIN[0] for k, _ in headers):
                headers.append(_ORIGIN)
                message = {**message, "headers": headers}
        await send(message)

    return cors_send


def _declared_length(headers: list[tuple[bytes, bytes]]) -> int:
    """The Content-Length the request declares (-1 if none or not a plain number)."""
    for name, value in headers:
        if name == b"content-length":
            value = value.strip()
            return int(value) if value.isdigit() and len(value) <= 18 else -1
    return -1


async def serve_asgi(handler: Handler, scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
    """One HTTP request the handler ``wants``, served from its ASGI scope."""
    method: str = scope["method"]
    topic: str = scope["path"][1:]
    limit = handler.body_limit(method, topic, scope["headers"], scope["query_string"])
    body: bytes | None = b""
    if limit != NO_BODY:
        if _declared_length(scope["headers"]) > limit:
            body = None  # refused unread: waiting for a body that large would let a client hold the request
        else:
            try:
                body = await read_body(receive, limit)
            except ClientGone:
                return
    peer = scope.get("client")
    client = peer[0] if peer else ""
    await send_reply(send, await handler(method, topic, scope["headers"], scope["query_string"], body, client))


def lazy_app(build: Callable[[], Any]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that builds the module's ``app`` on first access and keeps it.

    Why: granian imports ``module:app`` in each worker process; building at import would set up
    telemetry and read settings in whatever process merely imports the module."""
    built: list[Any] = []

    def __getattr__(name: str) -> Any:
        if name == "app":
            if not built:
                built.append(build())
            return built[0]
        raise AttributeError(name)

    return __getattr__
