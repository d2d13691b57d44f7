"""The ASGI front door's CORS: ntfy's ``Access-Control-Allow-Origin: *`` on every reply, once, and its preflight."""

from __future__ import annotations

from typing import Any

from upf_edge.asgi import send_preflight, send_reply, with_cors
from upf_edge.handler import Reply

ORIGIN = (b"access-control-allow-origin", b"*")


class Sent:
    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []

    async def __call__(self, message: dict[str, Any]) -> None:
        self.messages.append(message)

    def headers(self) -> list[tuple[bytes, bytes]]:
        return [(bytes(k).lower(), bytes(v)) for k, v in self.messages[0]["headers"]]


async def test_send_reply_allows_any_origin() -> None:
    sent = Sent()
    await send_reply(sent, Reply(200, b"{}\n"))
    assert sent.headers().count(ORIGIN) == 1 and sent.messages[1]["body"] == b"{}\n"


async def test_preflight_is_ntfys() -> None:
    sent = Sent()
    await send_preflight(sent)
    headers = dict(sent.headers())
    assert sent.messages[0]["status"] == 200 and sent.messages[1]["body"] == b""
    assert headers[b"access-control-allow-methods"] == b"GET, PUT, POST, PATCH, DELETE"
    assert (headers[b"access-control-allow-headers"], headers[b"access-control-allow-origin"]) == (b"*", b"*")


async def test_with_cors_adds_the_origin_once_and_passes_the_rest() -> None:
    sent = Sent()
    send = with_cors(sent)
    await send({"type": "http.response.start", "status": 404, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b"x"})
    assert sent.headers().count(ORIGIN) == 1 and sent.messages[1] == {"type": "http.response.body", "body": b"x"}
    sent = Sent()
    await with_cors(sent)(
        {"type": "http.response.start", "status": 200, "headers": [(b"Access-Control-Allow-Origin", b"x")]}
    )
    assert sent.headers() == [(b"access-control-allow-origin", b"x")]  # a route's own value is kept
