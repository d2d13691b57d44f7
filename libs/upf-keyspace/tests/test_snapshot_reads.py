"""A transaction's reads of the file within one event-loop iteration share one LMDB snapshot (as all
of a FoundationDB transaction's reads are at its read version), opened at its first read and ended
with the iteration; at most ``_SNAPSHOTS_MAX`` are open in a process, past that a read opens its own."""

from __future__ import annotations

import asyncio

from upf_keyspace.drivers.embedded import open_embedded
from upf_keyspace.drivers.embedded.reads import _SNAPSHOTS_MAX


async def _put(db, key: bytes, value: bytes) -> None:
    async def body(tr):
        tr.set(key, value)

    await db.transact(body)


def _commit_behind_the_loop(db, key: bytes, value: bytes) -> None:
    """A commit the loop has not seen, as another process's would be: straight into the file."""
    f = db._reader
    with f.env.begin(write=True) as w:
        version, stamp = f.version(w)
        w.put(key, value, db=f.kv)
        f.set_version(w, version + 1, stamp + 1)


async def test_reads_in_one_iteration_see_the_snapshot_of_the_first(tmp_path):
    db = await open_embedded(str(tmp_path / "s.db"))
    try:
        await _put(db, b"a", b"1")
        tr = db.create_transaction()
        assert await tr.get(b"a") == b"1"  # opens its snapshot; nothing here suspends
        _commit_behind_the_loop(db, b"b", b"2")
        assert await tr.get(b"b") is None
        assert await tr.get_range(b"a", b"c") == [(b"a", b"1")]
        fresh = db.create_transaction()
        assert await fresh.get(b"b") == b"2"  # another transaction's first read sees the file as it is
        assert len(db._snap_open) == 2
        await asyncio.sleep(0)  # the iteration ends, and the snapshots with it
        assert len(db._snap_open) == 0
        again = db.create_transaction()
        assert await again.get_range(b"a", b"c") == [(b"a", b"1"), (b"b", b"2")]
    finally:
        await db.close()


async def test_past_the_cap_reads_open_their_own(tmp_path):
    db = await open_embedded(str(tmp_path / "s.db"))
    try:
        await _put(db, b"a", b"1")
        trs = [db.create_transaction() for _ in range(_SNAPSHOTS_MAX + 5)]
        for tr in trs:
            assert await tr.get(b"a") == b"1"
            assert await tr.get_range(b"a", b"b") == [(b"a", b"1")]
        assert len(db._snap_open) == _SNAPSHOTS_MAX
        await asyncio.sleep(0)
        assert len(db._snap_open) == 0
    finally:
        await db.close()


async def test_a_watch_armed_on_an_older_snapshot_still_fires_for_what_came_after(tmp_path):
    """The watch's value comes from the snapshot; a change committed after the snapshot but before the
    watch is armed must fire it at once (FoundationDB's watch would)."""
    db = await open_embedded(str(tmp_path / "s.db"))
    try:
        await _put(db, b"bell", b"0")
        await _put(db, b"x", b"0")
        tr = db.create_transaction()
        assert await tr.get(b"x") == b"0"  # the snapshot
        watch = tr.watch(b"bell")
        await _put(db, b"bell", b"1")  # committed after the snapshot, before the watch is armed
        await tr.commit()  # read-only: arms the watch
        await asyncio.wait_for(watch, 5)
    finally:
        await db.close()


async def test_closing_the_store_with_a_snapshot_open(tmp_path):
    db = await open_embedded(str(tmp_path / "s.db"))
    await _put(db, b"a", b"1")
    tr = db.create_transaction()
    assert await tr.get(b"a") == b"1"
    await db.close()
    await asyncio.sleep(0)
    assert len(db._snap_open) == 0
