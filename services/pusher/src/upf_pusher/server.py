"""The pusher's front door: an asyncio Protocol HTTP/1.1 server that routes each request.

- ``GET /{topics}/ws|json|sse|raw``: a subscribe. The connection is handed to a transport adapter
  (``transport.set_protocol``) and the hub; this object is dropped, so an idle subscriber carries
  nothing of the request parsing. A poll on a keep-alive connection hands it back when its reply has
  ended (``Pusher.take_back``): a fresh one of these parses the next request.
- ``GET /v1/health``, ``/__lbheartbeat__``, ``/__heartbeat__``, ``/__version__``, ``/metrics``
  (Prometheus text: every metric of this process, so in the all-in-one program every role's): the ops
  routes every role shares (``upf_edge.ops``), served like the handler below.
- A request the optional ``handler`` wants (an ``upf_edge.Handler``: the writer's publish, in the
  all-in-one program): its body is read here and the handler awaited directly -- one parse, no ASGI.
- Anything else: the optional fallback ASGI app (the writer's cold routes, in the all-in-one program),
  else 404.

Limits: a request head over 16 KB is 431; a head not complete within ``HEAD_TIMEOUT`` seconds, or a
keep-alive connection idle for ``IDLE_TIMEOUT``, is closed. A peer address holding
``max_connections_per_ip`` connections gets 429 (42903) on the next one's first request (exempt peers:
``limit_exempt`` and ``proxy_trusted``). Accepting backs off while descriptors run out (``Acceptor``).
Error replies are ntfy's JSON.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
import time
from collections.abc import Callable
from importlib import metadata
from typing import Any

from websockets.exceptions import InvalidHandshake, InvalidUpgrade

from upf_edge import NO_BODY, Handler
from upf_edge.access import Identity
from upf_edge.errors import NOT_FOUND, NtfyError, Problem
from upf_edge.gate import AccessGate, Credential, auth_param
from upf_edge.handler import PREFLIGHT
from upf_edge.http11 import (
    HttpError,
    RequestBody,
    RequestHead,
    error_response,
    find_head_end,
    header_list,
    parse_head,
    reply_response,
)
from upf_edge.limiter import RequestLimiter, presents_credentials
from upf_edge.limits import LIMITS_DOCS
from upf_edge.limits_os import Acceptor, PeerCounter
from upf_edge.ops import MetricsAccess, OpsRoutes
from upf_edge.serve import bound_socket
from upf_keyspace import Settings, Store
from upf_keyspace import telemetry as tm

from . import __version__
from .asgi_bridge import INTERNAL_ERROR, MAX_BODY, ASGIApp, Cycle, Lifespan
from .hub import Hub
from .query import Subscribe, match_subscribe_path, parse_subscribe
from .session import new_session
from .transports import KeptAlive, StreamSubscriber, Subscriber, WsSubscriber, ws_handshake

__all__ = ["Pusher", "serve", "HEAD_TIMEOUT", "IDLE_TIMEOUT"]

log = logging.getLogger("upf.pusher.server")

HEAD_TIMEOUT = 30.0
IDLE_TIMEOUT = 75.0
STORE_CHECK_TIMEOUT = 5.0
SWEEP_SECS = 0.5  # how late a timeout may fire
_monotonic = time.monotonic
_MAX_PENDING = 64 * 1024
REFUSED_HEAD_TIMEOUT = 5.0
"""How long a connection over its address's cap may take to send the head its 429 answers."""
_TOO_MANY_CONNECTIONS = NtfyError(Problem(42903, 429, "limit reached: too many open connections", LIMITS_DOCS))
_SHUTTING_DOWN = Problem(50300, 503, "service unavailable: shutting down")
_NOT_WEBSOCKET = Problem(
    40016,
    400,
    "invalid request: client not using the websocket protocol",
    "https://ntfy.sh/docs/subscribe/api/#websockets",
)
_BAD_HANDSHAKE = Problem(40000, 400, "invalid request: bad websocket handshake")


def _package_version() -> str:
    try:
        return metadata.version("upf-pusher")
    except metadata.PackageNotFoundError:
        return __version__


class HandlerCycle:
    """One request served by the ``upf_edge`` handler: read its body, await the handler, write the reply.

    Same framing and limits as the ASGI fallback (``MAX_BODY``, chunked, 100-continue), without an
    ASGI scope or messages: the head parsed once is all the handler needs."""

    __slots__ = ("owner", "head", "handler", "reader", "task", "keep_alive")

    def __init__(self, owner: HttpProtocol, head: RequestHead, handler: Handler) -> None:
        self.owner = owner
        self.head = head
        self.handler = handler
        self.reader: RequestBody | None = None
        self.task: asyncio.Task[None] | None = None
        self.keep_alive = head.keep_alive

    def begin(self, buf: bytes) -> bytes | None:
        """As ``Cycle.begin``: the bytes after the body once it is complete (the handler then runs).

        A client waiting on ``Expect: 100-continue`` with a declared length over the handler's limit gets
        the handler's 413 instead of the go-ahead, and the connection then closes (its body is never read)."""
        head = self.head
        self.reader = RequestBody(head, MAX_BODY)
        if self.reader.expect_continue:
            limit = self.handler.body_limit(head.method, head.path[1:])
            if limit != NO_BODY and head.content_length is not None and head.content_length > limit:
                self.keep_alive = False
                self.task = self.owner.spawn(self._run(None))
                return b""
            self.owner.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        return self.feed(buf)

    def feed(self, data: bytes) -> bytes | None:
        assert self.reader is not None
        rest = self.reader.feed(data)
        if rest is not None:
            self.task = self.owner.spawn(self._run(self.reader.body))
        return rest

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
            topic = head.path[1:]
            limit = self.handler.body_limit(method, topic)
            body = b"" if limit == NO_BODY else raw if raw is not None and len(raw) <= limit else None
            reply = await self.handler(method, topic, head.headers, head.query_string, body, self.owner.client)
            if self.owner.pusher.closing:
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


def _keeps(head: RequestHead) -> bool:
    """Whether the connection serves another request after this one, for a request whose body is
    never read (a subscribe, a preflight): not if it has one, whose bytes would otherwise be parsed
    as the next request (a request hidden in a GET's body, as ntfy's server, which discards unread
    bodies, never runs it)."""
    return head.keep_alive and not head.content_length and not head.chunked


class HttpProtocol(asyncio.Protocol):
    """A connection until it is routed: parses heads, answers ops and errors, runs handler and fallback cycles."""

    __slots__ = ("pusher", "transport", "client", "buf", "busy", "deadline", "cycle", "gone", "admitted", "paused")

    def __init__(self, pusher: Pusher) -> None:
        self.pusher = pusher
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # set by connection_made before any use
        self.client = ""
        """The peer's IP ("" when the socket has none): who the request limit counts."""
        self.buf = b""
        self.busy = False
        self.deadline = 0.0  # time.monotonic() past which _timeout runs (0: none); see Pusher._sweep
        self.cycle: Cycle | HandlerCycle | None = None
        self.gone = False
        self.admitted = True
        """Counted against its address's connection cap (False: over it, its first request gets 429)."""
        self.paused = False
        """The peer is not reading our replies (above the write buffer's high mark): the next request
        waits. asyncio tells a transport's protocol once, so this also goes to whichever protocol
        takes the connection next."""

    # --- asyncio callbacks --------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # asyncio passes a BaseTransport; a stream server's is a Transport
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and peer:
            self.client = str(peer[0])
        self.pusher._http.add(self)
        if self.pusher._sweeper is None:
            self.pusher._arm_sweeper()
        self.admitted = self.pusher.peers.acquire(self.client)
        self._arm(HEAD_TIMEOUT if self.admitted else REFUSED_HEAD_TIMEOUT)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.admitted and not self.gone:
            self.pusher.peers.release(self.client)
        self.gone = True
        self._disarm()
        self.pusher._http.discard(self)
        if self.cycle is not None:
            self.cycle.connection_lost()

    def data_received(self, data: bytes) -> None:
        cycle = self.cycle
        if cycle is not None and cycle.reading_body:
            try:
                rest = cycle.feed(data)
            except HttpError as e:
                self._refuse(e)
                return
            if rest is not None:
                self._disarm()
                self.buf = rest
            return
        self.buf += data
        if self.busy or self.paused:
            if len(self.buf) > _MAX_PENDING:
                self.transport.pause_reading()
            return
        self._process()

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
    # (Pusher._sweep) enforces all the deadlines.
    def _arm(self, secs: float) -> None:
        self.deadline = _monotonic() + secs

    def _disarm(self) -> None:
        self.deadline = 0.0

    def _timeout(self) -> None:
        """No request head (or no request body) in time, or idle too long between requests: close."""
        self.deadline = 0.0
        if not self.busy or (self.cycle is not None and self.cycle.reading_body):
            self.transport.close()

    # --- requests -----------------------------------------------------------------------------------
    def _refuse(self, e: NtfyError) -> None:
        """Answer with ntfy's error JSON and close: the stream position is unknown after bad input."""
        if not self.transport.is_closing():
            self.transport.write(error_response(e.problem, extra=e.headers))
            self.transport.close()

    def _process(self) -> None:
        while not self.busy and not self.paused and not self.gone and not self.transport.is_closing():
            try:
                end = find_head_end(self.buf)
                if end < 0:
                    return
                raw, self.buf = self.buf[:end], self.buf[end:]
                head = parse_head(raw)
            except HttpError as e:
                self._refuse(e)
                return
            self._disarm()
            if not self.admitted:
                self._refuse(_TOO_MANY_CONNECTIONS)
                return
            if self._route(head):
                return  # handed over (subscriber) or waiting on async work

    def _reply(self, head: RequestHead, data: bytes, keep_alive: bool) -> None:
        self.transport.write(data)
        if not keep_alive:
            self.transport.close()
        else:
            self._arm(IDLE_TIMEOUT)

    def _route(self, head: RequestHead) -> bool:
        """Serve one request. True when this protocol must stop parsing (handed over, or busy)."""
        p = self.pusher
        keep = head.keep_alive
        if head.method == "GET":
            match = match_subscribe_path(head.path)
            if match is not None:
                return self._subscribe(head, *match)
        elif head.method == "OPTIONS":  # a CORS preflight, answered on every path as ntfy does
            keep = _keeps(head)  # a body is never read: close
            self._reply(head, reply_response(PREFLIGHT, keep_alive=keep), keep)
            return False
        if p.ops.wants(head.method, head.path):
            return self._begin(HandlerCycle(self, head, p.ops))
        handler = p.handler
        if handler is not None and handler.wants(head.method, head.path):
            return self._begin(HandlerCycle(self, head, handler))
        if p.fallback is not None:
            return self._begin(Cycle(self, head, p.fallback, p.lifespan.state if p.lifespan else None))
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

    def _subscribe(self, head: RequestHead, topics_raw: str, transport_name: str) -> bool:
        p = self.pusher
        keep = _keeps(head)
        try:
            headers, query = head.header_map(), head.query()
            req = parse_subscribe(
                topics_raw, transport_name, headers, query, time.time, p.settings.max_topics_per_subscribe
            )
        except HttpError as e:  # the head itself (a query that is not UTF-8): the stream is in doubt
            self._refuse(e)
            return True
        except NtfyError as e:
            self._reply(head, error_response(e.problem, keep_alive=keep), keep)
            return False
        if p.closing:
            self._reply(head, error_response(_SHUTTING_DOWN), False)
            return True
        # ntfy's order: bad credentials (401), then the request limit (429), then a denied topic (403;
        # one denied topic fails them all). A subscribe is a request: it spends a token.
        try:
            forwarded = header_list(head.headers, p.limiter.header)
            if (
                p.limiter.visitor(None, self.client, forwarded) is not None
                or p.limiter.wants_rates(req.topics)
                or (not p.gate.open and presents_credentials(headers.get("authorization"), auth_param(query)))
            ):  # an exempt peer's login attempts still count (ntfy's failed-login limit exempts no one)
                self.busy = True  # parsing waits while the store is asked (leases, failed logins, counts)
                p._spawn(self._subscribe_limited(head, req, transport_name, headers, query, forwarded))
                return True
            who = p.gate.identify(headers.get("authorization"), auth_param(query))
            p.gate.authorize(who, req.topics, write=False)
        except NtfyError as e:
            self._reply(head, error_response(e.problem, keep_alive=keep, extra=e.headers), keep)
            return False
        return self._attach(head, req, transport_name)

    async def _subscribe_limited(
        self, head: RequestHead, req: Subscribe, transport_name: str, headers: Any, query: Any, forwarded: str | None
    ) -> None:
        """A subscribe of a visitor the limits apply to, in ntfy's order: credentials (401, or 42909
        after too many failures), the request limit (42901), the ACL (403), then the visitor's open
        subscriptions across the fleet (42903; a poll holds none)."""
        p = self.pusher
        keep = _keeps(head)
        limiter = p.limiter
        visitor: str | None = None
        changes = p.gate.changes
        credential = (headers.get("authorization"), auth_param(query))
        try:
            who: Identity = await limiter.identify(p.gate, *credential, self.client, forwarded)
            visitor = limiter.visitor(who.user, self.client, forwarded)
            await limiter.check(visitor)
            p.gate.authorize(who, req.topics, write=False)
            await limiter.touch_topics(req.topics, visitor)  # 42904 (ntfy answers a subscribe 400 40009)
            if limiter.wants_rates(req.topics):  # ntfy: only on topics the subscriber may write
                writable = [t for t in req.topics if p.gate.open or p.gate.authorizer.permission(who, t).write]
                await limiter.set_rate_visitors(writable, limiter.visitor_of(who.user, self.client, forwarded))
            if req.poll:
                visitor = None
            else:
                await limiter.open_subscription(visitor, p.hub.node)
        except NtfyError as e:
            if not self.gone and not self.transport.is_closing():
                self._reply(head, error_response(e.problem, keep_alive=keep, extra=e.headers), keep)
                self._resume()
            return
        node = p.hub.node

        def uncount() -> None:
            limiter.close_subscription(visitor, node)

        if self.gone or self.transport.is_closing():
            uncount()
            return
        if p.closing:
            uncount()
            self._reply(head, error_response(_SHUTTING_DOWN), False)
            return
        if p.gate.changes != changes:  # an auth change while the store was asked: the hub's
            try:  # re-check of its streams (Pusher._auth_changed) did not see this one yet
                p.gate.check(*credential, req.topics, write=False)
            except NtfyError as e:
                uncount()
                self._reply(head, error_response(e.problem, keep_alive=keep, extra=e.headers), keep)
                self._resume()
                return
        on_close = uncount if visitor is not None else None
        if not self._attach(head, req, transport_name, on_close, credential if who.user is not None else None):
            self._resume()

    def _resume(self) -> None:
        """Parse what arrived while a request waited (pipelined requests)."""
        self.busy = False
        if not self.gone and not self.transport.is_closing():
            self.transport.resume_reading()
            self._process()

    def _attach(
        self,
        head: RequestHead,
        req: Subscribe,
        transport_name: str,
        on_close: Any = None,
        credential: Credential | None = None,
    ) -> bool:
        """Hand the admitted subscribe's connection to its transport and the hub (False: refused).
        ``on_close`` runs once when the subscription ends (or at once, when it is refused here);
        ``credential``: what an authenticated subscriber logged in with (None: anonymous)."""
        answer, taken = self._attach_sub(head, req, transport_name, on_close, credential)
        if not taken and on_close is not None:
            on_close()
        return answer

    def _attach_sub(
        self, head: RequestHead, req: Subscribe, transport_name: str, on_close: Any, credential: Credential | None
    ) -> tuple[bool, bool]:
        """``_attach``'s body: (its answer, whether the hub took the subscriber)."""
        p = self.pusher
        keep = _keeps(head)
        session = new_session(req.topics, req.topics_raw, p.hub.config, poll=req.poll, filter=req.filter)
        sub: Subscriber
        if transport_name == "ws":
            if not head.has_token(b"upgrade", b"websocket"):
                self._reply(head, error_response(_NOT_WEBSOCKET, keep_alive=keep), keep)
                return False, False
            try:
                accept = ws_handshake(head)
            except InvalidUpgrade:
                self._refuse(NtfyError(_NOT_WEBSOCKET))
                return True, False
            except InvalidHandshake:  # RFC 6455 4.4: the versions we speak go with the refusal
                self._refuse(NtfyError(_BAD_HANDSHAKE, ((b"sec-websocket-version", b"13"),)))
                return True, False
            sub = WsSubscriber(p.hub, session, self.transport, accept)
        else:
            sub = StreamSubscriber(p.hub, session, self.transport, transport_name, chunked=head.version == "1.1")
            if req.poll and keep and sub.chunked:
                sub.kept = KeptAlive(functools.partial(p.take_back, self.client))
        rest, self.buf = self.buf, b""
        self._handover()
        if self.admitted:
            sub.peers, sub.peer = p.peers, self.client  # the subscriber releases the count when it goes
        self.transport.set_protocol(sub)
        p.hub.attach(sub, req.since, on_close, credential)
        if self.paused:  # asyncio will not say so again: the subscriber starts paused
            sub.pause_writing()
        if rest:
            sub.data_received(rest)
        return True, True

    def _handover(self) -> None:
        self.gone = True
        self._disarm()
        self.pusher._http.discard(self)

    def adopt(self, transport: asyncio.Transport, client: str, pipelined: bytes, paused: bool) -> None:
        """Serve the next requests of a connection a keep-alive poll gave back. It was counted against
        its address's cap when it was accepted, and this protocol releases that count. ``paused``:
        the poll's reply is still above the write buffer's high mark, so the next request waits for
        ``resume_writing``, which asyncio now calls on this protocol."""
        self.transport = transport
        self.client = client
        self.buf = pipelined
        self.paused = paused
        transport.set_protocol(self)
        p = self.pusher
        p._http.add(self)
        if p.closing:
            transport.close()
            return
        if p._sweeper is None:
            p._arm_sweeper()
        self._arm(IDLE_TIMEOUT)
        self._process()

    # --- fallback cycles ----------------------------------------------------------------------------
    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        return self.pusher._spawn(coro)

    def cycle_done(self, cycle: Cycle | HandlerCycle, keep_alive: bool) -> None:
        self.cycle = None
        self.busy = False
        if self.gone or self.transport.is_closing():
            return
        if not keep_alive or self.pusher.closing:
            self.transport.close()
            return
        self.transport.resume_reading()
        self._arm(IDLE_TIMEOUT)
        self._process()


class Pusher:
    """The pusher role: a listening socket, its connections and the hub.

    ``start()`` binds and serves; ``stop()`` closes every connection cleanly (WebSocket close 1001,
    the last chunk of each stream), stops the hub and releases this node's affinity. The store is the
    caller's: it is neither opened nor closed here.
    """

    def __init__(
        self,
        settings: Settings,
        store: Store,
        *,
        fallback: ASGIApp | None = None,
        handler: Handler | None = None,
        telemetry: tm.Telemetry | None = None,
        metrics: Callable[[], bytes] | None = None,
        program: tuple[str, str] | None = None,
    ) -> None:
        """``metrics`` renders ``GET /metrics`` (default: this process's registry; the all-in-one's
        workers answer for all of them). ``program``: the (name, version) ``GET /__version__`` gives
        (default: upf-pusher's; the all-in-one gives its own)."""
        self.settings = settings
        self.store = store
        self.fallback = fallback
        self.handler = handler
        self.telemetry = tm.current() if telemetry is None else telemetry
        self.lifespan: Lifespan | None = Lifespan(fallback) if fallback is not None else None
        self.hub = Hub(settings, store, self.telemetry)
        registry = self.telemetry.registry
        name, version = program or ("upf-pusher", _package_version())
        self.ops = OpsRoutes(
            name,
            version,
            self.check_store,
            metrics or (lambda: tm.render_metrics(registry)),
            tm.METRICS_CONTENT_TYPE,
            heartbeat_timeout=STORE_CHECK_TIMEOUT + 1.0,
            scrapers=MetricsAccess.of(settings),
        )
        self.closing = False
        self.gate = AccessGate(store, settings.auth_default_access)
        """Replaced at start by the process's shared gate for this store (who may subscribe to what)."""
        self.limiter = RequestLimiter.shared(store, settings)
        """The request limit, shared with a writer in this process on the same store."""
        self.peers = PeerCounter(settings.max_connections_per_ip, settings.limit_exempt + settings.proxy_trusted)
        """Connections per peer address (a trusted proxy carries many clients: it is not counted)."""
        self._acceptor: Acceptor | None = None
        self._http: set[HttpProtocol] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._sweeper: asyncio.TimerHandle | None = None

    @property
    def port(self) -> int:
        assert self._acceptor is not None
        return int(self._acceptor.sock.getsockname()[1])

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return (self._acceptor.sock,) if self._acceptor is not None else ()

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def take_back(self, client: str, transport: asyncio.Transport, pipelined: bytes, paused: bool) -> None:
        """A keep-alive poll's reply has ended: its connection is an HTTP connection again."""
        HttpProtocol(self).adopt(transport, client, pipelined, paused)

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
        """Bind (settings' bind address by default), run the fallback's lifespan startup, start the hub,
        then listen. The bind comes first so a busy port fails before anything runs; a start that fails
        or is cancelled (a SIGTERM while a store call hangs) stops what it had started, as its caller
        closes the store next."""
        own = sock is None
        if sock is None:
            sock = bound_socket(
                self.settings.bind_host if host is None else host, self.settings.bind_port if port is None else port
            )
        gate: AccessGate | None = None
        try:
            if self.lifespan is not None:
                await self.lifespan.startup()
            gate = self.gate = await AccessGate.acquire(self.store, self.settings.auth_default_access)
            gate.listen(self._auth_changed)
            try:
                await self.limiter.reset_node(self.hub.node)  # this node holds no subscription yet
            except Exception:  # a store down at start must not keep the pusher down; the janitor sweeps later
                log.warning("subscription counts not cleared at start", exc_info=True)
            await self.hub.start()
            sock.listen(4096)
            self._acceptor = Acceptor(asyncio.get_running_loop(), sock, lambda: HttpProtocol(self))
            self._acceptor.start()
        except BaseException:
            await self._undo_start(sock if own else None, gate)
            raise
        log.info(
            "pusher listening",
            extra={
                "port": self.port,
                "node": self.settings.node_id,
                "fallback": self.fallback is not None,
                "handler": self.handler is not None,
            },
        )

    async def _undo_start(self, sock: socket.socket | None, gate: AccessGate | None) -> None:
        """Stop what a failed start began: the hub's loops (they would run on under a closed store), the
        gate's watch, the fallback's lifespan; close the socket it bound."""
        self.closing = True
        if self._acceptor is not None:
            self._acceptor.close()
            self._acceptor = None
        elif sock is not None:
            sock.close()
        await self.hub.stop()
        if gate is not None:
            gate.unlisten(self._auth_changed)
            await gate.release()
        if self.lifespan is not None:
            await self.lifespan.shutdown()

    def _auth_changed(self, tokens_only: bool) -> None:
        """An auth change (``upf user|access|token ...``, on any host) or a token's expiry applies to
        open streams too, as ntfy's access reset ends the user's subscriptions: each is checked as a
        new subscribe would be, with the credential it logged in with."""
        if self.closing:
            return
        seen: dict[Credential, Identity | None] = {}
        gate = self.gate
        self._spawn(self.hub.revoke(lambda cred, topics: gate.refusal(cred, topics, seen), tokens_only=tokens_only))

    async def check_store(self) -> bool:
        try:
            await asyncio.wait_for(self.store.read_after("__heartbeat__", None, 1), STORE_CHECK_TIMEOUT)
            return True
        except Exception:
            log.warning("store check failed", exc_info=True)
            return False

    async def stop(self, timeout: float | None = None) -> None:
        """Graceful shutdown within ``timeout`` seconds (default: ``shutdown_grace_secs``).

        Stop accepting; close idle keep-alive connections; let publishes whose request has fully arrived
        finish and get their reply (then the connection closes); end every stream cleanly so its client
        resumes elsewhere with ``since=``, and release this node's affinity so writers stop ringing it
        (``Hub.stop``); then cut whatever remains (a request body still arriving, a stuck store call)."""
        if self.closing:
            return
        self.closing = True
        grace = self.settings.shutdown_grace_secs if timeout is None else timeout
        deadline = time.monotonic() + grace
        log.info("pusher stopping", extra={"node": self.settings.node_id, "grace": grace})
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        if self._acceptor is not None:
            self._acceptor.close()
        for proto in list(self._http):
            if not proto.busy:
                proto.transport.close()
        # Streams end first (their clients resume elsewhere at once) and the affinity release gets at
        # most half the grace; in-flight requests run meanwhile and get the rest of it.
        try:
            await asyncio.wait_for(self.hub.stop(), grace / 2)
        except TimeoutError:
            log.warning("hub stop outlived half the shutdown grace", extra={"node": self.settings.node_id})
        try:  # its subscriptions are gone: so are their counts (the janitor sweeps them if this fails)
            await asyncio.wait_for(self.limiter.reset_node(self.hub.node), max(0.0, deadline - time.monotonic()))
        except Exception:
            log.warning("subscription counts not cleared at stop", exc_info=True)
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
        self.gate.unlisten(self._auth_changed)
        await self.gate.release()
        log.info("pusher stopped", extra={"node": self.settings.node_id})


async def serve(
    settings: Settings,
    store: Store,
    *,
    fallback: ASGIApp | None = None,
    handler: Handler | None = None,
    ready: asyncio.Event | None = None,
    host: str | None = None,
    port: int | None = None,
    sock: socket.socket | None = None,
    telemetry: tm.Telemetry | None = None,
    metrics: Callable[[], bytes] | None = None,
    program: tuple[str, str] | None = None,
) -> Pusher:
    """Start a pusher in the running loop and return it (call ``await pusher.stop()`` to end it).

    The all-in-one program calls this with the writer's plain-function front as ``handler`` (its hot
    routes, called directly) and the writer's ASGI app as ``fallback`` (its cold routes). The pusher
    never imports the writer: both arrive as callables.
    """
    pusher = Pusher(
        settings, store, fallback=fallback, handler=handler, telemetry=telemetry, metrics=metrics, program=program
    )
    await pusher.start(host=host, port=port, sock=sock)
    if ready is not None:
        ready.set()
    return pusher
