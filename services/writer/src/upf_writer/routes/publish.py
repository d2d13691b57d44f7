"""Publish routes: ``POST``/``PUT /{topic}`` (the hot path, also ``GET /{topic}?up=1``), JSON publish on
``/`` and the Matrix push gateway.

``/{topic}`` is a bare ASGI callable (``build_topic_endpoint``), not a Litestar route handler:
Litestar's per-request machinery (signature model, parameter parsing, response building) nearly
halves what this route can serve (bench/README.md: ~11k vs ~4.4-6.4k publishes/s with a no-op store
on one core), and this route carries nearly all of the writer's traffic. It
answers every method itself; ``WriterApp`` (app.py) hands it every one-segment path that is not one
of Litestar's own plain routes. (An ``@asgi`` route at ``/{topic:str}`` would be the obvious way, but
Litestar 2.25 raises KeyError routing an ``@asgi`` handler that has a path parameter.) The JSON and
Matrix routes are rare and stay ordinary Litestar handlers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

import msgspec
from litestar import Request, Response, get, route
from litestar.types import ASGIApp, ControllerRouterHandler, Receive, Scope, Send
from upf_keyspace import Published, Store, StoreError, message_from_envelope
from upf_keyspace import telemetry as tm

from .. import ingest, schemas
from ..context import WriterContext
from ..httpio import ClientGone, decode_headers, decode_query, read_body, send_json, send_problem
from ..ingest import Ingested, PublishError

__all__ = ["build", "build_topic_endpoint", "publish_one", "failure_problem"]

log = logging.getLogger("upf_writer.publish")

_REPLAYED = ((b"idempotent-replayed", b"true"),)
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
    answer: 503 for a store error (publishers retry), 500 for anything else."""
    if isinstance(exc, StoreError):
        log.warning("publish failed: store error", extra={"route": route_name, "store_code": exc.code})
        return ingest.STORE_UNAVAILABLE
    log.error("publish failed: unexpected error", exc_info=exc, extra={"route": route_name})
    return ingest.INTERNAL_ERROR


def build_topic_endpoint(ctx: WriterContext) -> ASGIApp:
    """``/{topic}``: POST/PUT publish, GET/HEAD UnifiedPush discovery. The topic is the path after
    its one leading slash (the caller routes only one-segment paths here)."""
    limits = ctx.limits
    metrics = ctx.metrics
    tracing = ctx.telemetry.tracing

    async def topic_endpoint(scope: Scope, receive: Receive, send: Send) -> None:
        method = scope["method"]
        topic: str = scope["path"][1:]
        publishing = False
        try:
            if method == "POST" or method == "PUT":
                publishing = True
                start_ns = time.time_ns() if tracing else 0
                headers = decode_headers(scope["headers"])
                ingest.validate_topic(topic)
                ingest.check_content_length(headers, limits.max_message_bytes, ingest.MESSAGE_TOO_LARGE)
                body = await read_body(receive, limits.max_message_bytes)
                if body is None:
                    raise PublishError(ingest.MESSAGE_TOO_LARGE)
                query = decode_query(scope["query_string"])
                ingested = ingest.ingest_publish(topic, headers, query, body, now=ctx.clock(), limits=limits)
                payload, replayed = await publish_one(ctx, ingested, headers, len(body), start_ns)
                await send_json(send, 200, payload, _REPLAYED if replayed else ())
            elif method == "GET" or method == "HEAD":
                ingest.validate_topic(topic)
                headers = decode_headers(scope["headers"])
                query = decode_query(scope["query_string"])
                if not ingest.unifiedpush_requested(headers, query):
                    raise PublishError(ingest.NOT_FOUND)
                await send_json(send, 200, schemas.UP_DISCOVERY)
            else:
                await send_problem(send, ingest.METHOD_NOT_ALLOWED, {"allow": "GET, HEAD, POST, PUT"})
        except PublishError as exc:
            if publishing:
                metrics.rejected(exc.problem.code)
            await send_problem(send, exc.problem)
        except ClientGone:
            return
        except Exception as exc:  # noqa: BLE001 - every failure still answers with ntfy's error JSON
            problem = failure_problem(exc, "topic")
            if publishing:
                metrics.rejected(problem.code)
            await send_problem(send, problem)

    return topic_endpoint


def _count_rejection(ctx: WriterContext, exc: BaseException) -> None:
    """A Litestar-routed publish failed: count it under the code its exception handler will answer with."""
    if isinstance(exc, PublishError):
        ctx.metrics.rejected(exc.problem.code)
    elif isinstance(exc, StoreError):
        ctx.metrics.rejected(ingest.STORE_UNAVAILABLE.code)
    elif isinstance(exc, Exception):
        ctx.metrics.rejected(ingest.INTERNAL_ERROR.code)


def build(ctx: WriterContext) -> list[ControllerRouterHandler]:
    """The Litestar-routed publish handlers (JSON publish, Matrix gateway)."""
    limits = ctx.limits

    @route("/", http_method=["POST", "PUT"], name="json_publish", status_code=200)
    async def json_publish(request: Request) -> Response[bytes]:
        start_ns = time.time_ns() if ctx.telemetry.tracing else 0
        try:
            headers = decode_headers(request.scope["headers"])
            limit = ingest.json_body_limit(limits)
            ingest.check_content_length(headers, limit, ingest.JSON_TOO_LARGE)
            body = await read_body(request.receive, limit)
            if body is None:
                raise PublishError(ingest.JSON_TOO_LARGE)
            query = decode_query(request.scope["query_string"])
            ingested = ingest.ingest_json(headers, query, body, now=ctx.clock(), limits=limits)
            payload, replayed = await publish_one(ctx, ingested, headers, len(body), start_ns, "json")
        except ClientGone:
            raise
        except BaseException as exc:
            _count_rejection(ctx, exc)
            raise
        return Response(payload, media_type=_JSON, headers={"idempotent-replayed": "true"} if replayed else None)

    @get("/_matrix/push/v1/notify", name="matrix_discovery")
    async def matrix_discovery() -> Response[bytes]:
        return Response(schemas.MATRIX_DISCOVERY, media_type=_JSON)

    @route("/_matrix/push/v1/notify", http_method=["POST"], name="matrix_notify", status_code=200)
    async def matrix_notify(request: Request) -> Response[bytes]:
        start_ns = time.time_ns() if ctx.telemetry.tracing else 0
        try:
            headers = decode_headers(request.scope["headers"])
            limit = limits.max_message_bytes - 1  # ntfy: 4096 bytes or more is too large
            ingest.check_content_length(headers, limit, ingest.MATRIX_TOO_LARGE)
            body = await read_body(request.receive, limit)
            if body is None:
                raise PublishError(ingest.MATRIX_TOO_LARGE)
            outcome = ingest.ingest_matrix(body, now=ctx.clock(), limits=limits)
            if outcome.ingested is None:
                log.info("matrix pushkey rejected", extra={"reason": "not this server or no valid topic"})
                return Response(schemas.encode(schemas.MatrixResponse((outcome.pushkey,))), media_type=_JSON)
            await publish_one(ctx, outcome.ingested, headers, len(body), start_ns, "matrix")
        except ClientGone:
            raise
        except BaseException as exc:
            _count_rejection(ctx, exc)
            raise
        return Response(schemas.encode(schemas.MatrixResponse()), media_type=_JSON)

    return [json_publish, matrix_discovery, matrix_notify]

