"""The write log: each physical commit's coalesced write ranges, in the file (``wlog``, for every
process) and in a bounded in-memory copy (this process's commits and what it has read back); conflict
checks read it."""

from __future__ import annotations

import sqlite3
import threading

from ... import errors
from .._ranges import IntervalSet

_WLOG_KEEP_SECS = 10.0
_WLOG_CACHE_ENTRIES = 65_536
_WLOG_CACHE_BYTES = 32 << 20
"""The in-memory copy of the write log is bounded by size too, not only by commits: one commit can
write thousands of keys (a many-topic subscribe), so 65,536 of them were gigabytes. 32 MiB holds the
10 s the log is kept at ~4,000 publishes/s (~800 bytes of write set each); an evicted entry costs one
read of the ``wlog`` table, never a wrong answer."""


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


class _WriteLog:
    """The handle's write-log checks (the base of ``EmbeddedDatabase``)."""

    _reader: sqlite3.Connection
    _wlog_cache: _WriteSetCache

    def _write_sets(self, conn: sqlite3.Connection, after: int, upto: int) -> list[IntervalSet]:
        """The write sets of commits after..upto: from this process's cache, else from the file."""
        cache = self._wlog_cache
        sets = [cache.get(v) for v in range(after + 1, upto + 1)]
        if all(s is not None for s in sets):
            return sets  # type: ignore[return-value]  # all() above: no None left, which mypy does not narrow
        loaded = {
            v: IntervalSet.decode(raw)
            for v, raw in conn.execute(
                "SELECT version, writes FROM wlog WHERE version > ? AND version <= ?", (after, upto)
            )
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
