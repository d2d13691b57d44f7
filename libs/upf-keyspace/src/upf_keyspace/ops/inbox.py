from __future__ import annotations

import msgspec

from .. import keys
from ..contract import Transaction, Watch

_DRAIN_BATCH = 1024


class Drained(msgspec.Struct):
    topics: set[str]
    bell: Watch
    more: bool
    """The inbox held more than one batch: drain again (the bell has fired already anyway)."""
    entries: int = 0
    """Inbox entries taken (one per poke; several may name the same topic)."""


async def drain(tr: Transaction, node: str, shard: int) -> Drained:
    """Take the poked topics of one shard and re-arm its bell in the same transaction, so a poke that
    lands after this read always fires the new watch."""
    begin, end = keys.inbox_range(node, shard)
    # A snapshot read: pokes committed after this read carry larger stamps (commit order), so they
    # sort after the last key read and survive the clear below; a conflicting read would instead make
    # every concurrent publish abort the drain.
    rows = await tr.get_range(begin, end, limit=_DRAIN_BATCH, snapshot=True)
    if rows:
        tr.clear_range(begin, rows[-1][0] + b"\x00")
    bell = tr.watch(keys.bell_key(node, shard))
    return Drained({v.decode() for _, v in rows}, bell, len(rows) == _DRAIN_BATCH, len(rows))


async def heartbeat(tr: Transaction, node: str, now: int) -> bool:
    """Refresh liveness; False when the record was missing (swept as dead), so the caller re-registers."""
    key = keys.liveness_key(node)
    existed = await tr.get(key) is not None
    tr.set(key, keys.pack_i64(now))
    return existed
