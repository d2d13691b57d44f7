"""Small GET routes the writer keeps in Litestar: ``/{topics}/auth`` (ntfy's: a request, so rate limited),
``/v1/stats`` and ``/`` (``GET``/``HEAD``).

The ops endpoints every role serves (``/v1/health``, ``__lbheartbeat__``, ``__heartbeat__``,
``__version__``, ``/metrics``) are ``upf_edge.ops.OpsRoutes``, one copy for all roles, served in front of
Litestar by ``WriterApp`` (``build_ops``)."""

from __future__ import annotations

from litestar import Request, Response, get, head
from litestar.types import ControllerRouterHandler

from upf_edge.gate import auth_param
from upf_edge.http11 import header_list
from upf_edge.ops import MetricsAccess, OpsRoutes
from upf_keyspace import telemetry as tm

from .. import __version__, ingest, schemas
from ..context import WriterContext

__all__ = ["build", "build_ops"]

_JSON = "application/json"


def build_ops(ctx: WriterContext) -> OpsRoutes:
    """The writer's ops endpoints: ``__heartbeat__`` pings the store (503 when it cannot)."""
    registry = ctx.telemetry.registry

    async def probe() -> None:
        await ctx.require_store().ping()

    return OpsRoutes(
        "upf-writer",
        __version__,
        probe,
        lambda: tm.render_metrics(registry),
        tm.METRICS_CONTENT_TYPE,
        scrapers=MetricsAccess.of(ctx.settings),
    )


def build(ctx: WriterContext) -> list[ControllerRouterHandler]:
    auth_body = schemas.encode(schemas.AuthResponse())

    @head("/", name="root_head")
    async def root_head() -> None:
        return None

    @get("/", name="root")
    async def root() -> Response[bytes]:
        return Response(b"UPF push server (ntfy protocol, UnifiedPush)\n", media_type="text/plain")

    @get("/{topics:str}/auth", name="topic_auth")
    async def topic_auth(topics: str, request: Request) -> Response[bytes]:
        """ntfy's check the app makes before subscribing: 200, or 401 (credentials), or 403 (read denied
        on any one of the topics)."""
        gate = ctx.require_gate()
        client = request.client.host if request.client else ""
        forwarded = header_list(request.scope["headers"], ctx.settings.proxy_forwarded_header.lower())
        who = await ctx.identify(
            request.headers.get("authorization"), auth_param(request.query_params), client, forwarded
        )
        await ctx.admit(who.user, client, forwarded)
        gate.authorize(who, ingest.validate_topic_list(topics), write=False)
        return Response(auth_body, media_type=_JSON)

    @get("/v1/stats", name="stats")
    async def stats() -> Response[bytes]:
        """ntfy's public stats, for the whole fleet (the store's counter and the janitor's samples)."""
        total, rate = await ctx.require_store().stats()
        return Response(schemas.encode(schemas.StatsResponse(total, rate)), media_type=_JSON)

    return [root_head, root, topic_auth, stats]
