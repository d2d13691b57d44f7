"""The LMDB file under the embedded driver: one environment per process shared by its handles (LMDB
forbids opening a file twice in a process), the write log's pruning, clock steps included, and LMDB's
key length."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from upf_keyspace import StoreError
from upf_keyspace.drivers.embedded import open_embedded
from upf_keyspace.drivers.embedded.committer import _prune
from upf_keyspace.drivers.embedded.file import _FILES, _T, _close_file, _open_file
from upf_keyspace.drivers.embedded.mutations import KEY_LIMIT_LMDB
from upf_keyspace.drivers.embedded.writelog import wlog_key
from upf_keyspace.errors import KEY_TOO_LARGE


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
    with it, retried as a conflict (the long one for ever)."""
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
