"""The writer's hot routes as one plain function: ``(method, topic, headers, query, body, client) -> Reply``.

``POST``/``PUT /{topic}`` (publish), ``POST``/``PUT /`` (ntfy's JSON publish) and ``GET``/``HEAD
/{topic}`` (the UnifiedPush endpoint check) carry nearly all of the writer's traffic; ``GET
/{topic}/publish`` (ntfy's webhook form) is a publish too. They are served
by :class:`WriterFront`, which implements ``upf_edge.handler.Handler``: it decodes, calls the pure
core (``ingest``), makes the one store call and returns the ntfy JSON reply or ntfy's JSON error body.
No framework is involved, so every front door calls it directly: UPF's own asyncio server
(``upf_edge.frontdoor``: the pusher's in the all-in-one program, the standalone writer's own by
default; no ASGI bridge), and ``upf_edge.asgi.serve_asgi`` under granian (``UPF_WRITER_SERVER=granian``,
``WriterApp`` in app.py). Why:
Litestar's per-request machinery costs ~3.5x a bare callable (measurements.md), and in the all-in-one
an ASGI bridge on top re-built a scope for every publish. Litestar keeps the cold routes.

ntfy v2.16's sequence-id routes are hot routes too: ``PUT|POST /{topic}/{sid}`` (a publish with that
sequence id), ``DELETE /{topic}/{sid}`` (``message_delete``) and ``PUT|GET /{topic}/{sid}/clear``
(alias ``/read``; ``message_clear``). ntfy's subscribe routes are GET only, so a sequence id may be
named ``ws``, ``json``, ``sse``, ``raw`` or ``auth``: ``PUT /t/ws`` publishes, ``GET /t/ws`` subscribes
(the front doors route a subscribe GET before asking :meth:`WriterFront.wants`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import msgspec

from upf_edge import NO_BODY, NtfyError, Problem, Reply, vapid
from upf_edge.access import ANONYMOUS
from upf_edge.gate import auth_param
from upf_edge.http11 import decode_headers, decode_query, forwarded_of

from . import ingest, schemas
from .context import WriterContext
from .routes.publish import failure_problem, publish_one
from .webpush import WebPushPolicy, webpush_reply

__all__ = ["WriterFront", "problem_reply"]

_REPLAYED = ((b"idempotent-replayed", b"true"),)
_ALLOW = ((b"allow", b"GET, HEAD, POST, PUT"),)
_SEQUENCE_METHODS = frozenset({"PUT", "POST", "DELETE"})
_CLEAR_METHODS = frozenset({"PUT", "GET"})
_CLEAR_TAILS = ("/clear", "/read")
_GET_PUBLISH = frozenset({"/publish", "/send", "/trigger"})
"""``GET /{topic}/publish`` (or ``/send``, ``/trigger``): ntfy's publish from query parameters, for
webhooks that can only GET (a body, if one is sent, is the message, as ntfy reads it)."""
_TEMPLATE_HEADERS = frozenset({b"x-template", b"template"})


def _publishable(topic: str) -> bool:
    try:
        ingest.validate_topic(topic)
    except NtfyError:
        return False
    return True


def problem_reply(problem: Problem, headers: tuple[tuple[bytes, bytes], ...] = ()) -> Reply:
    return Reply(problem.http, problem.body(), headers)


class WriterFront:
    """The writer's ``upf_edge`` handler (see the module docstring). ``reserved`` are the one-segment
    paths the writer's Litestar app serves itself (``/metrics``, ``/__version__``...): not topics."""

    __slots__ = ("ctx", "reserved", "_max", "_json_max", "_tracing", "_forwarded", "_webpush")

    def __init__(self, ctx: WriterContext, reserved: frozenset[str] = frozenset()) -> None:
        self.ctx = ctx
        self.reserved = reserved
        self._max = ctx.limits.max_message_bytes
        self._json_max = ingest.json_body_limit(ctx.limits)
        self._tracing = ctx.telemetry.tracing
        self._forwarded = ctx.settings.proxy_forwarded_header.lower()
        self._webpush = WebPushPolicy(ctx.settings, ctx.telemetry.registry)

    def wants(self, method: str, path: str) -> bool:
        if path == "/":
            return method == "POST" or method == "PUT"
        last = path.rfind("/")
        if last == 0:
            return len(path) > 1 and path not in self.reserved
        if method == "GET" and path[last:] in _GET_PUBLISH and path.count("/") == 2:
            return True
        return self._wants_sequence(method, path, last)

    def _wants_sequence(self, method: str, path: str, last: int) -> bool:
        """``/{topic}/{sid}`` (PUT, POST, DELETE) and ``/{topic}/{sid}/clear|read`` (PUT, GET), where the
        first segment could be a topic (``/v1/...``, ``/docs/...`` and the like stay the app's)."""
        first = path.find("/", 1)
        if first == last:
            ok = method in _SEQUENCE_METHODS and last < len(path) - 1
        else:
            ok = (
                method in _CLEAR_METHODS
                and path.endswith(_CLEAR_TAILS)
                and path.find("/", first + 1) == last
                and last > first + 1
            )
        return ok and first > 1 and path[1:first] not in ingest.DISALLOWED_TOPICS and path[:first] not in self.reserved

    def body_limit(self, method: str, topic: str, headers: Sequence[tuple[bytes, bytes]], query: bytes) -> int:
        get_publish = method == "GET" and topic.count("/") == 1 and topic[topic.find("/") :] in _GET_PUBLISH
        if method == "POST" or method == "PUT" or get_publish:
            if not topic:
                return self._json_max
            if topic.count("/") == 2:
                return NO_BODY  # a clear's body is ignored
            if query and (query.find(b"template") >= 0 or query.find(b"tpl") >= 0):  # find: see http11.parse_head
                return ingest.TEMPLATE_BODY_MAX  # a template publish's JSON may be larger (publish decides)
            for name, _ in headers:
                if name in _TEMPLATE_HEADERS:
                    return ingest.TEMPLATE_BODY_MAX
            return self._max
        return NO_BODY

    async def admit(
        self, method: str, topic: str, raw_headers: Sequence[tuple[bytes, bytes]], query: bytes, client: str
    ) -> Reply | None:
        """A publish whose client waits on ``Expect: 100-continue``: bad credentials (401, 42909) and,
        for a path's topic, a denied one (403) are answered before the body is sent, as ntfy's are
        (Go asks for the body when the handler first reads it). The rest (the request limit, the
        body's own checks) waits for the body: those the publish itself charges."""
        gate = self.ctx.gate
        if gate is None or gate.open:
            return None
        name = topic.partition("/")[0]
        try:
            headers, params = decode_headers(raw_headers), decode_query(query)
            forwarded = forwarded_of(headers, raw_headers, self._forwarded)
            who = await self.ctx.identify(headers.get("authorization"), auth_param(params), client, forwarded)
            if _publishable(name):  # else (or "", a JSON publish's topic is in its body) the publish's 400
                gate.authorize(who, (name,), write=True)
        except NtfyError as exc:
            return self._refused(exc, "topic" if topic else "json")
        return None

    async def __call__(
        self,
        method: str,
        topic: str,
        headers: Sequence[tuple[bytes, bytes]],
        query: bytes,
        body: bytes | None,
        client: str,
    ) -> Reply:
        if "/" in topic:
            if method == "GET" and topic.count("/") == 1 and topic[topic.find("/") :] in _GET_PUBLISH:
                return await self.publish(topic.partition("/")[0], headers, query, body, client)
            return await self._by_sequence(method, topic, headers, query, body, client)
        if method == "POST" or method == "PUT":
            return await self.publish(topic, headers, query, body, client)
        try:
            if method == "GET" or method == "HEAD":
                decoded, params = decode_headers(headers), decode_query(query)
                ctx = self.ctx
                forwarded = forwarded_of(decoded, headers, self._forwarded)
                # A bad login is still a 401 (and a failed login counted), but no request is spent: the
                # check reads nothing, and ntfy limits it not (an app server checks each new endpoint).
                await ctx.identify(decoded.get("authorization"), auth_param(params), client, forwarded)
                ingest.validate_topic(topic)
                if not ingest.unifiedpush_requested(decoded, params):
                    raise NtfyError(ingest.NOT_FOUND)
                return Reply(200, schemas.UP_DISCOVERY)
            return problem_reply(ingest.METHOD_NOT_ALLOWED, _ALLOW)
        except NtfyError as exc:
            return problem_reply(exc.problem, exc.headers)
        except Exception as exc:
            return problem_reply(failure_problem(exc, "topic"))

    async def _by_sequence(
        self,
        method: str,
        path: str,
        headers: Sequence[tuple[bytes, bytes]],
        query: bytes,
        body: bytes | None,
        client: str,
    ) -> Reply:
        """The sequence-id routes ``wants`` took: ``path`` is ``topic/sid`` or ``topic/sid/clear|read``."""
        parts = path.split("/")
        if len(parts) == 3:
            return await self.action(parts[0], parts[1], ingest.EVENT_CLEAR, headers, query, client)
        if method == "DELETE":
            return await self.action(parts[0], parts[1], ingest.EVENT_DELETE, headers, query, client)
        return await self.publish(parts[0], headers, query, body, client, parts[1])

    async def action(
        self,
        topic: str,
        sequence_id: str,
        event: str,
        raw_headers: Sequence[tuple[bytes, bytes]],
        query: bytes,
        client: str,
    ) -> Reply:
        """A ``message_clear`` or ``message_delete`` event: a write to the topic like a publish (the same
        401, 429, 403 order), stored so that every subscriber gets it in order with the messages."""
        ctx = self.ctx
        start_ns = time.time_ns() if self._tracing else 0
        route = "clear" if event == ingest.EVENT_CLEAR else "delete"
        try:
            headers = decode_headers(raw_headers)
            params = decode_query(query)
            gate = ctx.require_gate()
            forwarded = forwarded_of(headers, raw_headers, self._forwarded)
            who = await ctx.identify(headers.get("authorization"), auth_param(params), client, forwarded)  # 401/42909
            await ctx.admit(who.user, client, forwarded)
            gate.authorize(who, (ingest.validate_topic(topic),), write=True)  # 403 before the sequence id's 400
            ingested = ingest.ingest_action(topic, sequence_id, event, now=ctx.clock(), limits=ctx.limits)
            if self._webpush.restrict:  # a topic bound to a VAPID key takes a clear or delete only with it
                if vapid.is_webpush(headers.get("authorization"), None, None):
                    ingested = msgspec.structs.replace(ingested, webpush=True)
                await self._webpush.admit(ctx.require_store(), ingested, headers, ctx.clock())
            payload, _ = await publish_one(ctx, ingested, headers, 0, start_ns, route)
        except Exception as exc:
            return self._refused(exc, route)
        return Reply(200, payload)

    @staticmethod
    def _template_body(headers: dict[str, str], params: dict[str, str], body: bytes | None) -> bytes:
        """A body over the message limit (or unread, ``None``, past the front door's): 413 41301, unless
        it is a template publish's JSON within ntfy's 32 KB (else 413 41303)."""
        if not ingest.template_requested(headers, params):
            raise NtfyError(ingest.MESSAGE_TOO_LARGE)
        if body is None or len(body) > ingest.TEMPLATE_BODY_MAX:
            raise NtfyError(ingest.JSON_TOO_LARGE)
        return body

    def _refused(self, exc: Exception, route: str) -> Reply:
        """A publish, clear or delete refused: ntfy's error body (a bug is a 500 with the JSON too),
        counted by its code."""
        problem = exc.problem if isinstance(exc, NtfyError) else failure_problem(exc, route)
        self.ctx.metrics.rejected(problem.code)
        return problem_reply(problem, exc.headers if isinstance(exc, NtfyError) else ())

    async def publish(
        self,
        topic: str,
        raw_headers: Sequence[tuple[bytes, bytes]],
        query: bytes,
        body: bytes | None,
        client: str,
        sequence_id: str = "",
    ) -> Reply:
        """One publish: ``topic`` "" is ntfy's JSON publish on ``/`` (the topic is in the body).
        ``body`` is ``None`` when the front door found it over ``body_limit``; ``sequence_id`` is the
        path's (``/{topic}/{sid}``). Bad input stores nothing;
        so does a refusal (401, then the request limit's 429, then 403, as ntfy orders them). The 403
        comes before any parameter is read (ntfy's ``authorizeTopicWrite`` wraps ``handlePublish``) and
        before a path publish's 413 (ntfy's comes from the body). A JSON publish's body is read first, up
        to its topic (ntfy's ``transformBodyJSON`` wraps the request limit and the ACL), so its 413, 40024
        and 40009 come before the 429, which charges the topic's subscriber when subscriber-based
        limiting applies to it, as a path publish's does."""
        ctx = self.ctx
        start_ns = time.time_ns() if self._tracing else 0
        route = "topic" if topic else "json"
        try:
            headers = decode_headers(raw_headers)
            params = decode_query(query)
            gate = ctx.require_gate()
            forwarded = forwarded_of(headers, raw_headers, self._forwarded)
            if topic:
                who, visitor = await ctx.enter(  # 401/42909 first, then the request limit's 429
                    headers.get("authorization"), auth_param(params), client, forwarded, topic
                )
                gate.authorize(who, (ingest.validate_topic(topic),), write=True)
                if body is None or len(body) > self._max:
                    body = self._template_body(headers, params, body)
                ingested = ingest.ingest_publish(
                    topic, headers, params, body, now=ctx.clock(), limits=ctx.limits, sequence_id=sequence_id
                )
            else:  # the topic is in the body: the request limit charges it (its subscriber, maybe) once read
                who = (  # as enter(): an open gate asks nothing of the failed-login count
                    ANONYMOUS
                    if gate.open
                    else await ctx.identify(headers.get("authorization"), auth_param(params), client, forwarded)
                )
                ingest.check_content_length(headers, self._json_max, ingest.JSON_TOO_LARGE)
                if body is None or len(body) > self._json_max:
                    raise NtfyError(ingest.JSON_TOO_LARGE)
                json_topic, doc = ingest.decode_json(body, ctx.limits)
                visitor = await ctx.admit(who.user, client, forwarded, json_topic)
                gate.authorize(who, (json_topic,), write=True)
                ingested = ingest.ingest_decoded_json(
                    json_topic, doc, headers, params, now=ctx.clock(), limits=ctx.limits
                )
            if ingested.webpush or self._webpush.restrict:  # VAPID: 401 after the ACL's 403
                await self._webpush.admit(ctx.require_store(), ingested, headers, ctx.clock())
            limiter = ctx.limiter
            assert limiter is not None  # enter() checked it
            if not limiter.publish_local(visitor, ingested.topic):  # 507, 42908, 42904, 507: after the ACL
                await limiter.admit_publish(visitor, ingested.topic, ingest.unifiedpush_mode(headers, params))
            payload, replayed = await publish_one(ctx, ingested, headers, len(body), start_ns, route)
        except Exception as exc:
            return self._refused(exc, route)
        rate = ctx.limiter.headers(visitor)  # type: ignore[union-attr]  # the draft's headers, as on a 429
        extra = _REPLAYED + rate if replayed else rate
        if ingested.webpush:
            return webpush_reply(ctx.limits.public_url, ingested, payload, extra)
        return Reply(200, payload, extra)
