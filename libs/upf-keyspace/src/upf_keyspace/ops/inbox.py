from __future__ import annotations

from collections.abc import Mapping

import msgspec

from .. import keys
from ..contract import Transaction, WatchSet

_DRAIN_BATCH = 1024


class Drained(msgspec.Struct):
    topics: set[str]
    more: bool
    """The inbox held more than one batch: drain again (its bell was not re-armed)."""
    entries: int = 0
    """Inbox entries read (one per poke; several may name the same topic)."""
    last: bytes | None = None
    """The last inbox key read: the next drain reads after it, and ``clear`` may clear up to it."""


class Pokes(msgspec.Struct):
    """What one drain of several shards found, for all of them together: a busy node's wake-up
    drains dozens of shards holding one or two pokes each, and a set and a ``Drained`` per shard,
    built here and taken apart by the caller, cost more than the reads."""

    topics: set[str]
    """The topics poked, in any of the shards."""
    entries: int
    """Inbox entries read (one per poke; several may name the same topic)."""
    lasts: dict[int, bytes]
    """Each shard that had pokes: the last inbox key read (the next drain reads after it)."""
    more: list[int]
    """The shards that held more than one batch: drain them again (their bells were not re-armed)."""


async def drain(tr: Transaction, node: str, shard: int, bells: WatchSet, after: bytes | None = None) -> Drained:
    """Read the pokes of one shard after ``after`` and re-arm its bell (in ``bells``) in the same
    transaction, so a poke that lands after this read always rings it.

    Read-only on purpose: the delivery path takes no write lock and makes no durable commit. A poke
    committed after this snapshot carries a larger stamp (commit order), so it sorts after ``last``
    and the next drain reads it; ``clear`` removes what was read, in the background."""
    got = await drain_many(tr, node, {shard: after}, bells)
    return Drained(got.topics, bool(got.more), got.entries, got.lasts.get(shard, after))


async def drain_many(tr: Transaction, node: str, afters: Mapping[int, bytes | None], bells: WatchSet) -> Pokes:
    """``drain`` for several shards in one read-only transaction and one ``get_ranges``: one wake-up
    may follow several bells. ``bells`` (the node's K bells, ``bell_keys``) are re-armed for every
    shard read to its end; one with more than a batch left is not (drain it again at once)."""
    ranges = []
    for shard, after in afters.items():
        begin, end = keys.inbox_range(node, shard)
        ranges.append((begin if after is None else after + b"\x00", end, _DRAIN_BATCH))
    answers = await tr.get_ranges(ranges, snapshot=True)
    topics: set[str] = set()
    lasts: dict[int, bytes] = {}
    more: list[int] = []
    rearm = []
    entries = 0
    # An answer per shard; strict= would cost zip() a keyword parse on 3.11, every wake-up.
    for shard, rows in zip(afters, answers):  # noqa: B905
        if rows:
            entries += len(rows)
            lasts[shard] = rows[-1][0]
            for _, v in rows:  # a loop, not a comprehension: on 3.11 that is a function object and a frame
                topics.add(v.decode())
            if len(rows) == _DRAIN_BATCH:
                more.append(shard)
                continue
        rearm.append(shard)
    tr.arm(bells, rearm)
    return Pokes(topics, entries, lasts, more)


def bell_keys(node: str, shards: int) -> list[bytes]:
    """The keys of a node's bells, shard by shard: what its watch set watches."""
    return [keys.bell_key(node, shard) for shard in range(shards)]


async def clear(tr: Transaction, node: str, shard: int, upto: bytes) -> None:
    """Remove the pokes of one shard up to and including ``upto`` (already read by a drain)."""
    begin, _ = keys.inbox_range(node, shard)
    tr.clear_range(begin, upto + b"\x00")


async def clear_many(tr: Transaction, node: str, uptos: Mapping[int, bytes]) -> None:
    """``clear`` for several shards in one small write."""
    for shard, upto in uptos.items():
        await clear(tr, node, shard, upto)


SWEPT = keys.pack_i64(0)
"""The liveness record of a node whose sweep has begun (a heartbeat from the epoch: dead to
``dead_nodes``). A node that was only partitioned, not dead, and heartbeats between two sweep batches
reads it as swept, and holds its topics again: else the affinities the first batch cleared would be
gone while the node believed it still held them (no pokes, only the safety poll, until its
subscribers reconnect)."""


async def retire(tr: Transaction, node: str) -> None:
    """A node that stopped cleanly (its affinity released): its liveness record becomes ``SWEPT``, so the
    janitor sweeps what it leaves (its inbox, bells) at its next pass instead of three heartbeats later,
    and nothing takes it for running (``upf restore``). A blind write: no conflict with a sweep."""
    tr.set(keys.liveness_key(node), SWEPT)


async def heartbeat(tr: Transaction, node: str, now: int) -> bool:
    """Refresh liveness; False when the record was missing or ``SWEPT`` (swept as dead, wholly or in
    part), so the caller holds its topics again."""
    key = keys.liveness_key(node)
    raw = await tr.get(key)
    tr.set(key, keys.pack_i64(now))
    return raw is not None and raw != SWEPT
