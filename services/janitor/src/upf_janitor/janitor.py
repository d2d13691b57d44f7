"""The janitor's passes: expire TTL'd messages through the X index in bounded batches, sweep nodes
whose heartbeat is older than a few heartbeat intervals, then clear request buckets that have refilled
(a full bucket is the same as none: without this, every visitor ever seen would stay in the store), and
take a sample of the fleet's message counter for ``/v1/stats`` when one is due. ``X-Cache: no``
messages need nothing special: their X entry is due early (``UPF_NOCACHE_KEEP_SECS``).
The other limits' state goes the same way: the subscription counts of a node whose heartbeat is
stale or gone (a pusher that died cannot uncount its subscriptions), refilled failed-login buckets,
the daily message counts of days past, UnifiedPush topics' rate visitors a day old whose topic
no node holds, and active topics unused for 16 hours (ntfy's topic expunging, for the 42904 cap).
Last, the FoundationDB driver's commit markers a minute old (one range clear; ``ops.janitor``).

Bounded batches keep each transaction far below FoundationDB's 5 s / 10 MB limits and let writers
and pushers interleave; several janitors may run at once (their transactions conflict and retry,
nothing is cleared twice).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time

import msgspec

from upf_keyspace import Settings, Store, StoreError
from upf_keyspace import telemetry as tm
from upf_keyspace.limits import day_of

__all__ = ["Janitor", "JanitorMetrics", "PassResult", "DEAD_AFTER_HEARTBEATS"]

log = logging.getLogger("upf.janitor")

DEAD_AFTER_HEARTBEATS = 3
"""A node silent for this many heartbeat intervals is dead: its records are swept."""


def dead_after(settings: Settings) -> int:
    """Seconds of silence after which a node is dead (``DEAD_AFTER_HEARTBEATS`` heartbeats, at least 1)."""
    return max(1, int(round(settings.heartbeat_secs * DEAD_AFTER_HEARTBEATS)))


EXPIRE_BATCH = 500
SWEEP_BATCH = 500
BUCKET_BATCH = 500
STATS_SAMPLES = 10
"""Samples of the message counter kept for /v1/stats' rate (ntfy keeps 10)."""


class PassResult(msgspec.Struct):
    expired: int = 0
    swept_nodes: list[str] = msgspec.field(default_factory=list)
    cleared_affinities: int = 0
    cleared_buckets: int = 0
    cleared_subscriptions: int = 0


class JanitorMetrics:
    __slots__ = ("passes", "failed_passes", "expired", "swept_nodes", "cleared_affinities", "cleared_buckets")

    def __init__(self, registry: tm.Registry) -> None:
        passes = registry.counter(
            "upf.janitor.passes", "janitor passes, by result: ok or failed", attributes=("result",)
        )
        self.passes = passes.cell("ok")
        self.failed_passes = passes.cell("failed")
        self.expired = registry.counter("upf.janitor.expired", "messages deleted because their TTL ran out").cell()
        self.swept_nodes = registry.counter(
            "upf.janitor.swept_nodes", "dead pusher nodes whose records (affinity, inbox, bells, liveness) were swept"
        ).cell()
        self.cleared_affinities = registry.counter(
            "upf.janitor.cleared_affinities", "affinity records of dead nodes cleared"
        ).cell()
        self.cleared_buckets = registry.counter(
            "upf.janitor.cleared_buckets", "request buckets cleared because they had refilled"
        ).cell()


class Janitor:
    def __init__(self, store: Store, settings: Settings, telemetry: tm.Telemetry | None = None) -> None:
        self.store = store
        self.metrics = JanitorMetrics((tm.current() if telemetry is None else telemetry).registry)
        self.interval = settings.janitor_interval_secs
        self.dead_after = dead_after(settings)
        self.burst = settings.limit_request_burst
        self.refill_secs = settings.limit_request_refill_secs
        self.stats_every = settings.stats_sample_secs
        self.auth_burst = settings.limit_auth_failure_burst
        self.auth_refill_secs = settings.limit_auth_failure_refill_secs
        self.passes = 0
        self.last: PassResult | None = None

    async def run_once(self, now: int | None = None) -> PassResult:
        now = int(time.time()) if now is None else now
        result = PassResult()
        metrics = self.metrics
        batch = EXPIRE_BATCH
        while True:
            try:
                n = await self.store.expire(now, batch)
            except StoreError as exc:
                # A deletion needs fresh pages too (copy-on-write): on a nearly full disk a big batch
                # is refused where a small one fits, and each one that commits frees room.
                if not exc.storage_full or batch == 1:
                    raise
                batch = max(1, batch // 4)
                continue
            result.expired += n
            metrics.expired.add(n)
            if n < batch:
                break
            batch = min(EXPIRE_BATCH, batch * 2)
        for node in await self.store.stale_subscription_nodes(now, self.dead_after):
            while True:
                cleared = await self.store.reset_node_subscriptions(node, SWEEP_BATCH, now, self.dead_after)
                if cleared is None:  # it came back to life meanwhile
                    break
                result.cleared_subscriptions += cleared
                if cleared < SWEEP_BATCH:
                    break
        for node in await self.store.dead_nodes(now, self.dead_after):
            while True:
                cleared = await self.store.sweep_node(node, now, self.dead_after, SWEEP_BATCH)
                if cleared is None:  # it came back to life meanwhile
                    break
                result.cleared_affinities += cleared
                metrics.cleared_affinities.add(cleared)
                if cleared < SWEEP_BATCH:
                    result.swept_nodes.append(node)
                    metrics.swept_nodes.add()
                    break
        after: bytes | None = None
        while True:
            cleared, after = await self.store.sweep_buckets(now, self.burst, self.refill_secs, after, BUCKET_BATCH)
            result.cleared_buckets += cleared
            metrics.cleared_buckets.add(cleared)
            if after is None:
                break
        after = None
        while True:
            cleared, after = await self.store.sweep_auth_buckets(
                now, self.auth_burst, self.auth_refill_secs, after, BUCKET_BATCH
            )
            result.cleared_buckets += cleared
            metrics.cleared_buckets.add(cleared)
            if after is None:
                break
        await self.store.sweep_days(day_of(now))
        after = None
        while True:
            _, after = await self.store.sweep_topics(now, after, BUCKET_BATCH)
            if after is None:
                break
        after = None
        while True:
            _, after = await self.store.sweep_rate_visitors(now, after, BUCKET_BATCH)
            if after is None:
                break
        await self.store.sample_stats(now, self.stats_every, STATS_SAMPLES)
        await self.store.clear_commit_markers(now)
        self.passes += 1
        metrics.passes.add()
        self.last = result
        if result.expired or result.swept_nodes or result.cleared_buckets or result.cleared_subscriptions:
            log.info(
                "janitor pass",
                extra={
                    "expired": result.expired,
                    "swept_nodes": len(result.swept_nodes),
                    "cleared_affinities": result.cleared_affinities,
                    "cleared_buckets": result.cleared_buckets,
                    "cleared_subscriptions": result.cleared_subscriptions,
                },
            )
        return result

    async def run(self, stop: asyncio.Event) -> None:
        """Pass every interval (jittered, so a fleet of janitors spreads out) until ``stop`` is set."""
        while not stop.is_set():
            try:
                await self.run_once()
            except StoreError as exc:
                self.metrics.failed_passes.add()
                log.warning("janitor pass failed", extra={"code": exc.code})
            except Exception:
                self.metrics.failed_passes.add()
                log.exception("janitor pass crashed")
            delay = self.interval * random.uniform(0.9, 1.1)
            try:
                await asyncio.wait_for(stop.wait(), delay)
            except TimeoutError:
                pass
