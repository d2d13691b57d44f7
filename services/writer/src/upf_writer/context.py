"""What the writer's handlers share: settings, limits, the store, the clock, telemetry and metric cells.

One ``WriterContext`` per app, built by ``create_app`` and closed over by the handlers (no global
state). ``store`` is ``None`` until the app's lifespan has opened it (or was given one).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from upf_edge import NtfyError
from upf_edge.access import ANONYMOUS, Identity
from upf_edge.gate import AccessGate
from upf_edge.limiter import RequestLimiter
from upf_keyspace import Settings, Store
from upf_keyspace import telemetry as tm

from .ingest import CATALOG, STORE_UNAVAILABLE, Limits

__all__ = ["WriterContext", "WriterMetrics"]


def _unix_now() -> int:
    return int(time.time())


class WriterMetrics:
    """The writer's metric cells, made once (names: see upf_keyspace.telemetry for the Prometheus form)."""

    __slots__ = ("stored", "replayed", "rejections", "_rejected", "size", "commit")

    def __init__(self, registry: tm.Registry) -> None:
        publishes = registry.counter(
            "upf.writer.publishes",
            "publishes answered 200, by result: stored, or replayed (an idempotency key matched an earlier publish)",
            attributes=("result",),
        )
        self.stored = publishes.cell("stored")
        self.replayed = publishes.cell("replayed")
        self.rejections = registry.counter(
            "upf.writer.rejections", "publishes refused, by ntfy error code", attributes=("code",)
        )
        self._rejected = {p.code: self.rejections.cell(str(p.code)) for p in CATALOG}
        self.size = registry.histogram(
            "upf.writer.publish.size", "request body size of accepted publishes", unit="By", bounds=tm.BYTES_BUCKETS
        ).cell()
        self.commit = registry.histogram(
            "upf.writer.publish.commit.duration",
            "time of a publish's store transaction, retries and the group commit's fsync included",
            unit="s",
            bounds=tm.LATENCY_BUCKETS,
        ).cell()

    def rejected(self, code: int) -> None:
        cell = self._rejected.get(code)
        if cell is None:  # a code outside the catalog (an HTTP error Litestar raised): still bounded
            cell = self._rejected[code] = self.rejections.cell(str(code))
        cell.add()


class WriterContext:
    __slots__ = ("settings", "limits", "store", "clock", "telemetry", "metrics", "gate", "limiter")

    def __init__(
        self,
        settings: Settings,
        store: Store | None = None,
        clock: Callable[[], int] = _unix_now,
        telemetry: tm.Telemetry | None = None,
    ) -> None:
        self.settings = settings
        self.limits = Limits.from_settings(settings)
        self.store = store
        self.clock = clock
        self.telemetry = tm.current() if telemetry is None else telemetry
        self.metrics = WriterMetrics(self.telemetry.registry)
        self.gate: AccessGate | None = None
        """Who may publish where: the process's shared gate for the store, set by the app's lifespan."""
        self.limiter: RequestLimiter | None = None
        """The request limit (ntfy's 42901), the process's for the store, set with the gate."""

    def require_store(self) -> Store:
        store = self.store
        if store is None:
            raise NtfyError(STORE_UNAVAILABLE)
        return store

    def require_gate(self) -> AccessGate:
        gate = self.gate
        if gate is None:
            raise NtfyError(STORE_UNAVAILABLE)
        return gate

    async def admit(self, user: str | None, client: str, forwarded: str | None, topic: str = "") -> str | None:
        """Spend one request of the visitor (``user``, else ``client``'s address, or the address a
        trusted proxy forwarded) or raise the 429; called after authentication, before the ACL.
        A publish to ``topic`` is charged to the topic's subscriber instead when subscriber-based
        limiting applies to it. Returns the visitor charged (None: exempt), for the daily quota and
        the RateLimit headers. Awaits nothing when the visitor is exempt or holds a leased token."""
        limiter = self.limiter
        if limiter is None:
            raise NtfyError(STORE_UNAVAILABLE)
        visitor = limiter.visitor(user, client, forwarded)
        if topic and visitor is not None and limiter.config.subscriber_rate:
            visitor = await limiter.publisher(visitor, topic)
        if not limiter.take_local(visitor):
            await limiter.lease(visitor)  # type: ignore[arg-type]  # None is always taken locally
        return visitor

    async def enter(
        self, authorization: str | None, auth_param: str | None, client: str, forwarded: str | None, topic: str
    ) -> tuple[Identity, str | None]:
        """``identify``, then ``admit`` to ``topic``: the publish path's. Why: with the gate open nothing
        is asked of the limiter's failed-login count, and the coroutines the two steps took cost more
        than what they check."""
        gate = self.require_gate()
        who = ANONYMOUS if gate.open else await self.identify(authorization, auth_param, client, forwarded)
        return who, await self.admit(who.user, client, forwarded, topic)

    async def identify(
        self, authorization: str | None, auth_param: str | None, client: str, forwarded: str | None
    ) -> Identity:
        """Who the request is (401), behind ntfy's failed-login limit (42909)."""
        limiter = self.limiter
        if limiter is None:
            raise NtfyError(STORE_UNAVAILABLE)
        return await limiter.identify(self.require_gate(), authorization, auth_param, client, forwarded)
