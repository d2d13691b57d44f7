"""A subscriber that follows one topic across reconnects: each stream (ws or JSON) resumes with
``since=<last id>`` and records every message's seq (the body) and id, for the checker.

Why here: the soak (bench/soak.py) and the rolling-restart test both need one, differing only in
when they reconnect and where to (their own ``run``); what a stream records is the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

import websockets

from .checker import Received

__all__ = ["Follower"]


class Follower:
    """Streams one topic; ``stream(host, port, transport)`` runs one connection to its end."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.seqs: list[int] = []
        self.ids: list[str] = []
        self.corrupt = 0
        self.last = "all"
        self.connects = 0
        self.opened = asyncio.Event()

    def received(self) -> Received:
        return Received(topic=self.topic, seqs=list(self.seqs), ids=list(self.ids), corrupt=self.corrupt)

    def _frame(self, raw: str | bytes) -> None:
        try:
            f = json.loads(raw)
        except ValueError:
            self.corrupt += 1
            return
        event = f.get("event")
        if event == "open":
            self.opened.set()
        if event != "message":
            return
        try:
            self.seqs.append(int(f["message"]))
        except (KeyError, ValueError):
            self.corrupt += 1
            return
        self.ids.append(f["id"])
        self.last = f["id"]

    async def stream(self, host: str, port: int, transport: str, *, open_timeout: float = 10.0) -> None:
        """One connection, resumed from the last id; returns when the server ends it (a JSON stream
        cut mid-chunk ends quietly too, as the ntfy app sees it)."""
        self.connects += 1
        if transport == "ws":
            await self._ws(host, port, open_timeout)
        else:
            await self._json(host, port)

    async def _ws(self, host: str, port: int, open_timeout: float) -> None:
        url = f"ws://{host}:{port}/{self.topic}/ws?since={self.last}"
        async with websockets.connect(url, compression=None, open_timeout=open_timeout) as ws:
            with contextlib.suppress(websockets.ConnectionClosed):
                async for msg in ws:
                    self._frame(msg)

    async def _json(self, host: str, port: int) -> None:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(f"GET /{self.topic}/json?since={self.last} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            head = await reader.readuntil(b"\r\n\r\n")
            status = head.split(b"\r\n", 1)[0]
            if b" 200 " not in status + b" ":
                raise ConnectionError(status.decode(errors="replace"))
            buf = b""
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    return
                buf += (await reader.readexactly(size + 2))[:-2]
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    self._frame(line)
        except asyncio.IncompleteReadError:
            pass
        finally:
            writer.close()
