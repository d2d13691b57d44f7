"""The thin I/O around :mod:`upf_edge.limits`: one process's share of the fleet-wide request buckets.

Why leases: every process of a fleet must draw on one bucket per visitor (else N writers behind a
balancer grant N times the budget), but a store transaction on that bucket per request would make it a
hot, conflicting key. So a process takes ``lease_size`` tokens in one small transaction
(``Store.lease_tokens``) and spends them locally; it goes back to the store only when they run out.
What is admitted fleet-wide never exceeds the bucket (every token is taken from it first); the
tolerance is the other way: tokens leased by one process and not yet spent (at most ``lease_size``
per process per visitor) are not available to the others, and a visitor idle for ``IDLE_SECS``
loses its local leftovers (they are dropped, not returned). Exempt visitors never touch the store (but
for a failed login, below), and a refused visitor does not either until its announced Retry-After is
over.

The other limits of ntfy's visitor live here too, each fleet-wide with its state in the keyspace:
failed logins (42909, exempt peers included as in ntfy: one transaction per failure, none per
success; a block is remembered locally until it ends), the daily message quota (42908: leased like
requests) and open subscriptions (42903: counted per visitor and node, one transaction per subscribe
and per close, swept with a dead node).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import weakref
from collections.abc import Callable, Sequence

from upf_keyspace import Settings, Store
from upf_keyspace.limits import day_of, secs_to_next_day

from .access import ANONYMOUS, UNAUTHORIZED, Identity
from .errors import INSUFFICIENT_STORAGE, STORE_UNAVAILABLE, NtfyError
from .gate import AccessGate
from .limits import (
    NO_SUBSCRIBER,
    TOO_MANY_AUTH_FAILURES,
    TOO_MANY_MESSAGES,
    TOO_MANY_SUBSCRIPTIONS,
    TOO_MANY_TOPICS,
    LimitConfig,
    client_address,
    in_networks,
    limited,
    parse_address,
    rate_topic,
    refusal,
    success_headers,
    visitor_key,
)
from .tokenuse import TokenUses

__all__ = ["RequestLimiter", "IDLE_SECS", "presents_credentials"]

log = logging.getLogger("upf.edge.limiter")

UNCOUNT_RETRY_SECS = (0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0, 60.0, 60.0, 60.0, 60.0)
"""The waits between retries of a failed subscription uncount (~6 min in all). Why: a store that fails
for a moment (a full file, a FoundationDB recovery) must not leave the visitor's count one too high, so
that it meets 42903 with fewer subscriptions than its limit until this node restarts; the uncount
sets the count read in its transaction less one, so an attempt that did commit but reported a failure
can take one too many off, letting the visitor one more subscription: the safe side of a limit."""

IDLE_SECS = 60.0
"""A visitor's leased tokens unused this long are dropped (bounds the memory of many visitors)."""

_MAX_CACHED_PEERS = 4096
RATE_CACHE_SECS = 5.0
"""How long a UnifiedPush topic's rate visitor (or its absence) is believed without asking the store."""
RATE_REFRESH_SECS = 3600.0
"""A node writes a topic's rate visitor again only when it changed or is this old (one write per
subscribe would make reconnect storms write storms)."""
_MAX_CACHED_TOPICS = 65_536
TOPIC_REFRESH_SECS = 3600.0
"""A process marks a topic it knows active again only this often (the janitor expunges after 16 h)."""
STORED_REFRESH_SECS = 1.0
"""How stale a process's view of the fleet's stored bytes may be (``require_storage``)."""

_SHARED: weakref.WeakKeyDictionary[Store, RequestLimiter] = weakref.WeakKeyDictionary()


async def _wait_counted(pending: asyncio.Future[None], waiting: dict[str, int], visitor: str) -> None:
    """Wait for ``visitor``'s lease in flight, counted in ``waiting`` meanwhile."""
    waiting[visitor] = waiting.get(visitor, 0) + 1
    try:
        await asyncio.shield(pending)
    finally:
        if waiting[visitor] <= 1:
            del waiting[visitor]
        else:
            waiting[visitor] -= 1


def presents_credentials(authorization: str | None, auth_param: str | None) -> bool:
    """Whether a request tries to log in (ntfy charges failures, and refuses with 42909, only then):
    ``?auth=``, or a Basic or Bearer Authorization, trimmed as ntfy trims it (``vapid``/``WebPush`` and
    a bare ``Bearer`` are anonymous)."""
    if auth_param:
        return True
    if not authorization:
        return False
    head = authorization.strip()[:7].lower()
    return head.startswith("basic ") or head.startswith("bearer ")


class RequestLimiter:
    __slots__ = (
        "store",
        "config",
        "header",
        "clock",
        "_local",
        "_refused",
        "_pending",
        "_waiting",
        "_exempt_peers",
        "_exempt_keys",
        "_peer_keys",
        "_swept",
        "_left",
        "_blocked",
        "_messages",
        "_no_messages",
        "_message_pending",
        "_message_leased",
        "_message_waiting",
        "_tasks",
        "_rates",
        "_rates_set",
        "_topics",
        "_headers",
        "_stored",
        "token_uses",
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
        self._exempt_keys: dict[str, str] = {}  # exempt peers that logged in -> their ip: visitor
        self._peer_keys: dict[str, str] = {}  # other peers -> their ip: visitor
        self._swept = 0.0
        self._left: dict[str, tuple[int, float]] = {}  # visitor -> (whole tokens its bucket kept, when)
        self._blocked: dict[str, float] = {}  # visitor -> until when its logins are refused (42909)
        self._messages: dict[str, list[int]] = {}  # visitor -> [daily messages leased and unspent, day]
        self._no_messages: dict[str, float] = {}  # visitor -> when its daily quota is back (42908)
        self._message_pending: dict[str, asyncio.Future[None]] = {}  # visitor -> its message lease in flight
        self._message_leased: dict[str, tuple[int, float]] = {}  # visitor -> (its last message lease, when)
        self._message_waiting: dict[str, int] = {}  # visitor -> publishes waiting on that lease
        self._tasks: set[asyncio.Task[None]] = set()
        self._rates: dict[str, tuple[str | None, float]] = {}  # topic -> (its rate visitor, when read)
        self._rates_set: dict[str, tuple[str, float]] = {}  # topic -> (rate visitor this node wrote, when)
        self._topics: dict[str, float] = {}  # topic -> when this process last marked it active
        self._headers: dict[int, tuple[tuple[bytes, bytes], ...]] = {}  # remaining -> RateLimit headers
        self._stored: list[float] = [0.0, -math.inf]  # [the fleet's stored bytes, when read]
        self.token_uses = TokenUses(store, config.trusted, clock)
        """Tokens' last uses, recorded by :meth:`identify` (every role logs in through it)."""

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
        if by_peer:
            if peer in self._exempt_peers:
                return None
            known = self._peer_keys.get(peer)
            if known is not None:  # an address seen before: its prefix without parsing it again (~14 us)
                return known if user is None else "user:" + user
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
        if by_peer:
            if len(self._peer_keys) >= _MAX_CACHED_PEERS:
                self._peer_keys.clear()
            self._peer_keys[peer] = visitor_key(None, addr, config.prefix4, config.prefix6)
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
            await _wait_counted(pending, self._waiting, visitor)
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
        self._left[visitor] = (lease.left, now)
        if lease.granted > 1:
            self._local[visitor] = [lease.granted - 1, now]

    def _sweep(self, now: float) -> None:
        self._swept = now
        for v in [v for v, (_, last) in self._local.items() if now - last > IDLE_SECS]:
            del self._local[v]
        for v in [v for v, until in self._refused.items() if until <= now]:
            del self._refused[v]
        for v in [v for v, (_, at) in self._left.items() if now - at > IDLE_SECS]:
            del self._left[v]
        for v in [v for v, until in self._blocked.items() if until <= now]:
            del self._blocked[v]
        day = day_of(now)
        for v in [v for v, (_, d) in self._messages.items() if d != day]:
            del self._messages[v]
            self._message_leased.pop(v, None)
        for v in [v for v, until in self._no_messages.items() if until <= now]:
            del self._no_messages[v]
        for t in [t for t, (_, at) in self._rates.items() if now - at >= RATE_CACHE_SECS]:
            del self._rates[t]

    # --- RateLimit headers on admitted requests ---------------------------------------------------------
    def headers(self, visitor: str | None) -> tuple[tuple[bytes, bytes], ...]:
        """The draft's headers for an admitted request of ``visitor`` (none for an exempt one): what
        its bucket held at this process's last lease plus the tokens this process holds unspent."""
        if visitor is None:
            return ()
        left = self._left.get(visitor)
        local = self._local.get(visitor)
        remaining = (left[0] if left else 0) + (int(local[0]) if local else 0)
        cached = self._headers.get(remaining)
        if cached is None:  # the pair depends on the count alone: built once per count (~3.5 us each)
            if len(self._headers) >= _MAX_CACHED_PEERS:
                self._headers.clear()
            cached = self._headers[remaining] = success_headers(self.config, remaining)
        return cached

    # --- failed logins (ntfy's 42909) ---------------------------------------------------------------------
    async def identify(
        self, gate: AccessGate, authorization: str | None, auth_param: str | None, peer: str, forwarded: str | None
    ) -> Identity:
        """``gate.identify`` (an ``AccessGate``) behind ntfy's failed-login limit: a visitor (by address)
        with too many failures gets 42909 whatever it presents, and every 401 is charged to it in the
        store before it is answered (so the fleet's count is exact; a success costs nothing). Exempt
        peers too: ntfy's exemption covers requests and messages, never password guessing."""
        if gate.open:
            return ANONYMOUS
        visitor = self.login_visitor(peer, forwarded) if presents_credentials(authorization, auth_param) else None
        if visitor is not None:
            self.login_allowed(visitor)
        try:
            who = gate.identify(authorization, auth_param)
        except NtfyError as exc:
            if visitor is None or exc.problem != UNAUTHORIZED:
                raise
            raise await self.login_failed(visitor) from None
        if who.token:
            self.token_uses.note(who.token, who.user or "", peer, forwarded)
        return who

    def login_visitor(self, peer: str, forwarded: str | None) -> str | None:
        """The visitor failed logins are charged to: the address's, exempt or not (ntfy checks
        ``AuthAllowed`` for every visitor); None for a peer that is no IP (a Unix socket: local)."""
        visitor = self.visitor(None, peer, forwarded)
        if visitor is not None:
            return visitor
        by_peer = not self.config.trusted or not forwarded
        if by_peer:
            known = self._exempt_keys.get(peer)
            if known is not None:
                return known
        visitor = self.visitor_of(None, peer, forwarded)
        if by_peer and visitor is not None:  # an exempt peer logging in again: its key without parsing
            if len(self._exempt_keys) >= _MAX_CACHED_PEERS:
                self._exempt_keys.clear()
            self._exempt_keys[peer] = visitor
        return visitor

    def login_allowed(self, visitor: str) -> None:
        """Raise 42909 while ``visitor`` is known (here) to be blocked."""
        until = self._blocked.get(visitor)
        if until is not None:
            now = self.clock()
            if now < until:
                raise limited(TOO_MANY_AUTH_FAILURES, math.ceil(until - now))
            del self._blocked[visitor]

    async def login_failed(self, visitor: str) -> NtfyError:
        """Charge a failed login to ``visitor``; the error to answer with: 401, or 42909 when another
        process's failures had blocked it already."""
        config = self.config
        now = self.clock()
        try:
            failure = await self.store.auth_failure(visitor, now, config.auth_burst, config.auth_refill_secs)
        except Exception:
            log.warning("failed login not recorded", exc_info=True)
            return NtfyError(UNAUTHORIZED)
        if failure.blocked:
            self._blocked[visitor] = now + failure.blocked
        if not failure.counted:
            return limited(TOO_MANY_AUTH_FAILURES, failure.blocked)
        return NtfyError(UNAUTHORIZED)

    # --- daily messages (ntfy's 42908) --------------------------------------------------------------------
    async def message(self, visitor: str | None) -> None:
        """Spend one of ``visitor``'s messages of the UTC day or raise 42908. Leased like requests: sized
        by ``LimitConfig.message_want``, at most a hundredth of the quota, so a process holds at most
        that many unspent. Concurrent publishes of one visitor wait for one lease, as :meth:`lease`
        does, and the next lease takes one more for each of them: else each would take a lease of its
        own, spend one message of it and drop the rest (a transaction per publish, and the fleet's
        quota drawn many times faster than it is used)."""
        if visitor is None:
            return
        while True:
            now = self.clock()
            day = day_of(now)
            if self._spend_message(visitor, day):
                return
            until = self._no_messages.get(visitor)
            if until is not None:
                if now < until:
                    raise limited(TOO_MANY_MESSAGES, math.ceil(until - now))
                del self._no_messages[visitor]
            pending = self._message_pending.get(visitor)
            if pending is None:
                break
            await _wait_counted(pending, self._message_waiting, visitor)
        done = self._message_pending[visitor] = asyncio.get_running_loop().create_future()
        try:
            await self._lease_messages(visitor, now, day)
        finally:
            del self._message_pending[visitor]
            done.set_result(None)

    def _spend_message(self, visitor: str, day: int) -> bool:
        """Spend one message of ``visitor``'s lease for ``day`` (True), or say the store must be asked."""
        entry = self._messages.get(visitor)
        if entry is not None and entry[1] == day and entry[0] > 0:
            entry[0] -= 1
            return True
        return False

    async def _lease_messages(self, visitor: str, now: float, day: int) -> None:
        config = self.config
        last = self._message_leased.get(visitor)
        want = config.message_lease if last is None else config.message_want(last[0], now - last[1])
        want += self._message_waiting.get(visitor, 0)  # spent as soon as it lands: no one's slack
        try:
            granted = await self.store.lease_messages(visitor, day, want, config.message_limit)
        except Exception:
            log.warning("daily message lease failed", exc_info=True)
            raise NtfyError(STORE_UNAVAILABLE) from None
        if not granted:
            wait = secs_to_next_day(now)
            self._no_messages[visitor] = now + wait
            raise limited(TOO_MANY_MESSAGES, wait)
        self._messages[visitor] = [granted - 1, day]
        self._message_leased[visitor] = (granted, self.clock())  # timed from its grant, not its ask

    # --- open subscriptions (ntfy's 42903) ----------------------------------------------------------------
    async def open_subscription(self, visitor: str | None, node: str) -> None:
        """Count a subscription of ``visitor`` held on ``node``, or raise 42903 when the visitor holds
        the limit across the fleet. Pair with :meth:`close_subscription`."""
        if visitor is None:
            return
        try:
            total = await self.store.open_subscription(visitor, node, self.config.subscriptions)
        except Exception:
            log.warning("subscription count failed", exc_info=True)
            raise NtfyError(STORE_UNAVAILABLE) from None
        if total is None:
            raise NtfyError(TOO_MANY_SUBSCRIPTIONS)

    def close_subscription(self, visitor: str | None, node: str) -> None:
        """The subscription ended: uncount it in the background, retried while the store fails
        (``UNCOUNT_RETRY_SECS``); past the last retry the count is left to the node's restart or the
        janitor's dead-node sweep."""
        if visitor is None:
            return
        task = asyncio.get_running_loop().create_task(self._close(visitor, node))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _close(self, visitor: str, node: str) -> None:
        for attempt, delay in enumerate((*UNCOUNT_RETRY_SECS, None)):
            try:
                await self.store.close_subscription(visitor, node)
                return
            except Exception as exc:
                if delay is None:
                    log.warning("subscription uncount abandoned", exc_info=True, extra={"attempts": attempt + 1})
                    return
                log.warning("subscription uncount failed", extra={"retry_secs": delay, "error": type(exc).__name__})
            await asyncio.sleep(delay)

    # --- subscriber-based limiting for UnifiedPush topics (ntfy's visitor-subscriber-rate-limiting) --------
    def wants_rates(self, topics: Sequence[str]) -> bool:
        """Whether subscribing to ``topics`` sets rate visitors (the mode is on and one is UnifiedPush's)."""
        return self.config.subscriber_rate and any(rate_topic(t) for t in topics)

    def visitor_of(self, user: str | None, peer: str, forwarded: str | None) -> str | None:
        """The visitor of a request whether or not it is exempt (a subscriber becomes a topic's rate
        visitor either way, as in ntfy); None for a peer that is no IP."""
        addr = parse_address(peer)
        if addr is None:
            return None
        config = self.config
        return visitor_key(user, client_address(addr, forwarded, config.trusted), config.prefix4, config.prefix6)

    async def set_rate_visitors(self, topics: Sequence[str], visitor: str | None) -> None:
        """``visitor`` subscribed to ``topics`` (already filtered to those it may write, as ntfy
        requires): charge their publishes to it from now on. A store failure is logged, not fatal:
        the subscribe itself is fine."""
        if visitor is None:
            return
        now = self.clock()
        fresh = []
        for t in topics:
            if not rate_topic(t):
                continue
            done = self._rates_set.get(t)
            if done is None or done[0] != visitor or now - done[1] > RATE_REFRESH_SECS:
                fresh.append(t)
        if not fresh:
            return
        try:
            await self.store.set_rate_visitors(fresh, visitor, now)
        except Exception:
            log.warning("rate visitor not recorded", exc_info=True)
            return
        if len(self._rates_set) >= _MAX_CACHED_TOPICS:
            self._rates_set.clear()
        for t in fresh:
            self._rates_set[t] = (visitor, now)
            self._rates[t] = (visitor, now)

    async def rate_visitor(self, topic: str) -> str | None:
        """``topic``'s rate visitor (cached for ``RATE_CACHE_SECS``); None when the mode is off, the
        topic is not UnifiedPush's, or nobody subscribed to it."""
        if not self.config.subscriber_rate or not rate_topic(topic):
            return None
        now = self.clock()
        cached = self._rates.get(topic)
        if cached is not None and now - cached[1] < RATE_CACHE_SECS:
            return cached[0]
        try:
            found = await self.store.rate_visitor(topic, now)
        except Exception:
            log.warning("rate visitor lookup failed", exc_info=True)
            raise NtfyError(STORE_UNAVAILABLE) from None
        if len(self._rates) >= _MAX_CACHED_TOPICS:
            self._rates.clear()
        self._rates[topic] = (found, now)
        return found

    async def publisher(self, visitor: str | None, topic: str) -> str | None:
        """The visitor a publish to ``topic`` by ``visitor`` is charged to: the topic's rate visitor when
        there is one, else the publisher (None, exempt, stays exempt: ntfy exempts by the publisher)."""
        if visitor is None or not self.config.subscriber_rate:
            return visitor
        return await self.rate_visitor(topic) or visitor

    async def require_subscriber(self, topic: str, unifiedpush: bool) -> None:
        """ntfy's 507 50701: a UnifiedPush publish to a topic nobody has subscribed to, with the mode on."""
        if unifiedpush and self.config.subscriber_rate and rate_topic(topic) and await self.rate_visitor(topic) is None:
            raise NtfyError(NO_SUBSCRIBER)

    # --- a publish's limits after the ACL, together -----------------------------------------------------
    def publish_local(self, visitor: str | None, topic: str) -> bool:
        """Settle a publish's limits after the ACL without the store, all or nothing: True (its message
        is spent) when none of :meth:`admit_publish`'s checks could refuse it or would ask the store.
        Why: nearly every publish of a steady publisher is settled here, and each check as a coroutine
        cost more than what it checks. False: await ``admit_publish``, which runs them all."""
        config = self.config
        if config.subscriber_rate:
            return False
        now = self.clock()
        bound = config.max_store_bytes
        if bound and (now - self._stored[1] >= STORED_REFRESH_SECS or self._stored[0] >= bound):
            return False
        if visitor is None:
            return True
        return self._topic_fresh(topic, now) and self._spend_message(visitor, day_of(now))

    async def admit_publish(self, visitor: str | None, topic: str, unifiedpush: bool) -> None:
        """A publish's limits after the ACL, in ntfy's order: no subscriber (507 50701, in the
        subscriber mode, for a UnifiedPush publish), the day's messages (42908), the active topics
        (42904), then the storage bound (507 50702)."""
        await self.require_subscriber(topic, unifiedpush)
        await self.message(visitor)
        await self.touch_topics((topic,), visitor)
        await self.require_storage()

    # --- the storage bound (UPF_MAX_STORE_BYTES, 507) ---------------------------------------------------
    async def require_storage(self) -> None:
        """507 50702 while the fleet's stored message bytes are at or past ``UPF_MAX_STORE_BYTES``. The
        total is read at most once per ``STORED_REFRESH_SECS`` (one snapshot read of a few keys), so a
        fleet may pass the bound by that long's publishes; what is stored is never touched, and
        publishes resume as the janitor expires messages."""
        bound = self.config.max_store_bytes
        if not bound:
            return
        now = self.clock()
        if now - self._stored[1] >= STORED_REFRESH_SECS:
            self._stored[1] = now
            self._stored[0] = await self.store.stored_bytes()
        if self._stored[0] >= bound:
            raise NtfyError(INSUFFICIENT_STORAGE)

    # --- the fleet's active topics (ntfy's 42904) ------------------------------------------------------
    async def touch_topics(self, topics: Sequence[str], visitor: str | None) -> None:
        """Count ``topics`` among the fleet's active topics, or raise 42904 when a new one would pass
        the cap. A topic this process marked within ``TOPIC_REFRESH_SECS`` costs nothing; exempt
        visitors (None) are not counted."""
        if visitor is None:
            return
        now = self.clock()
        stale = [t for t in topics if not self._topic_fresh(t, now)]
        if not stale:
            return
        try:
            ok = await self.store.touch_topics(stale, int(now), self.config.total_topics)
        except Exception:
            log.warning("active topics not recorded", exc_info=True)
            raise NtfyError(STORE_UNAVAILABLE) from None
        if not ok:
            raise NtfyError(TOO_MANY_TOPICS)
        if len(self._topics) >= _MAX_CACHED_TOPICS:
            self._topics.clear()
        for t in stale:
            self._topics[t] = now

    def _topic_fresh(self, topic: str, now: float) -> bool:
        """This process marked ``topic`` active within ``TOPIC_REFRESH_SECS``."""
        return now - self._topics.get(topic, -TOPIC_REFRESH_SECS - 1) <= TOPIC_REFRESH_SECS

    async def reset_node(self, node: str) -> None:
        """Clear ``node``'s subscription counts (a process starting holds none; a node id reused across
        restarts must not inherit the last run's)."""
        while await self.store.reset_node_subscriptions(node, 500) == 500:
            pass
