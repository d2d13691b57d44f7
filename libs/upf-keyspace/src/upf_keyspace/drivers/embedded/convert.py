"""Stores made before the LMDB engine were SQLite files at the same path. The first open converts one:
its keys and counters are copied into LMDB, and the SQLite file is kept beside it as ``<path>.sqlite``.
Stop every process on the store before upgrading: an older process would go on writing the SQLite
file (now the copy) and its writes would be lost."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import sqlite3
import time

import lmdb

from .._private import create_private_file
from .file import _MAP_BYTES, _META, _META_KEY

log = logging.getLogger("upf.store.embedded")

_SQLITE_MAGIC = b"SQLite format 3\x00"
_ROWS_PER_TXN = 10_000


def is_sqlite(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(_SQLITE_MAGIC)) == _SQLITE_MAGIC
    except FileNotFoundError:
        return False


def convert_sqlite(path: str) -> None:
    """Convert the SQLite store at ``path`` in place (one process does it; the others wait for it)."""
    lock = path + ".convert"
    create_private_file(lock)
    with open(lock, "r+b") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        if not is_sqlite(path):
            return  # another process converted it while this one waited
        started = time.monotonic()
        tmp = path + ".lmdb-new"
        for stale in (tmp, tmp + "-lock"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(stale)
        conn = sqlite3.connect(path, isolation_level=None, timeout=30)
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # commits still in the WAL are copied too
            columns = {row[1] for row in conn.execute("PRAGMA table_info(meta)")}
            sql = "SELECT version, stamp FROM meta" if "stamp" in columns else "SELECT version, version FROM meta"
            version, stamp = conn.execute(sql).fetchone()
            rows = _copy(conn, tmp, int(version), int(stamp))
        finally:
            conn.close()
        kept = path + ".sqlite"
        if os.path.exists(kept):
            kept = f"{path}.sqlite-{int(time.time())}"
        try:
            os.link(path, kept)  # the old file stays, under its new name, before the store is replaced
        except OSError:  # a filesystem without hard links
            shutil.copy2(path, kept)
        os.replace(tmp, path)
        for stale in (tmp + "-lock", path + "-wal", path + "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(stale)
        log.warning(
            "embedded store converted from SQLite",
            extra={"store": path, "rows": rows, "kept_as": kept, "secs": round(time.monotonic() - started, 3)},
        )


def _copy(conn: sqlite3.Connection, tmp: str, version: int, stamp: int) -> int:
    env = lmdb.open(tmp, subdir=False, map_size=_MAP_BYTES, max_dbs=3, sync=True, mode=0o600)
    try:
        kv, meta = env.open_db(b"kv"), env.open_db(b"meta")
        env.open_db(b"wlog")
        rows = 0
        cursor = conn.execute("SELECT k, v FROM kv ORDER BY k")
        while chunk := cursor.fetchmany(_ROWS_PER_TXN):
            with env.begin(write=True) as txn:
                for k, v in chunk:
                    txn.put(bytes(k), bytes(v), db=kv, append=True)  # in key order: appended
            rows += len(chunk)
        with env.begin(write=True) as txn:
            txn.put(_META_KEY, _META.pack(version, stamp), db=meta)
        env.sync(True)
        return rows
    finally:
        env.close()
