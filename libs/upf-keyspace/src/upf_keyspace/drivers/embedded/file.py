"""The store file: an LMDB environment (one data file and its lock file) opened once per process and
shared by its handles, its three databases, and the stamp mark beside it.

The reads a pusher or a publish makes per message or per wake-up pass LMDB's database (and a get's
default) positionally, ``txn.get(key, None, db)`` and ``txn.cursor(db)``: a keyword argument makes
CPython build a dict for the call and the binding parse it, ~40% of a get (measured with timeit)."""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import sys
import threading
import time

import lmdb

from ... import errors
from ...settings import embedded_max_bytes
from .health import _RESERVE_CHECK_SECS, has_room, make_reserve, reserve_path

log = logging.getLogger("upf.store.embedded")

_STAMPS_PER_SEC = 1_000_000
"""A commit's stamp is at least the wall clock in microseconds (and above the last one), as
FoundationDB's versions advance about a million a second: a store that lost its last commits (a
restored copy) still stamps above every id it handed out before."""

_MAP_BYTES = 1 << 40 if sys.maxsize > 1 << 32 else 1 << 30
"""The address space reserved for the file (not its size: the file grows as pages are written): 1 TiB,
or 1 GiB in a 32-bit process (a small board's), whose whole address space is 4 GiB."""
_QUOTA_ROOM = 4 << 20
_MAX_READERS = 1024
_META_KEY = b"m"
_META = struct.Struct(">QQ")  # the commit counter, the last stamp
_T = struct.Struct(">d")  # a write-log entry's wall-clock time, before its write set


def _clock_stamp() -> int:
    return int(time.time() * _STAMPS_PER_SEC)


class _File:
    """One process's environment on a store file. LMDB forbids opening one file twice in a process
    (closing either breaks the other's locks), so handles share it, counted."""

    __slots__ = ("env", "kv", "meta", "wlog", "users", "path", "quota", "pinned", "reserve_checked")

    def __init__(self, path: str) -> None:
        self.quota = embedded_max_bytes()
        self.path = path
        self.env = lmdb.open(
            path,
            subdir=False,
            # Under a quota, room beyond it so that a commit which frees space can still copy its pages.
            map_size=self.quota * 2 + _QUOTA_ROOM if self.quota > 0 else _MAP_BYTES,
            max_dbs=3,
            max_readers=_MAX_READERS,
            sync=True,
            metasync=True,
            readahead=False,
            mode=0o600,
        )
        self.kv = self.env.open_db(b"kv")
        self.meta = self.env.open_db(b"meta")
        self.wlog = self.env.open_db(b"wlog")
        self.users = 0
        self.env.reader_check()  # slots of processes that died holding a snapshot
        self.pinned = 0
        """While the reserve is given back: the data size this process lets commits grow to (0: none)."""
        self.reserve_checked = 0.0
        self.check_reserve(time.monotonic())

    # --- the disk's reserve -----------------------------------------------------------------------
    # Why: on a disk filled to the last block, even a commit that deletes needs new pages (LMDB copies
    # the pages it changes, and each commit writes a write-log entry), so the janitor could not expire
    # anything and the store stayed full after every message had expired, restarts included. So a
    # store keeps ``<store>-reserve`` (``health.make_reserve``) and gives it back (truncates it to
    # nothing) when the disk fills; while it is empty and the disk has no room for it, every process
    # on the file lets commits grow the data no further than it was (as UPF_EMBEDDED_MAX_BYTES does):
    # deletions pass and make room for publishes, which are refused (507) beyond that.

    def quota_now(self) -> int:
        """The size limit a commit is checked against: the configured quota, or the pinned size."""
        if self.pinned and (not self.quota or self.pinned < self.quota):
            return self.pinned
        return self.quota

    def check_reserve(self, now: float) -> None:
        """The reserve whole (or made now): no pin. Given back (empty): pinned until the disk has room."""
        self.reserve_checked = now
        path = reserve_path(self.path)
        try:
            held = os.stat(path).st_size
        except OSError:
            held = -1  # none made yet (a small store, or a disk without room)
        if held > 0 or make_reserve(self.path):
            self._unpin()
        elif held == 0:
            if has_room(self.path):
                with contextlib.suppress(OSError):
                    os.unlink(path)  # made again once the store is large enough
                self._unpin()
            elif not self.pinned:
                self.pinned = max(self.committed_bytes(), 1)

    def _unpin(self) -> None:
        if self.pinned:
            log.warning("embedded store's disk has room again", extra={"path": self.path})
            self.pinned = 0

    def release_reserve(self) -> bool:
        """The disk is full: give the reserve back and pin the data's size (see above). Returns
        whether there was a reserve to give; an empty one is left (or made) for the other processes."""
        path = reserve_path(self.path)
        released = False
        try:
            if os.stat(path).st_size > 0:
                os.truncate(path, 0)
                released = True
                log.warning("embedded store's disk full: reserve given back", extra={"path": self.path})
        except FileNotFoundError:
            with contextlib.suppress(OSError):
                os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
        except OSError:
            log.exception("embedded store's reserve could not be given back")
        if not self.pinned:
            with contextlib.suppress(Exception):  # a read that fails leaves the quota as it was
                self.pinned = max(self.committed_bytes(), 1)
        self.reserve_checked = time.monotonic()
        return released

    def reserve_due(self, now: float) -> bool:
        return now - self.reserve_checked > _RESERVE_CHECK_SECS

    def begin_read(self) -> lmdb.Transaction:
        """A read-only transaction (it takes one of the file's reader slots until it ends). With every
        slot taken, those of dead processes are reclaimed first (a process killed holding snapshots
        keeps its slots until then; without this, a process that only reads never got them back); if
        live processes hold them all, a retryable READERS_FULL, not LMDB's own exception."""
        try:
            return self.env.begin()
        except lmdb.ReadersFullError:
            self.env.reader_check()
            try:
                return self.env.begin()
            except lmdb.ReadersFullError:
                raise errors.StoreError(errors.READERS_FULL) from None

    def version(self, txn: lmdb.Transaction) -> tuple[int, int]:
        raw = txn.get(_META_KEY, None, self.meta)  # positional: see the module's docstring
        if raw is None:
            return 0, 0
        version, stamp = _META.unpack(raw)
        return version, stamp

    def live_bytes(self, txn: lmdb.Transaction) -> int:
        """The pages the databases hold as ``txn`` sees them (not the file's high-water mark)."""
        total = 0
        for db in (None, self.kv, self.meta, self.wlog):
            st = txn.stat(db) if db is not None else txn.stat()
            total += (st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"]) * st["psize"]
        return total

    def committed_bytes(self) -> int:
        """``live_bytes`` as the last commit left them: while the committer holds the write lock, what
        its transaction began from. Read only for a commit over the quota, not before every commit:
        each ``txn.stat`` builds a dict, and the four cost a commit ~30,000 instructions."""
        with self.begin_read() as txn:
            return self.live_bytes(txn)

    def set_version(self, txn: lmdb.Transaction, version: int, stamp: int) -> None:
        txn.put(_META_KEY, _META.pack(version, stamp), db=self.meta)


_FILES: dict[str, _File] = {}
_FILES_LOCK = threading.Lock()


def _open_file(path: str) -> _File:
    key = os.path.realpath(path)
    with _FILES_LOCK:
        f = _FILES.get(key)
        if f is None:
            f = _FILES[key] = _File(path)
        f.users += 1
        return f


def _close_file(f: _File) -> None:
    with _FILES_LOCK:
        f.users -= 1
        if f.users == 0:
            _FILES.pop(os.path.realpath(f.path), None)
            f.env.close()


def _mark_path(path: str) -> str:
    """The stamp mark: the last stamp this host's processes committed, written after each commit and
    outside the store, so a store file that comes back without its last commits is noticed at open."""
    return path + ".mark"


def _read_mark(path: str) -> int:
    try:
        with open(_mark_path(path), "rb") as f:
            raw = f.read(8)
    except FileNotFoundError:
        return 0
    return int.from_bytes(raw, "big") if len(raw) == 8 else 0
