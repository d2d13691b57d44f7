from __future__ import annotations

import struct
from collections.abc import Awaitable, Sequence

import msgspec
from msgspec.structs import replace

from .. import keys
from ..contract import Transaction
from ..envelope import Envelope, decode_envelope, encode_envelope
from ..msgid import decode_id, encode_id


class Pending(msgspec.Struct):
    """What a publish body returns; the stamp is known only once the transaction has committed."""

    envelope: Envelope
    user_version: int = 0
    commit_stamp: Awaitable[bytes] | None = None
    duplicate_of: bytes | None = None
    """The stamp of the message an earlier commit stored under the same idempotency key."""
    poked: int = 0
    repeat: bool = False
    """The same idempotency key as an earlier publish of its group: this is that publish's answer."""


STAT_SLOTS = 16
"""The fleet-wide counters are spread over this many keys (summed when read), so the atomic add of
every publish does not all land on one hot key."""

TALLY = "tally"
"""The stats counter's name (``ST / "tally" / slot``): one 16-byte little-endian value per slot, the
message count in its low 8 bytes and the stored message bytes in its high 8, so a publish counts both
with one atomic add. The message count never goes below 0, so adding to the high half never borrows
from the low one, and the high half read as a signed 64-bit integer is the byte count."""

APPENDS = "appends"
"""``ST / "appends" / slot``: 8-byte little-endian counts of the messages that entered Q (publishes and
scheduled releases). It only grows, so a pusher whose last safety pass began at the same sum has
nothing new to find (``Hub.safety_pass``); the tally cannot say so, as expiries take from it."""

LEGACY_MESSAGES, LEGACY_BYTES = "messages", "bytes"
"""The two 8-byte counters ``TALLY`` replaced; stores written before it still hold them, and the
readers add them in."""

RELEASED_MARK = b"\x01"
"""An X entry's value starting with this byte names the publish id (base64url) of a released scheduled
message, not an idempotency key (those are printable ASCII): the janitor then clears its SR entry."""

_TALLY_BITS = 1 << 128

IDEM_KEEP_SECS = 3600
"""How long after its publish an idempotency key still answers a retry when its message leaves sooner
(TTL 0, ``X-Cache: no``, a Web Push ``Topic`` replacement): a retry after a lost answer comes within
seconds or minutes, and it must not deliver the message twice."""

_MARKER = struct.Struct("<qq")
"""An idempotency marker's value: its message's time and expiry, so a retry is answered as the
original was once the message is gone."""


def add_tally(tr: Transaction, topic: str, messages: int, stored_bytes: int, *, appended: bool = False) -> None:
    """Add to ``/v1/stats``' message count and to the fleet's stored message bytes (for
    ``UPF_MAX_STORE_BYTES``): added by a publish, the bytes taken off by the janitor's expiry and by
    a Web Push Topic replacement; ``appended``: and count one entry into Q (``APPENDS``). Atomic adds:
    never a conflict. Messages stored before the byte count existed are not in it."""
    add_tally_slot(tr, keys.shard_of(topic, STAT_SLOTS), messages, stored_bytes, 1 if appended else 0)


def add_tally_slot(tr: Transaction, slot: int, messages: int, stored_bytes: int, appended: int) -> None:
    """``add_tally`` for one slot, with ``appended`` entries into Q (so a group's adds can be summed)."""
    param = ((stored_bytes << 64) + messages) % _TALLY_BITS
    tr.add(keys.stat_key(TALLY, slot), param.to_bytes(16, "little"))
    if appended:
        tr.add(keys.stat_key(APPENDS, slot), appended.to_bytes(8, "little"))


async def publish(
    tr: Transaction,
    topic: str,
    env: Envelope,
    *,
    shard_count: int,
    idem: str = "",
    origin: bytes = b"",
    count: bool = True,
    index: bool = True,
    keep_released_secs: int = 0,
) -> Pending:
    """Append to Q, index in X, poke every node holding the topic: one stamp for all of it.

    ``origin`` is set by a scheduled release: the stamp the publisher was given, remembered in the X
    entry so the janitor can clear the SR entry that maps it to this Q stamp. ``count``: add to the
    stats' message count (a release was counted when it was scheduled). ``index``: point the time
    index (QT) at it (a late release is not: its second is in the past). ``keep_released_secs``: how
    long a released message's SR entry outlives it (the janitor's, for a Topic replacement's)."""
    if idem:
        original = await _original(tr, topic, await tr.get_range(*keys.idem_range(topic, idem), limit=1), env)
        if isinstance(original, Pending):
            return original
        if original is not None:
            tr.clear(original)  # a marker without its times, its message gone: publish anew
    # Read before writing: a read that none of the transaction's own writes can touch needs no merge
    # with them (the embedded driver then reads its snapshot directly: 4% of a publish's instructions).
    holders = await tr.get_range(*keys.affinity_range(topic))
    if env.push_topic:
        await replace_push_topic(tr, topic, env.push_topic, env.time, keep_released_secs)
    tallies: dict[int, list[int]] = {}
    pending = _append(
        tr,
        topic,
        env,
        holders,
        shard_count,
        tr.get_versionstamp(),
        tallies,
        idem=idem,
        origin=origin,
        count=count,
        index=index,
    )
    _add_tallies(tr, tallies)
    return pending


async def publish_many(tr: Transaction, items: Sequence[tuple[str, Envelope]], *, shard_count: int) -> list[Pending]:
    """Plain publishes (no idempotency key, no Web Push ``Topic``) in one transaction, each with its
    own user version under the one commit stamp.
    Why: a transaction's fixed costs (its reads' version, the commit's hand-off and conflict check)
    are most of a small publish's; concurrent publishers share them (``Store.publish`` through
    ``Database.transact_grouped``, which also holds this function to reading before writing).
    Every affinity range is read before anything is written, so no read merges with a write. The
    stats adds are summed per slot over the group: two adds per slot, not two per publish."""
    found = await tr.get_ranges([(*keys.affinity_range(topic), 0) for topic, _ in items])
    stamp = tr.get_versionstamp()
    tallies: dict[int, list[int]] = {}
    out = [
        _append(tr, topic, env, holders, shard_count, stamp, tallies)
        for (topic, env), holders in zip(items, found, strict=True)
    ]
    _add_tallies(tr, tallies)
    return out


async def publish_keyed(
    tr: Transaction, items: Sequence[tuple[str, Envelope, str]], *, shard_count: int
) -> list[Pending]:
    """Publishes with an idempotency key, ``(topic, envelope, key)``, grouped as ``publish_many``
    groups plain ones (a group of their own: plain publishes pay nothing for keys). Each key's
    marker is read with the affinity ranges, before any write. A key an earlier commit stored
    answers with that message (``duplicate_of``); a key twice in the group, its later items with the
    first's (``repeat``), also once the message is gone (see ``IDEM_KEEP_SECS``)."""
    n = len(items)
    found = await tr.get_ranges(
        [(*keys.affinity_range(topic), 0) for topic, _, _ in items]
        + [(*keys.idem_range(topic, idem), 1) for topic, _, idem in items]
    )
    stored: dict[int, Pending] = {}
    stale: list[bytes] = []
    for i, (topic, env, _) in enumerate(items):
        original = await _original(tr, topic, found[n + i], env)
        if isinstance(original, Pending):
            stored[i] = original
        elif original is not None:
            stale.append(original)
    for key in stale:  # after every read: cleared, and the publish stored anew
        tr.clear(key)
    stamp = tr.get_versionstamp()
    tallies: dict[int, list[int]] = {}
    firsts: dict[tuple[str, str], Pending] = {}
    out: list[Pending] = []
    for i, (topic, env, idem) in enumerate(items):
        if i in stored:
            out.append(stored[i])
            continue
        first = firsts.get((topic, idem))
        if first is not None:
            out.append(replace(first, poked=0, repeat=True))
            continue
        pending = firsts[topic, idem] = _append(tr, topic, env, found[i], shard_count, stamp, tallies, idem=idem)
        out.append(pending)
    _add_tallies(tr, tallies)
    return out


async def _original(
    tr: Transaction, topic: str, marker: Sequence[tuple[bytes, bytes]], env: Envelope
) -> Pending | bytes | None:
    """What an idempotency key's marker (its range, read with limit 1) means for the retry ``env``:
    the earlier publish's answer, from its message while stored, else from the retry's own content
    with the original's id and times (the marker outlives it, ``IDEM_KEEP_SECS``); the marker's key,
    stale, for the caller to clear when it holds no times (written before markers did); None: no
    marker."""
    if not marker:
        return None
    key, value = marker[0]
    _, _, stamp = keys.unpack_idem_key(key)
    raw = await tr.get(keys.queue_key(topic, stamp))
    if raw is not None:
        return Pending(envelope=decode_envelope(raw), duplicate_of=stamp)
    if len(value) != _MARKER.size:
        return key
    time, expires = _MARKER.unpack(value)
    return Pending(envelope=replace(env, time=time, expires=expires), duplicate_of=stamp)


def _add_tallies(tr: Transaction, tallies: dict[int, list[int]]) -> None:
    """The stats ``_append`` summed, two atomic adds per slot."""
    for slot, (messages, stored_bytes, appended) in tallies.items():
        add_tally_slot(tr, slot, messages, stored_bytes, appended)


def _append(
    tr: Transaction,
    topic: str,
    env: Envelope,
    holders: Sequence[tuple[bytes, bytes]],
    shard_count: int,
    stamp: Awaitable[bytes],
    tallies: dict[int, list[int]],
    *,
    idem: str = "",
    origin: bytes = b"",
    count: bool = True,
    index: bool = True,
) -> Pending:
    """A publish's writes, once its reads are done; its stats are summed into ``tallies`` (slot ->
    [messages, bytes, entries into Q]) for the caller to add with ``_add_tallies``."""
    uv = tr.next_user_version()
    value = encode_envelope(env)
    tr.set_versionstamped_key(keys.queue_key_incomplete(topic, uv), value)
    held = tallies.setdefault(keys.shard_of(topic, STAT_SLOTS), [0, 0, 0])
    held[0] += 1 if count else 0
    held[1] += len(value)
    held[2] += 1
    if env.push_topic:
        tr.set_versionstamped_key(keys.push_topic_key_incomplete(topic, env.push_topic, uv), b"")
    x_value = RELEASED_MARK + encode_id(origin).encode() if origin else idem.encode()
    tr.set_versionstamped_key(keys.expiry_key_incomplete(env.expires, topic, uv), x_value)
    if index:
        index_time(tr, topic, env.time, uv)
    if idem:
        tr.set_versionstamped_key(keys.idem_key_incomplete(topic, idem, uv), _MARKER.pack(env.time, env.expires))
    if holders:
        shard = keys.shard_of(topic, shard_count)
        payload = topic.encode()
        for key, _ in holders:
            _, node = keys.unpack_affinity_key(key)
            tr.set_versionstamped_key(keys.inbox_key_incomplete(node, shard, uv), payload)
            tr.add(keys.bell_key(node, shard), keys.ONE)
    return Pending(envelope=env, user_version=uv, commit_stamp=stamp, poked=len(holders))


async def replace_push_topic(
    tr: Transaction, topic: str, push_topic: str, now: int, keep_released_secs: int = 0
) -> int:
    """RFC 8030 section 5.4: the message this Web Push ``Topic`` last named on ``topic``, if it is
    still stored, leaves the queue with its marker, in the transaction that stores its replacement
    (``now``: its time), as the janitor's expiry takes a message: its idempotency marker or SR entry
    is held as long (``hold_until``), so a retry of it is not stored again, nor does its id resume from
    before it. Returns how many messages were replaced (0 or 1)."""
    replaced = 0
    for marker, _ in await tr.get_range(*keys.push_topic_range(topic, push_topic)):
        _, _, stamp = keys.unpack_push_topic_key(marker)
        qkey = keys.queue_key(topic, stamp)
        raw = await tr.get(qkey)
        if raw is not None:
            old = decode_envelope(raw)
            tr.clear(qkey)
            add_tally(tr, topic, 0, -len(raw))
            tr.clear(keys.expiry_key(old.expires, topic, stamp))
            x_value = RELEASED_MARK + old.origin_id.encode() if old.origin_id else old.idem.encode()
            retire(tr, topic, stamp, x_value, hold_until(old, x_value, keep_released_secs), now)
            await unindex_time(tr, topic, stamp, old.time)  # as the janitor's expiry does
            replaced += 1
        tr.clear(marker)
    return replaced


def hold_until(env: Envelope, x_value: bytes, keep_released_secs: int) -> int:
    """Until when what a message's X entry names (``x_value``) outlives the message: a released
    scheduled message's SR entry (its publish id -> its Q stamp, what ``since=<that id>`` resumes
    from) until ``keep_released_secs`` after its release; an idempotency marker until
    ``IDEM_KEEP_SECS`` after its publish; 0: nothing to hold."""
    if x_value.startswith(RELEASED_MARK):
        return env.published_ms // 1000 + keep_released_secs if keep_released_secs else 0
    return env.time + IDEM_KEEP_SECS if x_value else 0


def retire(tr: Transaction, topic: str, stamp: bytes, x_value: bytes, until: int, now: int) -> None:
    """What the X entry of a message that left Q named: held under an X entry of its own at ``until``
    (a plain key: the stamp is known) while that is after ``now``, else cleared."""
    if until > now:
        tr.set(keys.expiry_key(until, topic, stamp), x_value)
    elif x_value.startswith(RELEASED_MARK):
        origin = decode_id(x_value[1:].decode("ascii", "replace"))
        if origin is not None:
            tr.clear(keys.released_key(topic, origin, stamp))
    elif x_value:
        tr.clear(keys.idem_key(topic, x_value.decode(), stamp))


async def unindex_time(tr: Transaction, topic: str, stamp: bytes, second: int) -> None:
    """Clear the topic's time-index entry of this message's second if it names this message (a later
    message of the same second owns it otherwise). Not a snapshot read: a publish of that second
    committing meanwhile makes this transaction retry rather than clear the newer entry. An entry
    that outlives its message is harmless (a cursor need not exist); a second whose entry went while
    longer-lived messages of it remain is found through an earlier entry: more messages, never fewer."""
    index = keys.time_index_key(topic, second)
    if await tr.get(index) == stamp:
        tr.clear(index)


def index_time(tr: Transaction, topic: str, second: int, user_version: int) -> None:
    """Point the topic's entry for ``second`` at this message (see keys, QT): a blind versionstamped
    write, so concurrent publishes never conflict on it and the last to commit wins."""
    tr.set_versionstamped_value(keys.time_index_key(topic, second), keys.time_index_value_incomplete(user_version))
