"""The group commit: one thread per process takes every waiting transaction, resolves each against
the write log and the batch, applies them in one LMDB write transaction, then runs the grouped items
(``grouped``) in it, stamps them all, and hands the results back to the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import threading
import time
from typing import TYPE_CHECKING, Any, cast

import lmdb

from ... import errors
from ...contract import LIFETIME_SECS
from ...settings import embedded_commit_wait_ms
from .. import _metrics
from .._ranges import BatchWrites
from .._wake import Doorbell
from .file import _T, _clock_stamp, _File
from .grouped import GROUP_MAX, CommitTransaction, _Grouped, run_sync
from .health import _FullLog, _is_full, _OverQuota, disk_full
from .mutations import _Applier
from .watches import _Watches
from .writelog import _WLOG_KEEP_SECS, wlog_key

if TYPE_CHECKING:
    from .transaction import EmbeddedTransaction

log = logging.getLogger("upf.store.embedded")

_MAX_BATCH = 2048
_CLOCK_STEP_SECS = 60.0  # a write-log entry stamped this far ahead of the clock is from before a step back
_GROUP_WAIT_SECS = 0.020
"""The default of ``UPF_EMBEDDED_COMMIT_WAIT_MS``. While transactions keep arriving (concurrent
publishers, not one client awaiting each commit in turn), the committer sleeps this long before it
gathers and commits, as FoundationDB's commit proxies batch over an interval (theirs adapts between
1 and 20 ms): a physical commit (two fdatasyncs, the write log, the wakes) costs ~350 us of CPU, most
of it in the kernel, whether it carries one transaction or sixty. Measured at 2,000 publishes/s (1,000
topics, all-in-one): 1 ms woken by each arrival gave batches of 2.5 and 386 us of CPU per
publish-and-delivery; 5 ms gave batches of ~13 and 299-364 us (433-496 us with 2 workers, whose
batches are about half as big); 10 ms 280-338 us (382-459 us), for ~5 ms more at the median
(BENCHMARKS.md, eleventh pass). On another host, 20 ms spent 6-8% less than 10 ms with 1 worker and
6-16% with 2 (three alternating pairs, `bench/ab_allinone.py`), for 4-12 ms more at the p99 (18 -> 23
ms with 1 worker, 15 -> 27 ms with 2); at 500/s it saved 12% and 42% for a p50 of 8 -> 14 ms (1
worker) and 7 -> 18 ms (2) (BENCHMARKS.md, twelfth pass). It waits on an event that only the
``_GROUP_TARGET``-th waiting transaction sets (or the one that brings as many as recent commits
carried, so that it can time the quiet: ``_QUIET_GAPS``), not on the queue, which woke it once per
arrival. A lone sequential client never waits: nothing arrives while its commit runs. Nor does a
transaction that arrives longer than this after the last commit: the stream has paused."""


def quiet_secs(gap: float) -> float:
    """How long without an arrival ends a gather that holds as many as recent commits carried, given
    the longest ``gap`` between two arrivals seen while gathering (in this gather or, decaying, in
    recent ones)."""
    return max(_QUIET_MIN_SECS, _QUIET_GAPS * gap)


def commit_wait_secs() -> float:
    """``UPF_EMBEDDED_COMMIT_WAIT_MS`` in seconds, ``_GROUP_WAIT_SECS`` when unset. 0: no sleep, a
    commit takes what waits when it starts (the lowest latency, a commit per few transactions)."""
    ms = embedded_commit_wait_ms()
    return _GROUP_WAIT_SECS if ms is None else ms / 1000


_GROUP_TARGET = 32
"""The sleep ends as soon as this many transactions wait: the commit's cost is amortised already,
and clients that each await their commit (a closed loop of 64 connections) would otherwise stand
idle through the rest of it."""
_GROUP_MUTATIONS = 224
"""... or as soon as this many mutations wait in however many transactions: ``_GROUP_TARGET``
publishes' worth, at 7 each (Q, X, the time index, two counters, one holder's inbox and bell)."""
_QUIET_GAPS = 2
"""... or as soon as as many wait as the biggest recent commit carried (``_BAR_DECAY``) and nothing has
arrived for twice the longest gap between two arrivals seen while gathering (this gather's, or recent
ones', decaying like the count). Why: clients that each await their commit (a closed loop of 2-31
connections) are all back after a short burst, and nothing more comes until the commit; sleeping out
the window held each of them ~20 ms a publish (2 connections: 90 publishes/s against 1,100 for one).
Their gaps while gathering are the burst's. An open stream keeps its batches: it reaches its biggest
recent batch, if at all, near the window's end, and the gaps it had while gathering (a clumpy one's
pauses between clumps among them) set its quiet above its pauses."""
_BAR_DECAY = 0.9
"""The count a quiet needs is the biggest recent commit's, less 10% a commit: not the last commit's, so
that an open stream whose gather a clump of arrivals ended early does not lower its own bar (batches
would shrink commit after commit), and a closed loop that lost clients lowers it within a few commits."""
_QUIET_MIN_SECS = 0.00025
"""The shortest silence that ends a gather: below it, a burst's gaps are timer noise. A closed loop of
clients pays it once a commit on top of the commit itself (~1 ms with its fsyncs): at 1 ms the
writer answered 2 keep-alive connections ~1,040 publishes/s and 8 ~3,050/s, at 0.25 ms ~1,610 and
~3,930 (``bench/writer_layers.py --connections N``); open streams' batches at 2,000/s did not move."""
_BATCH_SIZE = _metrics.COMMIT_BATCH.cell("embedded")
_COMMIT_DURATION = _metrics.COMMIT_DURATION.cell("embedded")
_LOCK_WAIT = _metrics.COMMIT_LOCK_WAIT.cell("embedded")


class _Pending:
    """A transaction handed to the committer thread, with what it needs to resolve and check."""

    __slots__ = ("read_version", "reads", "writes", "mutations", "weight", "started", "future", "stamp")

    def __init__(self, tr: EmbeddedTransaction, future: asyncio.Future[bytes]) -> None:
        self.read_version = tr._read_version
        self.reads = tr._reads
        self.writes = tr._writes
        self.mutations = tr._mutations
        self.weight = len(tr._mutations)
        self.started = tr._started
        self.future = future
        self.stamp: bytes | BaseException | None = None


class _Committer(_Watches):
    path: str
    _queue: queue.SimpleQueue[_Pending | _Grouped | None]
    _enough: threading.Event  # set by a submit that brings the queue to _GROUP_TARGET while gathering
    _group_wait: float  # commit_wait_secs(), read at open
    _gathering: bool
    _submitted: int  # mutations ever submitted (the loop's thread writes it)
    _taken: int  # mutations ever taken into a commit (the committer's thread writes it)
    _arrived_at: float  # monotonic time of the last submit (the loop's thread writes it)
    _gap_max: float  # the longest gap between two arrivals in this gather (the loop's thread writes it)
    _gather_began: float  # monotonic time this gather began: gaps are timed from no earlier
    _gap: float  # the longest gap in recent gathers, decaying (the committer's thread's)
    _bar: float  # the biggest recent commit's transactions, decaying (the committer's thread's)
    _wake_at: int  # while gathering, a submit that queues this many sets _enough (to look again)
    _doorbell: Doorbell | None
    _last_prune: float  # monotonic time of the last prune of the write log
    _full_log: _FullLog
    _mark_fd: int

    def _submit(self, pending: _Pending | _Grouped) -> None:
        self._submitted += pending.weight
        now = time.monotonic()
        if self._gathering:
            # Not from an arrival before the gather: that span holds the last commit, which a closed
            # loop's clients await (a commit of 0.5 s gave the gathers after it a quiet of 1 s, less
            # 10% each: a slow disk held them as long as the window did).
            gap = now - max(self._arrived_at, self._gather_began)
            if gap > self._gap_max:
                self._gap_max = gap
        self._arrived_at = now  # before the put: a gather that counts it sees its time
        self._queue.put(pending)
        if self._gathering and (self._queue.qsize() == self._wake_at or self._enough_waits(0)):
            self._enough.set()

    def _enough_waits(self, gathered: int) -> bool:
        """Whether what waits amortises a commit already: ``_GROUP_TARGET`` transactions, or
        ``_GROUP_MUTATIONS`` mutations in fewer, bigger ones (a grouped item counts as a publish's
        ``_Grouped.weight``). The two counts are each written by one thread only."""
        return self._queue.qsize() + gathered >= _GROUP_TARGET or self._submitted - self._taken >= _GROUP_MUTATIONS

    def _commit_loop(self) -> None:
        f = self._reader
        busy = False  # do transactions stream in (see _GROUP_WAIT_SECS)?
        wait = self._group_wait
        ended = 0.0
        while True:
            first = self._queue.get()
            if first is None:
                return
            if busy and time.monotonic() - ended > wait:
                busy = False  # the stream paused: this one arrived alone, after a quiet spell
            batch = [first]
            self._gather(batch, wait if busy else 0.0)
            self._bar = max(float(len(batch)), self._bar * _BAR_DECAY)
            self._taken += sum(p.weight for p in batch)
            started = time.perf_counter()
            try:
                committed = self._commit_batch(f, batch)
            except Exception as exc:  # nothing of it committed: _apply_batch raises nothing after the commit
                # The disk full: its reserve given back, each again alone (deletions pass, growth stops at the pin).
                released = disk_full(exc, f.path) and f.release_reserve()
                if len(batch) > 1 or released:
                    if not _is_full(exc, f.path):  # a full store is logged once a minute, by _failure
                        log.warning("embedded commit failed, committing one by one", extra={"transactions": len(batch)})
                    self._commit_each(f, batch)
                else:
                    self._fail(batch, self._failure(exc, f, len(batch)))
            else:
                if committed:
                    self._ring()
                _COMMIT_DURATION.record(time.perf_counter() - started)
                _BATCH_SIZE.record(len(batch))
            busy = len(batch) > 1 or not self._queue.empty()  # a stream of concurrent transactions
            ended = time.monotonic()
            try:
                self._loop.call_soon_threadsafe(self._resolve, batch)
            except RuntimeError:  # the loop is gone: nobody is waiting any more
                return

    @staticmethod
    def _fail(batch: list[_Pending | _Grouped], failure: errors.StoreError) -> None:
        for p in batch:
            if p.stamp is None or isinstance(p.stamp, bytes):
                p.stamp = failure

    def _failure(self, exc: Exception, f: _File, n: int) -> errors.StoreError:
        """What a failed physical commit of ``n`` transactions answers each of them."""
        if _is_full(exc, f.path):
            # Not retryable: each caller learns at once, and the log gets one line a minute.
            self._full_log.add(n)
            return errors.StoreError(errors.STORAGE_FULL, type(exc).__name__)
        log.exception("embedded commit failed")
        return errors.StoreError(errors.NOT_COMMITTED, type(exc).__name__)

    def _commit_each(self, f: _File, batch: list[_Pending | _Grouped]) -> None:
        """After a physical commit of several transactions failed: each in a commit of its own, so
        that one whose writes the file refuses fails alone (as before, with a retryable 1020) and
        the others are stored. Without this, a write LMDB refuses (a key past its 511 bytes did,
        before the driver checked for it) failed every transaction that shared its commit, attempt
        after attempt; and on a full store, a transaction that frees space (the janitor's clears)
        failed with the publishes that shared its commit, so the store could not empty while they
        kept coming. Alone, a growing one fails at the quota's check, before any flush."""
        committed = False
        for p in batch:
            p.stamp = None  # decided in the commit that failed: decided again alone
            try:
                committed = self._commit_batch(f, [p], drain=False) or committed
            except Exception as exc:
                self._fail([p], self._failure(exc, f, 1))
        if committed:
            self._ring()

    def _gather(self, batch: list[_Pending | _Grouped], wait: float) -> None:
        """Add what waits in the queue to ``batch``; with a ``wait``, first sleep that long, until
        enough waits (``_enough_waits``), or until as many wait as recent commits carried (``_bar``)
        and the stream has gone quiet (``quiet_secs``), whichever comes first."""
        if wait and not self._enough_waits(len(batch)):
            now = time.monotonic()
            end = now + wait
            self._wake_at = int(self._bar) - len(batch)
            self._gap_max = 0.0
            self._gather_began = now
            self._enough.clear()
            self._gathering = True  # from here a submit sets the event (checked below if it came before)
            while not self._enough_waits(len(batch)) and now < end:
                until = end
                if self._queue.qsize() >= self._wake_at:  # a closed loop of clients would all be back
                    until = min(end, self._arrived_at + quiet_secs(max(self._gap_max, self._gap)))
                    if now >= until:
                        break
                self._enough.wait(until - now)
                self._enough.clear()  # what set it is read again above
                now = time.monotonic()
            self._gathering = False
            self._gap = max(self._gap_max, self._gap * _BAR_DECAY)
        self._drain(batch)

    def _drain(self, batch: list[_Pending | _Grouped]) -> None:
        while len(batch) < _MAX_BATCH:
            try:
                nxt = self._queue.get_nowait()
            except queue.Empty:
                return
            if nxt is None:  # closing: commit what was gathered, then stop
                self._queue.put(None)
                return
            batch.append(nxt)

    def _ring(self) -> None:
        try:
            if self._doorbell is not None:
                self._doorbell.ring()
        except Exception:  # a wake is advisory: peers' fallback poll still sees the commit
            log.exception("embedded wake failed")

    def _commit_batch(self, f: _File, batch: list[_Pending | _Grouped], *, drain: bool = True) -> bool:
        """Apply one physical commit; True if it committed anything. What arrived while another
        process held the file's write lock joins it (``drain``): with two workers on one store each
        commit waits for the other's ~2 ms of flushes, and those arrivals would otherwise wait for a
        flush of their own (the all-in-one with UPF_WORKERS=2, asked for 14,000 publishes/s,
        delivered ~12,100 a second without this and ~13,800 with it: BENCHMARKS.md, thirty-fifth
        pass)."""
        asked = time.perf_counter()
        txn = f.env.begin(write=True)  # waits for another process's write lock (a robust mutex)
        _LOCK_WAIT.record(time.perf_counter() - asked)
        try:
            if drain:
                taken = len(batch)
                self._drain(batch)
                if len(batch) > taken:
                    self._taken += sum(p.weight for p in batch[taken:])
            return self._apply_batch(f, txn, batch)
        except BaseException:
            txn.abort()
            raise

    def _apply_batch(self, f: _File, txn: lmdb.Transaction, batch: list[_Pending | _Grouped]) -> bool:
        version, last_stamp = f.version(txn)
        new_version = version + 1
        new_stamp = max(last_stamp + 1, _clock_stamp())
        prefix = new_stamp.to_bytes(8, "big")
        now = time.monotonic()
        in_batch = BatchWrites()
        applier = _Applier(txn, f.kv)
        order = 0
        grouped: list[_Grouped] = []
        for p in batch:
            if isinstance(p, _Grouped):
                grouped.append(p)
                continue
            if now - p.started > LIFETIME_SECS:
                p.stamp = errors.StoreError(errors.TRANSACTION_TOO_OLD)
                continue
            reads = p.reads
            if reads:
                try:
                    sets = self._write_sets(txn, p.read_version or 0, version)
                except errors.StoreError as exc:
                    p.stamp = exc
                    continue
                if in_batch.overlaps_any(reads) or (sets and any(s.overlaps_any(reads) for s in sets)):
                    p.stamp = errors.StoreError(errors.NOT_COMMITTED)
                    continue
            stamp = prefix + order.to_bytes(2, "big")
            order += 1
            stamped: list[bytes] = []
            applier.apply(p.mutations, stamp, stamped)
            in_batch.add_all(stamped, p.writes)
            p.stamp = stamp
        if grouped:  # after the others: they were checked against what they read, these read the file
            order = self._apply_grouped(txn, applier, in_batch, grouped, prefix, order)
        if not order:
            txn.abort()
            return False
        applier.flush()
        wall = time.time()
        written = in_batch.to_set()
        f.set_version(txn, new_version, new_stamp)
        # Timed by the monotonic clock: timed by the wall clock, a step back of an hour would stop
        # pruning (and reclaiming dead readers' slots) for that hour while the file grew.
        if now - self._last_prune > 1.0:  # before the insert, so a full file can reuse the space
            self._last_prune = now
            _prune(txn, f, wall - _WLOG_KEEP_SECS, wall + _CLOCK_STEP_SECS)
            f.env.reader_check()  # a killed process's reader slot would pin old pages: the file would grow
        encoded = written.encode()
        txn.put(wlog_key(new_version), _T.pack(wall) + encoded, db=f.wlog)
        if f.reserve_due(now):
            f.check_reserve(now)
        quota = f.quota_now()
        if quota:
            after = f.live_bytes(txn)
            if after > quota and after > f.committed_bytes():  # one that frees space passes, even over it
                raise _OverQuota
        txn.commit()
        # Nothing below may raise: the caller takes an exception for a commit that did not happen.
        with contextlib.suppress(OSError):  # the mark only notices lost commits; it never refuses one
            os.pwrite(self._mark_fd, prefix, 0)
        try:
            self._wlog_cache.put(new_version, written, encoded)
        except Exception:  # a version missing from the cache is read from the file's write log
            log.exception("embedded write log cache failed")
        return True

    def _apply_grouped(
        self,
        txn: lmdb.Transaction,
        applier: _Applier,
        in_batch: BatchWrites,
        grouped: list[_Grouped],
        prefix: bytes,
        order: int,
    ) -> int:
        """Run each function's items in grouped transactions of up to ``GROUP_MAX``, each with its
        own batch order; returns the next order."""
        by_key: dict[Any, list[_Grouped]] = {}
        for g in grouped:
            by_key.setdefault(g.key, []).append(g)
        for members in by_key.values():
            for i in range(0, len(members), GROUP_MAX):
                order = self._run_group(txn, applier, in_batch, members[i : i + GROUP_MAX], prefix, order)
        return order

    def _run_group(
        self,
        txn: lmdb.Transaction,
        applier: _Applier,
        in_batch: BatchWrites,
        group: list[_Grouped],
        prefix: bytes,
        order: int,
    ) -> int:
        """One grouped transaction. Refused before its commit (a value too large, say), or failed in
        the function (nothing of it applied), each item is run alone, so that failure is the one
        item's own."""
        applier.flush()  # its reads see the batch so far
        stamp = prefix + order.to_bytes(2, "big")
        tr = CommitTransaction(self, txn, stamp)
        first = group[0]
        try:
            results = run_sync(first.fn(tr, [g.item for g in group], **first.kwargs))
            if len(results) != len(group):
                raise errors.StoreError(errors.CLIENT_INVALID_OPERATION, "a grouped function answers each item")
        except errors.StoreError as exc:
            if len(group) > 1 and exc.code in errors.REFUSED_BEFORE_COMMIT:
                for g in group:
                    order = self._run_group(txn, applier, in_batch, [g], prefix, order)
                return order
            for g in group:
                g.stamp = exc
            return order
        except Exception as exc:  # a bug in the function fails its items, not the batch
            if len(group) > 1:  # nor the items of others it was grouped with
                for g in group:
                    order = self._run_group(txn, applier, in_batch, [g], prefix, order)
                return order
            log.exception("embedded grouped transaction failed")
            for g in group:
                g.stamp = exc
            return order
        applier.apply(tr.mutations, stamp, tr.stamped)  # stamped already: nothing is appended
        in_batch.add_all(tr.stamped, tr.writes)
        for g, result in zip(group, results, strict=True):
            g.stamp = stamp
            g.result = result
        return order + 1

    def _resolve(self, batch: list[_Pending | _Grouped]) -> None:
        self._grv = None  # what starts after these acknowledgements reads past them
        groups = {p.stamp for p in batch if type(p) is _Grouped and type(p.stamp) is bytes}
        if groups:  # counted here, on the loop's thread, as transact counts its transactions
            _metrics.transacted("embedded", len(groups))
        for p in batch:
            if isinstance(p.stamp, errors.StoreError) and p.stamp.storage_full:
                errors.STORAGE.write_refused()
            if p.future.done():
                continue
            if isinstance(p.stamp, BaseException):
                p.future.set_exception(p.stamp)
            elif type(p) is _Grouped:
                p.future.set_result(p.result)
            else:
                p.future.set_result(p.stamp)  # type: ignore[arg-type]  # stamped: every batch member is stamped or failed
        self._schedule_watch_check()


def _prune(txn: lmdb.Transaction, f: _File, before: float, ahead: float) -> None:
    """Drop the write log's commits older than ``before``. Versions are in commit order, so in time
    order but for a clock stepped back: an entry stamped after ``ahead`` (from before the step) goes
    too, or it would hold back the pruning of every later one. A dropped entry can only make an
    older transaction fail as too old, which it retries."""
    cur = txn.cursor(db=f.wlog)
    if not cur.first():
        return
    while True:
        raw = cast(bytes, cur.value())
        if not raw:
            return
        t = _T.unpack(raw[:8])[0]
        if before <= t <= ahead:
            return
        cur.delete()
