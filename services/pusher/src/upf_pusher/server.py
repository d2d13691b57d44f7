"""The pusher's front door: UPF's HTTP/1.1 server (``upf_edge.frontdoor``) with the subscribe routes.

- ``GET /{topics}/ws|json|sse|raw``: a subscribe. The connection is handed to a transport adapter
  (``transport.set_protocol``) and the hub; this object is dropped, so an idle subscriber carries
  nothing of the request parsing. A poll on a keep-alive connection hands it back when its reply has
  ended (``Pusher.take_back``): a fresh one of these parses the next request.
- Everything else as every front door serves it (``upf_edge.frontdoor``): the CORS preflight, the ops
  routes every role shares (``GET /metrics`` covers every metric of this process, so in the all-in-one
  program every role's), the optional direct ``handler`` (the writer's publish, in the all-in-one
  program: one parse, no ASGI), the optional fallback ASGI app (the writer's cold routes), else 404.
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

from upf_edge import Handler
from upf_edge.access import Identity
from upf_edge.asgi_bridge import ASGIApp
from upf_edge.errors import NtfyError, Problem
from upf_edge.frontdoor import SHUTTING_DOWN, FrontDoor, HttpProtocol, keeps
from upf_edge.gate import AccessGate, Credential, auth_param
from upf_edge.http11 import HttpError, RequestHead, error_response, header_list
from upf_edge.limiter import RequestLimiter, presents_credentials
from upf_edge.ops import MetricsAccess, OpsRoutes
from upf_keyspace import Settings, Store
from upf_keyspace import telemetry as tm

from . import __version__
from .hub import Hub
from .query import Subscribe, match_subscribe_path, parse_subscribe
from .session import new_session
from .transports import KeptAlive, StreamSubscriber, Subscriber, WsSubscriber, ws_handshake

__all__ = ["Pusher", "serve"]

log = logging.getLogger("upf.pusher.server")

STORE_CHECK_TIMEOUT = 5.0
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


def _kept(credential: Credential, who: Identity) -> Credential | None:
    """What an open stream is re-checked with at an auth change (``Pusher._auth_changed``): the
    credential it logged in with, also one it presented while auth was off (once auth is on it must
    pass, as a new subscribe's would), else None (anonymous: nothing is kept)."""
    return credential if who.user is not None or presents_credentials(*credential) else None


class PusherProtocol(HttpProtocol):
    """A connection of the pusher's front door: a subscribe is routed here, the rest as every front door."""

    __slots__ = ()
    door: Pusher

    def _route(self, head: RequestHead) -> bool:
        if head.method == "GET":
            match = match_subscribe_path(head.path)
            if match is not None:
                return self._subscribe(head, *match)
        return super()._route(head)

    def _subscribe(self, head: RequestHead, topics_raw: str, transport_name: str) -> bool:
        p = self.door
        keep = keeps(head)
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
            self._reply(head, error_response(SHUTTING_DOWN), False)
            return True
        # ntfy's order: bad credentials (401), then the request limit (429), then a denied topic (403;
        # one denied topic fails them all). A subscribe is a request: it spends a token.
        credential = (headers.get("authorization"), auth_param(query))
        try:
            forwarded = header_list(head.headers, p.limiter.header)
            if (
                p.limiter.visitor(None, self.client, forwarded) is not None
                or p.limiter.wants_rates(req.topics)
                or (not p.gate.open and presents_credentials(*credential))
            ):  # an exempt peer's login attempts still count (ntfy's failed-login limit exempts no one)
                self.busy = True  # parsing waits while the store is asked (leases, failed logins, counts)
                p.spawn(self._subscribe_limited(head, req, transport_name, headers, query, forwarded))
                return True
            who = p.gate.identify(*credential)
            p.gate.authorize(who, req.topics, write=False)
        except NtfyError as e:
            self._reply(head, error_response(e.problem, keep_alive=keep, extra=e.headers), keep)
            return False
        return self._attach(head, req, transport_name, None, _kept(credential, who))

    async def _subscribe_limited(
        self, head: RequestHead, req: Subscribe, transport_name: str, headers: Any, query: Any, forwarded: str | None
    ) -> None:
        """A subscribe of a visitor the limits apply to, in ntfy's order: credentials (401, or 42909
        after too many failures), the request limit (42901), the ACL (403), then the visitor's open
        subscriptions across the fleet (42903; a poll holds none)."""
        p = self.door
        keep = keeps(head)
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
            self._reply(head, error_response(SHUTTING_DOWN), False)
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
        if not self._attach(head, req, transport_name, on_close, _kept(credential, who)):
            self._resume()

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
        p = self.door
        keep = keeps(head)
        if self.eof and not req.poll:  # half-closed while its limits were checked: a stream ends at once
            self.transport.close()
            return True, False
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
            if req.poll and keep and sub.chunked and not self.eof:  # (half-closed: the poll's reply is the last)
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


class Pusher(FrontDoor):
    """The pusher role: a front door whose connections may become subscribers, and the hub.

    ``start()`` binds and serves; ``stop()`` closes every connection cleanly (WebSocket close 1001,
    the last chunk of each stream), stops the hub and releases this node's affinity. The store is the
    caller's: it is neither opened nor closed here.
    """

    protocol = PusherProtocol

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
        self.store = store
        self.telemetry = tm.current() if telemetry is None else telemetry
        registry = self.telemetry.registry
        name, version = program or ("upf-pusher", _package_version())
        ops = OpsRoutes(
            name,
            version,
            self.check_store,
            metrics or (lambda: tm.render_metrics(registry)),
            tm.METRICS_CONTENT_TYPE,
            heartbeat_timeout=STORE_CHECK_TIMEOUT + 1.0,
            scrapers=MetricsAccess.of(settings),
        )
        super().__init__(settings, ops, role="pusher", fallback=fallback, handler=handler)
        self.hub = Hub(settings, store, self.telemetry)
        self.gate = AccessGate(store, settings.auth_default_access)
        """Replaced at start by the process's shared gate for this store (who may subscribe to what)."""
        self._gate_held = False
        self.limiter = RequestLimiter.shared(store, settings)
        """The request limit, shared with a writer in this process on the same store."""

    def take_back(self, client: str, transport: asyncio.Transport, pipelined: bytes, paused: bool, eof: bool) -> None:
        """A keep-alive poll's reply has ended: its connection is an HTTP connection again."""
        PusherProtocol(self).adopt(transport, client, pipelined, paused, eof)

    async def _starting(self) -> None:
        self.gate = await AccessGate.acquire(self.store, self.settings.auth_default_access)
        self._gate_held = True
        self.gate.listen(self._auth_changed)
        try:
            await self.limiter.reset_node(self.hub.node)  # this node holds no subscription yet
        except Exception:  # a store down at start must not keep the pusher down; the janitor sweeps later
            log.warning("subscription counts not cleared at start", exc_info=True)
        await self.hub.start()

    async def _unstarting(self) -> None:
        """The hub's loops (they would run on under a closed store) and the gate's watch."""
        await self.hub.stop()
        await self._release_gate()

    async def _release_gate(self) -> None:
        if self._gate_held:
            self._gate_held = False
            self.gate.unlisten(self._auth_changed)
            await self.gate.release()

    def _auth_changed(self, tokens_only: bool) -> None:
        """An auth change (``upf user|access|token ...``, on any host) or a token's expiry applies to
        open streams too, as ntfy's access reset ends the user's subscriptions: each is checked as a
        new subscribe would be, with the credential it logged in with."""
        if self.closing:
            return
        seen: dict[Credential, Identity | None] = {}
        gate = self.gate
        self.spawn(self.hub.revoke(lambda cred, topics: gate.refusal(cred, topics, seen), tokens_only=tokens_only))

    async def check_store(self) -> bool:
        try:
            await asyncio.wait_for(self.store.read_after("__heartbeat__", None, 1), STORE_CHECK_TIMEOUT)
            return True
        except Exception:
            log.warning("store check failed", exc_info=True)
            return False

    async def _stopping(self, grace: float, deadline: float) -> None:
        """Streams end first (their clients resume elsewhere at once, ``Hub.stop``) and the affinity
        release gets at most half the grace; in-flight requests run meanwhile and get the rest of it."""
        try:
            await asyncio.wait_for(self.hub.stop(), grace / 2)
        except TimeoutError:
            log.warning("hub stop outlived half the shutdown grace", extra={"node": self.settings.node_id})
        try:  # its subscriptions are gone: so are their counts (the janitor sweeps them if this fails)
            await asyncio.wait_for(self.limiter.reset_node(self.hub.node), max(0.0, deadline - time.monotonic()))
        except Exception:
            log.warning("subscription counts not cleared at stop", exc_info=True)

    async def _stopped(self) -> None:
        await self._release_gate()


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
