"""serve_handler: one Handler over real sockets with the http11 codec: the ops routes, keep-alive, 404
for other paths, ntfy error bodies for malformed heads, and a body limit."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence

import pytest

from upf_edge import Reply
from upf_edge.ops import OpsRoutes
from upf_edge.serve import HandlerServer, serve_handler


async def read_reply(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    status = int(head[0].split(" ")[1])
    headers = {k.lower(): v for k, _, v in (line.partition(": ") for line in head[1:] if line)}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return status, headers, body


async def exchange(port: int, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        return await read_reply(reader)
    finally:
        writer.close()


@pytest.fixture
async def ops() -> AsyncIterator[tuple[HandlerServer, list[bool]]]:
    down: list[bool] = []

    async def probe() -> object:
        if down:
            raise RuntimeError("store down")
        return 1

    server = await serve_handler(OpsRoutes("upf-test", "1.2.3", probe, lambda: b"m 1\n", "text/plain"), "127.0.0.1", 0)
    try:
        yield server, down
    finally:
        server.close()
        await server.wait_closed()


async def test_ops_routes_on_one_keep_alive_connection(ops) -> None:
    server, down = ops
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\nGET /__version__ HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await read_reply(reader))[::2] == (200, b'{"healthy":true}\n')
        status, headers, body = await read_reply(reader)
        assert status == 200 and json.loads(body) == {"name": "upf-test", "version": "1.2.3"}
        assert headers["connection"] == "keep-alive" and headers["content-type"] == "application/json"
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        status, headers, body = await read_reply(reader)
        assert (status, headers["content-type"], body) == (200, "text/plain", b"m 1\n")
        writer.write(b"GET /__heartbeat__ HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await read_reply(reader))[::2] == (200, b'{"status":"ok","store":"ok"}\n')
        down.append(True)
        writer.write(b"GET /__heartbeat__ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        status, headers, body = await read_reply(reader)
        assert status == 503 and json.loads(body)["code"] == 50301 and headers["connection"] == "close"
        assert await reader.read() == b""
    finally:
        writer.close()


async def test_head_gets_no_body(ops) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", ops[0].port)
    try:
        writer.write(b"HEAD /v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        raw = await reader.read()
        assert raw.startswith(b"HTTP/1.1 200 OK\r\n") and raw.endswith(b"\r\n\r\n") and b"Content-Length: 17" in raw
    finally:
        writer.close()


@pytest.mark.parametrize(
    ("raw", "status", "code"),
    [
        (b"GET /mytopic HTTP/1.1\r\nHost: x\r\n\r\n", 404, 40401),
        (b"POST /v1/health HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", 405, 40501),
        (b"GET /v1/health HTTP/1.1\r\n\r\n", 400, 40000),  # no Host
        (b"GET /v1/health HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx", 400, 40000),
        (b"GET /v1/health HTTP/1.1\nHost: x\n\n", 400, 40000),  # bare LF
        (b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 431, 43100),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", 400, 40000),  # TLS to a plain port
    ],
)
async def test_bad_requests_get_ntfy_error_bodies(ops, raw: bytes, status: int, code: int) -> None:
    got, headers, body = await exchange(ops[0].port, raw)
    assert got == status and headers["content-type"] == "application/json"
    assert json.loads(body) == {"code": code, "http": status, "error": json.loads(body)["error"]} and body.endswith(
        b"\n"
    )


class Echo:
    """A handler that reads a body of at most 4 bytes and says what it got."""

    def wants(self, method: str, path: str) -> bool:
        return path == "/echo"

    def body_limit(self, method: str, topic: str, headers: object, query: bytes) -> int:
        return 4

    async def __call__(
        self,
        method: str,
        topic: str,
        headers: Sequence[tuple[bytes, bytes]],
        query: bytes,
        body: bytes | None,
        client: str,
    ) -> Reply:
        if body is None:
            return Reply(413, b'{"code":41301,"http":413,"error":"too large"}\n')
        return Reply(200, body + b"|" + query + b"|" + client.encode())


async def test_bodies_up_to_the_limit_and_none_over_it() -> None:
    server = await serve_handler(Echo(), "127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"POST /echo?a=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")
        assert (await read_reply(reader))[::2] == (200, b"abc|a=1|127.0.0.1")
        writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n")
        assert (await read_reply(reader))[::2] == (200, b"hi||127.0.0.1")
        writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nabcde")
        status, headers, _ = await read_reply(reader)
        assert status == 413 and headers["connection"] == "close"
        writer.close()
    finally:
        server.close()
        await server.wait_closed()


async def test_close_ends_idle_keep_alive_connections() -> None:
    server = await serve_handler(Echo(), "127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nz")
    assert (await read_reply(reader))[0] == 200
    server.close()
    await asyncio.wait_for(server.wait_closed(), 2)
    assert await asyncio.wait_for(reader.read(), 2) == b""
    writer.close()
