"""``create_app``: the writer as a Litestar ASGI app.

Two ways to run it:
- ``create_app(settings)``: the store is opened in the app's lifespan and closed at shutdown (the
  writer on granian, ``UPF_WRITER_SERVER=granian``: inside granian's worker process);
- ``create_app(settings, store)`` with an already-open store, which the app then neither opens nor
  closes (its owner does): the all-in-one program, and the standalone writer on UPF's own front door
  (``door.run_writer``).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from litestar import Litestar, Request, Response
from litestar.exceptions import HTTPException, MethodNotAllowedException, NotFoundException
from litestar.types import Receive, Scope, Send

from upf_edge import NtfyError
from upf_edge.asgi import send_preflight, serve_asgi, with_cors
from upf_edge.gate import AccessGate
from upf_edge.limiter import RequestLimiter
from upf_edge.ops import PATHS as OPS_PATHS
from upf_keyspace import Settings, Store, open_store
from upf_keyspace.telemetry import Telemetry

from . import ingest
from .context import WriterContext
from .front import WriterFront
from .ingest import Problem
from .routes import build_route_handlers
from .routes.ops import build_ops
from .routes.publish import failure_problem

__all__ = ["create_app", "StoreFactory", "WriterApp"]

log = logging.getLogger("upf_writer")

StoreFactory = Callable[[Settings], Awaitable[Store]]

_HTTP_PROBLEMS = {
    400: Problem(40000, 400, "invalid request"),
    404: ingest.NOT_FOUND,
    405: ingest.METHOD_NOT_ALLOWED,
    413: ingest.MESSAGE_TOO_LARGE,
}


def _problem_response(problem: Problem, headers: dict[str, str] | None = None) -> Response[bytes]:
    return Response(problem.body(), status_code=problem.http, media_type="application/json", headers=headers)


def _on_publish_error(_: Request, exc: NtfyError) -> Response[bytes]:
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in exc.headers} if exc.headers else None
    return _problem_response(exc.problem, headers)


def _on_not_found(_: Request, exc: NotFoundException) -> Response[bytes]:
    return _problem_response(ingest.NOT_FOUND)


def _on_method_not_allowed(_: Request, exc: MethodNotAllowedException) -> Response[bytes]:
    allow = (exc.headers or {}).get("Allow") or (exc.headers or {}).get("allow")
    return _problem_response(ingest.METHOD_NOT_ALLOWED, {"allow": allow} if allow else None)


def _on_http_exception(_: Request, exc: HTTPException) -> Response[bytes]:
    problem = _HTTP_PROBLEMS.get(exc.status_code)
    if problem is None:
        problem = Problem(exc.status_code * 100 + 1, exc.status_code, "request failed")
    return _problem_response(problem)


def _on_exception(_: Request, exc: Exception) -> Response[bytes]:
    return _problem_response(failure_problem(exc, "litestar"))


class WriterApp(Litestar):
    """The Litestar app behind a thin ASGI adapter: a request the writer's plain-function front
    (``front.WriterFront``: publish, JSON publish, the UnifiedPush check) or the shared ops endpoints
    (``upf_edge.ops``) want is served straight from the ASGI scope; everything else (lifespan, cold
    routes, 404/405) is plain Litestar.
    ``front`` is also what the all-in-one program hands the pusher's front door directly."""

    def __init__(self, *, ctx: WriterContext, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]  # Litestar's own keyword arguments, passed through
        litestar_paths = frozenset(
            r.path for r in self.routes if "{" not in r.path and r.path.rfind("/") == 0 and r.path != "/"
        )
        self.front = WriterFront(ctx, litestar_paths | OPS_PATHS)
        self.ops = build_ops(ctx)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:  # type: ignore[override]  # litestar's ASGI aliases
        if scope["type"] == "http":
            method, path = scope["method"], scope["path"]  # type: ignore[typeddict-item]  # litestar's scope type is an enum: `== "http"` does not narrow
            if method == "OPTIONS":  # ntfy answers a CORS preflight on every path
                await send_preflight(send)  # type: ignore[arg-type]  # litestar's ASGI aliases
                return
            if self.front.wants(method, path):
                await serve_asgi(self.front, scope, receive, send)  # type: ignore[arg-type]  # litestar's ASGI aliases
                return
            if self.ops.wants(method, path):
                await serve_asgi(self.ops, scope, receive, send)  # type: ignore[arg-type]  # litestar's ASGI aliases
                return
            send = with_cors(send)  # type: ignore[arg-type, assignment]  # litestar's ASGI aliases
        await super().__call__(scope, receive, send)


@asynccontextmanager
async def _gate(ctx: WriterContext, store: Store) -> AsyncIterator[None]:
    """The process's access gate and request limiter for ``store`` while the app serves (shared with a
    pusher beside it)."""
    ctx.gate = await AccessGate.acquire(store, ctx.settings.auth_default_access)
    ctx.limiter = RequestLimiter.shared(store, ctx.settings)
    try:
        yield
    finally:
        ctx.limiter = None
        gate, ctx.gate = ctx.gate, None
        await gate.release()


def create_app(
    settings: Settings,
    store: Store | None = None,
    *,
    store_factory: StoreFactory = open_store,
    clock: Callable[[], int] | None = None,
    telemetry: Telemetry | None = None,
) -> WriterApp:
    """The writer app. With ``store`` given, the caller owns it; otherwise ``store_factory(settings)``
    opens one at lifespan startup and the app closes it at shutdown. ``clock`` (unix seconds) is for
    tests. ``telemetry`` defaults to the process's (``upf_keyspace.telemetry.current()``)."""
    if clock is None:
        ctx = WriterContext(settings, store, telemetry=telemetry)
    else:
        ctx = WriterContext(settings, store, clock, telemetry=telemetry)

    @asynccontextmanager
    async def store_lifespan(_: Litestar) -> AsyncIterator[None]:
        if ctx.store is not None:
            log.info("writer started with a store it does not own")
            async with _gate(ctx, ctx.store):
                yield
            return
        ctx.store = await store_factory(settings)
        log.info("writer store opened", extra={"driver": "foundationdb" if settings.fdb_cluster_file else "embedded"})
        try:
            async with _gate(ctx, ctx.store):
                yield
        finally:
            opened, ctx.store = ctx.store, None
            await opened.close()
            log.info("writer store closed")

    app = WriterApp(
        ctx=ctx,
        route_handlers=build_route_handlers(ctx),
        lifespan=[store_lifespan],
        exception_handlers={
            NtfyError: _on_publish_error,
            NotFoundException: _on_not_found,
            MethodNotAllowedException: _on_method_not_allowed,
            HTTPException: _on_http_exception,
            Exception: _on_exception,
        },
        openapi_config=None,
        logging_config=None,
        debug=False,
        request_max_body_size=4 * settings.max_message_bytes,
    )
    app.state.writer = ctx
    return app
