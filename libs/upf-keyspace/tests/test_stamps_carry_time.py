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


async def test_a_wal_deleted_after_a_crash_is_noticed_and_ids_stay_ahead(tmp_path: Path, caplog) -> None:
    """The finding as found: a process commits and dies without checkpointing; its WAL is deleted."""
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
            os._exit(0)  # no close, no checkpoint: the commits are only in the WAL

        asyncio.run(main())
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    crashed = [bytes.fromhex(line) for line in out.stdout.split()]
    assert len(crashed) == 4
    os.unlink(str(path) + "-wal")
    os.unlink(str(path) + "-shm")
    with caplog.at_level(logging.ERROR, logger="upf.store.embedded"):
        new = await _publish(path, 2)
    assert min(new) > max(early + crashed)
    assert [r.getMessage() for r in caplog.records].count(LOST) == 1


async def test_a_store_from_before_stamps_carried_time_keeps_its_ids_below_new_ones(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    conn = sqlite3.connect(path)
    conn.executescript(
        """
        PRAGMA journal_mode = WAL;
        CREATE TABLE kv (k BLOB PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID;
        CREATE TABLE meta (id INTEGER PRIMARY KEY CHECK (id = 0), version INTEGER NOT NULL);
        INSERT INTO meta VALUES (0, 4242);
        CREATE TABLE wlog (version INTEGER PRIMARY KEY, t REAL NOT NULL, writes BLOB NOT NULL);
        """
    )
    conn.close()
    db = await open_embedded(str(path))
    try:

        async def body(tr):  # type: ignore[no-untyped-def]
            tr.set(b"k", b"v")
            return tr.get_versionstamp()

        stamp = await (await db.transact(body))
    finally:
        await db.close()
    assert int.from_bytes(stamp[:8], "big") > max(4242, int(time.time() * 1_000_000) - 60_000_000)
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("SELECT version FROM meta").fetchone()[0] == 4243  # the counter stays dense
    finally:
        conn.close()
