"""The one store call of every publish (``publish_one``), its failure policy, and the Matrix push
gateway routes.

The hot publish routes (``/{topic}`` and JSON publish on ``/``) are not Litestar handlers: they are
the plain function of ``upf_writer.front`` (Litestar's per-request machinery nearly halves what a
route can serve: bench/README.md, ~11k vs ~4.4-6.4k publishes/s with a no-op store on one core). The
Matrix gateway is rare and stays an ordinary Litestar handler.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

import msgspec
from litestar import Request, Response, get, route
from litestar.types import ControllerRouterHandler

from upf_edge import NtfyError
from upf_edge.errors import INSUFFICIENT_STORAGE
from upf_edge.gate import auth_param
from upf_keyspace import Published, Store, StoreError, message_from_envelope
from upf_keyspace import telemetry as tm

from .. import ingest, schemas
from ..context import WriterContext
from ..httpio import ClientGone, decode_headers, header_list, read_body
from ..ingest import Ingested

__all__ = ["build", "publish_one", "failure_problem"]

log = logging.getLogger("upf_writer.publish")

_JSON = "application/json"


_replace = msgspec.structs.replace


async def publish_one(
    ctx: WriterContext,
    ingested: Ingested,
    headers: Mapping[str, str] | None = None,
    size: int = 0,
    start_ns: int = 0,
    route: str = "topic",
) -> tuple[bytes, bool]:
    """The one store call of a publish; returns the ntfy message JSON and whether it was a replay.

    Stamps the envelope with the wall-clock milliseconds (``published_ms``, for the pusher's delivery
    latency) and, when tracing is on, runs the call in a ``publish`` span (child of the request's
    ``traceparent`` header, if any) whose W3C context goes into ``Envelope.traceparent``, so the
    delivering pusher's span links to it through the store. ``size`` is the request body's length."""
    store = ctx.require_store()
    if ctx.telemetry.tracing:
        return await _publish_traced(ctx, store, ingested, headers, size, start_ns, route)
    published = await _store(ctx, store, ingested, size, "")
    body = schemas.encode(message_from_envelope(published.stamp, ingested.topic, published.envelope))
    return body, published.duplicate


async def _store(ctx: WriterContext, store: Store, ingested: Ingested, size: int, traceparent: str) -> Published:
    """The store call itself, stamped with ``published_ms`` and counted."""
    metrics = ctx.metrics
    envelope = _replace(ingested.envelope, traceparent=traceparent, published_ms=int(time.time() * 1000))
    started = time.perf_counter()
    if ingested.due:  # scheduled: hidden in S until due (no idempotency marker: it points into Q)
        published = await store.schedule(ingested.topic, envelope, ingested.due)
    else:
        published = await store.publish(ingested.topic, envelope, idem=ingested.idem)
    metrics.commit.record(time.perf_counter() - started)
    metrics.size.record(size)
    (metrics.replayed if published.duplicate else metrics.stored).add()
    return published


async def _publish_traced(
    ctx: WriterContext,
    store: Store,
    ingested: Ingested,
    headers: Mapping[str, str] | None,
    size: int,
    start_ns: int,
    route: str,
) -> tuple[bytes, bool]:
    from opentelemetry.trace import SpanKind, Status, StatusCode

    parent = tm.context_from_headers(headers) if headers else None
    span = ctx.telemetry.tracer.start_span(
        "publish",
        context=parent,
        kind=SpanKind.SERVER,
        attributes={"upf.route": route, "upf.message.size": size},
        start_time=start_ns or None,
    )
    try:
        published = await _store(ctx, store, ingested, size, tm.traceparent_of(span))
        span.set_attribute("upf.message.id", published.id)
        span.set_attribute("upf.replayed", published.duplicate)
        span.set_attribute("upf.nodes_poked", published.poked)
        body = schemas.encode(message_from_envelope(published.stamp, ingested.topic, published.envelope))
    except BaseException as exc:
        span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
        span.set_attribute("error.type", type(exc).__name__)
        raise
    finally:
        span.end()
    return body, published.duplicate


def failure_problem(exc: BaseException, route_name: str) -> ingest.Problem:
    """Log an unexpected failure (never the topic: a UnifiedPush topic is a capability) and pick the
    answer: 507 for a full store (logged by the store, once a minute), 503 for another store error
    (publishers retry), 500 for anything else."""
    if isinstance(exc, StoreError) and exc.storage_full:
        return INSUFFICIENT_STORAGE
    if isinstance(exc, StoreError):
        log.warning("publish failed: store error", extra={"route": route_name, "store_code": exc.code})
        return ingest.STORE_UNAVAILABLE
    log.error("publish failed: unexpected error", exc_info=exc, extra={"route": route_name})
    return ingest.INTERNAL_ERROR


def _count_rejection(ctx: WriterContext, exc: BaseException) -> None:
    """A Litestar-routed publish failed: count it under the code its exception handler will answer with."""
    if isinstance(exc, NtfyError):
        ctx.metrics.rejected(exc.problem.code)
    elif isinstance(exc, StoreError):
        ctx.metrics.rejected((INSUFFICIENT_STORAGE if exc.storage_full else ingest.STORE_UNAVAILABLE).code)
    elif isinstance(exc, Exception):
        ctx.metrics.rejected(ingest.INTERNAL_ERROR.code)


def build(ctx: WriterContext) -> list[ControllerRouterHandler]:
    """The Litestar-routed publish handlers (the Matrix gateway: rare, so it keeps the framework)."""
    limits = ctx.limits

    @get("/_matrix/push/v1/notify", name="matrix_discovery")
    async def matrix_discovery() -> Response[bytes]:
        if not limits.public_url:
            raise NtfyError(ingest.PUBLIC_URL_MISSING)
        return Response(schemas.MATRIX_DISCOVERY, media_type=_JSON)

    @route("/_matrix/push/v1/notify", http_method=["POST"], name="matrix_notify", status_code=200)
    async def matrix_notify(request: Request) -> Response[bytes]:
        start_ns = time.time_ns() if ctx.telemetry.tracing else 0
        try:
            headers = decode_headers(request.scope["headers"])
            gate = ctx.require_gate()  # a homeserver sends no credentials: the topic's anonymous write access
            client = request.client.host if request.client else ""
            forwarded = header_list(request.scope["headers"], ctx.settings.proxy_forwarded_header.lower())
            who = await ctx.identify(headers.get("authorization"), auth_param(request.query_params), client, forwarded)
            if not limits.public_url:  # ntfy's order: after the login, before the body
                raise NtfyError(ingest.PUBLIC_URL_MISSING)
            limit = limits.max_message_bytes - 1  # ntfy: 4096 bytes or more is too large
            ingest.check_content_length(headers, limit, ingest.MATRIX_TOO_LARGE)
            body = await read_body(request.receive, limit)  # type: ignore[arg-type]  # litestar's ASGI aliases
            if body is None:
                raise NtfyError(ingest.MATRIX_TOO_LARGE)
            outcome = ingest.ingest_matrix(body, now=ctx.clock(), limits=limits)
            if outcome.ingested is None:
                log.info("matrix pushkey rejected", extra={"reason": "not this server or no valid topic"})
                return _matrix_rejected(outcome.pushkey)
            topic = outcome.ingested.topic
            # ntfy publishes to the pushkey's URL: the request limit charges the topic's subscriber when
            # subscriber-based limiting applies to it (not the homeserver, which serves many users).
            visitor = await ctx.admit(who.user, client, forwarded, topic)
            gate.authorize(who, (topic,), write=True)
            if ctx.settings.vapid_restrict and not await ctx.require_store().vapid_admit(
                topic, None, bind=False
            ):  # a homeserver carries no VAPID key: a topic bound to one refuses it
                raise NtfyError(ingest.VAPID_KEY_REFUSED)
            limiter = ctx.limiter
            assert limiter is not None  # admit() checked it
            # 507 50701 (a ?up=1 pushkey's topic nobody subscribed to), 42908, 42904, 507 50702. Unlike ntfy,
            # never {"rejected":[pushkey]} for a topic without a subscriber: what UPF knows of one is when it
            # last subscribed, not whether it was connected since, and a rejection makes the homeserver
            # delete the pusher for good, while a 507 is retried.
            await limiter.admit_publish(visitor, topic, outcome.unifiedpush)
            await publish_one(ctx, outcome.ingested, headers, len(body), start_ns, "matrix")
        except ClientGone:
            raise
        except BaseException as exc:
            _count_rejection(ctx, exc)
            raise
        return Response(schemas.encode(schemas.MatrixResponse()), media_type=_JSON)

    return [matrix_discovery, matrix_notify]


def _matrix_rejected(pushkey: str) -> Response[bytes]:
    return Response(schemas.encode(schemas.MatrixResponse((pushkey,))), media_type=_JSON)
