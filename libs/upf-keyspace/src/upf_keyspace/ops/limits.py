"""Request-limit leases: one small transaction takes a few tokens from a visitor's shared bucket.

Why leases: a fleet must share one budget per visitor, but a read-modify-write of the visitor's
bucket on every request would make that key a hot conflict. A process takes several tokens at a
time and spends them locally (``upf_edge.limiter``), so the bucket is touched once per lease.
"""

from __future__ import annotations

from .. import keys
from ..contract import Transaction
from ..limits import (
    RATE_VISITOR_SECS,
    Failure,
    Lease,
    RateVisitor,
    decode_bucket,
    decode_rate_visitor,
    encode_bucket,
    encode_rate_visitor,
    fail,
    is_full,
    take,
    take_count,
)

__all__ = [
    "lease",
    "sweep",
    "auth_failure",
    "sweep_auth",
    "lease_messages",
    "sweep_days",
    "open_subscription",
    "close_subscription",
    "reset_node_subscriptions",
    "stale_subscription_nodes",
    "set_rate_visitors",
    "rate_visitor",
    "sweep_rate_visitors",
    "TOPIC_EXPUNGE_SECS",
    "touch_topics",
    "sweep_topics",
]


async def lease(tr: Transaction, visitor: str, want: int, now: float, burst: int, refill_secs: float) -> Lease:
    """Take up to ``want`` tokens of ``visitor``'s bucket. A refusal writes nothing (the stored level
    plus the refill since is still the truth), so a refused visitor's retries do not conflict."""
    key = keys.bucket_key(visitor)
    raw = await tr.get(key)
    bucket, granted = take(None if raw is None else decode_bucket(raw), want, now, burst, refill_secs)
    if granted.granted:
        tr.set(key, encode_bucket(bucket))
    return granted


async def sweep(
    tr: Transaction, now: float, burst: int, refill_secs: float, after: bytes | None, limit: int
) -> tuple[int, bytes | None]:
    """Clear the buckets among the next ``limit`` after key ``after`` that have refilled to the burst
    (a full bucket is the same as none), so a visitor seen once does not stay in the store. Returns
    how many were cleared and the key to continue after (None: the end). The reads are not snapshot
    reads: a lease committing meanwhile makes this transaction retry instead of losing its take."""
    return await _sweep_buckets(tr, keys.bucket_range(), now, burst, refill_secs, after, limit)


async def _sweep_buckets(
    tr: Transaction,
    span: tuple[bytes, bytes],
    now: float,
    burst: int,
    refill_secs: float,
    after: bytes | None,
    limit: int,
) -> tuple[int, bytes | None]:
    begin, end = span
    if after is not None:
        begin = after + b"\x00"
    rows = await tr.get_range(begin, end, limit=limit)
    cleared = 0
    for key, raw in rows:
        if is_full(decode_bucket(raw), now, burst, refill_secs):
            tr.clear(key)
            cleared += 1
    return cleared, rows[-1][0] if len(rows) == limit else None


async def auth_failure(tr: Transaction, visitor: str, now: float, burst: int, refill_secs: float) -> Failure:
    """Charge one failed login to ``visitor``'s fleet-wide failure bucket (nothing is written when it
    is blocked already)."""
    key = keys.auth_bucket_key(visitor)
    raw = await tr.get(key)
    bucket, failure = fail(None if raw is None else decode_bucket(raw), now, burst, refill_secs)
    if bucket is not None:
        tr.set(key, encode_bucket(bucket))
    return failure


async def sweep_auth(
    tr: Transaction, now: float, burst: int, refill_secs: float, after: bytes | None, limit: int
) -> tuple[int, bytes | None]:
    """``sweep`` for the failed-login buckets."""
    return await _sweep_buckets(tr, keys.auth_bucket_range(), now, burst, refill_secs, after, limit)


async def lease_messages(tr: Transaction, visitor: str, day: int, want: int, limit: int) -> int:
    """Take up to ``want`` of ``visitor``'s messages of UTC ``day`` (at most ``limit`` a day); how many."""
    key = keys.daily_key(day, visitor)
    count = keys.unpack_i64(await tr.get(key))
    granted = take_count(count, want, limit)
    if granted:
        tr.set(key, keys.pack_i64(count + granted))
    return granted


async def sweep_days(tr: Transaction, today: int) -> None:
    """Clear the daily counts of days before ``today`` (one range clear)."""
    tr.clear_range(*keys.daily_range(today))


async def open_subscription(tr: Transaction, visitor: str, node: str, limit: int) -> int | None:
    """Count one more open subscription of ``visitor`` on ``node`` unless the fleet's total is at
    ``limit`` (None). The read of every node's count makes two nodes admitting the visitor's last
    slot at once conflict: one of them retries and sees the other's."""
    rows = await tr.get_range(*keys.subscription_range(visitor))
    total = sum(keys.unpack_i64(v) for _, v in rows)
    if total >= limit:
        return None
    key = keys.subscription_key(visitor, node)
    mine = keys.unpack_i64(await tr.get(key))
    tr.set(key, keys.pack_i64(mine + 1))
    if mine == 0:
        tr.set(keys.node_subscription_key(node, visitor), b"")
    return total + 1


async def close_subscription(tr: Transaction, visitor: str, node: str) -> None:
    """One subscription of ``visitor`` on ``node`` ended (a count swept meanwhile stays gone)."""
    key = keys.subscription_key(visitor, node)
    mine = keys.unpack_i64(await tr.get(key))
    if mine <= 1:
        tr.clear(key)
        tr.clear(keys.node_subscription_key(node, visitor))
    else:
        tr.set(key, keys.pack_i64(mine - 1))


async def reset_node_subscriptions(
    tr: Transaction, node: str, limit: int, now: int | None = None, max_age: int = 0
) -> int | None:
    """Clear up to ``limit`` of ``node``'s counts (a dead node's, or a node's own at start: a fresh
    process holds none). Returns how many visitors' counts were cleared; with ``now``, None (nothing
    cleared) when the node's heartbeat is fresh again, so a node that came back keeps its counts."""
    if now is not None:
        beat = await tr.get(keys.liveness_key(node))
        if beat is not None and now - keys.unpack_i64(beat) <= max_age:
            return None
    rows = await tr.get_range(*keys.node_subscription_range(node), limit=limit)
    for key, _ in rows:
        _, visitor = keys.unpack_node_subscription_key(key)
        tr.clear(keys.subscription_key(visitor, node))
        tr.clear(key)
    return len(rows)


async def stale_subscription_nodes(tr: Transaction, now: int, max_age: int) -> list[str]:
    """The nodes holding subscription counts whose heartbeat is missing or older than ``max_age``
    (one small read per node: the scan jumps from node to node)."""
    begin, end = keys.node_subscription_range()
    stale: list[str] = []
    while True:
        rows = await tr.get_range(begin, end, limit=1, snapshot=True)
        if not rows:
            return stale
        node, _ = keys.unpack_node_subscription_key(rows[0][0])
        beat = await tr.get(keys.liveness_key(node), snapshot=True)
        if beat is None or now - keys.unpack_i64(beat) > max_age:
            stale.append(node)
        begin = keys.node_subscription_range(node)[1]


async def set_rate_visitors(tr: Transaction, topics: list[str], visitor: str, now: float) -> None:
    """``visitor`` subscribed to these UnifiedPush topics: their publishes are charged to it (blind
    writes: the last subscriber wins, as in ntfy)."""
    raw = encode_rate_visitor(RateVisitor(visitor, now))
    for topic in topics:
        tr.set(keys.rate_visitor_key(topic), raw)


async def rate_visitor(tr: Transaction, topic: str, now: float) -> str | None:
    """The visitor a publish to ``topic`` is charged to: its last subscriber, while a node holds the
    topic or for ``RATE_VISITOR_SECS`` after that subscribe; else None (snapshot reads: a cache fill)."""
    raw = await tr.get(keys.rate_visitor_key(topic), snapshot=True)
    if raw is None:
        return None
    rv = decode_rate_visitor(raw)
    if now - rv.at <= RATE_VISITOR_SECS or await tr.get_range(*keys.affinity_range(topic), limit=1, snapshot=True):
        return rv.visitor
    return None


async def sweep_rate_visitors(tr: Transaction, now: float, after: bytes | None, limit: int) -> tuple[int, bytes | None]:
    """Clear rate visitors past ``RATE_VISITOR_SECS`` whose topic no node holds, ``limit`` per batch."""
    begin, end = keys.rate_visitor_range()
    if after is not None:
        begin = after + b"\x00"
    rows = await tr.get_range(begin, end, limit=limit)
    cleared = 0
    for key, raw in rows:
        if now - decode_rate_visitor(raw).at > RATE_VISITOR_SECS:
            topic = keys.unpack_rate_visitor_key(key)
            if not await tr.get_range(*keys.affinity_range(topic), limit=1):
                tr.clear(key)
                cleared += 1
    return cleared, rows[-1][0] if len(rows) == limit else None


TOPIC_EXPUNGE_SECS = 16 * 3600
"""ntfy's topicExpungeAfter: a topic nobody subscribes to stops counting this long after its last use."""


async def touch_topics(tr: Transaction, topics: list[str], now: int, limit: int) -> bool:
    """Mark ``topics`` active; False (nothing written) when one is new and the fleet already has
    ``limit`` active topics. The count is an atomic add read as a snapshot, so new topics created at
    once do not conflict on it (they may pass the limit by as many as are created concurrently); the
    topic's own key is read normally, so one topic is never counted twice."""
    new = [t for t in topics if await tr.get(keys.active_topic_key(t)) is None]
    if new and keys.unpack_i64(await tr.get(keys.topic_count_key(), snapshot=True)) + len(new) > limit:
        return False
    stamp = keys.pack_i64(now)
    for t in topics:
        tr.set(keys.active_topic_key(t), stamp)
    if new:
        tr.add(keys.topic_count_key(), keys.pack_i64(len(new)))
    return True


async def sweep_topics(tr: Transaction, now: int, after: bytes | None, limit: int) -> tuple[int, bytes | None]:
    """Stop counting topics unused for ``TOPIC_EXPUNGE_SECS`` that no node holds (no subscriber) and
    that have no rate visitor, as ntfy's topic pruning; ``limit`` per batch."""
    begin, end = keys.active_topic_range()
    if after is not None:
        begin = after + b"\x00"
    rows = await tr.get_range(begin, end, limit=limit)
    cleared = 0
    for key, raw in rows:
        if now - keys.unpack_i64(raw) <= TOPIC_EXPUNGE_SECS:
            continue
        topic = keys.unpack_active_topic_key(key)
        if await tr.get_range(*keys.affinity_range(topic), limit=1) or await rate_visitor(tr, topic, now) is not None:
            continue
        tr.clear(key)
        cleared += 1
    if cleared:
        tr.add(keys.topic_count_key(), keys.pack_i64(-cleared))
    return cleared, rows[-1][0] if len(rows) == limit else None
