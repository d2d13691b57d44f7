from __future__ import annotations

from .. import keys
from ..contract import Transaction
from ..envelope import decode_envelope
from ..msgid import decode_id
from .publish import RELEASED_MARK, add_tally


async def expire(tr: Transaction, now: int, limit: int) -> int:
    """Delete up to ``limit`` messages whose expiry is at or before ``now``, with their X and ID (or SR)
    entries, the time-index entry that names them and their Web Push Topic marker (else one marker per
    (topic, Topic) never reused would stay for good)."""
    rows = await tr.get_range(*keys.expiry_range(now + 1), limit=limit)
    for key, idem in rows:
        _, topic, stamp = keys.unpack_expiry_key(key)
        raw = await tr.get(keys.queue_key(topic, stamp), snapshot=True)
        if raw is not None:
            add_tally(tr, topic, 0, -len(raw))
            env = decode_envelope(raw)
            await _unindex_time(tr, topic, stamp, env.time)
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


async def _unindex_time(tr: Transaction, topic: str, stamp: bytes, second: int) -> None:
    """Clear the topic's time-index entry of this message's second if it names this message (a later
    message of the same second owns it otherwise). Not a snapshot read: a publish of that second
    committing meanwhile makes this transaction retry rather than clear the newer entry. An entry
    that outlives its message is harmless (a cursor need not exist); a second whose entry went while
    longer-lived messages of it remain is found through an earlier entry: more messages, never fewer."""
    index = keys.time_index_key(topic, second)
    if await tr.get(index) == stamp:
        tr.clear(index)


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
