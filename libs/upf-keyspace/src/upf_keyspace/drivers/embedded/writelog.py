"""The write log: each physical commit's coalesced write ranges, in the file (``wlog``, for every
process) and in a bounded in-memory copy (this process's commits and what it has read back); conflict
checks read it."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from ... import errors
from .._ranges import IntervalSet

if TYPE_CHECKING:
    import lmdb

    from .file import _File

_WLOG_KEEP_SECS = 10.0
_WLOG_CACHE_ENTRIES = 65_536
_WLOG_CACHE_BYTES = 32 << 20
"""The in-memory copy of the write log is bounded by size too, not only by commits: one commit can
write thousands of keys (a many-topic subscribe), so 65,536 of them were gigabytes. 32 MiB holds the
10 s the log is kept at ~4,000 publishes/s (~800 bytes of write set each); an evicted entry costs one
read of the ``wlog`` table, never a wrong answer."""
_DECODED = 64
"""Sets kept decoded (``_WriteSetCache``): the newest commits', which the watches' next check and the
conflict checks of transactions begun just before them read; ~0.3-1 s of commits under load."""


def _set_bytes(s: IntervalSet, encoded: int) -> int:
    """Roughly what an IntervalSet holds in memory, from the size of its encoding (``encoded``: its
    keys and a byte or two of header each): its keys plus two bytes objects and two list slots per
    interval. Why not sum the keys' lengths: that is a pass over every key of every commit a pusher
    reads back, and the encoding is at hand."""
    return encoded + 82 * len(s.begins) + 120


_HEADS_KEPT = 4096  # distinct heads tallied; a commit under any other head counts as wide
_EARLY_KEPT = 1024  # versions tallied past a gap; past it the run restarts after them (bounded memory)


class _HeadTally:
    """For each key head (``_ranges.head_of``), the last commit version that wrote under it, over an
    unbroken run of versions ``start < v <= upto``: then "did anything in (after, upto] write under
    this head" is one lookup, however many commits passed. That is what makes a publish's cached
    affinity read free at 1,000 round-robin topics, where ~200 commits pass between two publishes
    to one topic and checking each one cost as much as reading the file.

    Versions are tallied in any order (another process's commits arrive when read back from the
    file); ``upto`` only moves over versions all tallied. Written under the cache's lock, read
    without it: a writer tallies heads before moving ``upto`` and sets ``start`` before ``upto``, and
    a reader reads ``upto`` before the rest, so a lock-free reader never trusts an untallied version."""

    __slots__ = ("start", "upto", "last", "wide", "_early", "wanted")

    def __init__(self) -> None:
        self.start = -1  # nothing tallied yet
        self.upto = -1
        self.last: dict[bytes, int] = {}
        self.wide = -1  # last version with a write under no single head (or past _HEADS_KEPT)
        self._early: set[int] = set()  # tallied versions past a gap
        self.wanted = False
        """Set by the first ``quiet``: until a process asks, it tallies nothing. A pusher, whose reads
        the range cache does not keep, then pays nothing per commit it reads back; a version skipped
        while this turns on only leaves a gap, which makes ``quiet`` answer False (never wrongly True)."""

    def add(self, version: int, s: IntervalSet) -> None:
        if not self.wanted:
            return
        heads = s.heads()
        if heads is None:
            self.wide = max(self.wide, version)
        else:
            last = self.last
            for h in heads:
                if h in last or len(last) < _HEADS_KEPT:
                    if last.get(h, -1) < version:
                        last[h] = version
                elif self.wide < version:
                    self.wide = version
        if self.upto < 0:
            self.start = version - 1
            self.upto = version
        elif version == self.upto + 1:
            upto = version
            early = self._early
            while upto + 1 in early:
                upto += 1
                early.discard(upto)
            self.upto = upto
        elif version > self.upto:
            self._early.add(version)
            if len(self._early) > _EARLY_KEPT:  # a gap that never fills: restart the run past it
                top = max(self._early)
                self._early.clear()
                self.start = top
                self.upto = top

    def quiet(self, head: bytes, after: int, upto: int) -> bool:
        """True if it is known that no commit in (after, upto] wrote under ``head``."""
        if not self.wanted:
            self.wanted = True  # from now on: this first answer knows nothing yet
            return False
        if upto > self.upto:  # read first: see the class docstring
            return False
        return self.start <= after and self.wide <= after and self.last.get(head, -1) <= after


class _WriteSetCache:
    """Recent commits' write sets by version, bounded by entries and by bytes; the oldest inserted
    goes first. Written by the committer thread and the loop thread (under a lock), read lock-free.

    Every set is kept as its encoding; only the newest ``_DECODED`` are kept decoded too, and an older
    one is decoded when asked for. Why: a decoded set is two lists of a few hundred bytes objects
    each, and kept for the log's 10 s every such list was walked by the cyclic collector's young
    collections, which hold the GIL: with 2 workers at 4,500 publishes/s each took ~23 ms of CPU
    (max ~41 ms), every ~7 s, and stalled every publish and delivery in flight. A bytes object is
    not walked (BENCHMARKS.md, forty-first pass)."""

    __slots__ = ("_sets", "_raw", "_sizes", "bytes", "max_bytes", "max_entries", "_lock", "heads")

    def __init__(self, max_bytes: int, max_entries: int) -> None:
        self._sets: dict[int, IntervalSet] = {}  # the newest _DECODED, decoded
        self._raw: dict[int, bytes] = {}  # every cached set's encoding
        self._sizes: dict[int, int] = {}
        self.bytes = 0
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self.heads = _HeadTally()

    def __len__(self) -> int:
        return len(self._raw)

    def get(self, version: int) -> IntervalSet | None:
        # Lock-free: a set leaves ``_sets`` only while its encoding stays in ``_raw``.
        s = self._sets.get(version)
        if s is not None:
            return s
        raw = self._raw.get(version)
        return IntervalSet.decode(raw) if raw is not None else None

    def put(self, version: int, s: IntervalSet, encoded: bytes) -> None:
        """``encoded``: ``s.encode()``, kept. Each set is counted at its decoded size (``_set_bytes``)
        for as long as it is cached: the budget bounds what the cache holds, decoded or not."""
        size = _set_bytes(s, len(encoded))
        with self._lock:
            self.heads.add(version, s)
            if size > self.max_bytes:
                return  # larger than the whole budget: read from the file when needed
            if version in self._raw:
                return
            self._raw[version] = encoded
            self._sets[version] = s
            self._sizes[version] = size
            self.bytes += size
            while self.bytes > self.max_bytes or len(self._raw) > self.max_entries:
                oldest = next(iter(self._raw))
                self._sets.pop(oldest, None)
                del self._raw[oldest]
                self.bytes -= self._sizes.pop(oldest)
            while len(self._sets) > _DECODED:
                del self._sets[next(iter(self._sets))]

    def update(self, sets: dict[int, tuple[IntervalSet, bytes]]) -> None:
        for version, (s, encoded) in sets.items():
            self.put(version, s, encoded)


class _WriteLog:
    """The handle's write-log checks (the base of ``EmbeddedDatabase``)."""

    _reader: _File
    _wlog_cache: _WriteSetCache

    def _write_sets(self, txn: lmdb.Transaction | None, after: int, upto: int) -> list[IntervalSet]:
        """The write sets of commits after..upto: from this process's cache, else from the file
        (through ``txn``, the committer's, or a read transaction of its own)."""
        if after >= upto:  # most transactions read at the last version: nothing committed since
            return []
        cache = self._wlog_cache
        sets = [cache.get(v) for v in range(after + 1, upto + 1)]
        if None not in sets:
            return sets  # type: ignore[return-value]  # no None left, which mypy does not narrow
        f = self._reader
        if txn is None:
            with f.begin_read() as own:
                loaded = _load(own, f, after, upto)
        else:
            loaded = _load(txn, f, after, upto)
        cache.update(loaded)
        out = []
        for v, cached in zip(range(after + 1, upto + 1), sets, strict=True):
            got = loaded.get(v)
            # ``get`` may have decoded it already: not twice. Else the file's copy, else the cache's now.
            s = cached if cached is not None else got[0] if got is not None else cache.get(v)
            if s is None:
                # Pruned: the transaction outlived the write log, so it is too old to check.
                raise errors.StoreError(errors.TRANSACTION_TOO_OLD)
            out.append(s)
        return out

    def _changed_since(self, after: int, upto: int, ranges: list[tuple[bytes, bytes]]) -> bool:
        return any(s.overlaps_any(ranges) for s in self._write_sets(None, after, upto))


def wlog_key(version: int) -> bytes:
    return version.to_bytes(8, "big")


def _load(txn: lmdb.Transaction, f: _File, after: int, upto: int) -> dict[int, tuple[IntervalSet, bytes]]:
    """The write sets of commits after..upto in the file, each with its encoding."""
    out: dict[int, tuple[IntervalSet, bytes]] = {}
    cur = txn.cursor(f.wlog)  # positional: see file.py
    if cur.set_range(wlog_key(after + 1)):
        for k, raw in cur.iternext():
            v = int.from_bytes(k, "big")
            if v > upto:
                break
            encoded = bytes(raw[8:])
            out[v] = IntervalSet.decode(encoded), encoded
    return out
