from __future__ import annotations

from collections.abc import Awaitable

import msgspec

from .. import keys
from ..contract import Transaction
from ..envelope import Envelope, decode_envelope, encode_envelope

_ONE = keys.pack_i64(1)


class Pending(msgspec.Struct):
    """What a publish body returns; the stamp is known only once the transaction has committed."""

    envelope: Envelope
    user_version: int = 0
    commit_stamp: Awaitable[bytes] | None = None
    duplicate_of: bytes | None = None
    poked: int = 0


async def publish(tr: Transaction, topic: str, env: Envelope, *, shard_count: int, idem: str = "") -> Pending:
    """Append to Q, index in X, poke every node holding the topic: one stamp for all of it."""
    if idem:
        marker = await tr.get_range(*keys.idem_range(topic, idem), limit=1)
        if marker:
            _, _, stamp = keys.unpack_idem_key(marker[0][0])
            raw = await tr.get(keys.queue_key(topic, stamp))
            if raw is not None:
                return Pending(envelope=decode_envelope(raw), duplicate_of=stamp)
            tr.clear(marker[0][0])  # the original expired: publish anew
    uv = tr.next_user_version()
    tr.set_versionstamped_key(keys.queue_key_incomplete(topic, uv), encode_envelope(env))
    tr.set_versionstamped_key(keys.expiry_key_incomplete(env.expires, topic, uv), idem.encode())
    index_time(tr, topic, env.time, uv)
    if idem:
        tr.set_versionstamped_key(keys.idem_key_incomplete(topic, idem, uv), b"")
    holders = await tr.get_range(*keys.affinity_range(topic))
    if holders:
        shard = keys.shard_of(topic, shard_count)
        payload = topic.encode()
        for key, _ in holders:
            _, node = keys.unpack_affinity_key(key)
            tr.set_versionstamped_key(keys.inbox_key_incomplete(node, shard, uv), payload)
            tr.add(keys.bell_key(node, shard), _ONE)
    return Pending(envelope=env, user_version=uv, commit_stamp=tr.get_versionstamp(), poked=len(holders))


def index_time(tr: Transaction, topic: str, second: int, user_version: int) -> None:
    """Point the topic's entry for ``second`` at this message (see keys, QT): a blind versionstamped
    write, so concurrent publishes never conflict on it and the last to commit wins."""
    tr.set_versionstamped_value(keys.time_index_key(topic, second), keys.time_index_value_incomplete(user_version))
