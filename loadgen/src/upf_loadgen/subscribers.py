"""Fake devices: one long-lived ntfy subscription each, over /ws, /json or /sse.

A subscriber only records what arrives (seq, id, latency); judging it is the checker's job. If the
stream drops mid-run it resumes with ``since=<last id>`` a bounded number of times, as the ntfy app
does, so a server that closes streams shows up as disconnects and, if resume is broken, as loss.
"""

from __future__ import annotations

import asyncio
import logging
import time
from array import array
from urllib.parse import quote

import msgspec
from websockets.asyncio.client import ClientConnection, connect

from .checker import Received
from .http11 import Connection, Endpoint
from .metrics import LiveStats, record_us
from .wire import PayloadError, body_bytes, decode_message, decode_payload

__all__ = ["Subscriber"]

log = logging.getLogger(__name__)

_INITIAL_TRIES = 3


class SubscribeError(Exception):
    """The subscription was refused or never sent its open frame."""


class Subscriber:
    def __init__(
        self,
        *,
        topic: str,
        sub: int,
        transport: str,
        pusher: Endpoint,
        message_size: int,
        binary: bool,
        stats: LiveStats,
        reconnects: int,
        connect_timeout: float,
    ) -> None:
        self.topic = topic
        self.sub = sub
        self.transport = transport
        self.pusher = pusher
        self.message_size = message_size
        self.binary = binary
        self.stats = stats
        self.max_reconnects = reconnects
        self.connect_timeout = connect_timeout
        self.seqs: array[int] = array("q")
        self.ids: list[str] = []
        self.seen: set[int] = set()
        self.corrupt = 0
        self.foreign = 0
        self.disconnects = 0
        self.reconnects = 0
        self.last_id = ""
        self.failure = ""
        self.bad_frame = ""
        """the first frame that could not be used, for the report"""
        self.opened = asyncio.Event()
        self.ended = asyncio.Event()
        self.settled = asyncio.Event()
        """set on the first open frame or when the subscriber gives up, whichever comes first"""
        self._closing = False
        self._ws: ClientConnection | None = None
        self._conn: Connection | None = None
        self._open_in_stream = False

    def received(self) -> Received:
        return Received(
            topic=self.topic, sub=self.sub, seqs=self.seqs, ids=self.ids, corrupt=self.corrupt, foreign=self.foreign
        )

    def missing(self, accepted: dict[int, str]) -> int:
        if len(self.seen) < len(accepted):
            return len(accepted) - len(self.seen)  # a lower bound is enough to know we must wait
        return sum(1 for s in accepted if s not in self.seen)

    def _path(self) -> str:
        path = f"/{quote(self.topic, safe='')}/{self.transport}"
        if self.reconnects:
            # resume exactly after the last message; the topic is unique to this run, so "all"
            # is everything it ever got
            path += "?since=" + quote(self.last_id or "all", safe="")
        return path

    def on_frame(self, raw: bytes | str) -> None:
        now = time.monotonic_ns()
        try:
            msg = decode_message(raw)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            self.corrupt += 1
            if not self.bad_frame:
                self.bad_frame = f"{exc}: {raw[:200]!r}"
            return
        event = msg.event
        if event == "message":
            if msg.topic != self.topic:
                self.foreign += 1
                return
            if msg.id:
                self.last_id = msg.id
            try:
                p = decode_payload(body_bytes(msg), self.message_size, self.binary)
            except PayloadError as exc:
                self.corrupt += 1
                if not self.bad_frame:
                    self.bad_frame = f"{exc}: {raw[:200]!r}"
                return
            self.seqs.append(p.seq)
            self.ids.append(msg.id)
            if p.seq not in self.seen:
                self.seen.add(p.seq)
                self.stats.delivered += 1
                record_us(self.stats.latency, (now - p.sent_ns) // 1000)
        elif event == "open":
            self._open_in_stream = True
            self.opened.set()
            self.settled.set()
        # keepalive, poll_request and anything newer carry no load data

    async def run(self) -> None:
        """Subscribe, and resubscribe after a drop while the budget lasts; never raises."""
        tries = 0
        try:
            while not self._closing:
                self._open_in_stream = False
                try:
                    await self._stream()
                    reason = "stream ended"
                except Exception as exc:
                    reason = f"{type(exc).__name__}: {exc}"
                if self._closing:
                    return
                if not self.opened.is_set():
                    tries += 1
                    if tries >= _INITIAL_TRIES:
                        self.failure = reason
                        log.debug("subscribe failed: %s", reason)
                        return
                    await asyncio.sleep(0.2 * tries)
                    continue
                if self._open_in_stream:
                    self.disconnects += 1
                    log.debug("subscriber stream dropped: %s", reason)
                if self.reconnects >= self.max_reconnects:
                    self.failure = reason
                    return
                self.reconnects += 1
                await asyncio.sleep(min(0.2 * 2**self.reconnects, 2.0))
        finally:
            self.ended.set()
            self.settled.set()

    async def _stream(self) -> None:
        if self.transport == "ws":
            await self._stream_ws()
        else:
            await self._stream_http()

    async def _stream_ws(self) -> None:
        url = self.pusher.ws_url(self._path())
        async with connect(
            url,
            compression=None,
            proxy=None,
            open_timeout=self.connect_timeout,
            ping_interval=None,  # the server pings; our own pings would only add false timeouts
            close_timeout=2,
            max_size=1 << 20,
            user_agent_header="upf-loadgen",
        ) as ws:
            self._ws = ws
            try:
                if self._closing:
                    return
                async for frame in ws:
                    self.on_frame(frame)
            finally:
                self._ws = None

    async def _stream_http(self) -> None:
        conn = await asyncio.wait_for(Connection.open(self.pusher), self.connect_timeout)
        self._conn = conn
        try:
            if self._closing:
                return
            accept = "text/event-stream" if self.transport == "sse" else "application/x-ndjson"
            conn.send(
                "GET",
                self.pusher.prefix + self._path(),
                self.pusher.host_header,
                {"Accept": accept, "User-Agent": "upf-loadgen"},
                None,
            )
            status, headers = await asyncio.wait_for(conn.read_head(), self.connect_timeout)
            if status != 200:
                raise SubscribeError(f"HTTP {status}")
            if self.transport == "sse":
                await self._read_sse(conn, headers, status)
            else:
                await self._read_ndjson(conn, headers, status)
        finally:
            self._conn = None
            conn.close()
            await conn.wait_closed()

    async def _read_ndjson(self, conn: Connection, headers: dict[str, str], status: int) -> None:
        buf = b""
        async for chunk in conn.iter_body(headers, status):
            buf += chunk
            if b"\n" not in chunk:
                continue
            *lines, buf = buf.split(b"\n")
            for line in lines:
                if line.strip():
                    self.on_frame(line)

    async def _read_sse(self, conn: Connection, headers: dict[str, str], status: int) -> None:
        buf = b""
        data: list[bytes] = []
        async for chunk in conn.iter_body(headers, status):
            buf += chunk
            if b"\n" not in chunk:
                continue
            *lines, buf = buf.split(b"\n")
            for line in lines:
                line = line.rstrip(b"\r")
                if not line:
                    if data:
                        self.on_frame(b"\n".join(data))
                        data = []
                elif line.startswith(b"data:"):
                    value = line[5:]
                    data.append(value[1:] if value.startswith(b" ") else value)
                # "event:", "id:", "retry:" and ":" comments: the JSON carries the event type

    async def close(self) -> None:
        self._closing = True
        ws, conn = self._ws, self._conn
        if ws is not None:
            try:
                await ws.close()
            except Exception:
                pass
        if conn is not None:
            conn.close()
