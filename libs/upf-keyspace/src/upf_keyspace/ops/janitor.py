from __future__ import annotations

from .. import keys
from ..contract import Transaction
from ..envelope import decode_envelope
from ..msgid import decode_id
from .inbox import SWEPT
from .publish import RELEASED_MARK, add_tally, unindex_time


async def expire(tr: Transaction, now: int, limit: int) -> int:
    """Delete up to ``limit`` messages whose expiry is before ``now``, with their X and ID (or SR)
    entries, the time-index entry that names them and their Web Push Topic marker (else one marker per
    (topic, Topic) never reused would stay for good). Not at ``now``: a message's expiry second is its
    own (TTL 0 expires at its publish second, and a pass within that second would take it from a
    subscriber who is being poked for it; RFC 8030 delivers it to a connected user agent)."""
    rows = await tr.get_range(*keys.expiry_range(now), limit=limit)
    for key, idem in rows:
        _, topic, stamp = keys.unpack_expiry_key(key)
        raw = await tr.get(keys.queue_key(topic, stamp), snapshot=True)
        if raw is not None:
            add_tally(tr, topic, 0, -len(raw))
            env = decode_envelope(raw)
            await unindex_time(tr, topic, stamp, env.time)
            if env.push_topic:
                tr.clear(keys.push_topic_key(topic, env.push_topic, stamp))
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
    else:  # more to sweep: a node alive after all must learn it lost these (see ops.inbox.heartbeat)
        tr.set(keys.liveness_key(node), SWEPT)
    return len(rows)
