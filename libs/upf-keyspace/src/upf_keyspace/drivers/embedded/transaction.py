"""A transaction: reads kept on one snapshot, writes kept as an ordered mutation list (and an overlay
its own reads see), handed to the committer at commit."""

from __future__ import annotations

import asyncio
import operator
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from ... import errors
from ...contract import LIFETIME_SECS, TRANSACTION_LIMIT, WatchSet
from .._ranges import point
from .committer import _Pending
from .mutations import (
    _ADD,
    _CLEAR,
    _CLEAR_RANGE,
    _SET,
    _VS_KEY,
    _VS_VALUE,
    _add_le,
    check_range_sizes,
    check_sizes,
    check_stamped,
    check_user_version,
    empty_key,
)
from .reads import _Snapshot
from .watches import _CHANGED, _PENDING, _Watch, _WatchSet

if TYPE_CHECKING:
    from .database import EmbeddedDatabase

_MAX_WATCHES = 10_000
_limit_of = operator.itemgetter(2)  # of a get_ranges range (begin, end, limit)
_RETRY_LIMIT = 100
_UNREAD: Any = object()  # not among a check's values (``_watch_values``)
_NONE_CHECKED: dict[bytes, bytes | None] = {}


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
        "_commit_started",
        "_snap",
    )

    def __init__(self, db: EmbeddedDatabase) -> None:
        self._db = db
        self._attempts = 0
        self._snap: _Snapshot | None = None
        self._reset()

    def _snapshot(self) -> _Snapshot | None:
        """This iteration's snapshot for the transaction's reads of the file, opened at its first one."""
        snap = self._snap
        if snap is None or snap.gen != self._db._snap_gen:
            snap = self._snap = self._db._open_snapshot()
        return snap

    def _reset(self) -> None:
        self._snap = None  # a retry reads afresh (the open one still ends with its iteration)
        self._read_version: int | None = None
        self._reads: list[tuple[bytes, bytes]] = []  # conflict ranges (non-snapshot reads)
        self._seen: list[tuple[bytes, bytes]] = []  # everything read, for snapshot consistency
        self._writes: list[tuple[bytes, bytes]] = []
        self._mutations: list[tuple[int, bytes, bytes]] = []
        self._overlay: dict[bytes, bytes | None] = {}
        self._cleared: list[tuple[bytes, bytes]] = []
        self._adds: dict[bytes, list[bytes]] = {}
        self._unreadable: list[tuple[bytes, bytes]] = []
        self._watches: list[_Watch] = []
        self._stamp_future: asyncio.Future[bytes] | None = None
        self._user_version = 0
        self._size = 0
        self._started = time.monotonic()
        self._committing = False
        self._commit_started = False  # until a reset: FoundationDB's commitStarted

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
        if version != self._read_version:
            self._check_moved(version)

    def _note_reads(self, spans: list[tuple[bytes, bytes]], snapshot: bool, version: int) -> None:
        """``_note_read`` for the ranges of one ``get_ranges``, in one call: a wake-up reads dozens."""
        if not spans:
            return  # nothing read (every range empty): no read version taken, as in get_range
        if self._read_version is None:
            self._read_version = version
        self._seen += spans
        if not snapshot:
            self._reads += spans
            for begin, end in spans:
                self._size += len(begin) + len(end)
        if version != self._read_version:
            self._check_moved(version)

    def _check_moved(self, version: int) -> None:
        """A read at a later version than the transaction's first: fine unless a commit between them
        wrote what the transaction read."""
        assert self._read_version is not None
        if self._db._changed_since(self._read_version, version, self._seen):
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
        if not key:  # never stored (see check_sizes); LMDB refuses to look it up
            return None
        version, base = self._db._read_point(key, self._snapshot())
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
        if self._unreadable:
            self._check_readable(begin, end)
        # A read-only transaction (the pusher's drains and reads) has nothing of its own to merge.
        local = bool(self._overlay or self._cleared or self._adds) and self._touched(begin, end)
        version, rows = self._db._read_range_at(
            begin, end, 0 if local else limit, reverse, self._read_version, self._snapshot
        )
        if local:
            merged = {k: v for k, v in rows}
            for k in (
                list(merged)
                + [k for k in self._overlay if begin <= k < end]
                + [k for k in self._adds if begin <= k < end]
            ):
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

    async def get_ranges(
        self, ranges: list[tuple[bytes, bytes, int]], *, snapshot: bool = False
    ) -> list[list[tuple[bytes, bytes]]]:
        self._check_alive()
        snap = None
        # Only unlimited ranges (a publish's affinity reads) go by the range cache. A range with a limit
        # (a Q read, an inbox drain, an idempotency marker) starts past its last answer next time, so a
        # cached answer would never be reused; a connection's 128 topics read with a shared batch of a
        # row or two each went range by range through it. Empty ranges tested apart: min()'s default=
        # keyword would cost its every call a parse.
        if not (self._unreadable or self._overlay or self._cleared or self._adds) and (
            not ranges or min(map(_limit_of, ranges)) > 0
        ):
            snap = self._snapshot()
        if snap is None:  # writes of its own to merge, an unlimited range the cache may hold, or no snapshot
            return [await self.get_range(b, e, limit=n, snapshot=snapshot) for b, e, n in ranges]
        out = self._db._rows_many(snap.txn, ranges)
        # Like FoundationDB, a read that stopped at its limit only conflicts on what it covered; an
        # empty range reads nothing, as in get_range (and a call of only empty ranges takes no version).
        self._note_reads(
            [
                (begin, rows[-1][0] + b"\x00" if limit and len(rows) >= limit else end)
                for (begin, end, limit), rows in zip(ranges, out)  # noqa: B905  # a row list per range
                if begin < end
            ],
            snapshot,
            snap.version,
        )
        return out

    # --- writes ------------------------------------------------------------------------------------
    def _check_write(self, key: bytes, value: bytes, check: Callable[[bytes, bytes], int] = check_sizes) -> None:
        if self._committing:
            raise errors.StoreError(errors.USED_DURING_COMMIT)
        self._size += check(key, value)

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
        self._check_write(begin, end, check_range_sizes)
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
        offset = check_stamped(key, "key")
        self._check_write(key[:-4], value)
        self._mutations.append((_VS_KEY, key, value))
        prefix = key[:offset]
        self._unreadable.append((prefix, prefix + b"\xff" * 11))

    def set_versionstamped_value(self, key: bytes, value: bytes) -> None:
        check_stamped(value, "value")
        self._check_write(key, value[:-4])
        self._mutations.append((_VS_VALUE, key, value))
        self._writes.append(point(key))
        self._overlay.pop(key, None)
        self._adds.pop(key, None)
        self._unreadable.append(point(key))

    def add_read_conflict_range(self, begin: bytes, end: bytes) -> None:
        self._reads.append((begin, end))

    def next_user_version(self) -> int:
        uv = check_user_version(self._user_version)
        self._user_version += 1
        return uv

    def get_versionstamp(self) -> Awaitable[bytes]:
        """Asked for before ``commit``, as FoundationDB requires: asked after it, used_during_commit
        (2017), not a future nothing would ever resolve."""
        if self._stamp_future is None:
            self._stamp_future = self._db._loop.create_future()
            if self._commit_started:
                _fail_stamp(self._stamp_future, errors.USED_DURING_COMMIT)
        return self._stamp_future

    def watch(self, key: bytes) -> _Watch:
        """Registered at commit; refused past the watch limit, and for the empty key."""
        if not key:
            raise empty_key()
        values, versions = self._watch_values((key,))
        w = _Watch(self._db, key, values[0], versions[0])
        self._watches.append(w)
        return w

    def arm(self, ws: WatchSet, indexes: Sequence[int]) -> None:
        """Arm the set's watches at ``indexes`` in place, at this transaction's read: the values ``watch``
        would read, registered at commit as its are, and refused whole past the watch limit."""
        if not isinstance(ws, _WatchSet) or ws.db is not self._db:
            raise TypeError("a watch set of another store")
        if ws.closed or not indexes:
            return
        members, callbacks = ws.members, ws.callbacks
        keys = [members[i].key for i in indexes]
        values, versions = self._watch_values(keys)
        for i, value, version in zip(indexes, values, versions):  # noqa: B905  # one of each per index
            w = members[i]
            w.value = value
            w.version = version
            w.state = _PENDING
            w._on_fire = callbacks[i]
            self._watches.append(w)

    def _watch_values(self, keys: Sequence[bytes]) -> tuple[list[Any], list[int]]:
        """The value each watch of ``keys`` compares against, and the version it was read at."""
        db = self._db
        if db._watch_n + len(self._watches) + len(keys) > _MAX_WATCHES:
            raise errors.StoreError(errors.TOO_MANY_WATCHES)
        self._check_alive()
        snap = self._snapshot()
        local = bool(self._overlay or self._cleared or self._adds)
        if snap is not None and not local and (self._read_version is None or self._read_version == snap.version):
            # Every value from the one snapshot, at the read version: a node re-arms dozens of bells
            # a wake-up, and this is the usual case (the drain's read took the same snapshot). A
            # bell that just fired has its value at that version from the check that fired it.
            self._read_version = version = snap.version
            get, kv = snap.txn.get, db._reader.kv
            checked_at, checked = db._checked_values
            if checked_at != version:
                checked = _NONE_CHECKED
            values = []
            for key in keys:
                held = checked.get(key, _UNREAD)
                values.append(get(key, None, kv) if held is _UNREAD else held)
            return values, [version] * len(keys)
        values, versions = [], []
        for key in keys:
            version, base = db._read_point(key, snap)
            value: object = self._local_value(key, base) if local else base
            if self._read_version is None:
                self._read_version = version
            elif version != self._read_version and db._changed_since(self._read_version, version, [point(key)]):
                value = _CHANGED  # changed after our snapshot: FoundationDB's watch would fire at once
            values.append(value)
            versions.append(version)
        return values, versions

    # --- commit ------------------------------------------------------------------------------------
    async def commit(self) -> None:
        self._check_alive()
        if self._db._closed:  # the committer stops at close's marker: behind it, nothing would answer
            raise errors.StoreError(errors.CLIENT_INVALID_OPERATION, "database closed")
        if self._size > TRANSACTION_LIMIT:
            raise errors.StoreError(errors.TRANSACTION_TOO_LARGE, f"{self._size} bytes")
        watches = self._watches
        self._commit_started = True
        if not self._mutations:
            if self._stamp_future is not None and not self._stamp_future.done():
                _fail_stamp(self._stamp_future, errors.NO_COMMIT_VERSION)
            self._db._arm(watches)
            return
        if self._read_version is None:
            self._read_version = self._db._committed_version()
        self._committing = True
        future: asyncio.Future[bytes] = self._db._loop.create_future()
        self._db._submit(_Pending(self, future))
        try:
            # A cancelled caller cancels only its wait: the committer still commits (or fails) it.
            stamp = await future
        except errors.StoreError:  # FoundationDB: a failed commit's stamp is transaction_invalid_version
            if self._stamp_future is not None and not self._stamp_future.done():
                _fail_stamp(self._stamp_future, errors.TRANSACTION_INVALID_VERSION)
            raise
        finally:
            self._committing = False
        if self._stamp_future is not None and not self._stamp_future.done():
            self._stamp_future.set_result(stamp)
        self._db._arm(watches)

    async def on_error(self, exc: BaseException) -> None:
        if not isinstance(exc, errors.StoreError) or not exc.retryable or self._attempts >= _RETRY_LIMIT:
            raise exc
        self.cancel()
        self._attempts += 1
        await asyncio.sleep(min(1.0, 0.002 * (2 ** min(self._attempts, 9))) * random.random())
        self._reset()

    def cancel(self) -> None:
        for w in self._watches:
            w.cancel()
        if self._stamp_future is not None and not self._stamp_future.done():
            self._stamp_future.cancel()


def _fail_stamp(future: asyncio.Future[bytes], code: int) -> None:
    future.set_exception(errors.StoreError(code))
    future.exception()  # retrieved: a caller may never await it
