"""The embedded driver's watch bookkeeping: the running count behind the watch limit, and the
shortcuts that skip work on a wake-up, each pinned by a case where a wrong shortcut would miss a change."""

from __future__ import annotations

import asyncio

import pytest

from upf_keyspace import errors
from upf_keyspace.drivers.embedded import transaction

PREFIX = b"\x01test-watches/"


async def _put(db, items: dict[bytes, bytes]) -> None:
    async def body(tr):
        for k, v in items.items():
            tr.set(k, v)

    await db.transact(body)


async def _watch(db, key: bytes):
    async def body(tr):
        return tr.watch(key)

    return await db.transact(body)


def _counted(db) -> int:
    return sum(len(s) for s in db._watches.values())


async def test_watch_count_follows_arms_fires_and_cancels(pair):
    """The running count equals the registered watches through arming (two on one key), a change
    firing one, a cancel, and the limit counts it."""
    a, _ = pair
    k1, k2 = PREFIX + b"1", PREFIX + b"2"
    await _put(a, {k1: b"0", k2: b"0"})
    w1 = await _watch(a, k1)
    w1b = await _watch(a, k1)
    w2 = await _watch(a, k2)
    assert a._watch_count() == _counted(a) == 3
    await _put(a, {k1: b"1"})
    await asyncio.wait_for(asyncio.gather(w1.future, w1b.future), 2.0)
    await asyncio.sleep(0)  # the done callbacks unregister
    assert a._watch_count() == _counted(a) == 1
    w2.cancel()
    w2.cancel()
    await asyncio.sleep(0)
    assert a._watch_count() == _counted(a) == 0
    again = await _watch(a, k1)  # a key watched before: counted afresh
    assert a._watch_count() == _counted(a) == 1
    again.cancel()


async def test_watch_limit_uses_the_running_count(pair, monkeypatch):
    a, _ = pair
    monkeypatch.setattr(transaction, "_MAX_WATCHES", 3)
    await _put(a, {PREFIX + b"x": b"0"})
    held = [await _watch(a, PREFIX + b"x") for _ in range(3)]
    with pytest.raises(errors.StoreError) as info:
        await _watch(a, PREFIX + b"x")
    assert info.value.code == errors.TOO_MANY_WATCHES
    held[0].cancel()
    await asyncio.sleep(0)
    held.append(await _watch(a, PREFIX + b"x"))  # room again once one is gone
    for w in held:
        w.cancel()


async def test_keys_bound_as_bytearray_match_the_stored_blobs(pair):
    """Reads bind keys as bytearray (no adapter lookup); the rows written with bytes keys must be found
    by point and range reads with memcmp order, and come back as bytes."""
    a, _ = pair
    ks = [PREFIX + b"k", PREFIX + b"k\x00", PREFIX + b"k\x00\x00", PREFIX + b"k\x7f", PREFIX + b"k\x80", PREFIX + b"k\xff"]
    await _put(a, {k: k[-1:] for k in ks})
    assert a._reader.execute("SELECT typeof(?), ? = ?", (bytearray(b"x"), bytearray(b"x"), b"x")).fetchone() == ("blob", 1)

    async def read(tr):
        points = [await tr.get(k) for k in ks]
        return points, await tr.get_range(PREFIX + b"k\x00", PREFIX + b"k\xff"), await tr.get(PREFIX + b"k\x01")

    points, rows, missing = await a.transact(read)
    assert points == [k[-1:] for k in ks] and all(type(p) is bytes for p in points)
    assert rows == [(k, k[-1:]) for k in ks[1:-1]] and all(type(k) is bytes for k, _ in rows)
    assert missing is None
