"""Ids never go backwards (hardening finding 9): the embedded store's stamps carry the wall clock, so a
store file that lost its last commits (a deleted WAL after a crash, an older copy put back) still
stamps every new message above every id it handed out; and the loss is logged at open, not accepted
silently."""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from upf_keyspace import Envelope, Settings, open_store
from upf_keyspace.drivers.embedded import open_embedded

LOST = "embedded store lost commits"


async def _publish(path: Path, n: int, topic: str = "upLOST1") -> list[bytes]:
    store = await open_store(Settings(store_path=str(path)))
    try:
        now = int(time.time())
        return [
            (await store.publish(topic, Envelope(time=now, expires=now + 3600, message=f"m{i}"))).stamp
            for i in range(n)
        ]
    finally:
        await store.close()


async def test_stamps_are_at_least_the_clock_in_microseconds(tmp_path: Path) -> None:
    before = int(time.time() * 1_000_000)
    stamps = await _publish(tmp_path / "s.db", 3)
    after = int(time.time() * 1_000_000)
    prefixes = [int.from_bytes(s[:8], "big") for s in stamps]
    assert prefixes == sorted(set(prefixes))
    assert before <= prefixes[0] and prefixes[-1] <= after


async def test_an_older_copy_of_the_file_is_noticed_and_new_ids_sort_after_all_old_ones(tmp_path: Path, caplog) -> None:
    path = tmp_path / "s.db"
    early = await _publish(path, 3)
    shutil.copy(path, tmp_path / "old.db")  # closed, so checkpointed: the file alone is the store
    late = await _publish(path, 5)
    shutil.copy(tmp_path / "old.db", path)  # the last five commits are gone
    with caplog.at_level(logging.ERROR, logger="upf.store.embedded"):
        new = await _publish(path, 2)
    assert min(new) > max(early + late)
    lost = [r for r in caplog.records if r.getMessage() == LOST]
    assert len(lost) == 1
    assert lost[0].stamp_mark == int.from_bytes(late[-1][:8], "big")  # type: ignore[attr-defined]
    assert lost[0].last_stamp == int.from_bytes(early[-1][:8], "big")  # type: ignore[attr-defined]
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="upf.store.embedded"):
        await _publish(path, 1)  # reported once: the store is consistent again
    assert not [r for r in caplog.records if r.getMessage() == LOST]


async def test_a_process_that_dies_without_closing_loses_no_acknowledged_commit(tmp_path: Path, caplog) -> None:
    """A commit is acknowledged once LMDB synced it: a process killed right after loses none of them,
    and the next open does not take the store for one that lost commits."""
    path = tmp_path / "s.db"
    early = await _publish(path, 2)
    script = textwrap.dedent(
        f"""
        import asyncio, os, time
        from upf_keyspace import Envelope, Settings, open_store

        async def main():
            store = await open_store(Settings(store_path={str(path)!r}))
            now = int(time.time())
            for i in range(4):
                p = await store.publish("upLOST1", Envelope(time=now, expires=now + 3600, message=str(i)))
                print(p.stamp.hex(), flush=True)
            os._exit(0)  # no close

        asyncio.run(main())
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    crashed = [bytes.fromhex(line) for line in out.stdout.split()]
    assert len(crashed) == 4
    store = await open_store(Settings(store_path=str(path)))
    try:
        with caplog.at_level(logging.ERROR, logger="upf.store.embedded"):
            kept = [m.stamp for m in (await store.read_many([("upLOST1", None, 100)]))[0]]
    finally:
        await store.close()
    assert kept == early + crashed
    with caplog.at_level(logging.ERROR, logger="upf.store.embedded"):
        new = await _publish(path, 2)
    assert min(new) > max(early + crashed)
    assert LOST not in [r.getMessage() for r in caplog.records]


def _sqlite_store(path: Path, *, stamps: bool, version: int, rows: dict[bytes, bytes]) -> None:
    """A store as UPF wrote it before the LMDB engine (with or without the stamp column)."""
    conn = sqlite3.connect(path)
    conn.executescript(
        f"""
        PRAGMA journal_mode = WAL;
        CREATE TABLE kv (k BLOB PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID;
        CREATE TABLE meta (id INTEGER PRIMARY KEY CHECK (id = 0), version INTEGER NOT NULL
            {", stamp INTEGER NOT NULL DEFAULT 0" if stamps else ""});
        CREATE TABLE wlog (version INTEGER PRIMARY KEY, t REAL NOT NULL, writes BLOB NOT NULL);
        """
    )
    conn.execute(f"INSERT INTO meta VALUES (0, {version}{', ' + str(version * 1000) if stamps else ''})")
    conn.executemany("INSERT INTO kv VALUES (?, ?)", rows.items())
    conn.commit()
    conn.close()


async def test_a_store_from_before_stamps_carried_time_keeps_its_ids_below_new_ones(tmp_path: Path, caplog) -> None:
    path = tmp_path / "s.db"
    _sqlite_store(path, stamps=False, version=4242, rows={b"\x01old": b"v"})
    with caplog.at_level(logging.WARNING, logger="upf.store.embedded"):
        db = await open_embedded(str(path))
    try:

        async def body(tr):  # type: ignore[no-untyped-def]
            tr.set(b"k", b"v")
            return tr.get_versionstamp()

        stamp = await (await db.transact(body))
        assert db._committed_version() == 4243  # the counter stays dense
    finally:
        await db.close()
    assert int.from_bytes(stamp[:8], "big") > max(4242, int(time.time() * 1_000_000) - 60_000_000)
    assert [r.getMessage() for r in caplog.records] == ["embedded store converted from SQLite"]


async def test_a_sqlite_store_is_converted_with_what_its_wal_held_and_kept_beside(tmp_path: Path) -> None:
    """The store's keys, its counter and its stamps move to LMDB, including commits only in the WAL
    (a process that died without checkpointing); the SQLite file stays as ``<path>.sqlite``."""
    path = tmp_path / "s.db"
    rows = {b"\x01k%04d" % i: b"v%d" % i for i in range(2500)}
    _sqlite_store(path, stamps=True, version=77, rows=rows)
    script = textwrap.dedent(
        f"""
        import os, sqlite3
        conn = sqlite3.connect({str(path)!r}, isolation_level=None)
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        conn.execute("INSERT INTO kv VALUES (?, ?)", (b"\\x01wal-only", b"w"))
        os._exit(0)  # no checkpoint: that row is only in the WAL
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    assert os.path.getsize(str(path) + "-wal") > 0
    db = await open_embedded(str(path))
    try:

        async def read(tr):  # type: ignore[no-untyped-def]
            return await tr.get_range(b"\x01", b"\x02")

        got = dict(await db.transact(read))

        async def body(tr):  # type: ignore[no-untyped-def]
            tr.set(b"\x01new", b"n")
            return tr.get_versionstamp()

        stamp = await (await db.transact(body))
        assert db._committed_version() == 78
    finally:
        await db.close()
    assert got == {**rows, b"\x01wal-only": b"w"}
    assert int.from_bytes(stamp[:8], "big") > 77_000
    assert os.path.exists(str(path) + ".sqlite") and not os.path.exists(str(path) + "-wal")
    kept = sqlite3.connect(str(path) + ".sqlite")
    try:
        assert kept.execute("SELECT count(*) FROM kv").fetchone()[0] == 2501
    finally:
        kept.close()
    db = await open_embedded(str(path))  # opened again: already LMDB, nothing converted twice
    await db.close()
    assert not os.path.exists(str(path) + ".sqlite-" + str(int(time.time())))
