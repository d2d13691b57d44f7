"""A full store (a size quota on the store's data, or LMDB's map full): the commit fails at once with
STORAGE_FULL, not retried; reads still work; the process's storage health says degraded; a commit
that frees space still passes, so the store recovers."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time

import lmdb
import pytest

from upf_keyspace import SettingsError, errors, keys
from upf_keyspace.drivers.embedded import health, open_embedded
from upf_keyspace.drivers.embedded.health import _is_full, _OverQuota


@pytest.fixture
async def full_db(tmp_path, monkeypatch):
    monkeypatch.setenv("UPF_EMBEDDED_MAX_BYTES", str(256 * 1024))
    monkeypatch.setattr(errors, "STORAGE", errors.StorageHealth())
    db = await open_embedded(str(tmp_path / "store.db"))
    yield db
    await db.close()


async def put(db, key: bytes, size: int = 3000) -> None:
    async def body(tr):
        tr.set(key, b"x" * size)

    await db.transact(body)


async def test_full_store_fails_fast_not_retried_and_recovers(full_db, caplog):
    written = []
    with caplog.at_level(logging.ERROR, logger="upf.store.embedded"):
        with pytest.raises(errors.StoreError) as info:
            for i in range(1000):
                await put(full_db, b"k%04d" % i)
                written.append(b"k%04d" % i)
        started = time.monotonic()
        for i in range(20):  # each refusal is immediate
            with pytest.raises(errors.StoreError):
                await put(full_db, b"more%02d" % i)
        assert time.monotonic() - started < 2.0
    assert info.value.code == errors.STORAGE_FULL and not info.value.retryable
    assert 10 < len(written) < 1000 and errors.STORAGE.degraded()
    # One log line for all 21 refusals, no traceback.
    full_lines = [r for r in caplog.records if r.getMessage() == "embedded store full: writes refused"]
    assert len(full_lines) == 1 and full_lines[0].exc_info is None

    async def read_all(tr):
        return await tr.get_range(b"k", b"l")

    assert [k for k, _ in await full_db.transact(read_all)] == written  # nothing acknowledged lost

    async def free(tr):
        tr.clear_range(b"k", b"l")

    await full_db.transact(free)
    await put(full_db, b"after")
    errors.STORAGE.window_secs = 0.0  # degraded for a window after the last refusal, then healthy
    assert not errors.STORAGE.degraded()


def test_full_is_recognised_however_it_surfaces(tmp_path, monkeypatch):
    path = str(tmp_path / "store.db")
    assert _is_full(_OverQuota(), path)
    assert _is_full(lmdb.MapFullError("mdb_put: MDB_MAP_FULL: Environment mapsize limit reached"), path)
    assert _is_full(lmdb.Error("mdb_txn_commit: No space left on device"), path)
    assert _is_full(OSError(28, "No space left on device"), path)
    assert not _is_full(lmdb.ReadersFullError("mdb_txn_begin: MDB_READERS_FULL"), path)
    assert not _is_full(OSError(5, "Input/output error"), path)
    # LMDB's short write (a disk that filled during the commit) is EIO: full only on a disk with
    # almost nothing left, else an I/O error like any other.
    short = lmdb.Error(f"{path}: Input/output error")
    assert not _is_full(short, path)  # this disk has room
    monkeypatch.setattr(health, "_free_bytes", lambda p: 4096)
    assert _is_full(short, path)


@pytest.mark.parametrize("bad", ["lots", "-5", "1e6", "9" * 30])
async def test_bad_quota_is_refused_at_open_with_its_name(tmp_path, monkeypatch, bad):
    monkeypatch.setenv("UPF_EMBEDDED_MAX_BYTES", bad)
    with pytest.raises(SettingsError, match="UPF_EMBEDDED_MAX_BYTES"):
        await open_embedded(str(tmp_path / "store.db"))


async def test_subscribe_on_a_full_store_still_resolves_its_cursors(full_db):
    """The affinity write is refused: the subscribe still answers (read-only), so the stream opens."""
    from upf_keyspace import SINCE_ALL, SINCE_NONE, Envelope, Store

    store = Store(full_db, shard_count=8)
    first = await store.publish("t", Envelope(time=1, expires=2**40, message="m"))
    for size in (3000, 300, 30, 1):  # until not even a tiny write fits
        with pytest.raises(errors.StoreError):
            for i in range(100_000):
                await put(full_db, b"k%d-%06d" % (size, i), size)
    assert await store.subscribe(["t"], "n1", SINCE_ALL) == {"t": None}
    assert await store.subscribe(["t"], "n1", SINCE_NONE) == {"t": first.stamp}

    async def held(tr):
        return await tr.get_range(*keys.affinity_range("t"))

    assert await full_db.transact(held) == []  # the hold was refused: the read-only path answered


async def test_refusals_are_seen_by_every_process_on_the_file(tmp_path, monkeypatch):
    """Two processes (two health trackers) on one store: a refusal in one degrades both."""
    monkeypatch.setattr(errors, "STORAGE", errors.StorageHealth())
    db = await open_embedded(str(tmp_path / "store.db"))
    await db.close()
    marker = str(tmp_path / "store.db-full")
    other = errors.StorageHealth()
    other.share(marker)
    assert not errors.STORAGE.degraded() and not other.degraded()
    errors.STORAGE.write_refused()
    assert other.degraded()


async def test_over_a_lowered_quota_only_a_commit_that_grows_the_data_is_refused(tmp_path, monkeypatch):
    """Reopened under a quota its data already exceeds: a write that adds a page is refused, and one
    that frees a page passes though the data stays over the quota (the committer reads what the last
    commit left only for a commit over it)."""
    monkeypatch.setattr(errors, "STORAGE", errors.StorageHealth())
    path = str(tmp_path / "store.db")
    monkeypatch.setenv("UPF_EMBEDDED_MAX_BYTES", str(1024 * 1024))
    db = await open_embedded(path)
    for i in range(60):  # a 3,000-byte value takes an overflow page of its own: ~240 KiB in all
        await put(db, b"k%04d" % i)
    await db.close()
    monkeypatch.setenv("UPF_EMBEDDED_MAX_BYTES", str(128 * 1024))
    db = await open_embedded(path)
    try:
        with pytest.raises(errors.StoreError) as info:
            await put(db, b"more")
        assert info.value.code == errors.STORAGE_FULL

        async def drop(tr):
            tr.clear(b"k0000")

        await db.transact(drop)

        async def read(tr):
            return await tr.get(b"k0000"), await tr.get(b"k0059")

        assert await db.transact(read) == (None, b"x" * 3000)
    finally:
        await db.close()


_HOLD = """
import sys, lmdb
env = lmdb.open(sys.argv[1], subdir=False, map_size=1 << 40, max_dbs=3, max_readers=1024)
txn = env.begin(write=True)
print("held", flush=True)
sys.stdin.readline()
"""


async def test_on_a_full_store_a_clear_batched_with_growing_writes_still_frees(full_db, tmp_path):
    """A group commit refused as full is retried one transaction at a time, as any failed group is:
    the clear that shared it with two growing writes passes alone (the janitor's expiry must be able to
    free space while publishes keep arriving), and only the growing ones are refused."""
    with pytest.raises(errors.StoreError):
        for i in range(1000):
            await put(full_db, b"k%04d" % i)

    async def clear(tr):
        tr.clear(b"k0000")

    # Another process holds the write lock while the three queue, so that one commit takes them all.
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(tmp_path / "store.db")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        queued = [
            asyncio.ensure_future(put(full_db, b"new1")),
            asyncio.ensure_future(put(full_db, b"new2")),
            asyncio.ensure_future(full_db.transact(clear)),
        ]
        await asyncio.sleep(0.3)
        assert not any(f.done() for f in queued)
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.flush()
        grew1, grew2, cleared = await asyncio.wait_for(asyncio.gather(*queued, return_exceptions=True), 10)
    finally:
        holder.kill()
        holder.communicate(timeout=10)
    assert cleared is None
    for refused in (grew1, grew2):
        assert isinstance(refused, errors.StoreError) and refused.code == errors.STORAGE_FULL

    async def read(tr):
        return await tr.get(b"k0000"), await tr.get(b"new1")

    assert await full_db.transact(read) == (None, None)
