"""The LMDB file under the embedded driver: one environment per process shared by its handles (LMDB
forbids opening a file twice in a process), the write log's pruning, clock steps included, and LMDB's
key length."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest

from upf_keyspace import StoreError, errors
from upf_keyspace import telemetry as tm
from upf_keyspace.drivers import _metrics
from upf_keyspace.drivers.embedded import open_embedded
from upf_keyspace.drivers.embedded.committer import _prune
from upf_keyspace.drivers.embedded.file import _FILES, _T, _close_file, _open_file
from upf_keyspace.drivers.embedded.mutations import KEY_LIMIT_LMDB
from upf_keyspace.drivers.embedded.writelog import wlog_key
from upf_keyspace.errors import CLIENT_INVALID_OPERATION, KEY_TOO_LARGE


async def test_handles_on_one_file_share_its_environment_and_outlive_each_other(tmp_path) -> None:
    path = str(tmp_path / "s.db")
    a = await open_embedded(path)
    b = await open_embedded(str(tmp_path / "." / "s.db"))  # another spelling of the same file
    assert a._reader is b._reader and a._reader.users == 2

    async def put(tr):  # type: ignore[no-untyped-def]
        tr.set(b"\x01k", b"v")

    async def get(tr):  # type: ignore[no-untyped-def]
        return await tr.get(b"\x01k")

    await a.transact(put)
    await a.close()
    assert await b.transact(get) == b"v"  # closing one handle left the other's environment open

    async def put2(tr):  # type: ignore[no-untyped-def]
        tr.set(b"\x01k", b"w")

    await b.transact(put2)
    await b.close()
    assert not _FILES
    c = await open_embedded(path)
    try:
        assert await c.transact(get) == b"w"
    finally:
        await c.close()


def test_the_write_log_is_pruned_by_age_and_past_a_clock_step(tmp_path) -> None:
    f = _open_file(str(tmp_path / "s.db"))
    try:
        now = 1_000_000.0
        ages = {1: now - 30, 2: now - 11, 3: now + 3600, 4: now - 5, 5: now - 20, 6: now - 1}
        with f.env.begin(write=True) as txn:
            for v, t in ages.items():
                txn.put(wlog_key(v), _T.pack(t) + b"", db=f.wlog)
        with f.env.begin(write=True) as txn:
            _prune(txn, f, now - 10, now + 60)
        with f.env.begin() as txn:
            left = [int.from_bytes(k, "big") for k, _ in txn.cursor(db=f.wlog)]
        # 1 and 2 are old, 3 is from before the clock stepped back an hour; 4 is recent, so pruning
        # stops there (5, older, waits for the next pass: it only fails old transactions later).
        assert left == [4, 5, 6]
    finally:
        _close_file(f)


async def test_the_write_log_is_still_pruned_after_the_wall_clock_steps_back(tmp_path, monkeypatch) -> None:
    """The committer prunes about once a second by the monotonic clock: timed by the wall clock, a
    step back of an hour stopped pruning (and the reclaiming of dead readers' slots) for that hour,
    and the file grew with every commit."""
    from upf_keyspace.drivers.embedded import committer

    db = await open_embedded(str(tmp_path / "s.db"))
    try:

        async def put(tr):  # type: ignore[no-untyped-def]
            tr.set(b"\x01k", b"v")

        for _ in range(20):
            await db.transact(put)
        real = time.time
        monkeypatch.setattr(committer.time, "time", lambda: real() - 3600.0)  # NTP steps back an hour
        f = db._reader

        def from_before_the_step() -> int:
            """Write-log entries stamped an hour ahead of the stepped clock."""
            with f.env.begin() as txn:
                return sum(_T.unpack(v[:8])[0] > real() - 3000 for _, v in txn.cursor(db=f.wlog))

        assert from_before_the_step() >= 20
        deadline = time.monotonic() + 5
        while from_before_the_step() and time.monotonic() < deadline:  # a prune is due within ~1 s
            await db.transact(put)
            await asyncio.sleep(0.01)
        assert from_before_the_step() == 0
    finally:
        await db.close()


async def test_a_process_killed_holding_the_write_lock_does_not_stop_commits(tmp_path) -> None:
    """LMDB's writer mutex is robust: when its holder dies (kill -9 in the middle of a commit), the
    next writer takes it over instead of waiting forever."""
    path = str(tmp_path / "s.db")
    db = await open_embedded(path)
    try:
        holder = subprocess.Popen(
            [sys.executable, "-c", _HOLD_AND_WAIT, path], stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True
        )
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"

        async def put(tr):  # type: ignore[no-untyped-def]
            tr.set(b"\x01after", b"v")

        commit = asyncio.ensure_future(db.transact(put))
        await asyncio.sleep(0.3)
        assert not commit.done(), "the commit must wait while the lock is held"
        holder.kill()
        holder.wait(10)
        await asyncio.wait_for(commit, 10)

        async def get(tr):  # type: ignore[no-untyped-def]
            return await tr.get(b"\x01after"), await tr.get(b"\x01dead")

        assert await db.transact(get) == (b"v", None)  # the dead holder's write was never committed
    finally:
        await db.close()


async def test_a_commit_that_waits_for_another_processs_write_lock_records_the_wait(tmp_path) -> None:
    """Processes on one store file commit one at a time. The time a commit waited for another's
    write lock is its own histogram (``upf_store_commit_lock_wait_seconds``), so an operator can
    tell that wait from the commit's own work in ``upf_store_commit_duration_seconds``."""
    path = str(tmp_path / "s.db")
    db = await open_embedded(path)
    waits = _metrics.COMMIT_LOCK_WAIT.cell("embedded")
    holder: subprocess.Popen[str] | None = None
    try:

        async def put(tr):  # type: ignore[no-untyped-def]
            tr.set(b"\x01k", b"v")

        await db.transact(put)  # uncontended: recorded, near nothing
        count, total = sum(waits.counts), waits.sum
        holder = subprocess.Popen(
            [sys.executable, "-c", _HOLD_AND_WAIT, path], stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True
        )
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        commit = asyncio.ensure_future(db.transact(put))
        await asyncio.sleep(0.3)
        assert not commit.done()
        assert holder.stdin is not None
        holder.stdin.write("\n")  # the holder exits, its write transaction never committed
        holder.stdin.flush()
        await asyncio.wait_for(commit, 10)
        assert holder.wait(10) == 0
        assert sum(waits.counts) == count + 1
        assert 0.25 <= waits.sum - total < 10
        assert tm.REGISTRY.value("upf.store.commit.lock_wait", driver="embedded") == count + 1
    finally:
        if holder is not None and holder.poll() is None:
            holder.kill()
            holder.wait(10)
        await db.close()


_HOLD_AND_WAIT = """
import sys, lmdb
env = lmdb.open(sys.argv[1], subdir=False, map_size=1 << 40, max_dbs=3, max_readers=1024)
kv = env.open_db(b"kv")
txn = env.begin(write=True)
txn.put(b"\\x01dead", b"x", db=kv)
print("held", flush=True)
sys.stdin.readline()
"""


async def test_a_key_longer_than_lmdbs_is_refused_when_written_and_fails_nothing_beside_it(tmp_path) -> None:
    """LMDB takes keys of at most 511 bytes. A longer one is refused at once with 2102 (a key too
    large), set or cleared; transactions committing beside it are stored. It used to pass the
    contract's 10,000-byte check and fail the physical commit, and every transaction of the batch
    with it, retried as a conflict (the long one up to the retry limit)."""
    db = await open_embedded(str(tmp_path / "s.db"))
    try:
        assert db._reader.env.max_key_size() == KEY_LIMIT_LMDB == 511

        def writer(key: bytes, op: str):  # type: ignore[no-untyped-def]
            async def body(tr):  # type: ignore[no-untyped-def]
                if op == "set":
                    tr.set(key, b"v")
                else:
                    tr.clear(key)

            return body

        long_key = b"\x01" + b"k" * KEY_LIMIT_LMDB
        got = await asyncio.wait_for(
            asyncio.gather(
                db.transact(writer(long_key, "set")),
                db.transact(writer(long_key, "clear")),
                *(db.transact(writer(b"\x01ok%d" % i, "set")) for i in range(8)),
                db.transact(writer(b"\x01" + b"k" * (KEY_LIMIT_LMDB - 1), "set")),  # exactly 511 bytes
                return_exceptions=True,
            ),
            timeout=10,
        )
        for refused in got[:2]:
            assert isinstance(refused, StoreError) and refused.code == KEY_TOO_LARGE
        assert got[2:] == [None] * 9

        async def count(tr):  # type: ignore[no-untyped-def]
            return len(await tr.get_range(b"\x01", b"\x02"))

        assert await db.transact(count) == 9
    finally:
        await db.close()


async def test_the_empty_key_is_refused_when_written_and_reads_as_absent(tmp_path) -> None:
    """LMDB cannot store the empty key (FoundationDB can). Set, cleared or added to, in a transaction
    or a grouped one, it is refused at once with 2000 and fails nothing beside it (it failed the
    physical commit as a key too long did); read, it is absent; a range clear may still begin at it;
    watched, it is refused too."""
    db = await open_embedded(str(tmp_path / "s.db"))
    try:

        def body(op: str):  # type: ignore[no-untyped-def]
            async def run(tr):  # type: ignore[no-untyped-def]
                if op == "set":
                    tr.set(b"", b"v")
                elif op == "clear":
                    tr.clear(b"")
                elif op == "add":
                    tr.add(b"", b"\x01")
                elif op == "stamped value":
                    tr.set_versionstamped_value(b"", b"\xff" * 12 + b"\x00" * 4)
                else:
                    tr.set(b"\x01" + op.encode(), b"v")

            return run

        async def grouped(tr, items):  # type: ignore[no-untyped-def]
            for op in items:
                await body(op)(tr)
            return list(items)

        ops = ("set", "clear", "add", "stamped value")
        got = await asyncio.wait_for(
            asyncio.gather(
                *(db.transact(body(op)) for op in (*ops, "ok1", "ok2")),
                *(db.transact_grouped(grouped, op) for op in (*ops, "ok3")),
                return_exceptions=True,
            ),
            timeout=10,
        )
        for refused in (*got[:4], *got[6:10]):
            assert isinstance(refused, StoreError) and refused.code == CLIENT_INVALID_OPERATION
        assert got[4:6] == [None, None] and got[10] == "ok3"

        async def reads(tr):  # type: ignore[no-untyped-def]
            return await tr.get(b""), [k for k, _ in await tr.get_range(b"", b"\x02")]

        assert await db.transact(reads) == (None, [b"\x01ok1", b"\x01ok2", b"\x01ok3"])

        async def clear_from_the_first_key(tr):  # type: ignore[no-untyped-def]
            tr.clear_range(b"", b"\x01ok2")

        await db.transact(clear_from_the_first_key)
        assert await db.transact(reads) == (None, [b"\x01ok2", b"\x01ok3"])

        # Nor is it watched: the watch checks read every watched key, and LMDB refuses to look it up.
        async def watch_empty(tr):  # type: ignore[no-untyped-def]
            return tr.watch(b"")

        with pytest.raises(StoreError) as refused:
            await db.transact(watch_empty)
        assert refused.value.code == CLIENT_INVALID_OPERATION
        with pytest.raises(StoreError) as refused:
            db.watch_set([b"\x01ok2", b""], [lambda: None, lambda: None])
        assert refused.value.code == CLIENT_INVALID_OPERATION

        async def watch_ok(tr):  # type: ignore[no-untyped-def]
            return tr.watch(b"\x01ok2")

        w = await db.transact(watch_ok)
        await db.transact(body("ok2"))  # the same value: a watch fires on a change
        tr = db.create_transaction()
        tr.set(b"\x01ok2", b"changed")
        await tr.commit()
        await asyncio.wait_for(w, timeout=5)  # the store's watches still fire
    finally:
        await db.close()


_HOG_READERS = """
import sys, lmdb
env = lmdb.open(sys.argv[1], subdir=False, map_size=1 << 40, max_dbs=3, max_readers=1024, max_spare_txns=0)
txns = []
try:
    while True:
        txns.append(env.begin())
except lmdb.ReadersFullError:
    pass
print("holding", flush=True)
sys.stdin.readline()
"""


async def test_every_reader_slot_taken_is_a_retryable_error_and_heals_when_their_holder_dies(tmp_path) -> None:
    """LMDB's reader table (1,024 slots for every process on the file): while a live process holds
    them all, a read is the store's retryable READERS_FULL, not LMDB's exception; once it is killed
    (-9: its slots stay marked), the next read reclaims them, in a process that only reads too."""
    path = str(tmp_path / "s.db")
    db = await open_embedded(path)
    hog = subprocess.Popen(
        [sys.executable, "-c", _HOG_READERS, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert hog.stdout is not None and hog.stdout.readline().strip() == "holding"
        with pytest.raises(StoreError) as info:
            db._reader.begin_read()
        assert info.value.code == errors.READERS_FULL and info.value.retryable
        hog.kill()
        hog.communicate(timeout=10)

        async def read(tr):  # type: ignore[no-untyped-def]
            return await tr.get(b"\x01k")

        assert await asyncio.wait_for(db.transact(read), 10) is None
    finally:
        if hog.poll() is None:
            hog.kill()
            hog.communicate(timeout=10)
        await db.close()
