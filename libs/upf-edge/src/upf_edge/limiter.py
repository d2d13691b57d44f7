"""The thin I/O around :mod:`upf_edge.limits`: one process's share of the fleet-wide request buckets.

Why leases: every process of a fleet must draw on one bucket per visitor (else N writers behind a
balancer grant N times the budget), but a store transaction on that bucket per request would make it a
hot, conflicting key. So a process takes ``lease_size`` tokens in one small transaction
(``Store.lease_tokens``) and spends them locally; it goes back to the store only when they run out.
What is admitted fleet-wide never exceeds the bucket (every token is taken from it first); the
tolerance is the other way: tokens leased by one process and not yet spent (at most ``lease_size``
per process per visitor) are not available to the others, and a visitor idle for ``IDLE_SECS``
loses its local leftovers (they are dropped, not returned). Exempt visitors never touch the store, and
a refused visitor does not either until its announced Retry-After is over.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import weakref
from collections.abc import Callable

from upf_keyspace import Settings, Store

from .errors import STORE_UNAVAILABLE, NtfyError
from .limits import LimitConfig, client_address, in_networks, parse_address, refusal, visitor_key

__all__ = ["RequestLimiter", "IDLE_SECS"]

log = logging.getLogger("upf.edge.limiter")

IDLE_SECS = 60.0
"""A visitor's leased tokens unused this long are dropped (bounds the memory of many visitors)."""

_MAX_CACHED_PEERS = 4096

_SHARED: weakref.WeakKeyDictionary[Store, RequestLimiter] = weakref.WeakKeyDictionary()


class RequestLimiter:
    __slots__ = (
        "store", "config", "header", "clock", "_local", "_refused", "_pending", "_waiting", "_exempt_peers", "_swept",
        "__weakref__",
    )

    def __init__(self, store: Store, config: LimitConfig, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.config = config
        self.header = config.header
        """The forwarded header's lower-case name: callers pass its value to :meth:`visitor`."""
        self.clock = clock
        self._local: dict[str, list[float]] = {}  # visitor -> [tokens leased and unspent, last use]
        self._refused: dict[str, float] = {}  # visitor -> when its bucket will next hold a token
        self._pending: dict[str, asyncio.Future[None]] = {}  # visitor -> its lease in flight
        self._waiting: dict[str, int] = {}  # visitor -> requests waiting on that lease
        self._exempt_peers: set[str] = set()  # exempt peers, known without parsing them again
        self._swept = 0.0

    @classmethod
    def shared(cls, store: Store, settings: Settings) -> RequestLimiter:
        """The limiter of ``store`` in this process, so that the roles of an all-in-one share leases."""
        limiter = _SHARED.get(store)
        if limiter is None:
            limiter = _SHARED[store] = cls(store, LimitConfig.from_settings(settings))
        return limiter

    def visitor(self, user: str | None, peer: str, forwarded: str | None) -> str | None:
        """The visitor a request counts against, or None when it is exempt. A peer that is no IP (a
        Unix socket) is local, hence exempt."""
        config = self.config
        by_peer = not config.trusted or not forwarded  # the decision depends on the peer alone
        if by_peer and peer in self._exempt_peers:
            return None
        addr = parse_address(peer)
        if addr is None:
            return None
        addr = client_address(addr, forwarded, config.trusted)
        if in_networks(addr, config.exempt):
            if by_peer:
                if len(self._exempt_peers) >= _MAX_CACHED_PEERS:
                    self._exempt_peers.clear()
                self._exempt_peers.add(peer)
            return None
        return visitor_key(user, addr, config.prefix4, config.prefix6)

    def take_local(self, visitor: str | None) -> bool:
        """Spend one locally leased token (True), or say the store must be asked (False)."""
        if visitor is None:
            return True
        entry = self._local.get(visitor)
        if entry is None:
            return False
        entry[0] -= 1
        entry[1] = self.clock()
        if entry[0] <= 0:
            del self._local[visitor]
        return True

    async def check(self, visitor: str | None) -> None:
        """Admit one request of ``visitor`` or raise the 429 (503 when the store does not answer)."""
        if not self.take_local(visitor):
            await self.lease(visitor)  # type: ignore[arg-type]  # None is always taken locally

    async def lease(self, visitor: str) -> None:
        """Lease tokens for ``visitor`` from the store and spend one of them, or raise the 429.
        Concurrent requests of one visitor wait for a single lease instead of each taking one (which
        would empty the bucket into one process and refuse the rest); a refusal is remembered until its
        wait is over (no token can be in the bucket before then), so hammering costs no transaction."""
        while True:
            now = self.clock()
            until = self._refused.get(visitor)
            if until is not None:
                if now < until:
                    raise refusal(self.config, math.ceil(until - now))
                del self._refused[visitor]
            pending = self._pending.get(visitor)
            if pending is None:
                break
            waiting = self._waiting
            waiting[visitor] = waiting.get(visitor, 0) + 1
            try:
                await asyncio.shield(pending)
            finally:
                if waiting[visitor] <= 1:
                    del waiting[visitor]
                else:
                    waiting[visitor] -= 1
            if self.take_local(visitor):
                return
        if now - self._swept > IDLE_SECS:
            self._sweep(now)
        done = self._pending[visitor] = asyncio.get_running_loop().create_future()
        try:
            await self._lease(visitor, now)
        finally:
            del self._pending[visitor]
            done.set_result(None)

    async def _lease(self, visitor: str, now: float) -> None:
        """One lease: ``lease_size`` tokens plus one for every request already waiting on it (their
        tokens are spent at once, so they add to no one's unspent slack; one transaction serves them)."""
        config = self.config
        want = config.lease_size + self._waiting.get(visitor, 0)
        try:
            lease = await self.store.lease_tokens(visitor, want, now, config.burst, config.refill_secs)
        except Exception:
            log.warning("request limit lease failed", exc_info=True)
            raise NtfyError(STORE_UNAVAILABLE) from None
        if not lease.granted:
            self._refused[visitor] = now + lease.wait
            raise refusal(config, lease.wait)
        if lease.granted > 1:
            self._local[visitor] = [lease.granted - 1, now]

    def _sweep(self, now: float) -> None:
        self._swept = now
        for v in [v for v, (_, last) in self._local.items() if now - last > IDLE_SECS]:
            del self._local[v]
        for v in [v for v, until in self._refused.items() if until <= now]:
            del self._refused[v]
