"""A tiny ntfy-like server for exercising loadgen's client side before the real server exists.

It speaks just enough of the protocol: POST /{topic} (with ?up=1 binary -> base64), and
/{topic}/json, /{topic}/sse on a raw HTTP/1.1 listener, /{topic}/ws on a websockets listener.
Fault hooks let a test make it lose, duplicate or reorder one message, so we can check that loadgen
notices. Only 127.0.0.1, ephemeral ports.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from urllib.parse import parse_qs, urlsplit

import pytest
from websockets.asyncio.server import Server, ServerConnection, serve

Sink = Callable[[dict], None]


class FakeNtfy:
    def __init__(self, fault: str = "", fault_at: int = 5) -> None:
        """``fault`` is "", "drop", "dup", "swap", "reject" (answer 429) or "kick" (close the
        topic's streams right after delivering it); it hits the ``fault_at``-th publish (0-based,
        counted over all topics), and for "swap" also the next publish of the same topic."""
        self.fault = fault
        self.fault_at = fault_at
        self.subs: dict[str, list[Sink]] = defaultdict(list)
        self.closers: dict[str, list[Callable[[], None]]] = defaultdict(list)
        self.history: dict[str, list[dict]] = defaultdict(list)
        self.kicked = 0
        self.published = 0
        self.counter = 0
        self._held: dict[str, dict] = {}
        self._swap_topic = ""
        self._http: asyncio.Server | None = None
        self._ws: Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.http_url = ""
        self.ws_url = ""

    async def start(self) -> None:
        self._http = await asyncio.start_server(self._handle_http, "127.0.0.1", 0)
        port = self._http.sockets[0].getsockname()[1]
        self.http_url = f"http://127.0.0.1:{port}"
        self._ws = await serve(self._handle_ws, "127.0.0.1", 0, compression=None)
        wport = next(iter(self._ws.sockets)).getsockname()[1]
        self.ws_url = f"http://127.0.0.1:{wport}"

    async def close(self) -> None:
        if self._ws is not None:
            self._ws.close()
            await self._ws.wait_closed()
        if self._http is not None:
            self._http.close()
        for w in list(self._writers):
            w.close()
        for t in list(self._tasks):
            t.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=2)
        if self._http is not None:
            await self._http.wait_closed()

    # ------------------------------------------------------------------ publish + fan-out

    def _new_message(self, topic: str, body: bytes, up: bool) -> dict:
        self.counter += 1
        mid = base64.urlsafe_b64encode(self.counter.to_bytes(12, "big")).decode()
        msg = {
            "id": mid,
            "time": int(time.time()),
            "expires": int(time.time()) + 3600,
            "event": "message",
            "topic": topic,
        }
        try:
            text = body.decode("utf-8")
            msg["message"] = text if up else text.strip()
        except UnicodeDecodeError:
            msg["message"] = base64.b64encode(body).decode()
            msg["encoding"] = "base64"
        return msg

    def _fan_out(self, topic: str, msg: dict) -> None:
        n = self.published
        self.published += 1
        frames = [msg]
        if self.fault == "drop" and n == self.fault_at:
            frames = []
        elif self.fault == "dup" and n == self.fault_at:
            frames = [msg, msg]
        elif self.fault == "swap":
            if n == self.fault_at:
                self._held[topic] = msg
                self._swap_topic = topic
                frames = []
            elif topic == self._swap_topic and topic in self._held:
                frames = [msg, self._held.pop(topic)]
        self.history[topic].append(msg)
        for frame in frames:
            for sink in list(self.subs.get(topic, ())):
                sink(frame)
        if self.fault == "kick" and n == self.fault_at:
            for close in list(self.closers.get(topic, ())):
                self.kicked += 1
                close()

    def _backlog(self, topic: str, since: str) -> list[dict]:
        """ntfy's since: none/absent -> nothing, all -> everything, an id -> after it (unknown -> all)."""
        hist = self.history.get(topic, [])
        if not since or since == "none":
            return []
        for i, m in enumerate(hist):
            if m["id"] == since:
                return hist[i + 1 :]
        return list(hist)

    # ------------------------------------------------------------------ HTTP

    async def _handle_http(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        k, v = line.split(":", 1)
                        headers[k.strip().lower()] = v.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                parts = urlsplit(target)
                segs = [s for s in parts.path.split("/") if s]
                query = parse_qs(parts.query)
                if (
                    method in ("POST", "PUT")
                    and len(segs) == 1
                    and self.fault == "reject"
                    and self.published == self.fault_at
                ):
                    self.published += 1
                    data = b'{"code":42901,"http":429,"error":"limit reached: too many requests"}\n'
                    writer.write(
                        b"HTTP/1.1 429 Too Many Requests\r\n" + f"Content-Length: {len(data)}\r\n\r\n".encode() + data
                    )
                    await writer.drain()
                elif method in ("POST", "PUT") and len(segs) == 1:
                    msg = self._new_message(segs[0], body, "up" in query)
                    self._fan_out(segs[0], msg)
                    data = json.dumps(msg).encode() + b"\n"
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                        + f"Content-Length: {len(data)}\r\n\r\n".encode()
                        + data
                    )
                    await writer.drain()
                elif method == "GET" and len(segs) == 2 and segs[1] in ("json", "sse"):
                    since = query.get("since", [""])[0]
                    await self._stream(segs[0], segs[1], since, reader, writer)
                    return
                else:
                    writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                    await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            return
        finally:
            self._tasks.discard(task)
            self._writers.discard(writer)
            writer.close()

    async def _stream(
        self, topic: str, kind: str, since: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        ctype = "text/event-stream" if kind == "sse" else "application/x-ndjson"
        writer.write(f"HTTP/1.1 200 OK\r\nContent-Type: {ctype}\r\nTransfer-Encoding: chunked\r\n\r\n".encode())

        def frame(msg: dict) -> None:
            data = json.dumps(msg).encode()
            if kind == "sse":
                event = msg["event"]
                data = (b"" if event == "message" else f"event: {event}\n".encode()) + b"data: " + data + b"\n\n"
            else:
                data += b"\n"
            writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")

        frame({"id": "open0000open", "time": int(time.time()), "event": "open", "topic": topic})
        frame({"id": "keep0000keep", "time": int(time.time()), "event": "keepalive", "topic": topic})
        for m in self._backlog(topic, since):
            frame(m)
        self.subs[topic].append(frame)
        self.closers[topic].append(writer.close)
        try:
            await writer.drain()
            while await reader.read(4096):
                pass
        finally:
            self.subs[topic].remove(frame)
            self.closers[topic].remove(writer.close)

    # ------------------------------------------------------------------ WebSocket

    async def _handle_ws(self, ws: ServerConnection) -> None:
        assert ws.request is not None
        segs = [s for s in urlsplit(ws.request.path).path.split("/") if s]
        topic = segs[0]
        since = parse_qs(urlsplit(ws.request.path).query).get("since", [""])[0]
        q: asyncio.Queue[dict] = asyncio.Queue()
        await ws.send(
            json.dumps({"id": "open0000open", "time": int(time.time()), "event": "open", "topic": topic}) + "\n"
        )
        for m in self._backlog(topic, since):
            q.put_nowait(m)
        self.subs[topic].append(q.put_nowait)
        closer = lambda: self._tasks.add(asyncio.ensure_future(ws.close()))  # noqa: E731
        self.closers[topic].append(closer)

        async def sender() -> None:
            while True:
                msg = await q.get()
                await ws.send(json.dumps(msg) + "\n")

        task = asyncio.create_task(sender())
        try:
            await ws.wait_closed()
        finally:
            self.subs[topic].remove(q.put_nowait)
            self.closers[topic].remove(closer)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


@pytest.fixture
async def fake_ntfy() -> AsyncIterator[Callable[..., FakeNtfy]]:
    servers: list[FakeNtfy] = []

    async def make(fault: str = "", fault_at: int = 5) -> FakeNtfy:
        srv = FakeNtfy(fault, fault_at)
        await srv.start()
        servers.append(srv)
        return srv

    yield make  # type: ignore[misc]
    for srv in servers:
        await srv.close()
