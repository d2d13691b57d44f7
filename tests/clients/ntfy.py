"""A typed black-box ntfy client for cross-role tests: its own wire types, real sockets, no import of
UPF's packages (the contract is the protocol, not our code)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

import httpx
import msgspec
import websockets


class Frame(msgspec.Struct, frozen=True):
    id: str
    time: int
    event: str
    topic: str
    expires: int = 0
    message: str = ""
    encoding: str = ""
    title: str = ""
    priority: int = 0
    tags: list[str] = []
    click: str = ""
    sequence_id: str = ""
    poll_id: str = ""


_decode = msgspec.json.Decoder(Frame)


def parse_frame(raw: bytes | str) -> Frame:
    return _decode.decode(raw)


class Stream:
    """One subscription; ``next()`` returns the next frame (open, keepalive or message)."""

    def __init__(self) -> None:
        self.frames: asyncio.Queue[Frame | None] = asyncio.Queue()
        self.raw_lines: list[bytes] = []

    async def next(self, timeout: float = 5.0) -> Frame:
        frame = await asyncio.wait_for(self.frames.get(), timeout)
        if frame is None:
            raise EOFError("stream closed")
        return frame

    async def next_message(self, timeout: float = 5.0) -> Frame:
        while True:
            f = await self.next(timeout)
            if f.event == "message":
                return f

    async def messages(self, n: int, timeout: float = 5.0) -> list[Frame]:
        return [await self.next_message(timeout) for _ in range(n)]

    async def no_message_within(self, seconds: float) -> bool:
        try:
            await self.next_message(seconds)
        except TimeoutError:
            return True
        return False


async def _read_http_stream(host: str, port: int, path: str, stream: Stream, kind: str) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: upf-tests\r\n\r\n".encode())
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        if status != 200:
            raise RuntimeError(f"subscribe failed with {status}: {head!r}")
        chunked = b"transfer-encoding: chunked" in head.lower()
        buf = b""
        while True:
            if chunked:
                size_line = await reader.readuntil(b"\r\n")
                size = int(size_line.strip().split(b";")[0], 16)
                if size == 0:
                    break
                data = await reader.readexactly(size)
                await reader.readexactly(2)
            else:
                data = await reader.read(65536)
                if not data:
                    break
            buf += data
            if kind == "sse":
                while b"\n\n" in buf:
                    event, buf = buf.split(b"\n\n", 1)
                    stream.raw_lines.append(event)
                    for line in event.split(b"\n"):
                        if line.startswith(b"data: "):
                            stream.frames.put_nowait(parse_frame(line[6:]))
            else:
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    stream.raw_lines.append(line)
                    if kind == "json":
                        stream.frames.put_nowait(parse_frame(line))
                    else:  # raw: a line per event; non-message events are empty lines
                        stream.frames.put_nowait(
                            Frame(id="", time=0, event="message" if line else "other", topic="", message=line.decode())
                        )
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()
        stream.frames.put_nowait(None)


async def _read_ws(url: str, stream: Stream) -> None:
    try:
        async with websockets.connect(url, compression=None, open_timeout=5) as ws:
            async for msg in ws:
                stream.raw_lines.append(msg if isinstance(msg, bytes) else msg.encode())
                stream.frames.put_nowait(parse_frame(msg))
    except websockets.ConnectionClosed:
        pass
    finally:
        stream.frames.put_nowait(None)


@asynccontextmanager
async def subscribe(base: str, topics: str, transport: str = "json", query: str = "") -> AsyncIterator[Stream]:
    """Subscribe at ``base/{topics}/{transport}?{query}`` and wait for the open event (streams)."""
    u = urlsplit(base)
    path = f"/{topics}/{transport}" + (f"?{query}" if query else "")
    stream = Stream()
    if transport == "ws":
        task = asyncio.create_task(_read_ws(f"ws://{u.hostname}:{u.port}{path}", stream))
    else:
        task = asyncio.create_task(_read_http_stream(u.hostname or "127.0.0.1", u.port or 80, path, stream, transport))
    try:
        if "poll=1" not in query and transport != "raw":
            first = await stream.next(10)
            assert first.event == "open", first
        elif transport == "raw" and "poll=1" not in query:
            first = await stream.next(10)
            assert first.event == "other"
        yield stream
    finally:
        task.cancel()
        try:
            await task
        except (asyncio.CancelledError, Exception):
            pass


async def publish(
    base: str, topic: str, body: bytes | str, *, params: dict | None = None, headers: dict | None = None
) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as c:
        return await c.post(f"{base}/{topic}", content=body, params=params, headers=headers)


async def poll(base: str, topics: str, since: str = "all") -> list[Frame]:
    async with httpx.AsyncClient(timeout=10) as c:
        r = await c.get(f"{base}/{topics}/json", params={"poll": "1", "since": since})
        r.raise_for_status()
        return [parse_frame(line) for line in r.text.splitlines() if line.strip()]


def error_body(resp: httpx.Response) -> dict:
    body = json.loads(resp.text)
    assert set(body) >= {"code", "http", "error"}, body
    assert body["http"] == resp.status_code
    return body
