"""since=<time> through the time index (QT): a fixed, small number of keys read whatever the queue
length; the bounded, resumable fallback for rows written before the index; the janitor's cleanup."""

from __future__ import annotations

import time

import pytest

from upf_keyspace import Envelope, Since, keys
from upf_keyspace.envelope import encode_envelope
from upf_keyspace.ops import read
from upf_keyspace.ops.publish import index_time

BIG = 60_000
PER_SECOND = 10
PER_TRANSACTION = 5_000


@pytest.fixture
async def store(new_store):
    return await new_store(shard_count=8)


class Counting:
    """A transaction that counts the keys its reads return (and the reads): what position() costs."""

    def __init__(self, tr, tally):
        self._tr = tr
        self._tally = tally

    async def get(self, key, *, snapshot=False):
        self._tally["reads"] += 1
        value = await self._tr.get(key, snapshot=snapshot)
        self._tally["keys"] += value is not None
        return value

    async def get_range(self, begin, end, **kw):
        self._tally["reads"] += 1
        rows = await self._tr.get_range(begin, end, **kw)
        self._tally["keys"] += len(rows)
        return rows

    def __getattr__(self, name):
        return getattr(self._tr, name)


async def counted_position(store, topic, since):
    tally = {"reads": 0, "keys": 0}

    async def body(tr):
        return await read.position(Counting(tr, tally), topic, since)

    return await store.db.transact(body), tally


async def fill(store, topic, n, base, *, indexed=True, per_second=PER_SECOND):
    """``n`` messages, ``per_second`` per second from ``base``, written straight into Q (and QT when
    ``indexed``) in big transactions: the same keys a publish writes, without its per-message reads."""
    for start in range(0, n, PER_TRANSACTION):

        async def body(tr, start=start):
            for i in range(start, min(n, start + PER_TRANSACTION)):
                t = base + i // per_second
                uv = tr.next_user_version()
                env = Envelope(time=t, expires=t + 86400, message=f"m{i}")
                tr.set_versionstamped_key(keys.queue_key_incomplete(topic, uv), encode_envelope(env))
                tr.set_versionstamped_key(keys.expiry_key_incomplete(env.expires, topic, uv), b"")
                if indexed:
                    index_time(tr, topic, t, uv)

        await store.db.transact(body)


async def messages_from(store, topic, cursor, limit=1000):
    return [m.envelope.message for m in await store.read_after(topic, cursor, limit)]


async def test_position_reads_a_few_keys_on_a_large_topic(store):
    """60,000 messages: a time in the middle, near the end, before the start and after the end each
    cost at most two reads of one key each, and the cursor is exactly right."""
    base = int(time.time()) - BIG // PER_SECOND - 10
    await fill(store, "big", BIG, base)
    for second in (base + 3000, base + BIG // PER_SECOND - 1, base - 5, base + BIG):
        cursor, tally = await counted_position(store, "big", Since("time", time=second))
        assert tally["reads"] <= 2 and tally["keys"] <= 2, (second, tally)
        first = max(0, min(BIG, (second - base) * PER_SECOND))
        assert await messages_from(store, "big", cursor, 3) == [f"m{i}" for i in range(first, min(BIG, first + 3))]


async def test_same_second_is_inclusive_and_published_messages_are_indexed(store):
    """Through the ordinary publish: since=T includes every message of second T, none before."""
    for t, msg in ((1000, "a"), (1000, "b"), (2000, "c"), (2000, "d"), (3000, "e")):
        await store.publish("t", Envelope(time=t, expires=int(time.time()) + 3600, message=msg))
    for second, want in ((999, "abcde"), (1000, "abcde"), (1001, "cde"), (2000, "cde"), (3000, "e"), (3001, "")):
        cur = (await store.positions(["t"], Since("time", time=second)))["t"]
        assert "".join(await messages_from(store, "t", cur)) == want, second


async def test_unindexed_rows_are_scanned_in_bounded_resumable_batches(store):
    """Rows written before the index existed: one transaction reads at most one batch, the caller
    resumes, and the cursor is the same as the scan from the start would give."""
    base = 1_000_000
    await fill(store, "old", 3_000, base, indexed=False)
    cursor, tally = await counted_position(store, "old", Since("time", time=base + 250))
    assert isinstance(cursor, read.Resume) and tally["keys"] <= read._SCAN_BATCH + 1
    got = (await store.positions(["old"], Since("time", time=base + 250)))["old"]
    assert (await messages_from(store, "old", got, 2)) == ["m2500", "m2501"]
    # Indexed messages after the old ones: the index answers alone again.
    await fill(store, "old", 20, base + 1000)
    cursor, tally = await counted_position(store, "old", Since("time", time=base + 1001))
    assert tally["reads"] == 1 and (await messages_from(store, "old", cursor, 1)) == ["m10"]


async def test_a_live_subscribe_finishes_an_unindexed_scan(store):
    """The pusher's subscribe (with live marks) resolves since=<time> on pre-index rows to a cursor, not
    a half-done scan."""
    base = 1_000_000
    await fill(store, "old", 3_000, base, indexed=False)
    cursors, marks = await store.subscribe_live(["old"], "n1", Since("time", time=base + 250))
    assert (await messages_from(store, "old", cursors["old"], 2)) == ["m2500", "m2501"]
    assert marks["old"] is not None and marks["old"] > cursors["old"]


async def test_subscribe_resolves_time_with_the_index(store):
    await fill(store, "s", 2_000, 5_000)
    cur = await store.subscribe(["s", "empty"], "n1", Since("time", time=5_100))
    assert (await messages_from(store, "s", cur["s"], 1)) == ["m1000"] and cur["empty"] is None


async def test_janitor_clears_the_index_entry_with_its_message(store):
    """An entry is cleared with the message it names; an entry a later message of the same second
    owns stays until that one expires."""
    now = int(time.time())
    await store.publish("j", Envelope(time=500, expires=now - 10, message="gone"))
    await store.publish("j", Envelope(time=600, expires=now - 10, message="first"))
    await store.publish("j", Envelope(time=600, expires=now + 3600, message="second"))

    async def entries(tr):
        return [keys.unpack_time_index_key(k)[1] for k, _ in await tr.get_range(*keys.time_index_range("j"))]

    assert await store.db.transact(entries) == [500, 600]
    assert await store.expire(now) == 2
    assert await store.db.transact(entries) == [600]
    cur = (await store.positions(["j"], Since("time", time=601)))["j"]
    assert await messages_from(store, "j", cur) == []
