"""Grouped transactions (``EmbeddedDatabase.transact_grouped``): run by the committer thread inside
the group commit's write transaction, one per group of items that waited for the same commit.

Why: a publish is a handful of writes, and at moderate rates each came in a loop turn of its own, so
each paid for a transaction of its own on the event loop (its read version, its snapshot, its
mutation list handed over and checked for conflicts, its stamp future): 10-17% of the CPU per
publish-and-delivery at 2,000/s (BENCHMARKS.md, eighteenth pass). Inside the write transaction a
group's reads see every commit before it (LMDB's single writer), so it cannot conflict and needs no
read version, no conflict ranges and no check; every publish waiting for a commit shares one
transaction, not only those of one loop turn.

A grouped function reads before it writes (its writes are kept as mutations and applied when it
returns, so a read after a write could not see it: that read is refused), and it must not suspend
(no read of this driver does)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Sequence
from typing import TYPE_CHECKING, Any

from ... import errors
from ...contract import TRANSACTION_LIMIT
from .._ranges import point
from .mutations import (
    _ADD,
    _CLEAR,
    _CLEAR_RANGE,
    _SET,
    check_range_sizes,
    check_sizes,
    check_stamped,
    check_user_version,
    stamp_at,
)

if TYPE_CHECKING:
    import lmdb

    from .reads import _Reads

GROUP_MAX = 256
"""At most this many items share a grouped transaction (a commit may run several)."""


class _Grouped:
    """An item handed to the committer for ``fn``'s next group, with what it needs to answer."""

    __slots__ = ("fn", "item", "kwargs", "key", "future", "stamp", "result")
    # Counted as a plain publish's mutations for the commit's threshold (Q, X, the time index, two
    # counters, an inbox and a bell); kept at 7, as measured, since a group sums its counters' adds.
    weight = 7

    def __init__(self, fn: Callable[..., Awaitable[list[Any]]], item: Any, kwargs: dict[str, Any], future: Any) -> None:
        self.fn = fn
        self.item = item
        self.kwargs = kwargs
        self.key = (fn, tuple(sorted(kwargs.items())))
        hash(self.key)  # unhashable arguments fail here, at the caller, not in the group commit
        self.future = future
        self.stamp: bytes | BaseException | None = None
        self.result: Any = None


class _Known:
    """A stamp known when it is asked for: the grouped transaction runs inside its commit."""

    __slots__ = ("value",)

    def __init__(self, value: bytes) -> None:
        self.value = value

    def __await__(self) -> Generator[Any, None, bytes]:
        return self.value
        yield  # a generator that never suspends


class CommitTransaction:
    """The contract's transaction inside the committer's write transaction, for a grouped function."""

    __slots__ = ("_db", "_txn", "_stamp", "mutations", "writes", "stamped", "_user_version", "_size")

    def __init__(self, db: _Reads, txn: lmdb.Transaction, stamp: bytes) -> None:
        self._db = db
        self._txn = txn
        self._stamp = stamp
        self.mutations: list[tuple[int, bytes, bytes]] = []
        self.writes: list[tuple[bytes, bytes]] = []  # what it wrote but stamped keys, as ranges
        self.stamped: list[bytes] = []  # the keys it stamped
        self._user_version = 0
        self._size = 0

    # --- reads: the write transaction's view, before any write of this one ---------------------------
    def _check_read(self) -> None:
        if self.mutations:
            raise errors.StoreError(errors.CLIENT_INVALID_OPERATION, "a grouped transaction read after a write")

    async def get(self, key: bytes, *, snapshot: bool = False) -> bytes | None:
        self._check_read()
        if not key:  # never stored (see check_sizes); LMDB refuses to look it up
            return None
        value: bytes | None = self._txn.get(key, db=self._db._reader.kv)  # type: ignore[assignment]  # bytes: no buffers=True
        return value

    async def get_range(
        self, begin: bytes, end: bytes, *, limit: int = 0, reverse: bool = False, snapshot: bool = False
    ) -> list[tuple[bytes, bytes]]:
        self._check_read()
        return self._db._rows(self._txn, begin, end, limit, reverse) if begin < end else []

    async def get_ranges(
        self, ranges: list[tuple[bytes, bytes, int]], *, snapshot: bool = False
    ) -> list[list[tuple[bytes, bytes]]]:
        self._check_read()
        return self._db._rows_many(self._txn, ranges)

    def add_read_conflict_range(self, begin: bytes, end: bytes) -> None:
        """Nothing to do: inside the commit nothing can change what it read."""

    def watch(self, key: bytes) -> Any:
        raise errors.StoreError(errors.CLIENT_INVALID_OPERATION, "no watch in a grouped transaction")

    def watches(self, keys: Sequence[bytes]) -> list[Any]:
        return [self.watch(key) for key in keys]

    # --- writes --------------------------------------------------------------------------------------
    def _check_write(self, key: bytes, value: bytes, check: Callable[[bytes, bytes], int] = check_sizes) -> None:
        size = self._size = self._size + check(key, value)
        if size > TRANSACTION_LIMIT:
            raise errors.StoreError(errors.TRANSACTION_TOO_LARGE, f"{self._size} bytes")

    def set(self, key: bytes, value: bytes) -> None:
        self._check_write(key, value)
        self.mutations.append((_SET, key, value))
        self.writes.append(point(key))

    def clear(self, key: bytes) -> None:
        self._check_write(key, b"")
        self.mutations.append((_CLEAR, key, b""))
        self.writes.append(point(key))

    def clear_range(self, begin: bytes, end: bytes) -> None:
        self._check_write(begin, end, check_range_sizes)
        if begin < end:
            self.mutations.append((_CLEAR_RANGE, begin, end))
            self.writes.append((begin, end))

    def add(self, key: bytes, param: bytes) -> None:
        self._check_write(key, param)
        self.mutations.append((_ADD, key, param))
        self.writes.append(point(key))

    # The stamp is known here (the commit is under way), so a stamped write is stamped at once and
    # kept as a plain set.
    def set_versionstamped_key(self, key: bytes, value: bytes) -> None:
        key = stamp_at(key, check_stamped(key, "key"), self._stamp)
        self._check_write(key, value)
        self.mutations.append((_SET, key, value))
        self.stamped.append(key)

    def set_versionstamped_value(self, key: bytes, value: bytes) -> None:
        value = stamp_at(value, check_stamped(value, "value"), self._stamp)
        self._check_write(key, value)
        self.mutations.append((_SET, key, value))
        self.writes.append(point(key))

    def next_user_version(self) -> int:
        uv = check_user_version(self._user_version)
        self._user_version += 1
        return uv

    def get_versionstamp(self) -> Awaitable[bytes]:
        return _Known(self._stamp)

    async def commit(self) -> None:
        raise errors.StoreError(errors.CLIENT_INVALID_OPERATION, "a grouped transaction commits with its batch")

    async def on_error(self, exc: BaseException) -> None:
        raise exc

    def cancel(self) -> None:
        """Nothing to undo: its mutations are applied only when its function returns."""


def run_sync(coro: Any) -> Any:
    """Run a grouped function's coroutine to its end without a loop (it must not suspend)."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise errors.StoreError(errors.CLIENT_INVALID_OPERATION, "a grouped transaction suspended")
