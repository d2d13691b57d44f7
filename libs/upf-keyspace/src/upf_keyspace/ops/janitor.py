from __future__ import annotations

from .. import keys
from ..contract import Transaction
from ..envelope import decode_envelope
from .inbox import SWEPT
from .publish import add_tally, hold_until, retire, unindex_time

MARKER_KEEP_SECS = 60
"""How long a FoundationDB commit marker (keys: TX) is kept. Only its own ``transact`` call reads it,
on the attempt after a commit_unknown_result, within the 5 s transaction timeout; the rest is room
for clock skew between the writer's host and the janitor's."""


async def expire(tr: Transaction, now: int, limit: int, keep_released_secs: int = 0) -> int:
    """Delete up to ``limit`` messages whose expiry is before ``now``, with their X entries, the
    time-index entry that names them and their Web Push Topic marker (else one marker per (topic,
    Topic) never reused would stay for good). Not at ``now``: a message's expiry second is its own
    (TTL 0 expires at its publish second, and a pass within that second would take it from a
    subscriber who is being poked for it; RFC 8030 delivers it to a connected user agent).

    What its X entry names outlives it (``publish.hold_until``), under an X entry of its own that a
    later pass clears: a released scheduled message's SR entry by up to ``keep_released_secs`` after
    its release (the longest TTL), else its id would resume from where it was scheduled and messages
    published between its scheduling and its release, which the subscriber got before it, would come
    again; an idempotency marker for ``IDEM_KEEP_SECS`` after its publish, else a retry of a TTL 0
    push would be delivered twice."""
    rows = await tr.get_range(*keys.expiry_range(now), limit=limit)
    for key, x_value in rows:
        expiry, topic, stamp = keys.unpack_expiry_key(key)
        raw = await tr.get(keys.queue_key(topic, stamp), snapshot=True)
        until = 0
        if raw is not None:
            add_tally(tr, topic, 0, -len(raw))
            env = decode_envelope(raw)
            await unindex_time(tr, topic, stamp, env.time)
            if env.push_topic:
                tr.clear(keys.push_topic_key(topic, env.push_topic, stamp))
            until = hold_until(env, x_value, keep_released_secs)
        tr.clear(keys.queue_key(topic, stamp))
        tr.clear(key)
        retire(tr, topic, stamp, x_value, until, max(now, expiry))
    return len(rows)


async def dead_nodes(tr: Transaction, now: int, max_age: int) -> list[str]:
    """Nodes whose heartbeat is older than ``max_age``, and nodes that hold topics with no liveness
    record at all (the first heartbeat failed, then the node died: else its affinities would stay for
    good, each publish to its topics adding an inbox entry nobody drains). A live node swept that way
    learns it at its next heartbeat ("missing") and holds its topics again. One read per holding node."""
    rows = await tr.get_range(*keys.liveness_range(), snapshot=True)
    known: set[str] = set()
    out: list[str] = []
    for k, v in rows:
        node = keys.unpack_liveness_key(k)
        known.add(node)
        if now - keys.unpack_i64(v) > max_age:
            out.append(node)
    begin, end = keys.holders_range()
    while first := await tr.get_range(begin, end, limit=1, snapshot=True):
        node, _ = keys.unpack_reverse_affinity_key(first[0][0])
        if node not in known:
            out.append(node)
        begin = keys.reverse_affinity_range(node)[1]
    return out


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


async def clear_commit_markers(tr: Transaction, now: int) -> None:
    """Clear the commit markers older than ``MARKER_KEEP_SECS``: one blind range clear (no read, so no
    conflict with the writers setting theirs), cheap too on the embedded store, which writes none."""
    tr.clear_range(*keys.commit_markers_before(now - MARKER_KEEP_SECS))
