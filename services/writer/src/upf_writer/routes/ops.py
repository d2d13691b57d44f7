"""Small GET routes: ntfy's ``/v1/health``, ``/{topics}/auth`` and ``HEAD /``, plus the ops endpoints
every UPF role serves (``__lbheartbeat__``, ``__heartbeat__``, ``__version__`` and the Prometheus
scrape endpoint ``/metrics``)."""

from __future__ import annotations

import asyncio
import logging

from litestar import Response, get, head
from litestar.types import ControllerRouterHandler
from upf_keyspace import telemetry as tm

from .. import __version__, ingest, schemas
from ..context import WriterContext
from ..ingest import PublishError

__all__ = ["build", "HEARTBEAT_TIMEOUT_SECS"]

log = logging.getLogger("upf_writer.ops")

_JSON = "application/json"
HEARTBEAT_TIMEOUT_SECS = 2.0


def build(ctx: WriterContext) -> list[ControllerRouterHandler]:
    version_body = schemas.encode(schemas.VersionResponse(name="upf-writer", version=__version__))
    health_body = schemas.encode(schemas.HealthResponse())
    auth_body = schemas.encode(schemas.AuthResponse())
    heartbeat_ok = schemas.encode(schemas.HeartbeatResponse())

    @head("/", name="root_head")
    async def root_head() -> None:
        return None

    @get("/", name="root")
    async def root() -> Response[bytes]:
        return Response(b"UPF push server (ntfy protocol, UnifiedPush)\n", media_type="text/plain")

    @get("/v1/health", name="health")
    async def health() -> Response[bytes]:
        return Response(health_body, media_type=_JSON)

    @get("/{topics:str}/auth", name="topic_auth")
    async def topic_auth(topics: str) -> Response[bytes]:
        # No access control yet: every valid topic is readable and writable by anyone.
        ingest.validate_topic_list(topics)
        return Response(auth_body, media_type=_JSON)

    @get("/__lbheartbeat__", name="lbheartbeat")
    async def lbheartbeat() -> Response[bytes]:
        return Response(b"{}\n", media_type=_JSON)

    @get("/__heartbeat__", name="heartbeat")
    async def heartbeat() -> Response[bytes]:
        store = ctx.store
        try:
            if store is None:
                raise PublishError(ingest.STORE_UNAVAILABLE)
            await asyncio.wait_for(store.ping(), HEARTBEAT_TIMEOUT_SECS)
        except Exception as exc:  # noqa: BLE001 - any failure of the probe means "not healthy"
            log.warning("heartbeat failed: store read failed", extra={"error_type": type(exc).__name__})
            raise PublishError(ingest.STORE_UNAVAILABLE) from None
        return Response(heartbeat_ok, media_type=_JSON)

    @get("/__version__", name="version")
    async def version() -> Response[bytes]:
        return Response(version_body, media_type=_JSON)

    registry = ctx.telemetry.registry

    @get("/metrics", name="metrics")
    async def metrics() -> Response[bytes]:
        # "metrics" is one of ntfy's disallowed topic names, so this route shadows no topic.
        return Response(tm.render_metrics(registry), media_type=tm.METRICS_CONTENT_TYPE)

    return [root_head, root, health, topic_auth, lbheartbeat, heartbeat, version, metrics]
