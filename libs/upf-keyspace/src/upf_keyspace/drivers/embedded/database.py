"""The handle: ``EmbeddedDatabase`` (the layers of this package over one process's state), opening the
store file (noticing lost commits), and raising its stamp floor."""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ... import errors
from .. import _metrics
from .._private import create_private_file, make_private_dirs
from .._wake import Doorbell, Inbox
from . import writelog
from .committer import _Committer, _Pending
from .file import _SCHEMA, _connect, _mark_path, _migrate, _read_mark
from .health import _FullLog, _health_marker
from .transaction import EmbeddedTransaction
from .watches import _FALLBACK_POLL_SECS, _NO_WAKE_POLL_SECS, _Watch

log = logging.getLogger("upf.store.embedded")
T = TypeVar("T")


class EmbeddedDatabase(_Committer):
    name = "embedded"

    def __init__(self, path: str, loop: asyncio.AbstractEventLoop) -> None:
        self.path = path
        self._loop = loop
        self._reader = _connect(path)
        self._grv: int | None = None
        self._watches: dict[bytes, set[_Watch]] = {}
        self._watch_n = 0
        self._unchecked = False
        self._wlog_cache = writelog._WriteSetCache(writelog._WLOG_CACHE_BYTES, writelog._WLOG_CACHE_ENTRIES)
        self._queue: queue.SimpleQueue[_Pending | None] = queue.SimpleQueue()
        self._closed = False
        self._check_scheduled = False
        self._watch_version = self._committed_version()
        self._range_cache: dict[tuple[bytes, bytes, int, bool], tuple[int, list[tuple[bytes, bytes]]]] = {}
        self._last_prune = 0.0
        self._full_log = _FullLog()
        create_private_file(_mark_path(path))
        self._mark_fd = os.open(_mark_path(path), os.O_RDWR | getattr(os, "O_NOFOLLOW", 0))
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
        os.close(self._mark_fd)
        for s in list(self._watches.values()):
            for w in list(s):
                w.cancel()
        self._reader.close()


async def open_embedded(path: str) -> EmbeddedDatabase:
    """Open (creating if needed) the store file; the schema is created idempotently by any process.
    What it creates is private: directories 0700, the file (and so its WAL and SHM) 0600.

    A file whose last stamp is below the stamp mark lost commits (SQLite drops a damaged or missing
    WAL's frames silently): that is logged as an error, and stamps resume above the mark."""
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
        _migrate(conn)
        stamp = int(conn.execute("SELECT stamp FROM meta").fetchone()[0])
        mark = _read_mark(path)
        if mark > stamp:
            log.error("embedded store lost commits", extra={"store": path, "last_stamp": stamp, "stamp_mark": mark})
            conn.execute("UPDATE meta SET stamp = ?", (mark,))
        conn.execute("COMMIT")
    finally:
        conn.close()
    errors.STORAGE.share(_health_marker(path))
    return EmbeddedDatabase(path, asyncio.get_running_loop())


def raise_stamp_floor(path: str, floor: int) -> int:
    """Make every later commit's stamp exceed ``floor``, and return the stamp floor now in force.

    Why: ``upf restore`` writes messages with the stamps (ids) they had; stamps carry the clock, but
    the clock of the host that issued them may run ahead of this one. The mark moves with it, so the
    restore is not taken for lost commits. Run it with no process using the store (the restore's own
    handle closed)."""
    conn = _connect(path)
    try:
        conn.execute("BEGIN IMMEDIATE")
        _migrate(conn)
        conn.execute("UPDATE meta SET stamp = MAX(stamp, ?)", (floor,))
        stamp = int(conn.execute("SELECT stamp FROM meta").fetchone()[0])
        conn.execute("COMMIT")
    finally:
        conn.close()
    create_private_file(_mark_path(path))
    with open(_mark_path(path), "r+b") as f:
        f.write(stamp.to_bytes(8, "big"))
    return stamp
