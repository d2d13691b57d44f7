"""The store file: its schema, connections with the driver's pragmas, and the write lock."""

from __future__ import annotations

import os
import sqlite3
import time

from .health import _quota_bytes

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS kv (k BLOB PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS meta (id INTEGER PRIMARY KEY CHECK (id = 0), version INTEGER NOT NULL)",
    "INSERT OR IGNORE INTO meta VALUES (0, 0)",
    "CREATE TABLE IF NOT EXISTS wlog (version INTEGER PRIMARY KEY, t REAL NOT NULL, writes BLOB NOT NULL)",
    "CREATE INDEX IF NOT EXISTS wlog_t ON wlog (t)",
)


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
