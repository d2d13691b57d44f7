"""UPF's own HTTP/1.1 front door: an asyncio Protocol server that routes each request to a role's
plain-function handlers, else to its ASGI app.

Why not granian: a publish through granian's ASGI bridge crosses a Rust I/O thread, an ASGI scope and
message dicts; here the head is parsed once (``http11``) and the handler awaited directly, which is
what lets the writer's CPU per publish approach a bare ASGI app's. The pusher serves its subscriptions
on a subclass (``upf_pusher.server``): a role adds routes by overriding ``HttpProtocol._route``.

- ``OPTIONS`` on any path: the CORS preflight, as ntfy answers it.
- The ops routes (health, heartbeats, version, metrics): the role's ops ``Handler``.
- A request the optional ``handler`` wants (the writer's publish): its body is read here and the
  handler awaited directly -- one parse, no ASGI.
- Anything else: the optional fallback ASGI app (the writer's cold routes), else 404.

Limits: a request head over 16 KB is 431; a head not complete within ``HEAD_TIMEOUT`` seconds, or a
keep-alive connection idle for ``IDLE_TIMEOUT``, is closed. A connection's last reply is followed by a
lingering close: what the peer still sends (a body refused with 413, unread) is read and dropped until
it closes, for up to ``LINGER_SECS`` and ``LINGER_BYTES``, so the reply is not lost to a reset. A peer address holding
``max_connections_per_ip`` connections gets 429 (42903) on the next one's first request (exempt peers:
``limit_exempt`` and ``proxy_trusted``). Accepting backs off while descriptors run out (``Acceptor``).
Error replies are ntfy's JSON.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from typing import Any

from upf_keyspace import Settings

from .asgi_bridge import INTERNAL_ERROR, MAX_BODY, ASGIApp, Cycle, Lifespan
from .errors import NOT_FOUND, NtfyError, Problem
from .handler import NO_BODY, PREFLIGHT, Handler
from .http11 import HttpError, RequestBody, RequestHead, error_response, find_head_end, parse_head, reply_response
from .limits import LIMITS_DOCS
from .limits_os import Acceptor, PeerCounter
from .serve import bound_socket

__all__ = ["FrontDoor", "HttpProtocol", "HandlerCycle", "keeps", "HEAD_TIMEOUT", "IDLE_TIMEOUT", "SHUTTING_DOWN"]

log = logging.getLogger("upf.edge.frontdoor")

HEAD_TIMEOUT = 30.0
IDLE_TIMEOUT = 75.0
SWEEP_SECS = 0.5  # how late a timeout may fire
LISTEN_BACKLOG = 4096
_monotonic = time.monotonic
_MAX_PENDING = 64 * 1024
REFUSED_HEAD_TIMEOUT = 5.0
"""How long a connection over its address's cap may take to send the head its 429 answers."""
_TASK_NAME = "upf-request"  # every request's task: a fixed name, none formatted per task
TOO_MANY_CONNECTIONS = NtfyError(Problem(42903, 429, "limit reached: too many open connections", LIMITS_DOCS))
SHUTTING_DOWN = Problem(50300, 503, "service unavailable: shutting down")
LINGER_SECS = 30.0
LINGER_BYTES = 32 * 1024 * 1024
"""A lingering close's limits (nginx's ``lingering_close``, its ``lingering_time``): a client that writes
a whole refused body before it reads (most do: curl without ``Expect``, Go, urllib3) gets its 413. The
kernel answers a close with bytes still unread by a reset, which can reach the client before it has
read the reply. 32 MiB covers the 15 MB attachment a client of ntfy's default limits may send."""


_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class HandlerCycle:
    """One request served by the ``upf_edge`` handler: read its body, await the handler, write the reply.

    Same framing as the ASGI fallback (chunked, 100-continue), without an ASGI scope or messages: the
    head parsed once is all the handler needs. A body is read up to ``MAX_BODY`` or the handler's own
    limit, whichever is larger; past the handler's limit the handler answers (its own 413)."""

    __slots__ = ("owner", "head", "handler", "limit", "reader", "task", "keep_alive")

    def __init__(self, owner: HttpProtocol, head: RequestHead, handler: Handler) -> None:
        self.owner = owner
        self.head = head
        self.handler = handler
        self.limit = handler.body_limit(head.method, head.path[1:], head.headers, head.query_string)
        """The most body bytes the handler takes (``NO_BODY``: none is read)."""
        self.reader: RequestBody | None = None
        self.task: asyncio.Task[None] | None = None
        self.keep_alive = head.keep_alive

    def begin(self, buf: bytes) -> bytes | None:
        """As ``Cycle.begin``: the bytes after the body once it is complete (the handler then runs).

        A body the handler would refuse as too large and that is not worth reading (a declared length
        over ``MAX_BODY``, or over the handler's limit from a client waiting on ``Expect:
        100-continue``) gets the handler's own 413 at once, as one under ``MAX_BODY`` does once read;
        the connection then closes, its body unread."""
        head = self.head
        limit = self.limit
        try:
            self.reader = RequestBody(head, MAX_BODY if limit == NO_BODY else max(MAX_BODY, limit))
        except HttpError as e:
            if e.problem.http != 413 or limit == NO_BODY:
                raise
            return self._too_large()
        if self.reader.expect_continue:
            if limit != NO_BODY and head.content_length is not None and head.content_length > limit:
                return self._too_large()
            if limit != NO_BODY:  # the handler's 401 or 403 comes before the body is asked for
                self.task = self.owner.spawn(self._admit(buf))
                return None
            self.owner.transport.write(_CONTINUE)
        return self.feed(buf)

    async def _admit(self, buf: bytes) -> None:
        """Ask the handler whether the body is wanted; while it decides, what arrives waits in the
        owner's buffer (``reading_body`` is false). Refused: the reply, and the connection closes with
        the body unread (a lingering close drops it). Else ``100 Continue`` and the body is read."""
        head = self.head
        owner = self.owner
        try:
            refusal = await self.handler.admit(
                head.method, head.path[1:], head.headers, head.query_string, owner.client
            )
        except asyncio.CancelledError:
            raise
        except Exception:  # the request's own call meets it again, and answers
            log.exception("handler admit failed", extra={"method": head.method})
            refusal = None
        t = owner.transport
        if owner.gone or t.is_closing() or owner.cycle is not self:
            return
        if refusal is not None:
            self.keep_alive = False
            t.write(reply_response(refusal, keep_alive=False, head_only=head.method == "HEAD"))
            owner.cycle_done(self, False)
            return
        self.task = None
        t.write(_CONTINUE)
        pending, owner.buf = owner.buf, b""
        owner.feed_body(self, buf + pending)
        if self.reading_body and owner.eof:  # half-closed before its body came: it never will
            t.close()
        elif not t.is_closing():
            t.resume_reading()

    def feed(self, data: bytes) -> bytes | None:
        assert self.reader is not None
        try:
            rest = self.reader.feed(data)
        except HttpError as e:  # a chunked body past the cap: the handler's 413, as for a declared one
            if e.problem.http != 413 or self.limit == NO_BODY:
                raise
            return self._too_large()
        if rest is not None:
            self.task = self.owner.spawn(self._run(self.reader.body))
        return rest

    def _too_large(self) -> bytes:
        self.keep_alive = False
        self.task = self.owner.spawn(self._run(None))
        return b""

    @property
    def reading_body(self) -> bool:
        return self.task is None

    def connection_lost(self) -> None:
        """Nothing to wake: the handler finishes its store call; its reply is dropped."""

    async def _run(self, raw: bytes | None) -> None:
        head = self.head
        method = head.method
        t = self.owner.transport
        finished = False
        try:
            limit = self.limit
            body = b"" if limit == NO_BODY else raw if raw is not None and len(raw) <= limit else None
            reply = await self.handler(method, head.path[1:], head.headers, head.query_string, body, self.owner.client)
            if self.owner.door.closing:
                self.keep_alive = False  # shutting down: this reply is the connection's last
            if not t.is_closing():
                t.write(reply_response(reply, keep_alive=self.keep_alive, head_only=method == "HEAD"))
            finished = True
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("handler failed", extra={"method": method})  # never the path: it names a topic
            if not t.is_closing():
                t.write(error_response(INTERNAL_ERROR))
        finally:
            self.owner.cycle_done(self, self.keep_alive and finished)


def keeps(head: RequestHead) -> bool:
    """Whether the connection serves another request after this one, for a request whose body is
    never read (a subscribe, a preflight): not if it has one, whose bytes would otherwise be parsed
    as the next request (a request hidden in a GET's body, as ntfy's server, which discards unread
    bodies, never runs it)."""
    return head.keep_alive and not head.content_length and not head.chunked


class HttpProtocol(asyncio.Protocol):
    """A connection until it is routed: parses heads, answers ops and errors, runs handler and fallback cycles."""

    __slots__ = (
        "door",
        "transport",
        "client",
        "buf",
        "busy",
        "deadline",
        "cycle",
        "gone",
        "admitted",
        "paused",
        "lingered",
        "idle",
        "eof",
    )

    def __init__(self, door: FrontDoor) -> None:
        self.door = door
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # set by connection_made before any use
        self.client = ""
        """The peer's IP ("" when the socket has none): who the request limit counts."""
        self.buf = b""
        self.busy = False
        self.deadline = 0.0  # time.monotonic() past which _timeout runs (0: none); see FrontDoor._sweep
        self.cycle: Cycle | HandlerCycle | None = None
        self.gone = False
        self.admitted = True
        """Counted against its address's connection cap (False: over it, its first request gets 429)."""
        self.paused = False
        """The peer is not reading our replies (above the write buffer's high mark): the next request
        waits. asyncio tells a transport's protocol once, so this also goes to whichever protocol
        takes the connection next."""
        self.lingered = -1
        """Bytes dropped since the last reply (``_linger``); -1 while the connection serves requests."""
        self.idle = False
        """Waiting between requests (``IDLE_TIMEOUT``): the next head's first bytes start its own
        ``HEAD_TIMEOUT``, as Go's server times a keep-alive connection's next head."""
        self.eof = False
        """The peer half-closed while its request ran (``eof_received``): reply, then close."""

    # --- asyncio callbacks --------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # asyncio passes a BaseTransport; a stream server's is a Transport
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and peer:
            self.client = str(peer[0])
        door = self.door
        door._http.add(self)
        if door._sweeper is None:
            door._arm_sweeper()
        self.admitted = door.peers.acquire(self.client)
        self._arm(HEAD_TIMEOUT if self.admitted else REFUSED_HEAD_TIMEOUT)
        if door.closing:  # accepted before the stop, made after it: as the stop's idle connections
            transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.admitted and not self.gone:
            self.door.peers.release(self.client)
        self.gone = True
        self._disarm()
        self.door._http.discard(self)
        if self.cycle is not None:
            self.cycle.connection_lost()

    def data_received(self, data: bytes) -> None:
        cycle = self.cycle
        if cycle is not None and cycle.reading_body:
            self.feed_body(cycle, data)
            return
        scanned = len(self.buf)
        self.buf += data
        if self.busy or self.paused:
            if self.lingered >= 0:
                self._drop()
                return
            if len(self.buf) > _MAX_PENDING:
                self.transport.pause_reading()
            return
        self._process(scanned)

    def feed_body(self, cycle: Cycle | HandlerCycle, data: bytes) -> None:
        """Body bytes for ``cycle``; once the body is whole, what follows it is the next request's."""
        try:
            rest = cycle.feed(data)
        except HttpError as e:
            self._refuse(e)
            return
        if rest is not None:
            self._disarm()
            self.buf = rest

    def eof_received(self) -> bool | None:
        """The peer half-closed. A request it sent whole still runs and is answered, then the
        connection closes, as Go's server does: a publish is stored, and a client that got no reply
        would send it again. Between requests, mid-head, mid-body (nothing runs) or lingering: close
        now (asyncio closes the transport when this returns a false value)."""
        cycle = self.cycle
        if self.busy and self.lingered < 0 and not (cycle is not None and cycle.reading_body):
            self.eof = True
            return True
        return None

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if not self.busy and not self.gone and not self.transport.is_closing():
            self.transport.resume_reading()
            self._process()

    # --- timers -------------------------------------------------------------------------------------
    # A deadline, not a loop timer: arming and cancelling a TimerHandle on every request of a keep-alive
    # connection cost ~3.5 us (measured; a float store is ~0.2 us), about half of parsing its head, and
    # leaves a cancelled 75 s timer in the loop's heap per request; one sweep every SWEEP_SECS
    # (FrontDoor._sweep) enforces all the deadlines.
    def _arm(self, secs: float) -> None:
        self.deadline = _monotonic() + secs

    def _disarm(self) -> None:
        self.deadline = 0.0

    def _timeout(self) -> None:
        """No request head (or no request body) in time, idle too long between requests, or lingering
        for ``LINGER_SECS``: close."""
        self.deadline = 0.0
        if not self.busy or self.lingered >= 0 or (self.cycle is not None and self.cycle.reading_body):
            self.transport.close()

    # --- requests -----------------------------------------------------------------------------------
    def _refuse(self, e: NtfyError) -> None:
        """Answer with ntfy's error JSON and close: the stream position is unknown after bad input."""
        if not self.transport.is_closing():
            self.transport.write(error_response(e.problem, extra=e.headers))
            self._linger()

    def _linger(self) -> None:
        """Close after the last reply without resetting it: half-close (the reply, then our FIN), then
        read and drop what the peer still sends until it closes (``eof_received``: asyncio then closes
        the transport), ``LINGER_BYTES`` have come, or ``LINGER_SECS`` have passed (``_timeout``). A
        stopping door closes at once."""
        t = self.transport
        if t.is_closing():
            return
        if self.door.closing or self.eof or not t.can_write_eof():
            t.close()  # (the peer's side is closed already: nothing to drain)
            return
        self.busy = True  # no request is parsed any more
        self.cycle = None  # nor is a body read (a cycle still running ends in ``cycle_done``)
        self.lingered = 0
        t.write_eof()
        t.resume_reading()
        self._arm(LINGER_SECS)
        self._drop()  # what came with the reply's request; past the limit already, it closes now

    def _drop(self) -> None:
        self.lingered += len(self.buf)
        self.buf = b""
        if self.lingered > LINGER_BYTES:
            self.transport.close()

    def _process(self, scanned: int = 0) -> None:
        """Serve the complete requests in ``buf``; ``scanned``: how much of it held no head's end."""
        while not self.busy and not self.paused and not self.gone and not self.transport.is_closing():
            buf = self.buf
            if buf[:2] == b"\r\n":  # empty lines before a request line are ignored (RFC 9112 2.2)
                i = 2
                while buf.startswith(b"\r\n", i):
                    i += 2
                buf = self.buf = buf[i:]
                scanned = max(scanned - i, 0)
            try:
                end = find_head_end(buf, scanned)
                if end < 0:
                    if self.eof:  # the peer sends nothing more: its last complete request is served
                        self.transport.close()
                    elif self.idle and buf:  # a head has begun after the idle wait: its own timeout
                        self.idle = False
                        self._arm(HEAD_TIMEOUT)
                    return
                raw, self.buf = buf[:end], buf[end:]
                head = parse_head(raw)
            except HttpError as e:
                self._refuse(e)
                return
            scanned = 0
            self.idle = False
            self._disarm()
            if not self.admitted:
                self._refuse(TOO_MANY_CONNECTIONS)
                return
            if self._route(head):
                return  # handed over (a subscriber) or waiting on async work

    def _reply(self, head: RequestHead, data: bytes, keep_alive: bool) -> None:
        self.transport.write(data)
        if not keep_alive:
            self._linger()
        else:
            self._wait_idle()

    def _wait_idle(self) -> None:
        self.idle = True
        self._arm(IDLE_TIMEOUT)

    def _route(self, head: RequestHead) -> bool:
        """Serve one request. True when this protocol must stop parsing (handed over, or busy)."""
        door = self.door
        if head.method == "OPTIONS":  # a CORS preflight, answered on every path as ntfy does
            keep = keeps(head)  # a body is never read: close
            self._reply(head, reply_response(PREFLIGHT, keep_alive=keep), keep)
            return False
        if door.ops.wants(head.method, head.path):
            return self._begin(HandlerCycle(self, head, door.ops))
        handler = door.handler
        if handler is not None and handler.wants(head.method, head.path):
            return self._begin(HandlerCycle(self, head, handler))
        if door.fallback is not None:
            return self._begin(Cycle(self, head, door.fallback, door.lifespan.state if door.lifespan else None))
        keep = keeps(head)  # its body is never read: close
        self._reply(head, error_response(NOT_FOUND, keep_alive=keep), keep)
        return False

    def _begin(self, cycle: Cycle | HandlerCycle) -> bool:
        """Hand the request (and what has arrived of its body) to a cycle; parsing waits for it."""
        self.busy = True
        self.cycle = cycle
        buf, self.buf = self.buf, b""
        try:
            rest = cycle.begin(buf)
        except HttpError as e:
            self._refuse(e)
            return True
        if rest is not None:
            self.buf = rest
        else:
            self._arm(HEAD_TIMEOUT)  # a body that never arrives
        return True

    def _resume(self) -> None:
        """Parse what arrived while a request waited (pipelined requests)."""
        self.busy = False
        if not self.gone and not self.transport.is_closing():
            self.transport.resume_reading()
            self._process()

    def _handover(self) -> None:
        """The connection now belongs to another protocol (a subscriber): this one is done with it."""
        self.gone = True
        self._disarm()
        self.door._http.discard(self)

    def adopt(
        self, transport: asyncio.Transport, client: str, pipelined: bytes, paused: bool, eof: bool = False
    ) -> None:
        """Serve the next requests of a connection another protocol gives back (a keep-alive poll's). It
        was counted against its address's cap when it was accepted, and this protocol releases that
        count. ``paused``: the previous reply is still above the write buffer's high mark, so the next
        request waits for ``resume_writing``, which asyncio now calls on this protocol. ``eof``: the
        peer half-closed meanwhile: what it pipelined is served, then the connection closes."""
        self.transport = transport
        self.client = client
        self.buf = pipelined
        self.paused = paused
        self.eof = eof
        transport.set_protocol(self)
        door = self.door
        door._http.add(self)
        if door.closing:
            transport.close()
            return
        if door._sweeper is None:
            door._arm_sweeper()
        self._wait_idle()
        self._process()

    # --- cycles -------------------------------------------------------------------------------------
    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        return self.door.spawn(coro)

    def cycle_done(self, cycle: Cycle | HandlerCycle, keep_alive: bool) -> None:
        self.cycle = None
        if self.lingered >= 0:
            return  # refused while it ran: the connection is closing, what arrives is dropped
        self.busy = False
        if self.gone or self.transport.is_closing():
            return
        if not keep_alive or self.door.closing:
            self._linger()
            return
        if not self.eof:
            self.transport.resume_reading()
        self._wait_idle()
        self._process()


class FrontDoor:
    """A listening socket and its HTTP connections, serving a role's ops routes, its direct handler and
    its fallback ASGI app (whose lifespan this runs).

    ``start()`` binds (unless given a socket), runs the fallback's lifespan startup and the role's
    ``_starting``, then listens; ``stop()`` stops accepting, closes idle keep-alive connections, lets
    requests whose body has arrived finish and get their reply within the grace, then cuts the rest
    and runs the lifespan shutdown. A role (the pusher) subclasses it for its own start and stop and
    sets ``protocol`` to its ``HttpProtocol`` subclass.
    """

    protocol: type[HttpProtocol] = HttpProtocol

    def __init__(
        self,
        settings: Settings,
        ops: Handler,
        *,
        role: str,
        fallback: ASGIApp | None = None,
        handler: Handler | None = None,
    ) -> None:
        """``role`` is named in the start and stop log lines (an attribute: the messages are static)."""
        self.settings = settings
        self.role = role
        self.ops = ops
        self.fallback = fallback
        self.handler = handler
        self.lifespan: Lifespan | None = Lifespan(fallback) if fallback is not None else None
        self.closing = False
        self.peers = PeerCounter(settings.max_connections_per_ip, settings.limit_exempt + settings.proxy_trusted)
        """Connections per peer address (a trusted proxy carries many clients: it is not counted)."""
        self._acceptor: Acceptor | None = None
        self._http: set[HttpProtocol] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None  # set by start: spawn's tasks are made on it
        self._sweeper: asyncio.TimerHandle | None = None

    @property
    def port(self) -> int:
        assert self._acceptor is not None
        return int(self._acceptor.sock.getsockname()[1])

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return (self._acceptor.sock,) if self._acceptor is not None else ()

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        """A task ``stop`` waits for within the grace (a request being served), then cancels.

        Made on the loop ``start`` listened on, named: ``get_running_loop()`` asks the kernel for the
        process id on every call (asyncio's check for a fork), and ``create_task`` formats a name
        ("Task-N") per task: ~1 us of every request (BENCHMARKS.md, forty-third pass). A loop with a
        task factory gets its own tasks."""
        loop = self._loop
        if loop is not None:
            task: asyncio.Task[Any] = asyncio.Task(coro, loop=loop, name=_TASK_NAME)
        else:
            task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _arm_sweeper(self) -> None:
        """Sweep while an unrouted connection exists, not forever: an idle node takes no timer wake-ups."""
        if not self.closing:
            self._sweeper = asyncio.get_running_loop().call_later(SWEEP_SECS, self._sweep)

    def _sweep(self) -> None:
        """Run the timeout of every connection past its deadline (see HttpProtocol._arm)."""
        self._sweeper = None
        now = _monotonic()
        for proto in [p for p in self._http if p.deadline and p.deadline <= now]:
            proto._timeout()
        if self._http:
            self._arm_sweeper()

    async def start(
        self, *, host: str | None = None, port: int | None = None, sock: socket.socket | None = None
    ) -> None:
        """Bind (settings' bind address by default), run the fallback's lifespan startup and the role's
        ``_starting``, then listen. The bind comes first so a busy port fails before anything runs; a
        start that fails or is cancelled (a SIGTERM while a store call hangs) stops what it had started."""
        own = sock is None
        if sock is None:
            sock = bound_socket(
                self.settings.bind_host if host is None else host, self.settings.bind_port if port is None else port
            )
        try:
            if self.lifespan is not None:
                await self.lifespan.startup()
            await self._starting()
            sock.listen(LISTEN_BACKLOG)
            loop = asyncio.get_running_loop()
            self._acceptor = Acceptor(loop, sock, lambda: self.protocol(self))
            self._loop = loop if loop.get_task_factory() is None else None
            self._acceptor.start()
        except BaseException:
            await self._undo_start(sock if own else None)
            raise
        log.info(
            "front door listening",
            extra={
                "role": self.role,
                "port": self.port,
                "node": self.settings.node_id,
                "fallback": self.fallback is not None,
                "handler": self.handler is not None,
            },
        )

    async def _starting(self) -> None:
        """The role's start, after the fallback's lifespan startup and before listening."""

    async def _unstarting(self) -> None:
        """Undo what ``_starting`` began (it may have failed part-way)."""

    async def _stopping(self, grace: float, deadline: float) -> None:
        """The role's stop, after accepting stopped and idle connections closed, while requests in
        flight run on; ``grace`` is the whole stop's, which ends at ``deadline`` (time.monotonic)."""

    async def _stopped(self) -> None:
        """The role's last step, after the fallback's lifespan shutdown."""

    async def _undo_start(self, sock: socket.socket | None) -> None:
        """Stop what a failed start began; close the socket it bound."""
        self.closing = True
        if self._acceptor is not None:
            self._acceptor.close()
            await self._acceptor.wait_closed()
            self._acceptor = None
        elif sock is not None:
            sock.close()
        await self._unstarting()
        if self.lifespan is not None:
            await self.lifespan.shutdown()

    async def stop(self, timeout: float | None = None) -> None:
        """Graceful shutdown within ``timeout`` seconds (default: ``shutdown_grace_secs``).

        Stop accepting; close idle keep-alive connections; run the role's ``_stopping``; let requests
        whose body has fully arrived finish and get their reply (then the connection closes); then cut
        whatever remains (a request body still arriving, a stuck store call)."""
        if self.closing:
            return
        self.closing = True
        grace = self.settings.shutdown_grace_secs if timeout is None else timeout
        deadline = time.monotonic() + grace
        log.info("front door stopping", extra={"role": self.role, "node": self.settings.node_id, "grace": grace})
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        if self._acceptor is not None:
            self._acceptor.close()
            await self._acceptor.wait_closed()
        for proto in list(self._http):
            if not proto.busy or proto.lingered >= 0:
                proto.transport.close()
        await self._stopping(grace, deadline)
        while self._tasks and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for proto in list(self._http):
            proto.transport.abort()
        await asyncio.sleep(0)  # let connection_lost callbacks run
        if self.lifespan is not None:
            await self.lifespan.shutdown()
        await self._stopped()
        log.info("front door stopped", extra={"role": self.role, "node": self.settings.node_id})
