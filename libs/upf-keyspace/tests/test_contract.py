"""The transaction contract: FoundationDB's semantics, checked against every driver."""

from __future__ import annotations

import asyncio
import struct

import fdb.tuple as fdbtuple
import pytest

from upf_keyspace.errors import (
    ACCESSED_UNREADABLE,
    KEY_TOO_LARGE,
    NO_COMMIT_VERSION,
    NOT_COMMITTED,
    TRANSACTION_INVALID_VERSION,
    TRANSACTION_TOO_LARGE,
    USED_DURING_COMMIT,
    VALUE_TOO_LARGE,
    StoreError,
)


async def put(db, items):
    async def body(tr):
        for k, v in items.items():
            tr.set(k, v)

    await db.transact(body)


async def read(db, key):
    async def body(tr):
        return await tr.get(key)

    return await db.transact(body)


async def test_set_get_clear(db, prefix):
    """A committed set is read back; a clear removes it; a missing key reads as None."""
    await put(db, {prefix + b"a": b"1"})
    assert await read(db, prefix + b"a") == b"1"
    assert await read(db, prefix + b"missing") is None

    async def clear(tr):
        tr.clear(prefix + b"a")

    await db.transact(clear)
    assert await read(db, prefix + b"a") is None


async def test_get_range_order_limit_reverse(db, prefix):
    """Ranges come back in byte order, honour limit and reverse, and exclude the end key."""
    await put(db, {prefix + bytes([i]): bytes([i]) for i in (5, 1, 3, 0xFF, 0)})

    async def body(tr):
        return (
            await tr.get_range(prefix, prefix + b"\xff"),
            await tr.get_range(prefix, prefix + b"\xff", limit=2),
            await tr.get_range(prefix, prefix + b"\xff", limit=2, reverse=True),
            await tr.get_range(prefix + b"\x01", prefix + b"\x05"),
        )

    full, first2, last2, middle = await db.transact(body)
    assert [k[-1] for k, _ in full] == [0, 1, 3, 5]
    assert [k[-1] for k, _ in first2] == [0, 1]
    assert [k[-1] for k, _ in last2] == [5, 3]
    assert [k[-1] for k, _ in middle] == [1, 3]


async def test_get_ranges_answers_as_get_range_each(db, prefix):
    """``get_ranges`` gives, in order, what ``get_range`` gives for each range (limits, empty and
    inverted ranges, big limits past the small-range cache), with the transaction's own writes seen."""
    await put(db, {prefix + bytes([i, j]): bytes([i, j]) for i in range(1, 6) for j in range(i)})
    ranges = [
        (prefix + b"\x03", prefix + b"\x06", 5),  # a limit past the cache's rows, cut short
        (prefix + b"\x03", prefix + b"\x04", 256),
        (prefix + b"\x01", prefix + b"\x06", 3),
        (prefix + b"\x05", prefix + b"\x02", 256),
        (prefix + b"\x02", prefix + b"\x02", 1024),
        (prefix + b"\x06", prefix + b"\xff", 256),
        (prefix + b"\x05\x01", prefix + b"\x06", 256),
        (prefix + b"\x01", prefix + b"\x03", 2),
    ]

    async def both(tr):
        many = await tr.get_ranges(ranges, snapshot=True)
        each = [await tr.get_range(b, e, limit=n, snapshot=True) for b, e, n in ranges]
        return many, each

    many, each = await db.transact(both)
    assert many == each
    assert [len(rows) for rows in many] == [5, 3, 3, 0, 0, 0, 4, 2]

    async def with_own_writes(tr):
        tr.set(prefix + b"\x03\x09", b"mine")
        tr.clear(prefix + b"\x05\x02")
        return await tr.get_ranges(ranges), [await tr.get_range(b, e, limit=n) for b, e, n in ranges]

    many, each = await db.transact(with_own_writes)
    assert many == each
    assert many[1][-1] == (prefix + b"\x03\x09", b"mine")

    async def no_ranges(tr):
        return await tr.get_ranges([]), await tr.get_ranges([], snapshot=True)

    assert await db.transact(no_ranges) == ([], [])  # no range: no rows, and no error


async def test_get_ranges_conflicts_like_get_range(db, prefix):
    """A non-snapshot ``get_ranges`` conflicts with a write inside what it read, and a range cut by
    its limit only on the part it covered; a snapshot one conflicts with nothing."""
    await put(db, {prefix + b"a%d" % i: b"" for i in range(1, 8)})
    for snapshot, written, fails in (
        (False, b"b5", True),  # inside the second range, read whole
        (False, b"a9", False),  # past the first range's limit of 5: not covered
        (True, b"b5", False),
    ):
        t1 = db.create_transaction()
        rows = await t1.get_ranges(
            [(prefix + b"a", prefix + b"b", 5), (prefix + b"b", prefix + b"c", 256)], snapshot=snapshot
        )
        assert len(rows[0]) == 5
        t1.set(prefix + b"result", b"x")
        await put(db, {prefix + written: b"new"})
        if fails:
            with pytest.raises(StoreError) as info:
                await t1.commit()
            assert info.value.code == NOT_COMMITTED
        else:
            await t1.commit()
        t1.cancel()


async def test_clear_range(db, prefix):
    """clear_range removes [begin, end) and nothing else."""
    await put(db, {prefix + bytes([i]): b"x" for i in range(6)})

    async def body(tr):
        tr.clear_range(prefix + b"\x02", prefix + b"\x04")

    await db.transact(body)

    async def rows(tr):
        return await tr.get_range(prefix, prefix + b"\xff")

    assert [k[-1] for k, _ in await db.transact(rows)] == [0, 1, 4, 5]


async def test_read_your_writes(db, prefix):
    """A transaction sees its own sets, clears, range clears and atomic adds before commit."""
    await put(db, {prefix + b"a": b"old", prefix + b"b": b"keep", prefix + b"c": b"gone"})

    async def body(tr):
        tr.set(prefix + b"a", b"new")
        tr.clear(prefix + b"c")
        tr.set(prefix + b"d", b"added")
        tr.add(prefix + b"n", struct.pack("<q", 5))
        tr.add(prefix + b"n", struct.pack("<q", 2))
        got = await tr.get(prefix + b"a")
        rows = await tr.get_range(prefix, prefix + b"\xff")
        return got, rows

    got, rows = await db.transact(body)
    assert got == b"new"
    assert rows == [
        (prefix + b"a", b"new"),
        (prefix + b"b", b"keep"),
        (prefix + b"d", b"added"),
        (prefix + b"n", struct.pack("<q", 7)),
    ]


async def test_atomic_add_little_endian_semantics(db, prefix):
    """add is 64-bit little-endian two's complement; missing counts as zero; overflow wraps; a longer
    existing value is truncated to the param's length."""

    async def add(tr, key, n, fmt="<q"):
        tr.add(key, struct.pack(fmt, n))

    await db.transact(add, prefix + b"c", 41)
    await db.transact(add, prefix + b"c", 1)
    assert struct.unpack("<q", await read(db, prefix + b"c"))[0] == 42
    await db.transact(add, prefix + b"c", -50)
    assert struct.unpack("<q", await read(db, prefix + b"c"))[0] == -8
    await put(db, {prefix + b"w": b"\xff\xff"})
    await db.transact(add, prefix + b"w", 1, "<H")
    assert await read(db, prefix + b"w") == b"\x00\x00"
    await put(db, {prefix + b"t": struct.pack("<q", 0x0102)})
    await db.transact(add, prefix + b"t", 1, "<B")
    assert await read(db, prefix + b"t") == b"\x03"


async def test_versionstamped_keys_share_one_stamp_and_increase(db, prefix, stamp):
    """Every versionstamped op of a transaction gets the same 10 bytes, the committed stamp; later
    commits get larger stamps; user versions tell the entries apart."""
    stamps = []
    for _ in range(3):

        async def body(tr):
            for uv in (0, 1):
                tr.set_versionstamped_key(
                    fdbtuple.pack_with_versionstamp(("q", stamp(user_version=uv)), prefix=prefix), b"v"
                )
            return tr.get_versionstamp()

        fut = await db.transact(body)
        stamps.append(await fut)

    async def rows(tr):
        return await tr.get_range(prefix, prefix + b"\xff")

    found = [fdbtuple.unpack(k, prefix_len=len(prefix))[1] for k, _ in await db.transact(rows)]
    assert len(found) == 6
    assert all(len(s) == 10 for s in stamps) and stamps == sorted(stamps) and len(set(stamps)) == 3
    assert [(v.tr_version, v.user_version) for v in found] == [(s, uv) for s in stamps for uv in (0, 1)]


async def test_versionstamped_key_unreadable_before_commit(db, prefix, stamp):
    """Reading the range a versionstamped key will land in, in the same transaction, is refused."""

    async def body(tr):
        tr.set_versionstamped_key(fdbtuple.pack_with_versionstamp(("q", stamp(user_version=0)), prefix=prefix), b"")
        await tr.get_range(prefix, prefix + b"\xff")

    with pytest.raises(StoreError) as info:
        await db.transact(body)
    assert info.value.code == ACCESSED_UNREADABLE


async def test_versionstamped_value_gets_the_commit_stamp(db, prefix):
    """A versionstamped value is the commit's 10 bytes plus the user version as written; the key is
    unreadable in its own transaction; a blind write that a snapshot reader never conflicts with."""
    value = b"\xff" * 10 + (7).to_bytes(2, "big") + (0).to_bytes(4, "little")

    async def body(tr):
        tr.set_versionstamped_value(prefix + b"k", value)
        return tr.get_versionstamp()

    stamp = await (await db.transact(body))
    assert await read(db, prefix + b"k") == stamp + (7).to_bytes(2, "big")

    async def read_back(tr):
        tr.set_versionstamped_value(prefix + b"k", value)
        await tr.get(prefix + b"k")

    with pytest.raises(StoreError) as info:
        await db.transact(read_back)
    assert info.value.code == ACCESSED_UNREADABLE

    async def short(tr):
        tr.set_versionstamped_value(prefix + b"k", b"\x00" * 13)

    async def past_end(tr):
        tr.set_versionstamped_value(prefix + b"k", b"\x00" * 12 + (4).to_bytes(4, "little"))

    for bad in (short, past_end):
        with pytest.raises(StoreError):
            await db.transact(bad)


async def test_versionstamp_of_read_only_transaction_fails(db, prefix):
    """A read-only transaction has no commit version (2021)."""

    async def body(tr):
        await tr.get(prefix + b"x")
        return tr.get_versionstamp()

    fut = await db.transact(body)
    with pytest.raises(StoreError) as info:
        await fut
    assert info.value.code == NO_COMMIT_VERSION


async def test_versionstamp_asked_after_commit_or_of_a_failed_commit_fails(db, prefix):
    """Asked for after ``commit``: used_during_commit (2017); asked before a commit that then failed
    (a conflict): transaction_invalid_version (2020). Neither waits for ever."""
    key = prefix + b"vs"
    await put(db, {key: b"0"})
    tr = db.create_transaction()
    tr.set(key, b"1")
    await tr.commit()
    with pytest.raises(StoreError) as info:
        await asyncio.wait_for(tr.get_versionstamp(), 5)
    assert info.value.code == USED_DURING_COMMIT
    t1, t2 = db.create_transaction(), db.create_transaction()
    await t1.get(key)
    await t2.get(key)
    t1.set(key, b"2")
    t2.set(key, b"3")
    stamp = t2.get_versionstamp()
    await t1.commit()
    with pytest.raises(StoreError):
        await t2.commit()
    with pytest.raises(StoreError) as info:
        await asyncio.wait_for(stamp, 5)
    assert info.value.code == TRANSACTION_INVALID_VERSION


async def test_conflicting_writers_one_retries(db, prefix):
    """Two transactions that read then write the same key: the second to commit fails with 1020."""
    key = prefix + b"counter"
    await put(db, {key: b"0"})
    t1, t2 = db.create_transaction(), db.create_transaction()
    v1 = await t1.get(key)
    v2 = await t2.get(key)
    t1.set(key, str(int(v1) + 1).encode())
    t2.set(key, str(int(v2) + 1).encode())
    await t1.commit()
    with pytest.raises(StoreError) as info:
        await t2.commit()
    assert info.value.code == NOT_COMMITTED and info.value.retryable


async def test_retry_loop_serializes_increments(db, prefix):
    """Concurrent read-modify-write increments through the retry loop lose no update."""
    key = prefix + b"n"
    await put(db, {key: b"0"})

    async def incr(tr):
        tr.set(key, str(int(await tr.get(key)) + 1).encode())

    await asyncio.gather(*(db.transact(incr) for _ in range(40)))
    assert await read(db, key) == b"40"


async def test_snapshot_reads_do_not_conflict(db, prefix):
    """A snapshot read adds no conflict range: a concurrent change of that key lets the commit through."""
    key, other = prefix + b"k", prefix + b"o"
    await put(db, {key: b"1"})
    t1 = db.create_transaction()
    await t1.get(key, snapshot=True)
    t1.set(other, b"x")
    await put(db, {key: b"2"})
    await t1.commit()
    assert await read(db, other) == b"x"


async def test_range_read_conflicts_with_insert_inside_it(db, prefix):
    """A phantom: a key inserted inside a range another transaction read makes that one fail."""
    t1 = db.create_transaction()
    await t1.get_range(prefix + b"a", prefix + b"z")
    t1.set(prefix + b"result", b"x")
    await put(db, {prefix + b"m": b"new"})
    with pytest.raises(StoreError) as info:
        await t1.commit()
    assert info.value.code == NOT_COMMITTED


async def test_watch_fires_after_committed_change(db, prefix):
    """A watch fires once another transaction changes the value, not before."""
    key = prefix + b"bell"
    await put(db, {key: b"0"})

    async def arm(tr):
        return tr.watch(key)

    watch = await db.transact(arm)
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(asyncio.shield(asyncio.ensure_future(_wait(watch))), 0.2)
    await put(db, {key: b"1"})
    await asyncio.wait_for(_wait(watch), 2.0)


async def _wait(w):
    await w


async def test_watch_fires_for_change_between_read_version_and_arming(db, prefix):
    """A change committed after the watching transaction's read but before it commits still fires."""
    key = prefix + b"bell"
    await put(db, {key: b"0"})
    tr = db.create_transaction()
    await tr.get(prefix + b"unrelated")
    await put(db, {key: b"1"})
    watch = tr.watch(key)
    await tr.commit()
    await asyncio.wait_for(_wait(watch), 2.0)


async def test_a_watch_set_calls_once_per_arming_for_armed_keys_only(db, prefix):
    """A watch set's key calls its callback once per arming when its value changes; a key changed
    between the arming transaction's read and its commit calls at once; an unarmed key never calls; a
    key armed again calls again; a cancelled set calls nothing."""
    keys = [prefix + b"set" + bytes([i]) for i in range(3)]
    await put(db, dict.fromkeys(keys, b"0"))
    calls: list[int] = []
    rang = asyncio.Event()

    def ring(i: int) -> None:
        calls.append(i)
        rang.set()

    ws = db.watch_set(keys, [lambda i=i: ring(i) for i in range(3)])
    tr = db.create_transaction()
    await tr.get(prefix + b"unrelated")
    await put(db, {keys[1]: b"1"})
    tr.arm(ws, [0, 1])
    await tr.commit()
    await asyncio.wait_for(rang.wait(), 2.0)
    await asyncio.sleep(0.2)
    assert calls == [1]
    rang.clear()
    await put(db, {keys[0]: b"1", keys[2]: b"1"})
    await asyncio.wait_for(rang.wait(), 2.0)
    await asyncio.sleep(0.2)
    assert calls == [1, 0]  # 2 was never armed; 1 was not armed again

    async def arm(tr, indexes):
        tr.arm(ws, indexes)

    await db.transact(arm, [1, 2])
    rang.clear()
    await put(db, {keys[1]: b"2"})
    await asyncio.wait_for(rang.wait(), 2.0)
    await asyncio.sleep(0.2)
    assert calls == [1, 0, 1]
    ws.cancel()
    await put(db, {keys[2]: b"2"})
    await asyncio.sleep(0.2)
    assert calls == [1, 0, 1]


async def test_limits_are_enforced_with_clear_errors(db, prefix):
    """Oversized keys, values and transactions fail with FoundationDB's codes."""

    async def big_key(tr):
        tr.set(prefix + b"k" * 10_001, b"")

    async def big_value(tr):
        tr.set(prefix + b"k", b"v" * 100_001)

    async def big_txn(tr):
        for i in range(110):
            tr.set(prefix + str(i).encode(), b"v" * 99_000)

    for body, code in ((big_key, KEY_TOO_LARGE), (big_value, VALUE_TOO_LARGE), (big_txn, TRANSACTION_TOO_LARGE)):
        with pytest.raises(StoreError) as info:
            await db.transact(body)
        assert info.value.code == code
