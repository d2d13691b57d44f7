"""Watches: registered at commit with the value the transaction saw, checked against the keys later
commits wrote, woken by this process's commits, other processes' wake datagrams, or the backstop poll."""

from __future__ import annotations

import asyncio
import bisect
import itertools
import operator
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any

from ... import errors
from ...settings import embedded_wake_pace_ms
from .._ranges import HEAD_BYTES, IntervalSet
from .._wake import Inbox
from .mutations import empty_key
from .reads import _Reads

if TYPE_CHECKING:
    from .database import EmbeddedDatabase

_FALLBACK_POLL_SECS = 1.0  # the backstop for lost wake datagrams
_WAKE_PACE_SECS = 0.010
"""The default of ``UPF_EMBEDDED_WAKE_PACE_MS``. Each of another process's commits wakes this one, and
a wake-up costs a process far more than its instructions (an idle process is scheduled in with cold
caches): in the split shape at 10,000 publishes/s the pusher was woken ~190 times a second, once per
writer commit, at ~200 us of CPU each, about an eighth of its CPU. Woken within this long of its last
check more than ``_QUICK_WAKES`` times in a row, it stops listening and checks once when the pace is
up (``_paced``); while commits keep coming it stays on that beat, and once a pace passes with none it
listens again. At 10,000/s the pusher then checked ~95-99 times a second and spent 13-17% less CPU per
delivery, for up to this long more latency (p50 +9-10 ms). Commits further apart, or only a few close
together (at 2,000/s; mostly at 5,000/s, where they came ~7 ms apart but unevenly), are checked at
once (BENCHMARKS.md, thirty-fourth pass). Only other processes' commits are paced: this process's own
are checked at once."""
_QUICK_WAKES = 3
"""Wakes within a pace of the last check that are still checked at once, in a row: a stream of commits
is paced from the next one; two or three close together (the README's smoke test publishes twice and
polls at once) are not delayed."""
_NO_WAKE_POLL_SECS = 0.05  # without a wake socket (a read-only directory, no /proc for long paths)
_ZEROS = itertools.repeat(b"\x00")  # each interval's point end is its begin + this
_FEW_WATCHED = 4  # a set this many times bigger than the watched keys is searched key by key
_SLICED_ABOVE = 32  # a set of more intervals is cut to the watched heads' slices (``_written``)
_HEAD = operator.itemgetter(slice(0, HEAD_BYTES))
_CHANGED = object()  # a watched value no committed value equals: the watch fires when armed


def _written(watched: Collection[bytes], sets: list[IntervalSet], heads: _Heads | None = None) -> list[bytes]:
    """The ``watched`` keys some write set covers.

    - With ``heads`` (the watched keys' heads, kept across checks), a big set is cut to the slices
      under those heads first: a node's bells share one head, and a commit of publishes writes
      hundreds of keys under others (Q, X, QT, IN).
    - A process watching a few keys (a writer's, a janitor's) bisects each into every set.
    - Otherwise most written intervals are single keys (a commit of publishes writes no other kind):
      those are matched by one set intersection, in C. Only a set with a wider interval (a
      clear_range) then has its intervals bisected into the sorted watched keys."""
    keys = watched.keys() if isinstance(watched, dict) else set(watched)
    found: set[bytes] = set()
    ordered: list[bytes] | None = None
    bounds: list[tuple[bytes, bytes | None]] | None = None
    for ws in sets:
        begins, ends = ws.begins, ws.ends
        n = len(begins)
        if heads is not None and n > _SLICED_ABOVE and bounds is None:
            bounds = heads.of(keys)  # only for a big set: a commit of one publish is searched as it is
        if bounds is not None and n > _SLICED_ABOVE and 2 * len(bounds) < len(keys):
            for head, above in bounds:
                lo = bisect.bisect_right(ends, head)  # the first interval that may hold a key >= head
                hi = n if above is None else bisect.bisect_left(begins, above, lo)
                if lo >= hi:
                    continue
                sb = begins[lo:hi]
                found.update(keys & set(sb))
                if all(map(operator.eq, ends[lo:hi], map(bytes.__add__, sb, _ZEROS))):
                    continue
                for k in keys:  # a wider interval under this head: each key bisected into the slice
                    i = bisect.bisect_right(ends, k, lo, hi)
                    if i < hi and begins[i] <= k:
                        found.add(k)
            continue
        if len(keys) * _FEW_WATCHED < n:
            for k in keys:  # ws.overlaps(k, k + b"\x00"), inlined: a call per watched key per set
                i = bisect.bisect_right(ends, k)
                if i < n and begins[i] <= k:
                    found.add(k)
            continue
        found.update(keys & set(begins))
        if all(map(operator.eq, ends, map(bytes.__add__, begins, _ZEROS))):
            continue
        if ordered is None:
            ordered = sorted(watched)
        m = len(ordered)
        for b, e in zip(begins, ends, strict=True):
            i = bisect.bisect_left(ordered, b)
            while i < m and ordered[i] < e:
                found.add(ordered[i])
                i += 1
    return list(found)


def wake_pace_secs() -> float:
    """``UPF_EMBEDDED_WAKE_PACE_MS`` in seconds, ``_WAKE_PACE_SECS`` when unset. 0: a check at every wake."""
    ms = embedded_wake_pace_ms()
    return _WAKE_PACE_SECS if ms is None else ms / 1000


def _above(prefix: bytes) -> bytes | None:
    """The first key after every key that starts with ``prefix`` (None: no such key)."""
    p = prefix.rstrip(b"\xff")
    return p[:-1] + bytes((p[-1] + 1,)) if p else None


class _Heads:
    """The heads of the watched keys, kept across checks: a node's bells re-arm the same keys every
    wake-up, so the heads are recomputed only when a key not seen before is watched. A head whose keys
    are no longer watched stays until the next rebuild; it costs two bisects a set, and finds nothing."""

    __slots__ = ("seen", "bounds")

    def __init__(self) -> None:
        self.seen: set[bytes] = set()
        self.bounds: list[tuple[bytes, bytes | None]] = []

    def of(self, keys: Collection[bytes]) -> list[tuple[bytes, bytes | None]]:
        seen = self.seen
        if len(seen) > 2 * len(keys) + 64 or not seen.issuperset(keys):
            self.seen = set(keys)
            self.bounds = [(h, _above(h)) for h in sorted(set(map(_HEAD, keys)))]
        return self.bounds


_PENDING, _FIRED, _CANCELLED = 0, 1, 2


class _Watch:
    """One registered watch; awaiting it waits for the change. ``cancel`` unregisters it.

    Firing and ``cancel`` unregister it at once (a watch set's stays registered when it fires: see
    ``_Member``). Its future exists only once something awaits it (or reads ``future``): a watch
    set's member (the pusher's bells) calls its callback instead, and costs no future and no loop
    handle. An awaited one also gets a done-callback, since cancelling its awaiter cancels the future
    behind our back."""

    __slots__ = ("key", "value", "version", "state", "_future", "_db", "_on_fire")

    def __init__(self, db: EmbeddedDatabase, key: bytes, value: Any, version: int | None = None) -> None:
        self._db = db
        self.key = key
        self.value = value
        self.version = version  # the commit the value was read at (None: unknown, re-read when armed)
        self.state = _PENDING
        self._future: asyncio.Future[None] | None = None
        self._on_fire: Callable[[], None] | None = None

    @property
    def future(self) -> asyncio.Future[None]:
        """The watch as a future, made on first use in the state the watch is in."""
        fut = self._future
        if fut is None:
            fut = self._future = self._db._loop.create_future()
            if self.state == _FIRED:
                fut.set_result(None)
            elif self.state == _CANCELLED:
                fut.cancel()
            else:
                fut.add_done_callback(self._forget)
        return fut

    def __await__(self) -> Any:
        # Not shielded: a waiter that gives up (a timeout) cancels the watch, as destroying an FDB
        # watch future does, so abandoned watches never pile up.
        return self.future.__await__()

    def _forget(self, _fut: asyncio.Future[None]) -> None:
        if self.state == _PENDING:  # its awaiter was cancelled, which cancelled the future
            self.state = _CANCELLED
            self._on_fire = None
            self._db._unregister(self)

    def done(self) -> bool:
        fut = self._future
        return self.state != _PENDING or (fut is not None and fut.done())

    def cancel(self) -> None:
        self._on_fire = None
        if self.state == _PENDING:  # a done one left the registry when it fired, or is leaving it
            self.state = _CANCELLED
            self._db._unregister(self)
            if self._future is not None:
                self._future.cancel()

    def _fire(self) -> None:
        self.state = _FIRED
        db = self._db
        s = db._watches.get(self.key)  # db._unregister(self), inlined: a node fires dozens a wake-up
        if s is not None and self in s:
            s.discard(self)
            db._watch_n -= 1
            if not s:
                del db._watches[self.key]
        fut = self._future
        if fut is not None and not fut.done():  # done: its awaiter was cancelled, ``_forget`` is due
            fut.set_result(None)
        callback = self._on_fire
        if callback is not None:
            self._on_fire = None
            callback()


class _Member(_Watch):
    """A watch set's watch. It stays registered when it fires: its set arms it again within the
    wake-up, and leaving and joining the registry each time costs more than what a fired one costs
    while it waits (a value read, when a commit writes its key again before then)."""

    __slots__ = ()

    def _fire(self) -> None:
        self.state = _FIRED
        callback = self._on_fire
        if callback is not None:
            self._on_fire = None
            callback()

    def cancel(self) -> None:
        self._on_fire = None
        if self.state != _CANCELLED:
            self.state = _CANCELLED
            self._db._unregister(self)


class _WatchSet:
    """Watches on a fixed list of keys, each armed again in place by ``arm``: a pusher re-arms dozens of
    its bells every wake-up, and a watch object, a callback registration and a cancel each cost more
    than the four fields an arming sets."""

    __slots__ = ("db", "members", "callbacks", "closed")

    def __init__(self, db: EmbeddedDatabase, keys: Sequence[bytes], callbacks: Sequence[Callable[[], None]]) -> None:
        if len(keys) != len(callbacks):
            raise ValueError("a watch set needs one callback per key")
        if not all(keys):
            raise empty_key()
        self.db = db
        self.members = [_Member(db, key, None) for key in keys]
        for w in self.members:
            w.state = _CANCELLED  # unarmed until a transaction arms it
        self.callbacks = list(callbacks)
        self.closed = False

    def cancel(self) -> None:
        self.closed = True
        for w in self.members:
            w.cancel()


class _Watches(_Reads):
    _watches: dict[bytes, set[_Watch]]
    _closed: bool
    _check_scheduled: bool
    _watch_version: int
    _checked_values: tuple[int, dict[bytes, bytes | None]]
    """The last check's version and the watched keys' values it read: a drain at that version re-arms
    a fired bell on the value without reading it again."""
    _heads: _Heads  # the watched keys' heads, for ``_written``
    _watch_n: int  # the watches in ``_watches``, kept as they come and go: the limit check is per watches() call
    _unchecked: bool  # a commit was announced while nothing was watched: no check has covered it
    _fallback: asyncio.TimerHandle | None
    _inbox: Inbox | None
    fallback_poll_secs: float
    _wake_pace: float  # wake_pace_secs(), read at open
    _woke_at: float  # the loop's time of the last check a wake began
    _quick: int  # the wakes in a row that came within a pace of the check before them
    _paced_check: asyncio.TimerHandle | None  # while deaf to wakes: the check at the pace's end

    def _watch_count(self) -> int:
        return self._watch_n

    def _arm(self, watches: list[_Watch]) -> None:
        """Register watches, firing at once those whose key already changed (before this point the
        incremental check below cannot see the change: it may predate the checked version)."""
        skipped = False
        registry = self._watches
        checked = self._watch_version
        for w in watches:
            if w.state:
                continue
            if w.version is not None and w.value is not _CHANGED and checked <= w.version:
                # No check has moved past the version the value was read at, so the next one compares
                # every commit after it: no change can slip between the read and this point.
                skipped = True
            elif self._read_point(w.key)[1] != w.value:
                w._fire()
                continue
            s = registry.get(w.key)  # registered, inline: a node re-arms dozens a wake-up
            if s is None:
                registry[w.key] = {w}
                self._watch_n += 1
            elif w not in s:
                s.add(w)
                self._watch_n += 1
        if skipped and self._unchecked:
            self._schedule_watch_check()  # a commit announced while nothing was watched may be one of them
        if self._watches and self._fallback is None and not self._closed:
            self._fallback = self._loop.call_later(self.fallback_poll_secs, self._fallback_poll)

    def _unregister(self, w: _Watch) -> None:
        # Inlined in ``_Watch._fire`` (and its mirror, registering, in ``_arm``): change all three together.
        s = self._watches.get(w.key)
        if s is not None and w in s:
            s.discard(w)
            self._watch_n -= 1
            if not s:
                del self._watches[w.key]

    def _schedule_watch_check(self) -> None:
        if not self._watches:
            self._unchecked = True
        elif not self._check_scheduled and not self._closed:
            self._check_scheduled = True
            self._loop.call_soon(self._check_watches)

    def _check_watches(self) -> None:
        """Compare the watched keys that commits since the last check wrote: their write sets come
        from the write log (this process's from memory), so a commit that touched no watched key
        costs one version read, not a read of every watched key. The version, the write sets and
        the values are read in one LMDB read transaction: one snapshot, one begin."""
        self._check_scheduled = False
        if not self._watches or self._closed:
            self._unchecked = True
            return
        self._unchecked = False
        f = self._reader
        with f.begin_read() as txn:
            current_version = self._observed(f.version(txn)[0])
            if current_version == self._watch_version:
                return
            try:
                sets = self._write_sets(txn, self._watch_version, current_version)
            except errors.StoreError:  # the log no longer reaches back that far: compare them all
                sets = None
            self._watch_version = current_version
            keys = list(self._watches) if sets is None else _written(self._watches, sets, self._heads)
            if not keys:
                return
            current: dict[bytes, bytes | None] = {key: txn.get(key, None, f.kv) for key in keys}  # type: ignore[misc]  # positional (see file.py); bytes: no buffers=True, whatever the stubs add
            self._checked_values = (current_version, current)
        for key in keys:
            value = current[key]
            for w in list(self._watches.get(key, ())):
                if w.value != value and not w.state:
                    w._fire()

    def _on_wake(self) -> None:
        """Another process committed (one or many datagrams): one check covers them all. After
        ``_QUICK_WAKES`` in a row each within a pace of the check before it, the next such wake stops
        the listening: the next check is at the pace's end (``_WAKE_PACE_SECS``)."""
        inbox = self._inbox
        if inbox is None:
            return
        inbox.drain()
        now = self._loop.time()
        if now - self._woke_at >= self._wake_pace:
            self._quick = 0
        elif self._quick < _QUICK_WAKES:
            self._quick += 1
        elif not self._closed:
            self._loop.remove_reader(inbox.fileno())
            self._paced_check = self._loop.call_at(self._woke_at + self._wake_pace, self._paced)
            return
        self._woke_at = now
        self._schedule_watch_check()

    def _paced(self) -> None:
        """A pace is up: check for what woke this process meanwhile. Wakes came during it: stay deaf
        for another pace; none came: listen again (a wake sent meanwhile is read at once)."""
        self._paced_check = None
        inbox = self._inbox
        if inbox is None or self._closed:
            return
        self._woke_at = self._loop.time()
        self._schedule_watch_check()
        if inbox.drain():
            self._paced_check = self._loop.call_at(self._woke_at + self._wake_pace, self._paced)
        else:
            self._quick = 0
            self._loop.add_reader(inbox.fileno(), self._on_wake)

    def _fallback_poll(self) -> None:
        """The backstop for lost datagrams: one commit-counter read a second, only while watched."""
        self._fallback = None
        if self._closed or not self._watches:
            return
        self._schedule_watch_check()
        self._fallback = self._loop.call_later(self.fallback_poll_secs, self._fallback_poll)
