"""The embedded store's in-memory write log is bounded by bytes, not only by commits: large write
sets (a many-topic subscribe writes thousands of keys) cannot grow it past its budget, and an evicted
entry is read back from the file, so conflicts are still caught."""

from __future__ import annotations

import pytest

from upf_keyspace.drivers import embedded
from upf_keyspace.drivers._ranges import point
from upf_keyspace.drivers.embedded import writelog
from upf_keyspace.errors import NOT_COMMITTED, StoreError

BUDGET = 1 << 20


@pytest.fixture
async def db(tmp_path, monkeypatch):
    monkeypatch.setattr(writelog, "_WLOG_CACHE_BYTES", BUDGET)
    database = await embedded.open_embedded(str(tmp_path / "store.db"))
    yield database
    await database.close()


async def big_commit(db, n: int) -> None:
    async def body(tr):
        for i in range(1000):
            tr.set(b"affinity/%06d/topic-%04d/%s" % (n, i, b"n" * 60), b"")

    await db.transact(body)


async def test_write_log_cache_stays_within_its_byte_budget(db):
    """40 commits of 1,000 keys (~11 MB of write sets, far under 65,536 commits): within 1 MiB."""
    for n in range(40):
        await big_commit(db, n)
    cache = db._wlog_cache
    kept = [cache.get(v) for v in range(1, 60) if cache.get(v) is not None]
    keys = sum(len(k) for s in kept for k in (*s.begins, *s.ends))  # what the kept sets hold in keys
    assert 0 < keys < cache.bytes <= BUDGET  # the tally counts the keys and then some
    assert len(cache) < 40


async def test_evicted_write_sets_still_catch_conflicts(db):
    tr = db.create_transaction()
    await tr.get(b"affinity/000003/topic-0005/" + b"n" * 60)  # read version before every big commit
    for n in range(40):
        await big_commit(db, n)
    tr.set(b"elsewhere", b"x")
    with pytest.raises(StoreError) as info:
        await tr.commit()
    assert info.value.code == NOT_COMMITTED


async def small_commit(db, n: int) -> None:
    async def body(tr):
        tr.set(b"topic/%06d" % n, b"x")

    await db.transact(body)


async def test_only_the_newest_write_sets_stay_decoded_and_older_ones_decode_alike(db):
    """Sets kept decoded for the whole log were walked by every young collection of the cyclic
    collector; past the newest ``_DECODED`` only their encoding is kept, and reads back the same."""
    commits = writelog._DECODED + 40
    for n in range(commits):
        await small_commit(db, n)
    cache = db._wlog_cache
    versions = sorted(cache._raw)
    assert len(versions) >= commits
    assert sorted(cache._sets) == versions[-writelog._DECODED :]
    first = [v for v in versions if cache.get(v).overlaps(*point(b"topic/000000"))]
    assert len(first) == 1 and first[0] not in cache._sets  # found in the set decoded from its encoding
    s = cache.get(first[0])
    assert s.encode() == cache._raw[first[0]] and not s.overlaps(*point(b"topic/000001"))


async def test_a_conflict_with_an_encoded_write_set_is_caught(db):
    tr = db.create_transaction()
    await tr.get(b"topic/000000")  # read version before every commit below
    for n in range(writelog._DECODED + 10):
        await small_commit(db, n)
    cache = db._wlog_cache
    assert len(cache._sets) == writelog._DECODED < len(cache)  # the first commit's set is encoded only
    tr.set(b"elsewhere", b"x")
    with pytest.raises(StoreError) as info:
        await tr.commit()
    assert info.value.code == NOT_COMMITTED
