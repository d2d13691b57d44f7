"""Run an ASGI app (the writer's Litestar app) for every request of a front door (``frontdoor``) that is
not a subscribe, an ops route or the direct handler's (the writer's publish, called without ASGI), as a
minimal ASGI HTTP server would.

Why: UPF's own connection layer is the front door of the all-in-one process (it is chosen for memory
per idle connection) and of the standalone writer (for its CPU per publish); the hot routes are called
directly (``frontdoor.HandlerCycle``) and the cold rest is handed to the fallback app in the same process.

What it supports: HTTP/1.1 with keep-alive (requests on one connection are served in order),
request bodies with Content-Length or chunked transfer coding up to ``MAX_BODY`` (413 above it),
``Expect: 100-continue``, and the app's ASGI lifespan. What it does not: HTTP/2, trailers, streaming
request bodies (the body is read whole, it is small), write backpressure on responses (they are small).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Protocol

from upf_edge.errors import Problem
from upf_edge.http11 import LAST_CHUNK, RequestBody, RequestHead, chunk, error_response, response_head

__all__ = ["ASGIApp", "INTERNAL_ERROR", "MAX_BODY", "Cycle", "Lifespan"]

log = logging.getLogger("upf.edge.asgi")

ASGIApp = Callable[
    [MutableMapping[str, Any], Callable[[], Awaitable[dict[str, Any]]], Callable[[dict[str, Any]], Awaitable[None]]],
    Awaitable[None],
]
MAX_BODY = 64 * 1024
_NO_BODY_STATUS = frozenset({204, 304})
INTERNAL_ERROR = Problem(50000, 500, "internal server error")
"""The front door's own, for a handler or app that raised (the writer's failures, as ntfy's, answer 50001)."""


class Owner(Protocol):
    """The connection that runs a cycle (frontdoor.HttpProtocol)."""

    transport: asyncio.Transport

    def cycle_done(self, cycle: Cycle, keep_alive: bool) -> None: ...

    def spawn(self, coro: Any) -> asyncio.Task[Any]: ...


def _addr(info: Any) -> tuple[str, int] | None:
    if isinstance(info, tuple) and len(info) >= 2:
        return (str(info[0]), int(info[1]))
    return None


class Cycle:
    """One request handed to the app: read its body, call the app, write what it sends."""

    __slots__ = (
        "owner",
        "head",
        "app",
        "scope",
        "keep_alive",
        "reader",
        "body_given",
        "started",
        "finished",
        "head_sent",
        "chunked",
        "status",
        "resp_headers",
        "disconnected",
        "_disconnect",
        "task",
    )

    def __init__(self, owner: Owner, head: RequestHead, app: ASGIApp, state: dict[str, Any] | None) -> None:
        self.owner = owner
        self.head = head
        self.app = app
        t = owner.transport
        self.scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": head.version,
            "method": head.method,
            "scheme": "http",
            "path": head.path,
            "raw_path": head.raw_path,
            "query_string": head.query_string,
            "root_path": "",
            "headers": head.headers,
            "client": _addr(t.get_extra_info("peername")),
            "server": _addr(t.get_extra_info("sockname")),
        }
        if state is not None:
            self.scope["state"] = dict(state)
        self.keep_alive = head.keep_alive
        self.reader: RequestBody | None = None
        self.body_given = False
        self.started = self.finished = self.head_sent = self.chunked = False
        self.status = 0
        self.resp_headers: list[tuple[bytes, bytes]] = []
        self.disconnected = False
        self._disconnect: asyncio.Future[None] | None = None
        self.task: asyncio.Task[None] | None = None

    # --- request body ---------------------------------------------------------------------------------
    def begin(self, buf: bytes) -> bytes | None:
        """Decide the body framing and consume what ``buf`` holds of it. Returns the bytes after the body
        once it is complete (the app is then running), else None. Raises HttpError (400, 413, 501)."""
        self.reader = RequestBody(self.head, MAX_BODY)
        if self.reader.expect_continue:
            self.owner.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        return self.feed(buf)

    def feed(self, data: bytes) -> bytes | None:
        assert self.reader is not None
        rest = self.reader.feed(data)
        if rest is not None:
            self.task = self.owner.spawn(self._run())
        return rest

    @property
    def reading_body(self) -> bool:
        return self.task is None

    # --- app ----------------------------------------------------------------------------------------
    async def _run(self) -> None:
        try:
            await self.app(self.scope, self.receive, self.send)
        except asyncio.CancelledError:
            self.keep_alive = False
            raise
        except Exception:
            log.exception("fallback app failed", extra={"method": self.head.method})  # never the path: it names a topic
            self._fail()
        else:
            if not self.finished:
                log.warning("fallback app returned without a full response", extra={"method": self.head.method})
                self._fail()
        finally:
            self.owner.cycle_done(self, self.keep_alive and self.finished)

    def _fail(self) -> None:
        t = self.owner.transport
        self.keep_alive = False
        if not self.head_sent and not t.is_closing():
            t.write(error_response(INTERNAL_ERROR))
        self.finished = False

    async def receive(self) -> dict[str, Any]:
        if not self.body_given:
            self.body_given = True
            body = self.reader.body if self.reader is not None else b""
            return {"type": "http.request", "body": body, "more_body": False}
        if not (self.finished or self.disconnected):
            if self._disconnect is None:
                self._disconnect = asyncio.get_running_loop().create_future()
            await self._disconnect
        return {"type": "http.disconnect"}

    def connection_lost(self) -> None:
        self.disconnected = True
        if self._disconnect is not None and not self._disconnect.done():
            self._disconnect.set_result(None)

    async def send(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            if self.started:
                raise RuntimeError("response already started")
            self.started = True
            self.status = int(message["status"])
            self.resp_headers = [(bytes(k), bytes(v)) for k, v in message.get("headers", ())]
        elif kind == "http.response.body":
            if not self.started or self.finished:
                raise RuntimeError("response body out of order")
            body = bytes(message.get("body", b""))
            more = bool(message.get("more_body", False))
            t = self.owner.transport
            out = b""
            if not self.head_sent:
                out = self._head(body, more)
            if self.head.method != "HEAD" and self.status not in _NO_BODY_STATUS:
                if self.chunked:
                    if body:
                        out += chunk(body)
                    if not more:
                        out += LAST_CHUNK
                else:
                    out += body
            if out and not t.is_closing():
                t.write(out)
            if not more:
                self.finished = True
                if self._disconnect is not None and not self._disconnect.done():
                    self._disconnect.set_result(None)
        # other message types (trailers, pathsend) are not offered in the scope's extensions

    def _head(self, body: bytes, more: bool) -> bytes:
        self.head_sent = True
        headers = [(k, v) for k, v in self.resp_headers if k.lower() != b"connection"]
        names = {k.lower() for k, _ in headers}
        if self.status not in _NO_BODY_STATUS and self.status >= 200:
            if b"content-length" not in names and b"transfer-encoding" not in names:
                if not more:
                    headers.append((b"content-length", str(len(body)).encode()))
                elif self.head.version == "1.1":
                    headers.append((b"transfer-encoding", b"chunked"))
                    self.chunked = True
                else:
                    self.keep_alive = False  # HTTP/1.0: the body ends when the connection does
            elif b"transfer-encoding" in names:
                self.chunked = True
        headers.append((b"connection", b"keep-alive" if self.keep_alive else b"close"))
        return response_head(self.status, headers)


class Lifespan:
    """The app's ASGI lifespan: startup before serving, shutdown after. An app without lifespan
    support (it raises on the lifespan scope) is fine."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.state: dict[str, Any] = {}
        self._inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._started: asyncio.Future[str] | None = None
        self._stopped: asyncio.Future[str] | None = None
        self._task: asyncio.Task[None] | None = None
        self.supported = True

    async def startup(self) -> None:
        loop = asyncio.get_running_loop()
        self._started = loop.create_future()
        self._stopped = loop.create_future()
        self._task = loop.create_task(self._main())
        await self._inbox.put({"type": "lifespan.startup"})
        outcome = await self._started
        if outcome.startswith("failed"):
            raise RuntimeError("fallback app startup failed")

    async def shutdown(self, timeout: float = 10.0) -> None:
        if self._task is None:
            return
        if self.supported and not self._task.done():
            await self._inbox.put({"type": "lifespan.shutdown"})
            assert self._stopped is not None
            try:
                await asyncio.wait_for(asyncio.shield(self._stopped), timeout)
            except TimeoutError:
                log.warning("fallback app shutdown timed out")
        if not self._task.done():
            self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self._task = None

    async def _main(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": self.state}
        try:
            await self.app(scope, self._inbox.get, self._send)
        except asyncio.CancelledError:
            raise
        except BaseException:
            if self._started is not None and not self._started.done():
                self.supported = False
                log.info("fallback app has no lifespan support")
            else:
                log.exception("fallback app lifespan failed")
        finally:
            for f in (self._started, self._stopped):
                if f is not None and not f.done():
                    f.set_result("ended")

    async def _send(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "lifespan.startup.complete" and self._started and not self._started.done():
            self._started.set_result("complete")
        elif kind == "lifespan.startup.failed" and self._started and not self._started.done():
            self._started.set_result("failed: " + str(message.get("message", "")))
        elif (
            kind in ("lifespan.shutdown.complete", "lifespan.shutdown.failed")
            and self._stopped
            and not self._stopped.done()
        ):
            self._stopped.set_result(kind)
