"""The handle: ``EmbeddedDatabase`` (the layers of this package over one process's state), opening the
store file (noticing lost commits), and raising its stamp floor."""

from __future__ import annotations

import asyncio
import errno
import logging
import math
import os
import queue
import random
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import lmdb

from ... import errors
from .. import _metrics
from .._private import create_private_file, make_private_dirs
from .._wake import Doorbell, Inbox
from . import writelog
from .committer import _Committer, _Pending, commit_wait_secs
from .convert import convert_sqlite, is_sqlite
from .file import _close_file, _File, _mark_path, _open_file, _read_mark
from .grouped import _Grouped
from .health import _FullLog, _health_marker
from .reads import _Snapshot
from .transaction import EmbeddedTransaction
from .watches import _FALLBACK_POLL_SECS, _NO_WAKE_POLL_SECS, _Heads, _Watch, _WatchSet, wake_pace_secs

log = logging.getLogger("upf.store.embedded")
T = TypeVar("T")


class EmbeddedDatabase(_Committer):
    name = "embedded"

    def __init__(self, path: str, loop: asyncio.AbstractEventLoop, group_wait: float, wake_pace: float) -> None:
        self._group_wait = group_wait
        self._wake_pace = wake_pace
        self._woke_at = -math.inf
        self._quick = 0
        self._paced_check = None
        self.path = path
        self._loop = loop
        self._reader: _File = _open_file(path)
        self._grv: int | None = None
        self._watches: dict[bytes, set[_Watch]] = {}
        self._watch_n = 0
        self._unchecked = False
        self._wlog_cache = writelog._WriteSetCache(writelog._WLOG_CACHE_BYTES, writelog._WLOG_CACHE_ENTRIES)
        self._queue: queue.SimpleQueue[_Pending | _Grouped | None] = queue.SimpleQueue()
        self._enough = threading.Event()
        self._gathering = False
        self._submitted = self._taken = 0
        self._arrived_at = self._gap_max = self._gap = self._gather_began = 0.0
        self._bar = 0.0
        self._wake_at = 0
        self._closed = False
        self._check_scheduled = False
        try:
            self._watch_version = self._committed_version()
        except BaseException:  # (every reader slot taken): the file's use count must not leak
            _close_file(self._reader)
            raise
        self._checked_values: tuple[int, dict[bytes, bytes | None]] = (-1, {})
        self._heads = _Heads()
        self._range_cache: dict[tuple[bytes, bytes, int, bool], tuple[int, list[tuple[bytes, bytes]]]] = {}
        self._snap_open: list[_Snapshot] = []
        self._snap_gen = 0
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

    def watch_set(self, keys: Sequence[bytes], callbacks: Sequence[Callable[[], None]]) -> _WatchSet:
        return _WatchSet(self, keys, callbacks)

    async def transact_grouped(self, fn: Callable[..., Awaitable[list[T]]], item: Any, **kwargs: Any) -> T:
        """Run ``fn(tr, items, **kwargs)`` over ``item`` and the other items waiting for the same
        commit with the same function and arguments, inside the group commit (see ``grouped``), and
        return this item's answer. A failed physical commit is retried as ``transact`` retries."""
        attempts = 0
        while True:
            if self._closed:
                raise errors.StoreError(errors.CLIENT_INVALID_OPERATION, "database closed")
            future: asyncio.Future[T] = self._loop.create_future()
            self._submit(_Grouped(fn, item, kwargs, future))
            try:
                return await future
            except errors.StoreError as exc:
                if not exc.retryable or attempts >= 100:
                    _metrics.failed("embedded", exc.code)
                    raise
                _metrics.retried("embedded", exc.code)
            attempts += 1
            await asyncio.sleep(min(1.0, 0.002 * (2 ** min(attempts, 9))) * random.random())

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        if self._fallback is not None:
            self._fallback.cancel()
            self._fallback = None
        if self._paced_check is not None:
            self._paced_check.cancel()
            self._paced_check = None
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
        _close_file(self._reader)


async def open_embedded(path: str) -> EmbeddedDatabase:
    """Open (creating if needed) the store file. What it creates is private: directories 0700, the
    file and its lock file 0600.

    A file whose last stamp is below the stamp mark lost commits (a restored copy): that is logged as
    an error, and stamps resume above the mark."""
    group_wait = commit_wait_secs()  # a bad UPF_EMBEDDED_COMMIT_WAIT_MS is refused before anything is made
    wake_pace = wake_pace_secs()  # and so is a bad UPF_EMBEDDED_WAKE_PACE_MS
    try:
        make_private_dirs(os.path.dirname(os.path.abspath(path)))
        if is_sqlite(path):
            await asyncio.to_thread(convert_sqlite, path)
        create_private_file(path)
        create_private_file(path + "-lock")
        f = _open_file(path)
        try:
            with f.env.begin(write=True) as txn:
                version, stamp = f.version(txn)
                mark = _read_mark(path)
                if mark > stamp:
                    extra = {"store": path, "last_stamp": stamp, "stamp_mark": mark}
                    log.error("embedded store lost commits", extra=extra)
                    f.set_version(txn, version, mark)
                elif txn.get(b"m", db=f.meta) is None:
                    f.set_version(txn, version, stamp)
        finally:
            _close_file(f)
    except (OSError, lmdb.Error) as exc:  # a directory, a read-only disk, no permission, not an LMDB file
        if _passing(exc):
            raise  # a restart may cure it: not a setting to fix
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise errors.StoreOpenError(f"UPF_STORE_PATH {path} cannot be opened: {reason}") from exc
    errors.STORAGE.share(_health_marker(path))
    return EmbeddedDatabase(path, asyncio.get_running_loop(), group_wait, wake_pace)


_PASSING_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EAGAIN, errno.EINTR, errno.EBUSY})


def _passing(exc: BaseException) -> bool:
    """An open that failed for the moment (descriptors or memory short, every reader slot taken by
    live processes), not for its path: the supervisor's restart may cure it."""
    if isinstance(exc, lmdb.ReadersFullError | lmdb.MemoryError):
        return True
    return isinstance(exc, OSError) and exc.errno in _PASSING_ERRNOS


def raise_stamp_floor(path: str, floor: int) -> int:
    """Make every later commit's stamp exceed ``floor``, and return the stamp floor now in force.

    Why: ``upf restore`` writes messages with the stamps (ids) they had; stamps carry the clock, but
    the clock of the host that issued them may run ahead of this one. The mark moves with it, so the
    restore is not taken for lost commits. Run it with no process using the store (the restore's own
    handle closed)."""
    if is_sqlite(path):
        convert_sqlite(path)
    f = _open_file(path)
    try:
        with f.env.begin(write=True) as txn:
            version, stamp = f.version(txn)
            stamp = max(stamp, floor)
            f.set_version(txn, version, stamp)
    finally:
        _close_file(f)
    create_private_file(_mark_path(path))
    with open(_mark_path(path), "r+b") as fh:
        fh.write(stamp.to_bytes(8, "big"))
    return stamp
