"""A lean HTTP/1.1 client over asyncio streams.

Why not a library: loadgen shares the machine's cores with the server it measures, so every
microsecond of client CPU is taken from the server. Measured by loadgen/bench/client_cost.py (3,000
keep-alive POSTs over 16 connections to a one-worker all-in-one UPF, the better of two interleaved
runs, 2-core machine shared with other work, 2026-12-01):

    client          client CPU/publish   server CPU/publish (same run)
    this module          61 us                 160 us
    httpx              1697 us                 573 us   (11x the server's cost at its best rate)
    h11 + asyncio       122 us                 197 us   (2x this module; 0.6x the server)

httpx costs more than the thing measured. h11 costs less than the server but twice this client: on
two shared cores, client plus server is 221 us a publish here against 319 us with h11, so a run would
top out ~30% lower for the client's sake. This one does exactly what loadgen needs: keep-alive POSTs
through a bounded pool, and long-lived streaming GETs (/json, /sse).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
import time
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import msgspec

__all__ = ["Endpoint", "HttpError", "Connection", "Pool", "parse_endpoint", "check_loopback"]

_MAX_HEAD = 64 * 1024
_IDLE_DROP_SECS = 2.0


class HttpError(Exception):
    """The server's reply was not valid HTTP/1.1 as loadgen reads it, or the connection ended early."""


class Endpoint(msgspec.Struct, frozen=True):
    scheme: str
    host: str
    port: int
    prefix: str

    @property
    def tls(self) -> bool:
        return self.scheme in ("https", "wss")

    @property
    def host_header(self) -> str:
        default = 443 if self.tls else 80
        return self.host if self.port == default else f"{self.host}:{self.port}"

    def http_url(self, path: str) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host_header}{self.prefix}{path}"

    def ws_url(self, path: str) -> str:
        return f"{'wss' if self.tls else 'ws'}://{self.host_header}{self.prefix}{path}"


def parse_endpoint(url: str) -> Endpoint:
    parts = urlsplit(url if "://" in url else "http://" + url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https", "ws", "wss"):
        raise ValueError("URL scheme must be http, https, ws or wss")
    if not parts.hostname:
        raise ValueError("URL has no host")
    tls = scheme in ("https", "wss")
    port = parts.port or (443 if tls else 80)
    return Endpoint(scheme=scheme, host=parts.hostname, port=port, prefix=parts.path.rstrip("/"))


def check_loopback(ep: Endpoint) -> bool:
    """True when every address the host resolves to is loopback; loadgen refuses to load anything
    else unless told to, so a mistyped URL cannot aim a flood at a real machine."""
    try:
        return ipaddress.ip_address(ep.host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(ep.host, ep.port, type=socket.SOCK_STREAM)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


def _ssl_context(ep: Endpoint) -> ssl.SSLContext | None:
    return ssl.create_default_context() if ep.tls else None


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.reusable = True
        self.idle_since = time.monotonic()

    @classmethod
    async def open(cls, ep: Endpoint) -> Connection:
        ctx = _ssl_context(ep)
        reader, writer = await asyncio.open_connection(
            ep.host, ep.port, ssl=ctx, server_hostname=ep.host if ctx else None, limit=_MAX_HEAD
        )
        sock = writer.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        return cls(reader, writer)

    def close(self) -> None:
        self.reusable = False
        self.writer.close()

    async def wait_closed(self) -> None:
        try:
            await self.writer.wait_closed()
        except (OSError, ssl.SSLError):
            pass

    def send(self, method: str, target: str, host: str, headers: dict[str, str], body: bytes | None) -> None:
        lines = [f"{method} {target} HTTP/1.1", f"Host: {host}"]
        lines.extend(f"{k}: {v}" for k, v in headers.items())
        if body is not None:
            lines.append(f"Content-Length: {len(body)}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        self.writer.write(head + body if body else head)

    async def read_head(self) -> tuple[int, dict[str, str]]:
        try:
            raw = await self.reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            self.reusable = False
            raise HttpError("connection closed before a response") from exc
        except asyncio.LimitOverrunError as exc:
            self.reusable = False
            raise HttpError("response head too large") from exc
        lines = raw.decode("latin-1").split("\r\n")
        status_line = lines[0].split(" ", 2)
        if len(status_line) < 2 or not status_line[0].startswith("HTTP/1."):
            self.reusable = False
            raise HttpError("malformed status line")
        try:
            status = int(status_line[1])
        except ValueError as exc:
            self.reusable = False
            raise HttpError("malformed status code") from exc
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if not line:
                continue
            name, sep, value = line.partition(":")
            if not sep:
                continue
            key = name.strip().lower()
            value = value.strip()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        if status_line[0] == "HTTP/1.0" or "close" in headers.get("connection", "").lower():
            self.reusable = False
        return status, headers

    async def iter_body(self, headers: dict[str, str], status: int) -> AsyncIterator[bytes]:
        """The response body as it arrives; for a streaming reply this runs until the server ends it."""
        if status in (204, 304) or 100 <= status < 200:
            return
        if "chunked" in headers.get("transfer-encoding", "").lower():
            while True:
                try:
                    size_line = await self.reader.readuntil(b"\r\n")
                    size = int(size_line.split(b";", 1)[0].strip(), 16)
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
                    self.reusable = False
                    raise HttpError("bad chunked body") from exc
                if size == 0:
                    try:
                        while (await self.reader.readuntil(b"\r\n")) != b"\r\n":
                            pass  # trailers
                    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
                        self.reusable = False
                        raise HttpError("bad chunked trailer") from exc
                    return
                try:
                    data = await self.reader.readexactly(size + 2)
                except asyncio.IncompleteReadError as exc:
                    self.reusable = False
                    raise HttpError("chunked body cut short") from exc
                yield data[:-2]
        elif "content-length" in headers:
            try:
                remaining = int(headers["content-length"])
            except ValueError as exc:
                self.reusable = False
                raise HttpError("bad content-length") from exc
            while remaining > 0:
                data = await self.reader.read(min(remaining, 65536))
                if not data:
                    self.reusable = False
                    raise HttpError("body cut short")
                remaining -= len(data)
                yield data
        else:
            self.reusable = False
            while True:
                data = await self.reader.read(65536)
                if not data:
                    return
                yield data

    async def read_body(self, headers: dict[str, str], status: int) -> bytes:
        parts = [chunk async for chunk in self.iter_body(headers, status)]
        return b"".join(parts)


class Pool:
    """A bounded keep-alive pool: at most ``size`` connections and requests in flight, reused LIFO so
    the hot connections stay hot and idle ones age out before a server's keep-alive timeout."""

    def __init__(self, ep: Endpoint, size: int) -> None:
        self.ep = ep
        self._sem = asyncio.Semaphore(size)
        self._idle: list[Connection] = []
        self._all: set[Connection] = set()
        self.opened = 0
        self.waits = 0
        """requests that found every connection busy and queued for one"""

    async def _take(self) -> Connection:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if conn.reader.at_eof() or now - conn.idle_since > _IDLE_DROP_SECS:
                self._discard(conn)
                continue
            return conn
        conn = await Connection.open(self.ep)
        self.opened += 1
        self._all.add(conn)
        return conn

    def _discard(self, conn: Connection) -> None:
        conn.close()
        self._all.discard(conn)

    async def request(
        self, method: str, target: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        if self._sem.locked():
            self.waits += 1
        async with self._sem:
            conn = await self._take()
            try:
                conn.send(method, target, self.ep.host_header, headers or {}, body)
                status, head = await conn.read_head()
                data = await conn.read_body(head, status)
            except BaseException:
                self._discard(conn)
                raise
            if conn.reusable:
                conn.idle_since = time.monotonic()
                self._idle.append(conn)
            else:
                self._discard(conn)
            return status, data

    async def aclose(self) -> None:
        conns = list(self._all)
        self._all.clear()
        self._idle.clear()
        for conn in conns:
            conn.close()
        for conn in conns:
            await conn.wait_closed()
