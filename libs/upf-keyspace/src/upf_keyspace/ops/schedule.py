"""Scheduled delivery (ntfy's ``X-Delay``/``X-At``/``X-In``): a message waits in S until it is due, then
one transaction moves it into Q.

Exactly once with any number of releasers: ``release_due`` reads the due S keys *not* as a snapshot
and clears them in the same transaction that appends to Q, so of two releasers racing for one key,
one commits and the other conflicts, retries and finds it gone. A releaser killed before its commit
changed nothing; one killed after it released everything it read.

The publisher's id is the S key's stamp; the message enters Q later under a newer stamp, so the
released envelope carries the publisher's id in ``origin_id`` (the frame's id) and an SR entry maps
that id to the Q stamp, which is what ``since=<that id>`` resumes from (see ``read.position``).
"""

from __future__ import annotations

import msgspec

from .. import keys
from ..contract import Transaction, Watch
from ..envelope import Envelope, decode_envelope, encode_envelope
from ..msgid import encode_id
from .publish import Pending, add_tally, publish

__all__ = ["schedule", "next_due", "watch_due", "release_due"]


async def schedule(tr: Transaction, topic: str, env: Envelope, due: int) -> Pending:
    """Keep ``env`` in S until ``due`` (unix secs). No subscriber is poked (none may see it yet); the
    releasers are, through the schedule bell (an atomic add: schedulings never conflict on it)."""
    uv = tr.next_user_version()
    tr.set_versionstamped_key(keys.scheduled_key_incomplete(due, topic, uv), encode_envelope(env))
    tr.add(keys.schedule_bell_key(), keys.ONE)
    add_tally(tr, topic, 1, 0)
    return Pending(envelope=env, user_version=uv, commit_stamp=tr.get_versionstamp())


async def next_due(tr: Transaction) -> int | None:
    """The earliest due time in S (a snapshot read: releasers poll it cheaply), or None."""
    begin, end = keys.scheduled_due_range((1 << 63) - 2)
    rows = await tr.get_range(begin, end, limit=1, snapshot=True)
    return keys.unpack_scheduled_key(rows[0][0])[0] if rows else None


async def watch_due(tr: Transaction) -> tuple[int | None, Watch]:
    """The earliest due time and a watch on the schedule bell, from one read version: a scheduling
    committed after the read fires the watch, so a releaser sleeping until ``due`` misses none."""
    return await next_due(tr), tr.watch(keys.schedule_bell_key())


async def release_due(
    tr: Transaction, now: int, limit: int, *, shard_count: int, now_ms: int = 0, keep_released_secs: int = 0
) -> int:
    """Move up to ``limit`` messages due at or before ``now`` from S into Q, poking their topics' holders
    as a publish does. Returns how many were released. ``now_ms`` becomes their ``published_ms``, so a
    pusher's delivery latency counts from the release, not from the scheduling."""
    rows = await tr.get_range(*keys.scheduled_due_range(now), limit=limit)
    written: set[str] = set()
    released = 0
    for key, raw in rows:
        _, origin, topic = keys.unpack_scheduled_key(key)
        env = decode_envelope(raw)
        if env.push_topic and topic in written:
            # Its replacement reads the topic's Q and WT, which this transaction's releases made
            # unreadable (versionstamped keys): it waits for the next transaction, or the whole batch
            # would fail, and every later pass with it (S is read from its first due key).
            break
        tr.clear(key)
        env = msgspec.structs.replace(env, origin_id=encode_id(origin), published_ms=now_ms or env.published_ms)
        # Released late (a releaser down, say), its due second is not indexed: that entry would name a
        # stamp newer than later seconds' messages, and since=<a later second> would skip them.
        pending = await publish(
            tr,
            topic,
            env,
            shard_count=shard_count,
            origin=origin,
            count=False,
            index=env.time >= now,
            keep_released_secs=keep_released_secs,
        )
        tr.set_versionstamped_key(keys.released_key_incomplete(topic, origin, pending.user_version), b"")
        written.add(topic)
        released += 1
    return released
