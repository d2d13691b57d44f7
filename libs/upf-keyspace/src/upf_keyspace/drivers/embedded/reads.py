"""Reads on the loop thread: point and range reads that each see one LMDB snapshot with its
version, the read version shared by an event-loop iteration, and the small-range cache.

A transaction's reads in one event-loop iteration share one LMDB read transaction (``_Snapshot``),
opened at its first read of the file and ended when the iteration ends: a pusher's wake-up reads
every rung shard's inbox, or every poked topic's queue, in one transaction without suspending, and
each read would otherwise open its own and read the commit counter again. It is FoundationDB's own
model (every read at the read version), and bounded: at most ``_SNAPSHOTS_MAX`` are open in a process
at once (LMDB's reader table is shared by every process on the file); past that a read opens its own."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from ... import errors
from .._ranges import head_of
from .writelog import _WriteLog

if TYPE_CHECKING:
    import lmdb

_RANGE_CACHE_ENTRIES = 1024  # small range results kept (hot ones: reuse needs a recent entry), with their version
_RANGE_CACHE_SCAN = 8
"""When the head tally (``writelog._HeadTally``) cannot rule a cached range's commits out, at most
this many commits' write sets are checked to reuse it; further back, one read of the file is cheaper
than the scan (1,000 topics published round-robin made it ~30 us per read)."""
_RANGE_CACHE_ROWS = 4  # only results this small are kept (affinity reads: 0 or 1 row) ...
_RANGE_CACHE_BYTES = 1024  # ... and this many key and value bytes, so the cache stays under ~1 MB
_SNAPSHOTS_MAX = 8


class _Snapshot:
    """One LMDB read transaction and the commit counter it sees, until the iteration that opened it ends
    (``gen``: the generation of snapshots it belongs to; all of one iteration's end together)."""

    __slots__ = ("txn", "version", "gen")

    def __init__(self, txn: lmdb.Transaction, version: int, gen: int) -> None:
        self.txn = txn
        self.version = version
        self.gen = gen


class _Reads(_WriteLog):
    _loop: asyncio.AbstractEventLoop
    _grv: int | None
    _range_cache: dict[tuple[bytes, bytes, int, bool], tuple[int, list[tuple[bytes, bytes]]]]
    _snap_open: list[_Snapshot]
    _snap_gen: int

    def _open_snapshot(self) -> _Snapshot | None:
        """A snapshot for a transaction's reads in this iteration (None: too many are open)."""
        if len(self._snap_open) >= _SNAPSHOTS_MAX:
            return None
        f = self._reader
        txn = f.begin_read()
        snap = _Snapshot(txn, self._observed(f.version(txn)[0]), self._snap_gen)
        if not self._snap_open:
            self._loop.call_soon(self._end_snapshots)
        self._snap_open.append(snap)
        return snap

    def _end_snapshots(self) -> None:
        snaps, self._snap_open = self._snap_open, []
        self._snap_gen += 1
        for snap in snaps:
            try:
                snap.txn.abort()
            except Exception:  # the file was closed meanwhile: its transactions went with it
                pass

    # Each read is one LMDB read transaction (a transaction's snapshot, or its own): the commit counter
    # and the rows come from one snapshot. LMDB's calls here take their database positionally (see
    # file.py).
    def _read_point(self, key: bytes, snap: _Snapshot | None = None) -> tuple[int, bytes | None]:
        f = self._reader
        if snap is not None:
            # Typed here, not with cast(): that is a Python call per read.
            value: bytes | None = snap.txn.get(key, None, f.kv)  # type: ignore[assignment]  # the stubs add memoryview, returned only with buffers=True
            return snap.version, value
        with f.begin_read() as txn:
            version = f.version(txn)[0]
            value = txn.get(key, None, f.kv)  # type: ignore[assignment]  # as above: no buffers=True
        return self._observed(version), value

    def _read_range(
        self, begin: bytes, end: bytes, limit: int, reverse: bool, snap: _Snapshot | None = None
    ) -> tuple[int, list[tuple[bytes, bytes]]]:
        if snap is not None:
            return snap.version, self._rows(snap.txn, begin, end, limit, reverse)
        with self._reader.begin_read() as txn:
            version = self._reader.version(txn)[0]
            rows = self._rows(txn, begin, end, limit, reverse)
        return self._observed(version), rows

    def _rows(
        self, txn: lmdb.Transaction, begin: bytes, end: bytes, limit: int, reverse: bool
    ) -> list[tuple[bytes, bytes]]:
        cur = txn.cursor(self._reader.kv)
        if not reverse:
            return _forward(cur, [(begin, end, limit)])[0]
        rows: list[tuple[bytes, bytes]] = []
        ok = cur.prev() if cur.set_range(end) else cur.last()
        while ok:
            k = cast(bytes, cur.key())
            if k < begin:
                break
            rows.append((k, cast(bytes, cur.value())))
            if len(rows) == limit:
                break
            ok = cur.prev()
        return rows

    def _rows_many(
        self, txn: lmdb.Transaction, ranges: list[tuple[bytes, bytes, int]]
    ) -> list[list[tuple[bytes, bytes]]]:
        """Forward ``_rows`` for several ranges through one cursor (a transaction's ``get_ranges``)."""
        return _forward(txn.cursor(self._reader.kv), ranges)

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
        self,
        begin: bytes,
        end: bytes,
        limit: int,
        reverse: bool,
        at: int | None,
        snapshot: Callable[[], _Snapshot | None] | None = None,
    ) -> tuple[int, list[tuple[bytes, bytes]]]:
        """A range read for a transaction whose snapshot is ``at`` (None: not chosen yet). A small
        result read before is reused when no commit between its version and the snapshot wrote into
        the range (the write sets are in memory for this process's commits), so a publish's affinity
        read usually costs no read of the file on the loop thread. Otherwise it is read from the file."""
        if limit > _RANGE_CACHE_ROWS:  # never kept (below): a Q or inbox drain goes straight to the file
            return self._read_range(begin, end, limit, reverse, None if snapshot is None else snapshot())
        key = (begin, end, limit, reverse)
        hit = self._range_cache.get(key)
        if hit is not None:
            target = self._read_version_now() if at is None else at
            cached, rows = hit
            try:
                lo, hi = (cached, target) if cached <= target else (target, cached)
                if lo == hi or self._unchanged_since(lo, hi, begin, end):
                    if cached < target:
                        self._range_cache[key] = (target, rows)
                    return target, list(rows)
            except errors.StoreError:  # the write log no longer reaches back: read the file
                pass
        version, rows = self._read_range(begin, end, limit, reverse, None if snapshot is None else snapshot())
        # A read with a larger limit (a Q or inbox drain) moves on to a later start key, so its entry
        # would never be hit again and would only push the affinity entries out.
        if (
            limit <= _RANGE_CACHE_ROWS
            and len(rows) <= _RANGE_CACHE_ROWS
            and sum(len(k) + len(v) for k, v in rows) <= _RANGE_CACHE_BYTES
        ):
            if hit is None and len(self._range_cache) >= _RANGE_CACHE_ENTRIES:
                del self._range_cache[next(iter(self._range_cache))]  # the oldest entry
            self._range_cache[key] = (version, list(rows))
        return version, rows

    def _unchanged_since(self, after: int, upto: int, begin: bytes, end: bytes) -> bool:
        """True if no commit after..upto wrote into [begin, end): from the head tally when it can
        tell, else from each commit's write set (loaded from the file if not in memory, which also
        fills the tally's gap), up to _RANGE_CACHE_SCAN commits."""
        head = head_of(begin, end)
        if head is not None and self._wlog_cache.heads.quiet(head, after, upto):
            return True
        return upto - after <= _RANGE_CACHE_SCAN and not self._changed_since(after, upto, [(begin, end)])

    def _committed_version(self) -> int:
        f = self._reader
        with f.begin_read() as txn:
            return self._observed(f.version(txn)[0])

    def _observed(self, version: int) -> int:
        """Whatever this iteration has seen of the file, a transaction started later in it sees too
        (a read-only transaction completes without yielding to the loop)."""
        if self._grv is not None and version > self._grv:
            self._grv = version
        return version


def _forward(cur: lmdb.Cursor, ranges: list[tuple[bytes, bytes, int]]) -> list[list[tuple[bytes, bytes]]]:
    """For each (begin, end, limit), the rows in [begin, end), at most ``limit`` of them (0: all), read
    forward through ``cur``. One call for all: a pusher's wake-up reads dozens of ranges.

    Key first, value only inside the range: ``iternext`` would copy the value of the row past the end
    (a neighbouring topic's envelope) to find the end. Faster at every length (timeit: 434 against
    557 ns for a one-row range, 11.2 against 11.8 us for 64 rows)."""
    out = []
    # Typed here, not with cast(): that is a Python call per row.
    key: Callable[[], bytes] = cur.key  # type: ignore[assignment]  # the stubs add memoryview (buffers=True only)
    value: Callable[[], bytes] = cur.value  # type: ignore[assignment]  # as for key
    step = cur.next
    for begin, end, limit in ranges:
        rows: list[tuple[bytes, bytes]] = []
        if begin < end and cur.set_range(begin):
            k = key()
            while k < end:
                rows.append((k, value()))
                if len(rows) == limit or not step():
                    break
                k = key()
        out.append(rows)
    return out
