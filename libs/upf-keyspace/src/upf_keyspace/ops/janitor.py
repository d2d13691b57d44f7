from __future__ import annotations

from .. import keys
from ..contract import Transaction
from ..msgid import decode_id
from .publish import RELEASED_MARK


async def expire(tr: Transaction, now: int, limit: int) -> int:
    """Delete up to ``limit`` messages whose expiry is at or before ``now``, with their X and ID (or SR) entries."""
    rows = await tr.get_range(*keys.expiry_range(now + 1), limit=limit)
    for key, idem in rows:
        _, topic, stamp = keys.unpack_expiry_key(key)
        tr.clear(keys.queue_key(topic, stamp))
        tr.clear(key)
        if idem.startswith(RELEASED_MARK):
            origin = decode_id(idem[1:].decode("ascii", "replace"))
            if origin is not None:
                tr.clear(keys.released_key(topic, origin, stamp))
        elif idem:
            tr.clear(keys.idem_key(topic, idem.decode(), stamp))
    return len(rows)


async def dead_nodes(tr: Transaction, now: int, max_age: int) -> list[str]:
    rows = await tr.get_range(*keys.liveness_range(), snapshot=True)
    return [keys.unpack_liveness_key(k) for k, v in rows if now - keys.unpack_i64(v) > max_age]


async def sweep_node(tr: Transaction, node: str, now: int, max_age: int, limit: int) -> int | None:
    """Clear a dead node's affinities (``limit`` per call); once none are left, its inbox, bells and
    liveness. Returns how many affinities were cleared, or None if the node came back to life."""
    raw = await tr.get(keys.liveness_key(node))
    if raw is not None and now - keys.unpack_i64(raw) <= max_age:
        return None
    rows = await tr.get_range(*keys.reverse_affinity_range(node), limit=limit)
    for key, _ in rows:
        _, topic = keys.unpack_reverse_affinity_key(key)
        tr.clear(keys.affinity_key(topic, node))
        tr.clear(key)
    if len(rows) < limit:
        tr.clear_range(*keys.node_inbox_range(node))
        tr.clear_range(*keys.node_bell_range(node))
        tr.clear(keys.liveness_key(node))
    return len(rows)
