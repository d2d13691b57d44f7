"""CPU of one durable SQLite commit on this machine, same run: a bare one (one insert) against one with
the embedded driver's statements (the meta row read and updated, three puts, one atomic add's read and
write, the write-log row, the stamp mark), each with synchronous=FULL and NORMAL. What a physical
commit costs whatever it carries; why the committer gathers (see committer._GROUP_WAIT_SECS).

    uv run python libs/upf-keyspace/bench/commit_cost.py [--commits N]
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import tempfile
import time


def _open(sync: str) -> tuple[sqlite3.Connection, int]:
    d = tempfile.mkdtemp(prefix="commit-cost-")
    c = sqlite3.connect(os.path.join(d, "x.db"), isolation_level=None)
    c.execute("PRAGMA journal_mode=WAL")
    c.execute(f"PRAGMA synchronous={sync}")
    c.execute(f"PRAGMA mmap_size = {1 << 28}")
    c.execute("CREATE TABLE kv (k BLOB PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID")
    c.execute("CREATE TABLE meta (id INTEGER PRIMARY KEY, version INTEGER, stamp INTEGER)")
    c.execute("INSERT INTO meta VALUES (0, 0, 0)")
    c.execute("CREATE TABLE wlog (version INTEGER PRIMARY KEY, t REAL NOT NULL, writes BLOB NOT NULL)")
    c.execute("CREATE INDEX wlog_t ON wlog (t)")
    return c, os.open(os.path.join(d, "mark"), os.O_RDWR | os.O_CREAT)


def bare(c: sqlite3.Connection, _fd: int) -> None:
    c.execute("BEGIN IMMEDIATE")
    c.execute("INSERT INTO kv VALUES (?, ?)", (os.urandom(20), b"x" * 200))
    c.execute("COMMIT")


def driver_like(c: sqlite3.Connection, fd: int) -> None:
    c.execute("BEGIN IMMEDIATE")
    v, s = c.execute("SELECT version, stamp FROM meta").fetchone()
    rows = [(os.urandom(40), b"x" * 200), (os.urandom(40), b""), (os.urandom(30), b"y" * 14)]
    c.executemany("INSERT OR REPLACE INTO kv VALUES (?, ?)", rows)
    c.execute("SELECT v FROM kv WHERE k = ?", (b"tally",)).fetchone()
    c.execute("INSERT OR REPLACE INTO kv VALUES (?, ?)", (b"tally", b"z" * 16))
    c.execute("UPDATE meta SET version = ?, stamp = ?", (v + 1, s + 1))
    c.execute("INSERT INTO wlog VALUES (?, ?, ?)", (v + 1, time.time(), os.urandom(200)))
    c.execute("COMMIT")
    os.pwrite(fd, b"12345678", 0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--commits", type=int, default=2000)
    a = ap.parse_args()
    for sync in ("FULL", "NORMAL"):
        for name, fn in (("bare", bare), ("driver-like", driver_like)):
            c, fd = _open(sync)
            c0, t0 = time.process_time(), time.monotonic()
            for _ in range(a.commits):
                fn(c, fd)
            cpu = (time.process_time() - c0) / a.commits * 1e6
            wall = (time.monotonic() - t0) / a.commits * 1e6
            print(f"synchronous={sync:<6} {name:<12} {cpu:6.0f} us CPU per commit, {wall:6.0f} us wall")
            c.close()
            os.close(fd)


if __name__ == "__main__":
    main()
