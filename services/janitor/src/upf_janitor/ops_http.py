"""The janitor's ops endpoints (it serves no users): the same paths every role has, so one probe
config fits the fleet, plus the Prometheus scrape endpoint ``/metrics``. Deliberately tiny: GET only,
one request per connection."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

Handler = Callable[[], Awaitable[tuple[int, str, bytes]]]


async def serve_ops(host: str, port: int, routes: dict[str, Handler]) -> asyncio.Server:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            method, _, rest = head.split(b"\r\n", 1)[0].decode("latin-1").partition(" ")
            path = rest.split(" ", 1)[0].split("?", 1)[0]
            handler = routes.get(path) if method in ("GET", "HEAD") else None
            if handler is None:
                status, ctype, body = 404, "application/json", b'{"code":40401,"http":404,"error":"page not found"}\n'
            else:
                status, ctype, body = await handler()
            reason = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}.get(status, "OK")
            writer.write(
                f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n".encode("latin-1") + (b"" if method == "HEAD" else body)
            )
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, ConnectionError, ValueError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, host, port, limit=16384)


def json_body(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"
