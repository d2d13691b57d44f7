"""The embedded store: FoundationDB's transaction contract on one SQLite file (WAL mode) that several
processes on one host share.

How it keeps FoundationDB's meaning:
- Keys are the same tuple-encoded bytes in a ``WITHOUT ROWID`` table with a BLOB primary key, which
  SQLite orders by memcmp: FoundationDB's byte order.
- Optimistic serializable transactions. A transaction's read version is the store's commit counter
  when it first reads. Each read is one SQLite snapshot; if the counter moved since the read version,
  the read is checked against the write log and the transaction fails with NOT_COMMITTED (1020,
  retryable) if anything it has seen changed, so every transaction sees one snapshot. At commit the
  committer fails it the same way if a commit after its read version wrote anything it read (the
  resolver's rule), including earlier transactions of the same batch.
- Reads that avoid the file: a transaction's first read version may be the commit counter read once
  per event-loop iteration and shared (FoundationDB's proxies batch read versions the same way), and a
  small range result read before is reused while no commit between its version and the snapshot wrote
  into the range. A publish's affinity read thus usually costs no SQLite statement on the loop thread.
- Group commit: one committer thread per process takes every waiting transaction, and applies them in
  one SQLite write transaction (BEGIN IMMEDIATE, so processes serialise on the file lock), each with
  its own batch order, then commits with ``synchronous=FULL``: a commit returns only once the WAL is
  fsynced. The 10-byte stamp is the 8-byte big-endian commit counter (kept in the file, so strictly
  increasing across processes) plus the 2-byte batch order.
- The write log (``wlog``) keeps each physical commit's coalesced write ranges for 10 s (longer than
  the 5 s transaction lifetime), so any process can check conflicts against any other's commits.
- Watches: armed at commit with the value the transaction saw. This process's commits schedule the
  check directly; other processes' commits arrive as a datagram on this handle's wake socket (see
  ``_wake``), read by the event loop, so nothing runs while nothing commits. A 1 s poll of the commit
  counter, only while watches exist, is the backstop for a lost datagram: it costs latency, never a
  missed watch. The check compares only the watched keys the new commits wrote.
- A full disk (SQLITE_FULL, ENOSPC) fails a commit with STORAGE_FULL, not retried, logged once a
  minute, and reported to the process's ``errors.STORAGE`` for the health endpoints.
  ``UPF_EMBEDDED_MAX_BYTES`` (default 0, none) caps the file's size the same way (SQLite's
  ``max_page_count``): a quota, and how the tests fill a "disk" without root.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import queue
import random
import sqlite3
import struct
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from .. import errors
from ..contract import KEY_LIMIT, LIFETIME_SECS, TRANSACTION_LIMIT, VALUE_LIMIT
from . import _metrics
from ._private import create_private_file, make_private_dirs
from ._wake import Doorbell, Inbox
from ._ranges import BatchWrites, IntervalSet, point

__all__ = ["EmbeddedDatabase", "EmbeddedTransaction", "open_embedded"]

log = logging.getLogger("upf.store.embedded")
T = TypeVar("T")

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS kv (k BLOB PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS meta (id INTEGER PRIMARY KEY CHECK (id = 0), version INTEGER NOT NULL)",
    "INSERT OR IGNORE INTO meta VALUES (0, 0)",
    "CREATE TABLE IF NOT EXISTS wlog (version INTEGER PRIMARY KEY, t REAL NOT NULL, writes BLOB NOT NULL)",
    "CREATE INDEX IF NOT EXISTS wlog_t ON wlog (t)",
)
_CHANGED = object()  # a watched value no committed value equals: the watch fires when armed
_WLOG_KEEP_SECS = 10.0
_WLOG_CACHE_ENTRIES = 65_536
_WLOG_CACHE_BYTES = 32 << 20
"""The in-memory copy of the write log is bounded by size too, not only by commits: one commit can
write thousands of keys (a many-topic subscribe), so 65,536 of them were gigabytes. 32 MiB holds the
10 s the log is kept at ~4,000 publishes/s (~800 bytes of write set each); an evicted entry costs one
read of the ``wlog`` table, never a wrong answer."""
_MAX_BATCH = 2048
_MAX_WATCHES = 10_000
_RETRY_LIMIT = 100
_FALLBACK_POLL_SECS = 1.0  # the backstop for lost wake datagrams
_NO_WAKE_POLL_SECS = 0.05  # without a wake socket (a read-only directory, no /proc for long paths)
_RANGE_CACHE_ENTRIES = 1024  # small range results kept (hot ones: reuse needs a recent entry), with their version
_RANGE_CACHE_SCAN = 8
"""At most this many commits' write sets are checked to reuse a cached range; further back, one
SQLite read is cheaper than the scan (1,000 topics published round-robin made it ~30 us per read)."""
_RANGE_CACHE_ROWS = 4  # only results this small are kept (affinity reads: 0 or 1 row) ...
_RANGE_CACHE_BYTES = 1024  # ... and this many key and value bytes, so the cache stays under ~1 MB
_I64 = struct.Struct("<q")
_FULL_LOG_SECS = 60.0  # a full disk is logged once a minute (with the count refused since), not per commit
_BATCH_SIZE = _metrics.COMMIT_BATCH.cell("embedded")
_COMMIT_DURATION = _metrics.COMMIT_DURATION.cell("embedded")

# Mutation kinds, in a transaction's ordered mutation list.
_SET, _CLEAR, _CLEAR_RANGE, _ADD, _VS_KEY, _VS_VALUE = range(6)


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


def _quota_bytes() -> int:
    raw = os.environ.get("UPF_EMBEDDED_MAX_BYTES", "").strip() or "0"
    if not raw.isdigit() or len(raw) > 20:
        raise RuntimeError("UPF_EMBEDDED_MAX_BYTES must be a whole number of bytes (0: no quota)")
    return int(raw)


def _add_le(base: bytes | None, param: bytes) -> bytes:
    """FoundationDB's ADD: little-endian, the existing value zero-extended or truncated to the param's length."""
    n = len(param)
    a = int.from_bytes((base or b"")[:n].ljust(n, b"\x00"), "little")
    b = int.from_bytes(param, "little")
    return ((a + b) % (1 << (8 * n))).to_bytes(n, "little") if n else b""


def _stamp_key(raw: bytes, stamp10: bytes) -> bytes:
    key, off = raw[:-4], int.from_bytes(raw[-4:], "little")
    return key[:off] + stamp10 + key[off + 10 :]


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


def _is_full(exc: BaseException) -> bool:
    """SQLite's SQLITE_FULL ("database or disk is full") or the OS's ENOSPC, however it surfaced."""
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", None)
        if code is not None and code & 0xFF == sqlite3.SQLITE_FULL:
            return True
        return "database or disk is full" in str(exc)
    return isinstance(exc, OSError) and exc.errno == errno.ENOSPC


class _Applier:
    """Applies a batch's mutations in order, but runs consecutive puts as one ``executemany``: the
    committer's Python time is what competes with the event loop for the GIL."""

    __slots__ = ("conn", "puts", "pending", "added")

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.puts: list[tuple[bytes, bytes]] = []
        self.pending: set[bytes] = set()
        self.added: dict[bytes, bytes | None] = {}  # values of keys this batch atomically added to

    def flush(self) -> None:
        if self.puts:
            self.conn.executemany("INSERT OR REPLACE INTO kv VALUES (?, ?)", self.puts)
            self.puts.clear()
            self.pending.clear()

    def put(self, key: bytes, value: bytes) -> None:
        self.puts.append((key, value))
        self.pending.add(key)
        if key in self.added:
            self.added[key] = value

    def add(self, key: bytes, param: bytes) -> None:
        if key in self.added:
            base = self.added[key]
        else:
            if key in self.pending:
                self.flush()
            row = self.conn.execute("SELECT v FROM kv WHERE k = ?", (key,)).fetchone()
            base = row[0] if row else None
        value = _add_le(base, param)
        self.puts.append((key, value))
        self.pending.add(key)
        self.added[key] = value

    def delete(self, key: bytes) -> None:
        self.flush()
        self.conn.execute("DELETE FROM kv WHERE k = ?", (key,))
        if key in self.added:
            self.added[key] = None

    def delete_range(self, begin: bytes, end: bytes) -> None:
        self.flush()
        self.conn.execute("DELETE FROM kv WHERE k >= ? AND k < ?", (begin, end))
        for k in [k for k in self.added if begin <= k < end]:
            self.added[k] = None


def _set_bytes(s: IntervalSet) -> int:
    """Roughly what an IntervalSet holds in memory: its keys plus two bytes objects and two list
    slots per interval."""
    return sum(map(len, s.begins)) + sum(map(len, s.ends)) + 82 * len(s.begins) + 120


class _WriteSetCache:
    """Recent commits' write sets by version, bounded by entries and by bytes; the oldest inserted
    goes first. Written by the committer thread and the loop thread (under a lock), read lock-free."""

    __slots__ = ("_sets", "_sizes", "bytes", "max_bytes", "max_entries", "_lock")

    def __init__(self, max_bytes: int, max_entries: int) -> None:
        self._sets: dict[int, IntervalSet] = {}
        self._sizes: dict[int, int] = {}
        self.bytes = 0
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._sets)

    def get(self, version: int) -> IntervalSet | None:
        return self._sets.get(version)

    def put(self, version: int, s: IntervalSet) -> None:
        size = _set_bytes(s)
        if size > self.max_bytes:
            return  # larger than the whole budget: read from the file when needed
        with self._lock:
            if version in self._sets:
                return
            self._sets[version] = s
            self._sizes[version] = size
            self.bytes += size
            while self.bytes > self.max_bytes or len(self._sets) > self.max_entries:
                oldest = next(iter(self._sets))
                del self._sets[oldest]
                self.bytes -= self._sizes.pop(oldest)

    def update(self, sets: dict[int, IntervalSet]) -> None:
        for version, s in sets.items():
            self.put(version, s)


class _Watch:
    """One registered watch; awaiting it waits for the change. ``cancel`` unregisters it."""

    __slots__ = ("key", "value", "future", "_db")

    def __init__(self, db: EmbeddedDatabase, key: bytes, value: bytes | None) -> None:
        self._db = db
        self.key = key
        self.value = value
        self.future: asyncio.Future[None] = db._loop.create_future()
        self.future.add_done_callback(lambda _f: db._unregister(self))

    def __await__(self) -> Any:
        # Not shielded: a waiter that gives up (a timeout) cancels the watch, as destroying an FDB
        # watch future does, so abandoned watches never pile up.
        return self.future.__await__()

    def done(self) -> bool:
        return self.future.done()

    def cancel(self) -> None:
        if not self.future.done():
            self.future.cancel()


class _Pending:
    """A transaction handed to the committer thread, with what it needs to resolve and check."""

    __slots__ = ("read_version", "reads", "writes", "mutations", "started", "future", "stamp")

    def __init__(self, tr: EmbeddedTransaction, future: asyncio.Future[bytes]) -> None:
        self.read_version = tr._read_version
        self.reads = tr._reads
        self.writes = tr._writes
        self.mutations = tr._mutations
        self.started = tr._started
        self.future = future
        self.stamp: bytes | BaseException | None = None


class EmbeddedTransaction:
    __slots__ = (
        "_db",
        "_read_version",
        "_reads",
        "_seen",
        "_writes",
        "_mutations",
        "_overlay",
        "_cleared",
        "_adds",
        "_unreadable",
        "_watches",
        "_stamp_future",
        "_user_version",
        "_size",
        "_started",
        "_attempts",
        "_committing",
    )

    def __init__(self, db: EmbeddedDatabase) -> None:
        self._db = db
        self._attempts = 0
        self._reset()

    def _reset(self) -> None:
        self._read_version: int | None = None
        self._reads: list[tuple[bytes, bytes]] = []  # conflict ranges (non-snapshot reads)
        self._seen: list[tuple[bytes, bytes]] = []  # everything read, for snapshot consistency
        self._writes: list[tuple[bytes, bytes]] = []
        self._mutations: list[tuple[int, bytes, bytes]] = []
        self._overlay: dict[bytes, bytes | None] = {}
        self._cleared: list[tuple[bytes, bytes]] = []
        self._adds: dict[bytes, list[bytes]] = {}
        self._unreadable: list[tuple[bytes, bytes]] = []
        self._watches: list[tuple[bytes, bytes | None]] = []
        self._stamp_future: asyncio.Future[bytes] | None = None
        self._user_version = 0
        self._size = 0
        self._started = time.monotonic()
        self._committing = False

    # --- reads -------------------------------------------------------------------------------------
    def _check_alive(self) -> None:
        if self._committing:
            raise errors.StoreError(errors.USED_DURING_COMMIT)
        if time.monotonic() - self._started > LIFETIME_SECS:
            raise errors.StoreError(errors.TRANSACTION_TOO_OLD)

    def _check_readable(self, begin: bytes, end: bytes) -> None:
        for b, e in self._unreadable:
            if b < end and begin < e:
                raise errors.StoreError(errors.ACCESSED_UNREADABLE)

    def _note_read(self, begin: bytes, end: bytes, snapshot: bool, version: int) -> None:
        """Record a read and keep the transaction on one snapshot (see the module docstring)."""
        if self._read_version is None:
            self._read_version = version
        self._seen.append((begin, end))
        if not snapshot:
            self._reads.append((begin, end))
            self._size += len(begin) + len(end)
        if version != self._read_version and self._db._changed_since(self._read_version, version, self._seen):
            raise errors.StoreError(errors.NOT_COMMITTED, "snapshot moved")

    def _local_value(self, key: bytes, base: bytes | None) -> bytes | None:
        if key in self._overlay:
            value = self._overlay[key]
        elif any(b <= key < e for b, e in self._cleared):
            value = None
        else:
            value = base
        for param in self._adds.get(key, ()):
            value = _add_le(value, param)
        return value

    def _touched(self, begin: bytes, end: bytes) -> bool:
        return (
            any(begin <= k < end for k in self._overlay)
            or any(b < end and begin < e for b, e in self._cleared)
            or any(begin <= k < end for k in self._adds)
        )

    def _get_sync(self, key: bytes, snapshot: bool) -> bytes | None:
        self._check_alive()
        self._check_readable(key, key + b"\x00")
        version, base = self._db._read_point(key)
        self._note_read(*point(key), snapshot, version)
        return self._local_value(key, base)

    async def get(self, key: bytes, *, snapshot: bool = False) -> bytes | None:
        return self._get_sync(key, snapshot)

    async def get_range(
        self,
        begin: bytes,
        end: bytes,
        *,
        limit: int = 0,
        reverse: bool = False,
        snapshot: bool = False,
    ) -> list[tuple[bytes, bytes]]:
        self._check_alive()
        if begin >= end:
            return []
        self._check_readable(begin, end)
        local = self._touched(begin, end)
        version, rows = self._db._read_range_at(begin, end, 0 if local else limit, reverse, self._read_version)
        if local:
            merged = {k: v for k, v in rows}
            for k in list(merged) + [k for k in self._overlay if begin <= k < end] + [
                k for k in self._adds if begin <= k < end
            ]:
                value = self._local_value(k, merged.get(k))
                if value is None:
                    merged.pop(k, None)
                else:
                    merged[k] = value
            rows = sorted(merged.items(), reverse=reverse)
            if limit:
                rows = rows[:limit]
        # Like FoundationDB, a read that stopped at its limit only conflicts on what it covered.
        lo, hi = begin, end
        if limit and len(rows) >= limit:
            if reverse:
                lo = rows[-1][0]
            else:
                hi = rows[-1][0] + b"\x00"
        self._note_read(lo, hi, snapshot, version)
        return rows

    # --- writes ------------------------------------------------------------------------------------
    def _check_write(self, key: bytes, value: bytes) -> None:
        if self._committing:
            raise errors.StoreError(errors.USED_DURING_COMMIT)
        if len(key) > KEY_LIMIT:
            raise errors.StoreError(errors.KEY_TOO_LARGE, f"{len(key)} bytes")
        if len(value) > VALUE_LIMIT:
            raise errors.StoreError(errors.VALUE_TOO_LARGE, f"{len(value)} bytes")
        self._size += len(key) + len(value)

    def set(self, key: bytes, value: bytes) -> None:
        self._check_write(key, value)
        self._mutations.append((_SET, key, value))
        self._writes.append(point(key))
        self._overlay[key] = value
        self._adds.pop(key, None)

    def clear(self, key: bytes) -> None:
        self._check_write(key, b"")
        self._mutations.append((_CLEAR, key, b""))
        self._writes.append(point(key))
        self._overlay[key] = None
        self._adds.pop(key, None)

    def clear_range(self, begin: bytes, end: bytes) -> None:
        self._check_write(begin, end)
        if begin >= end:
            return
        self._mutations.append((_CLEAR_RANGE, begin, end))
        self._writes.append((begin, end))
        for k in [k for k in self._overlay if begin <= k < end]:
            del self._overlay[k]
        for k in [k for k in self._adds if begin <= k < end]:
            del self._adds[k]
        self._cleared.append((begin, end))

    def add(self, key: bytes, param: bytes) -> None:
        self._check_write(key, param)
        self._mutations.append((_ADD, key, param))
        self._writes.append(point(key))
        if key in self._overlay and self._overlay[key] is not None:
            self._overlay[key] = _add_le(self._overlay[key], param)
        else:
            self._adds.setdefault(key, []).append(param)

    def set_versionstamped_key(self, key: bytes, value: bytes) -> None:
        if len(key) < 14:
            raise errors.StoreError(errors.CLIENT_INVALID_OPERATION, "versionstamped key shorter than 14 bytes")
        offset = int.from_bytes(key[-4:], "little")
        if offset + 10 > len(key) - 4:
            raise errors.StoreError(errors.CLIENT_INVALID_OPERATION, "versionstamp offset past the key")
        self._check_write(key[:-4], value)
        self._mutations.append((_VS_KEY, key, value))
        prefix = key[:offset]
        self._unreadable.append((prefix, prefix + b"\xff" * 11))

    def set_versionstamped_value(self, key: bytes, value: bytes) -> None:
        if len(value) < 14:
            raise errors.StoreError(errors.CLIENT_INVALID_OPERATION, "versionstamped value shorter than 14 bytes")
        offset = int.from_bytes(value[-4:], "little")
        if offset + 10 > len(value) - 4:
            raise errors.StoreError(errors.CLIENT_INVALID_OPERATION, "versionstamp offset past the value")
        self._check_write(key, value[:-4])
        self._mutations.append((_VS_VALUE, key, value))
        self._writes.append(point(key))
        self._overlay.pop(key, None)
        self._adds.pop(key, None)
        self._unreadable.append(point(key))

    def add_read_conflict_range(self, begin: bytes, end: bytes) -> None:
        self._reads.append((begin, end))

    def next_user_version(self) -> int:
        uv = self._user_version
        if uv > 0xFFFF:
            raise errors.StoreError(errors.CLIENT_INVALID_OPERATION, "more than 65536 stamped entries")
        self._user_version += 1
        return uv

    def get_versionstamp(self) -> Awaitable[bytes]:
        if self._stamp_future is None:
            self._stamp_future = self._db._loop.create_future()
        return self._stamp_future

    def watch(self, key: bytes) -> _Watch:
        if self._db._watch_count() + len(self._watches) >= _MAX_WATCHES:
            raise errors.StoreError(errors.TOO_MANY_WATCHES)
        self._check_alive()
        version, base = self._db._read_point(key)
        value: Any = self._local_value(key, base)
        if self._read_version is None:
            self._read_version = version
        elif version != self._read_version and self._db._changed_since(self._read_version, version, [point(key)]):
            value = _CHANGED  # changed after our snapshot: FoundationDB's watch would fire at once
        w = _Watch(self._db, key, value)
        self._watches.append(w)  # type: ignore[arg-type]
        return w

    # --- commit ------------------------------------------------------------------------------------
    async def commit(self) -> None:
        self._check_alive()
        if self._size > TRANSACTION_LIMIT:
            raise errors.StoreError(errors.TRANSACTION_TOO_LARGE, f"{self._size} bytes")
        watches = self._watches
        if not self._mutations:
            if self._stamp_future is not None and not self._stamp_future.done():
                self._stamp_future.set_exception(errors.StoreError(errors.NO_COMMIT_VERSION))
                self._stamp_future.exception()  # retrieved: a read-only caller may never await it
            self._db._arm(watches)  # type: ignore[arg-type]
            return
        if self._read_version is None:
            self._read_version = self._db._committed_version()
        self._committing = True
        future: asyncio.Future[bytes] = self._db._loop.create_future()
        self._db._submit(_Pending(self, future))
        try:
            # A cancelled caller cancels only its wait: the committer still commits (or fails) it.
            stamp = await future
        finally:
            self._committing = False
        if self._stamp_future is not None and not self._stamp_future.done():
            self._stamp_future.set_result(stamp)
        self._db._arm(watches)  # type: ignore[arg-type]

    async def on_error(self, exc: BaseException) -> None:
        if not isinstance(exc, errors.StoreError) or not exc.retryable or self._attempts >= _RETRY_LIMIT:
            raise exc
        self.cancel()
        self._attempts += 1
        await asyncio.sleep(min(1.0, 0.002 * (2 ** min(self._attempts, 9))) * random.random())
        self._reset()

    def cancel(self) -> None:
        for w in self._watches:
            w.future.cancel()  # type: ignore[attr-defined]
        if self._stamp_future is not None and not self._stamp_future.done():
            self._stamp_future.cancel()


class EmbeddedDatabase:
    name = "embedded"

    def __init__(self, path: str, loop: asyncio.AbstractEventLoop) -> None:
        self.path = path
        self._loop = loop
        self._reader = _connect(path)
        self._grv: int | None = None
        self._watches: dict[bytes, set[_Watch]] = {}
        self._wlog_cache = _WriteSetCache(_WLOG_CACHE_BYTES, _WLOG_CACHE_ENTRIES)
        self._queue: queue.SimpleQueue[_Pending | None] = queue.SimpleQueue()
        self._closed = False
        self._check_scheduled = False
        self._watch_version = self._committed_version()
        self._range_cache: dict[tuple[bytes, bytes, int, bool], tuple[int, list[tuple[bytes, bytes]]]] = {}
        self._last_prune = 0.0
        self._full_logged = -_FULL_LOG_SECS
        self._full_refused = 0
        self.fallback_poll_secs = _FALLBACK_POLL_SECS
        self._fallback: asyncio.TimerHandle | None = None
        self._inbox: Inbox | None = None
        self._doorbell: Doorbell | None = None
        try:
            self._inbox = Inbox(path)
            self._doorbell = Doorbell(path, self._inbox.name)
            loop.add_reader(self._inbox.fileno(), self._on_wake)
        except OSError:
            # Watches still work, by polling: other processes' commits are seen within 50 ms.
            log.warning("embedded wake socket unavailable, polling for other processes' commits", exc_info=True)
            if self._inbox is not None:
                self._inbox.close()
                self._inbox = None
            self.fallback_poll_secs = _NO_WAKE_POLL_SECS
        self._committer = threading.Thread(target=self._commit_loop, name="upf-store-committer", daemon=True)
        self._committer.start()

    # --- reads (on the loop thread) -----------------------------------------------------------------
    # One statement is one SQLite snapshot: the commit counter comes first (k IS NULL), then the
    # rows, so a read and the version it saw cannot disagree. SQLite runs UNION ALL arms in order.
    _POINT_SQL = "SELECT NULL, version FROM meta UNION ALL SELECT k, v FROM kv WHERE k = ?"

    def _read_point(self, key: bytes) -> tuple[int, bytes | None]:
        rows = self._reader.execute(self._POINT_SQL, (key,)).fetchall()
        return self._observed(self._split(rows, 1)[0]), (rows[1][1] if len(rows) > 1 else None)

    @staticmethod
    def _split(rows: list[tuple[Any, Any]], _n: int) -> tuple[int, list[tuple[bytes, bytes]]]:
        if rows[0][0] is not None:  # defensive: never seen, but the order is not a documented promise
            raise errors.StoreError(errors.NOT_COMMITTED, "unordered union")
        return rows[0][1], rows

    def _read_range(self, begin: bytes, end: bytes, limit: int, reverse: bool) -> tuple[int, list[tuple[bytes, bytes]]]:
        order = "DESC" if reverse else "ASC"
        sql = (
            "SELECT NULL, version FROM meta UNION ALL SELECT * FROM "
            f"(SELECT k, v FROM kv WHERE k >= ? AND k < ? ORDER BY k {order} LIMIT ?)"
        )
        rows = self._reader.execute(sql, (begin, end, limit or -1)).fetchall()
        version, _ = self._split(rows, 0)
        return self._observed(version), rows[1:]

    def _read_version_now(self) -> int:
        """The commit counter for a transaction's first read, read once per event-loop iteration and
        shared, as FoundationDB's proxies batch read-version requests. Still externally consistent:
        every transaction started in this iteration started after whatever woke the iteration (a
        commit's acknowledgement reaches its waiter in a later iteration, and so does any request
        sent after another process's acknowledgement)."""
        v = self._grv
        if v is None:
            v = self._grv = self._committed_version()
            self._loop.call_soon(self._expire_grv)
        return v

    def _expire_grv(self) -> None:
        self._grv = None

    def _read_range_at(
        self, begin: bytes, end: bytes, limit: int, reverse: bool, at: int | None
    ) -> tuple[int, list[tuple[bytes, bytes]]]:
        """A range read for a transaction whose snapshot is ``at`` (None: not chosen yet). A small
        result read before is reused when no commit between its version and the snapshot wrote into
        the range (the write sets are in memory for this process's commits), so a publish's affinity
        read usually costs no SQLite statement on the loop thread. Otherwise it is read from the file."""
        key = (begin, end, limit, reverse)
        hit = self._range_cache.get(key)
        if hit is not None:
            target = self._read_version_now() if at is None else at
            cached, rows = hit
            try:
                lo, hi = (cached, target) if cached <= target else (target, cached)
                if lo == hi or (hi - lo <= _RANGE_CACHE_SCAN and not self._changed_since(lo, hi, [(begin, end)])):
                    if cached < target:
                        self._range_cache[key] = (target, rows)
                    return target, list(rows)
            except errors.StoreError:  # the write log no longer reaches back: read the file
                pass
        version, rows = self._read_range(begin, end, limit, reverse)
        if len(rows) <= _RANGE_CACHE_ROWS and sum(len(k) + len(v) for k, v in rows) <= _RANGE_CACHE_BYTES:
            if hit is None and len(self._range_cache) >= _RANGE_CACHE_ENTRIES:
                del self._range_cache[next(iter(self._range_cache))]  # the oldest entry
            self._range_cache[key] = (version, list(rows))
        return version, rows

    def _committed_version(self) -> int:
        return self._observed(self._reader.execute("SELECT version FROM meta").fetchone()[0])

    def _observed(self, version: int) -> int:
        """Whatever this iteration has seen of the file, a transaction started later in it sees too
        (a read-only transaction completes without yielding to the loop)."""
        if self._grv is not None and version > self._grv:
            self._grv = version
        return version

    def _write_sets(self, conn: sqlite3.Connection, after: int, upto: int) -> list[IntervalSet]:
        """The write sets of commits after..upto: from this process's cache, else from the file."""
        cache = self._wlog_cache
        sets = [cache.get(v) for v in range(after + 1, upto + 1)]
        if all(s is not None for s in sets):
            return sets  # type: ignore[return-value]
        loaded = {
            v: IntervalSet.decode(raw)
            for v, raw in conn.execute("SELECT version, writes FROM wlog WHERE version > ? AND version <= ?", (after, upto))
        }
        cache.update(loaded)
        out = []
        for v in range(after + 1, upto + 1):
            s = loaded.get(v) or cache.get(v)
            if s is None:
                # Pruned: the transaction outlived the write log, so it is too old to check.
                raise errors.StoreError(errors.TRANSACTION_TOO_OLD)
            out.append(s)
        return out

    def _changed_since(self, after: int, upto: int, ranges: list[tuple[bytes, bytes]]) -> bool:
        return any(s.overlaps_any(ranges) for s in self._write_sets(self._reader, after, upto))

    # --- commits (on the committer thread) ----------------------------------------------------------
    def _submit(self, pending: _Pending) -> None:
        self._queue.put(pending)

    def _commit_loop(self) -> None:
        # No SQLite busy handler here: its sleeps (1, 2, 5, 10 ... 25 ms) let a waiter oversleep the
        # other process's lock by tens of ms; _begin_write polls the lock far more finely instead.
        conn = _connect(self.path, busy_timeout_ms=0)
        try:
            while True:
                first = self._queue.get()
                if first is None:
                    return
                batch = [first]
                while len(batch) < _MAX_BATCH:
                    try:
                        nxt = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if nxt is None:
                        self._queue.put(None)
                        break
                    batch.append(nxt)
                started = time.perf_counter()
                try:
                    if self._commit_batch(conn, batch):
                        self._ring()
                    _COMMIT_DURATION.record(time.perf_counter() - started)
                    _BATCH_SIZE.record(len(batch))
                except Exception as exc:  # a failed physical commit fails every transaction in it
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                    if _is_full(exc):
                        # Not retryable: each caller learns at once, and the log gets one line a minute.
                        failure = errors.StoreError(errors.STORAGE_FULL, type(exc).__name__)
                        self._log_full(len(batch))
                    else:
                        log.exception("embedded commit failed")
                        failure = errors.StoreError(errors.NOT_COMMITTED, type(exc).__name__)
                    for p in batch:
                        if p.stamp is None or isinstance(p.stamp, bytes):
                            p.stamp = failure
                try:
                    self._loop.call_soon_threadsafe(self._resolve, batch)
                except RuntimeError:  # the loop is gone: nobody is waiting any more
                    return
        finally:
            conn.close()

    def _log_full(self, refused: int) -> None:
        self._full_refused += refused
        now = time.monotonic()
        if now - self._full_logged >= _FULL_LOG_SECS:
            log.error("embedded store full: writes refused", extra={"refused_transactions": self._full_refused})
            self._full_logged = now
            self._full_refused = 0

    def _ring(self) -> None:
        try:
            if self._doorbell is not None:
                self._doorbell.ring()
        except Exception:  # a wake is advisory: peers' fallback poll still sees the commit
            log.exception("embedded wake failed")

    def _commit_batch(self, conn: sqlite3.Connection, batch: list[_Pending]) -> bool:
        """Apply one physical commit; True if it committed anything."""
        _begin_write(conn)
        version = conn.execute("SELECT version FROM meta").fetchone()[0]
        new_version = version + 1
        prefix = new_version.to_bytes(8, "big")
        now = time.monotonic()
        in_batch = BatchWrites()
        applier = _Applier(conn)
        order = 0
        for p in batch:
            if now - p.started > LIFETIME_SECS:
                p.stamp = errors.StoreError(errors.TRANSACTION_TOO_OLD)
                continue
            if p.reads:
                try:
                    sets = self._write_sets(conn, p.read_version or 0, version)
                except errors.StoreError as exc:
                    p.stamp = exc
                    continue
                if in_batch.overlaps_any(p.reads) or any(s.overlaps_any(p.reads) for s in sets):
                    p.stamp = errors.StoreError(errors.NOT_COMMITTED)
                    continue
            stamp = prefix + order.to_bytes(2, "big")
            order += 1
            for b, e in self._apply(applier, p.mutations, stamp):
                in_batch.add(b, e)
            for b, e in p.writes:
                in_batch.add(b, e)
            p.stamp = stamp
        applier.flush()
        if order:
            wall = time.time()
            written = in_batch.to_set()
            conn.execute("UPDATE meta SET version = ?", (new_version,))
            if wall - self._last_prune > 1.0:  # before the insert, so a full file can reuse the space
                self._last_prune = wall
                conn.execute("DELETE FROM wlog WHERE t < ?", (wall - _WLOG_KEEP_SECS,))
            conn.execute("INSERT INTO wlog VALUES (?, ?, ?)", (new_version, wall, written.encode()))
            conn.execute("COMMIT")
            self._wlog_cache.put(new_version, written)
            return True
        conn.execute("ROLLBACK")
        return False

    @staticmethod
    def _apply(applier: _Applier, mutations: list[tuple[int, bytes, bytes]], stamp: bytes) -> list[tuple[bytes, bytes]]:
        stamped: list[tuple[bytes, bytes]] = []
        for kind, a, b in mutations:
            if kind == _VS_KEY:
                key = _stamp_key(a, stamp)
                applier.put(key, b)
                stamped.append(point(key))
            elif kind == _SET:
                applier.put(a, b)
            elif kind == _VS_VALUE:
                applier.put(a, _stamp_key(b, stamp))
            elif kind == _ADD:
                applier.add(a, b)
            elif kind == _CLEAR:
                applier.delete(a)
            elif kind == _CLEAR_RANGE:
                applier.delete_range(a, b)
        return stamped

    def _resolve(self, batch: list[_Pending]) -> None:
        self._grv = None  # what starts after these acknowledgements reads past them
        for p in batch:
            if isinstance(p.stamp, errors.StoreError) and p.stamp.storage_full:
                errors.STORAGE.write_refused()
            if p.future.done():
                continue
            if isinstance(p.stamp, BaseException):
                p.future.set_exception(p.stamp)
            else:
                p.future.set_result(p.stamp)  # type: ignore[arg-type]
        self._schedule_watch_check()

    # --- watches ------------------------------------------------------------------------------------
    def _watch_count(self) -> int:
        return sum(len(s) for s in self._watches.values())

    def _arm(self, watches: list[_Watch]) -> None:
        """Register watches, firing at once those whose key already changed (before this point the
        incremental check below cannot see the change: it may predate the checked version)."""
        for w in watches:
            if w.future.done():
                continue
            _, value = self._read_point(w.key)
            if value != w.value:
                w.future.set_result(None)
            else:
                self._watches.setdefault(w.key, set()).add(w)
        if self._watches and self._fallback is None and not self._closed:
            self._fallback = self._loop.call_later(self.fallback_poll_secs, self._fallback_poll)

    def _unregister(self, w: _Watch) -> None:
        s = self._watches.get(w.key)
        if s is not None:
            s.discard(w)
            if not s:
                del self._watches[w.key]

    def _schedule_watch_check(self) -> None:
        if self._watches and not self._check_scheduled and not self._closed:
            self._check_scheduled = True
            self._loop.call_soon(self._check_watches)

    def _check_watches(self) -> None:
        """Compare the watched keys that commits since the last check wrote: their write sets come
        from the write log (this process's from memory), so a commit that touched no watched key
        costs one version read, not a read of every watched key."""
        self._check_scheduled = False
        if not self._watches or self._closed:
            return
        current_version = self._committed_version()
        if current_version == self._watch_version:
            return
        try:
            sets = self._write_sets(self._reader, self._watch_version, current_version)
        except errors.StoreError:  # the log no longer reaches back that far: compare them all
            sets = None
        self._watch_version = current_version
        keys = [k for k in self._watches if sets is None or any(ws.overlaps(*point(k)) for ws in sets)]
        if not keys:
            return
        current: dict[bytes, bytes] = {}
        for i in range(0, len(keys), 500):
            chunk = keys[i : i + 500]
            marks = ",".join("?" * len(chunk))
            current.update(self._reader.execute(f"SELECT k, v FROM kv WHERE k IN ({marks})", chunk).fetchall())
        for key in keys:
            value = current.get(key)
            for w in list(self._watches.get(key, ())):
                if w.value != value and not w.future.done():
                    w.future.set_result(None)

    def _on_wake(self) -> None:
        """Another process committed (one or many datagrams): one check covers them all."""
        if self._inbox is not None:
            self._inbox.drain()
        self._schedule_watch_check()

    def _fallback_poll(self) -> None:
        """The backstop for lost datagrams: one commit-counter read a second, only while watched."""
        self._fallback = None
        if self._closed or not self._watches:
            return
        self._schedule_watch_check()
        self._fallback = self._loop.call_later(self.fallback_poll_secs, self._fallback_poll)

    # --- the contract -------------------------------------------------------------------------------
    def create_transaction(self) -> EmbeddedTransaction:
        if self._closed:
            raise errors.StoreError(errors.CLIENT_INVALID_OPERATION, "database closed")
        return EmbeddedTransaction(self)

    async def transact(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        return await _metrics.run("embedded", self.create_transaction(), fn, args, kwargs)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        if self._fallback is not None:
            self._fallback.cancel()
            self._fallback = None
        if self._inbox is not None:
            self._loop.remove_reader(self._inbox.fileno())
            self._inbox.close()
        await asyncio.to_thread(self._committer.join)
        if self._doorbell is not None:
            self._doorbell.close()
        for s in list(self._watches.values()):
            for w in list(s):
                w.cancel()
        self._reader.close()


async def open_embedded(path: str) -> EmbeddedDatabase:
    """Open (creating if needed) the store file; the schema is created idempotently by any process.
    What it creates is private: directories 0700, the file (and so its WAL and SHM) 0600."""
    make_private_dirs(os.path.dirname(os.path.abspath(path)))
    create_private_file(path)
    conn = _connect(path)
    try:
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if mode.lower() != "wal":
            raise RuntimeError("the embedded store needs SQLite's WAL mode")
        conn.execute("BEGIN IMMEDIATE")
        for stmt in _SCHEMA:
            conn.execute(stmt)
        conn.execute("COMMIT")
    finally:
        conn.close()
    errors.STORAGE.share(_health_marker(path))
    return EmbeddedDatabase(path, asyncio.get_running_loop())


def raise_version_floor(path: str, floor: int) -> int:
    """Make every later commit's version exceed ``floor``, and return the version now in force.

    Why: ``upf restore`` writes messages with the stamps (ids) they had; the store they land in may have
    committed far fewer times, and its next stamps would sort before them (``since=<old id>`` would then
    skip new messages). Run it with no process using the store (the restore's own handle closed)."""
    conn = _connect(path)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("UPDATE meta SET version = MAX(version, ?)", (floor,))
        version = int(conn.execute("SELECT version FROM meta").fetchone()[0])
        conn.execute("COMMIT")
        return version
    finally:
        conn.close()


def _health_marker(path: str) -> str:
    """``<store>-full``: its mtime is the last refused write of any process on the file (see
    ``errors.StorageHealth``); created with an mtime long past, so a new one says healthy."""
    marker = path + "-full"
    if not os.path.exists(marker):
        with contextlib.suppress(OSError):  # a disk too full for it: this process still reports its own
            create_private_file(marker)
            os.utime(marker, (0, 0))
    return marker
