"""The store file: its schema, connections with the driver's pragmas, the write lock, and the stamp
mark beside it."""

from __future__ import annotations

import os
import sqlite3
import time

from .health import _quota_bytes

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS kv (k BLOB PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS meta (id INTEGER PRIMARY KEY CHECK (id = 0), version INTEGER NOT NULL,"
    " stamp INTEGER NOT NULL DEFAULT 0)",
    "INSERT OR IGNORE INTO meta (id, version) VALUES (0, 0)",
    "CREATE TABLE IF NOT EXISTS wlog (version INTEGER PRIMARY KEY, t REAL NOT NULL, writes BLOB NOT NULL)",
    "CREATE INDEX IF NOT EXISTS wlog_t ON wlog (t)",
)


_STAMPS_PER_SEC = 1_000_000
"""A commit's stamp is at least the wall clock in microseconds (and above the last one), as
FoundationDB's versions advance about a million a second: a store that lost its last commits (a
damaged or deleted WAL, a restored copy) still stamps above every id it handed out before."""


def _clock_stamp() -> int:
    return int(time.time() * _STAMPS_PER_SEC)


def _migrate(conn: sqlite3.Connection) -> None:
    """Stores made before stamps carried time: their stamps were the commit counter, so the stamp
    column starts there (inside the caller's write transaction)."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(meta)")}
    if "stamp" not in columns:
        conn.execute("ALTER TABLE meta ADD COLUMN stamp INTEGER NOT NULL DEFAULT 0")
        conn.execute("UPDATE meta SET stamp = version")


def _mark_path(path: str) -> str:
    """The stamp mark: the last stamp this host's processes committed, written after each commit and
    outside SQLite, so a store file that comes back without its last commits is noticed at open."""
    return path + ".mark"


def _read_mark(path: str) -> int:
    try:
        with open(_mark_path(path), "rb") as f:
            raw = f.read(8)
    except FileNotFoundError:
        return 0
    return int.from_bytes(raw, "big") if len(raw) == 8 else 0


def _connect(path: str, *, busy_timeout_ms: int = 30_000) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=busy_timeout_ms / 1000)
    conn.execute(f"PRAGMA busy_timeout = {busy_timeout_ms}")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute(f"PRAGMA mmap_size = {os.environ.get('UPF_EMBEDDED_MMAP', 1 << 28)}")
    quota = _quota_bytes()
    if quota > 0:
        # A size quota on the file: writes past it fail with SQLITE_FULL, exactly as on a full disk.
        page = conn.execute("PRAGMA page_size").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {max(1, quota // page)}")
    return conn


_LOCK_WAIT_SECS = 30.0


def _begin_write(conn: sqlite3.Connection) -> None:
    """BEGIN IMMEDIATE, waiting for another process's write lock in steps of 0.2-2 ms."""
    deadline = time.monotonic() + _LOCK_WAIT_SECS
    pause = 0.0002
    while True:
        try:
            conn.execute("BEGIN IMMEDIATE")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
            if time.monotonic() > deadline:
                raise
            time.sleep(pause)
            pause = min(pause * 1.5, 0.002)
