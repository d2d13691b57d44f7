"""The smallest front door: one :class:`~upf_edge.handler.Handler` served over asyncio with this library's
HTTP/1.1 codec (``http11``), for a role that serves nothing but its handler (the janitor's ops routes).

Why not the pusher's server or granian: the janitor serves five GET routes to probes and scrapers; the
pusher's server carries subscriptions and a fallback app, granian an extra process model. This is the
same parser, the same replies and the same ntfy error bodies, with keep-alive and a head timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

from .errors import NOT_FOUND
from .handler import NO_BODY, Handler, Reply
from .http11 import HttpError, RequestBody, error_response, find_head_end, parse_head, reply_response

__all__ = ["serve_handler", "HandlerServer", "NOT_FOUND", "HEAD_TIMEOUT_SECS", "bound_socket", "bind_error"]

HEAD_TIMEOUT_SECS = 10.0
_READ = 65536


def bound_socket(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A bound TCP socket, not yet listening: a busy port fails before a role starts anything, and the
    port refuses connections until the role serves. ``reuse_port``: workers sharing one port
    (SO_REUSEPORT), each binding its own. An IPv6 host (``::``) takes IPv4 too."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


def bind_error(host: str, port: int, exc: OSError) -> str:
    """The one line a busy or bad UPF_BIND gets (the program prefixes its name), from every program."""
    return f"cannot bind UPF_BIND {host}:{port}: {exc}"


def base_url(host: str, port: int) -> str:
    """``http://host:port`` for a start line: an IPv6 host in brackets, as a URL must have it."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class HandlerServer:
    """The listening server and its open connections: ``close`` ends both, so a stopping process does
    not wait out an idle keep-alive connection (``asyncio.Server.wait_closed`` waits for them)."""

    def __init__(self) -> None:
        self.server: asyncio.Server | None = None
        self.connections: set[asyncio.StreamWriter] = set()

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for writer in list(self.connections):
            writer.close()

    async def wait_closed(self) -> None:
        if self.server is not None:
            await self.server.wait_closed()


async def serve_handler(
    handler: Handler, host: str, port: int, *, head_timeout: float = HEAD_TIMEOUT_SECS
) -> HandlerServer:
    """Listen on ``host:port`` and answer every request with ``handler`` (404 for what it does not want)."""
    served = HandlerServer()

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        served.connections.add(writer)
        peer = writer.get_extra_info("peername")
        client = peer[0] if isinstance(peer, tuple) else ""
        buf = b""
        try:
            while True:
                end = find_head_end(buf)
                while end < 0:
                    data = await asyncio.wait_for(reader.read(_READ), head_timeout)
                    if not data:
                        return
                    scanned = len(buf)
                    buf += data
                    end = find_head_end(buf, scanned)
                head = parse_head(buf[:end])
                buf = buf[end:]
                topic = head.path[1:]
                head_only = head.method == "HEAD"
                declares_body = head.chunked or bool(head.content_length)
                limit = (
                    handler.body_limit(head.method, topic, head.headers, head.query_string)
                    if handler.wants(head.method, head.path)
                    else None
                )
                body: bytes | None = b""
                if limit is None or limit == NO_BODY:
                    keep_alive = head.keep_alive and not declares_body  # an unread body may follow
                else:
                    keep_alive = head.keep_alive
                    try:
                        framed = RequestBody(head, limit)
                        rest = framed.feed(buf)
                        while rest is None:
                            data = await asyncio.wait_for(reader.read(_READ), head_timeout)
                            if not data:
                                return
                            rest = framed.feed(data)
                        body, buf = framed.body, rest
                    except HttpError as exc:
                        if exc.problem.http != 413:
                            raise
                        body, keep_alive = None, False  # over the limit: the handler answers, unread
                if limit is None:
                    reply = Reply(404, NOT_FOUND.body())
                else:
                    reply = await handler(head.method, topic, head.headers, head.query_string, body, client)
                writer.write(reply_response(reply, keep_alive=keep_alive, head_only=head_only))
                await writer.drain()
                if not keep_alive:
                    return
        except HttpError as exc:
            with contextlib.suppress(ConnectionError):
                writer.write(error_response(exc.problem))
                await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            served.connections.discard(writer)
            writer.close()

    served.server = await asyncio.start_server(connection, host, port)
    return served
