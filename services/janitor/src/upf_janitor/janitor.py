"""The janitor's passes: expire TTL'd messages through the X index in bounded batches, then sweep
nodes whose heartbeat is older than a few heartbeat intervals.

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

__all__ = ["Janitor", "PassResult", "DEAD_AFTER_HEARTBEATS"]

log = logging.getLogger("upf.janitor")

DEAD_AFTER_HEARTBEATS = 3
"""A node silent for this many heartbeat intervals is dead: its records are swept."""
EXPIRE_BATCH = 500
SWEEP_BATCH = 500


class PassResult(msgspec.Struct):
    expired: int = 0
    swept_nodes: list[str] = msgspec.field(default_factory=list)
    cleared_affinities: int = 0


class Janitor:
    def __init__(self, store: Store, settings: Settings) -> None:
        self.store = store
        self.interval = settings.janitor_interval_secs
        self.dead_after = max(1, int(round(settings.heartbeat_secs * DEAD_AFTER_HEARTBEATS)))
        self.passes = 0
        self.last: PassResult | None = None

    async def run_once(self, now: int | None = None) -> PassResult:
        now = int(time.time()) if now is None else now
        result = PassResult()
        while True:
            n = await self.store.expire(now, EXPIRE_BATCH)
            result.expired += n
            if n < EXPIRE_BATCH:
                break
        for node in await self.store.dead_nodes(now, self.dead_after):
            while True:
                cleared = await self.store.sweep_node(node, now, self.dead_after, SWEEP_BATCH)
                if cleared is None:  # it came back to life meanwhile
                    break
                result.cleared_affinities += cleared
                if cleared < SWEEP_BATCH:
                    result.swept_nodes.append(node)
                    break
        self.passes += 1
        self.last = result
        if result.expired or result.swept_nodes:
            log.info(
                "janitor pass",
                extra={"expired": result.expired, "swept_nodes": len(result.swept_nodes),
                       "cleared_affinities": result.cleared_affinities},
            )
        return result

    async def run(self, stop: asyncio.Event) -> None:
        """Pass every interval (jittered, so a fleet of janitors spreads out) until ``stop`` is set."""
        while not stop.is_set():
            try:
                await self.run_once()
            except StoreError as exc:
                log.warning("janitor pass failed", extra={"code": exc.code})
            except Exception:
                log.exception("janitor pass crashed")
            delay = self.interval * random.uniform(0.9, 1.1)
            try:
                await asyncio.wait_for(stop.wait(), delay)
            except asyncio.TimeoutError:
                pass
