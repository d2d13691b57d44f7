"""Test kit for the pusher: a real embedded store in tmp_path, a pusher on 127.0.0.1:0, and a
recording client per transport that speaks only the public protocol (HTTP/1.1 streams, WebSocket).

Timeouts are in MS, scaled by UPF_TESTS_TIMEOUT_FACTOR for slow machines.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import websockets
from websockets.asyncio.client import connect as ws_connect

from upf_keyspace import Envelope, Published, Settings, Store, open_store
from upf_pusher.server import Pusher, serve

MS = 0.001 * float(os.environ.get("UPF_TESTS_TIMEOUT_FACTOR", "1"))
TRANSPORTS = ("ws", "json", "sse", "raw")


def settings_for(tmp_path: Any, **overrides: Any) -> Settings:
    base: dict[str, Any] = dict(
        store_path=str(tmp_path / "upf.db"),
        node_id="node-" + uuid.uuid4().hex[:8],
        shard_count=4,
        keepalive_secs=30.0,
        safety_poll_secs=30.0,
        heartbeat_secs=30.0,
        slow_subscriber_timeout_secs=30.0,
    )
    base.update(overrides)
    return Settings(**base)


@pytest.fixture
async def store(tmp_path: Any) -> AsyncIterator[Store]:
    s = await open_store(settings_for(tmp_path))
    yield s
    await s.close()


StartPusher = Callable[..., Awaitable[Pusher]]


@pytest.fixture
async def start_pusher(tmp_path: Any, store: Store) -> AsyncIterator[StartPusher]:
    """Start pushers on port 0 against the shared store: ``await start_pusher(keepalive_secs=...)``."""
    started: list[Pusher] = []

    async def start(*, fallback: Any = None, **overrides: Any) -> Pusher:
        p = await serve(settings_for(tmp_path, **overrides), store, fallback=fallback, host="127.0.0.1", port=0)
        started.append(p)
        return p

    yield start
    for p in started:
        await p.stop()


@pytest.fixture
async def pusher(start_pusher: StartPusher) -> Pusher:
    return await start_pusher()


async def publish(store: Store, topic: str, text: str, *, ttl: int = 600) -> Published:
    now = int(time.time())
    return await store.publish(topic, Envelope(time=now, expires=now + ttl, message=text))


class Client:
    """A recording subscriber over one transport; ``next()`` returns events as dicts.

    raw events become ``{"event": "message", "message": line}`` or ``{"event": "other"}``.
    """

    def __init__(self, transport: str) -> None:
        self.transport = transport
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.status = 0
        self.headers: dict[str, str] = {}
        self.closed = asyncio.Event()
        self._ws: Any = None
        self._writer: asyncio.StreamWriter | None = None
        self._task: asyncio.Task[None] | None = None

    async def open(self, port: int, path: str, *, headers: dict[str, str] | None = None) -> Client:
        if self.transport == "ws":
            self._ws = await ws_connect(f"ws://127.0.0.1:{port}{path}", additional_headers=headers, compression=None)
            self.status = 101
            self._task = asyncio.create_task(self._read_ws())
            return self
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        self._writer = writer
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        writer.write(f"GET {path} HTTP/1.1\r\nHost: test\r\n{extra}\r\n".encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5000 * MS)
        lines = head.decode("latin-1").split("\r\n")
        self.status = int(lines[0].split()[1])
        self.headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
        self._task = asyncio.create_task(self._read_stream(reader))
        return self

    async def _read_ws(self) -> None:
        try:
            async for frame in self._ws:
                self.events.put_nowait(json.loads(frame))
        except websockets.ConnectionClosed:
            pass
        finally:
            self.closed.set()

    async def _read_stream(self, reader: asyncio.StreamReader) -> None:
        buf = b""
        try:
            while True:
                if self.headers.get("transfer-encoding") == "chunked":
                    size = int((await reader.readuntil(b"\r\n")).strip(), 16)
                    if size == 0:
                        break
                    buf += await reader.readexactly(size)
                    await reader.readexactly(2)
                else:
                    data = await reader.read(65536)
                    if not data:
                        break
                    buf += data
                buf = self._parse(buf)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.closed.set()

    def _parse(self, buf: bytes) -> bytes:
        sep = b"\n\n" if self.transport == "sse" else b"\n"
        while sep in buf:
            item, buf = buf.split(sep, 1)
            if self.transport == "json":
                assert item, "a blank line on /json"
                self.events.put_nowait(json.loads(item))
            elif self.transport == "sse":
                fields = dict(line.split(b": ", 1) for line in item.split(b"\n"))
                ev = json.loads(fields[b"data"])
                assert fields.get(b"event", b"message").decode() == ev["event"]
                if ev["event"] == "message":
                    assert b"event" not in fields
                self.events.put_nowait(ev)
            else:
                text = item.decode()
                self.events.put_nowait({"event": "message", "message": text} if text else {"event": "other"})
        return buf

    async def next(self, timeout_ms: float = 3000) -> dict[str, Any]:
        return await asyncio.wait_for(self.events.get(), timeout_ms * MS)

    async def next_message(self, timeout_ms: float = 3000) -> dict[str, Any]:
        """The next message event, skipping open/keepalive."""
        deadline = time.monotonic() + timeout_ms * MS
        while True:
            ev = await asyncio.wait_for(self.events.get(), max(0.0, deadline - time.monotonic()))
            if ev["event"] == "message":
                return ev

    async def messages(self, n: int, timeout_ms: float = 3000) -> list[dict[str, Any]]:
        return [await self.next_message(timeout_ms) for _ in range(n)]

    async def quiet(self, ms: float = 200) -> list[dict[str, Any]]:
        """Messages that arrive within ``ms`` (expected: none)."""
        await asyncio.sleep(ms * MS)
        out = []
        while not self.events.empty():
            ev = self.events.get_nowait()
            if ev["event"] == "message":
                out.append(ev)
        return out

    async def close(self) -> None:
        if self._ws is not None:
            await self._ws.close()
        if self._writer is not None:
            self._writer.close()
            try:
                await self._writer.wait_closed()
            except ConnectionError:
                pass
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, 2000 * MS)
            except TimeoutError:
                self._task.cancel()


@pytest.fixture
async def clients() -> AsyncIterator[Callable[..., Awaitable[Client]]]:
    """Open clients that are closed at teardown: ``await clients(port, "json", "/t/json")``."""
    opened: list[Client] = []

    async def open_client(port: int, transport: str, path: str, *, headers: dict[str, str] | None = None) -> Client:
        c = Client(transport)
        opened.append(c)
        return await c.open(port, path, headers=headers)

    yield open_client
    for c in opened:
        await c.close()


async def raw_request(port: int, data: bytes, *, timeout_ms: float = 3000) -> bytes:
    """Send raw bytes, return everything until the server closes (or the timeout)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    out = b""
    try:
        while True:
            chunk = await asyncio.wait_for(reader.read(65536), timeout_ms * MS)
            if not chunk:
                break
            out += chunk
    except TimeoutError:
        pass
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except ConnectionError:
            pass
    return out


async def eventually(cond: Callable[[], bool], timeout_ms: float = 3000) -> None:
    deadline = time.monotonic() + timeout_ms * MS
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(10 * MS)
