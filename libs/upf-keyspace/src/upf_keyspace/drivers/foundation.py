"""The FoundationDB driver: the real ``foundationdb`` bindings (7.3 series, API version 730).

The bindings block; this bridges each FDB future into asyncio with ``on_ready`` and
``call_soon_threadsafe`` (fdb-facts.md §5, option b), so the event loop never waits on the network
thread. The callback only hops threads; the future is read on the loop, where it is already ready.
Transaction timeout and retry limit are set once, at open. Watches are returned as awaitables the
caller must pair with a timeout (a watch on an unreachable cluster never fires nor fails).

Unexercised on the machines this was written on: no libfdb_c or cluster can be installed there. The
contract suite runs against it wherever FDB_CLUSTER_FILE names a reachable cluster.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from .. import errors
from . import _metrics
from ._turns import TurnGroups

__all__ = ["FoundationDatabase", "open_foundationdb", "API_VERSION", "load_bindings"]

API_VERSION = 730
_TIMEOUT_MS = 5_000
_RETRY_LIMIT = 100
T = TypeVar("T")


def load_bindings() -> Any:
    """Import fdb and select API 730, or raise RuntimeError saying why FoundationDB can't be used."""
    import fdb

    try:
        if not fdb.is_api_version_selected():
            fdb.api_version(API_VERSION)
    except Exception as exc:  # a missing libfdb_c raises a bare Exception (fdb-facts.md §1)
        raise RuntimeError(f"FoundationDB client library unavailable: {exc}") from exc
    return fdb


def _bridge(loop: asyncio.AbstractEventLoop, fut: Any, convert: Callable[[Any], Any]) -> asyncio.Future[Any]:
    out: asyncio.Future[Any] = loop.create_future()

    def on_loop(f: Any) -> None:
        if out.done():
            return
        try:
            out.set_result(convert(f))
        except Exception as exc:
            out.set_exception(_wrap(exc))

    def on_ready(f: Any) -> None:  # on the network thread: hop, nothing else
        loop.call_soon_threadsafe(on_loop, f)

    def forward_cancel(o: asyncio.Future[Any]) -> None:
        if o.cancelled():
            try:
                fut.cancel()
            except Exception:
                pass

    out.add_done_callback(forward_cancel)
    out._fdb_future = fut  # type: ignore[attr-defined]  # pin: destroying it would cancel a watch
    fut.on_ready(on_ready)
    return out


def _wrap(exc: BaseException) -> BaseException:
    code = getattr(exc, "code", None)
    if isinstance(code, int):
        return errors.StoreError(code, getattr(exc, "description", ""))
    return exc


class _FdbWatch:
    __slots__ = ("_future",)

    def __init__(self, future: asyncio.Future[Any]) -> None:
        self._future = future

    def __await__(self) -> Any:
        return self._future.__await__()

    def done(self) -> bool:
        return self._future.done()

    def cancel(self) -> None:
        self._future.cancel()


class FoundationTransaction:
    __slots__ = ("_db", "_tr", "_loop", "_user_version", "_watches")

    def __init__(self, db: FoundationDatabase) -> None:
        self._db = db
        self._tr = db._db.create_transaction()
        self._loop = db._loop
        self._user_version = 0
        self._watches: list[_FdbWatch] = []

    async def get(self, key: bytes, *, snapshot: bool = False) -> bytes | None:
        src = self._tr.snapshot if snapshot else self._tr
        value: bytes | None = await _bridge(self._loop, src.get(key), lambda f: f.value)
        return value

    async def get_range(
        self,
        begin: bytes,
        end: bytes,
        *,
        limit: int = 0,
        reverse: bool = False,
        snapshot: bool = False,
    ) -> list[tuple[bytes, bytes]]:
        fdb = self._db._fdb
        src = self._tr.snapshot if snapshot else self._tr
        out: list[tuple[bytes, bytes]] = []
        lo, hi = begin, end
        iteration = 1
        while True:
            remaining = limit - len(out) if limit else 0
            fut = src._get_range(
                fdb.KeySelector.first_greater_or_equal(lo),
                fdb.KeySelector.first_greater_or_equal(hi),
                remaining,
                fdb.StreamingMode.want_all,
                iteration,
                reverse,
            )
            kvs, count, more = await _bridge(self._loop, fut, lambda f: f.wait())
            out.extend((bytes(kv.key), bytes(kv.value)) for kv in kvs)
            if not more or not count or (limit and len(out) >= limit):
                return out
            iteration += 1
            if reverse:
                hi = out[-1][0]
            else:
                lo = out[-1][0] + b"\x00"

    async def get_ranges(
        self, ranges: list[tuple[bytes, bytes, int]], *, snapshot: bool = False
    ) -> list[list[tuple[bytes, bytes]]]:
        # Every read is issued before any is awaited: one round trip for the lot, not one per range.
        return list(await asyncio.gather(*(self.get_range(b, e, limit=n, snapshot=snapshot) for b, e, n in ranges)))

    def set(self, key: bytes, value: bytes) -> None:
        self._tr.set(key, value)

    def clear(self, key: bytes) -> None:
        self._tr.clear(key)

    def clear_range(self, begin: bytes, end: bytes) -> None:
        self._tr.clear_range(begin, end)

    def add(self, key: bytes, param: bytes) -> None:
        self._tr.add(key, param)

    def set_versionstamped_key(self, key: bytes, value: bytes) -> None:
        self._tr.set_versionstamped_key(key, value)

    def set_versionstamped_value(self, key: bytes, value: bytes) -> None:
        self._tr.set_versionstamped_value(key, value)

    def add_read_conflict_range(self, begin: bytes, end: bytes) -> None:
        self._tr.add_read_conflict_range(begin, end)

    def next_user_version(self) -> int:
        uv = self._user_version
        self._user_version += 1
        return uv

    def get_versionstamp(self) -> Awaitable[bytes]:
        # Key futures fake ``bytes``; take the real value (fdb-facts.md §2).
        return _bridge(self._loop, self._tr.get_versionstamp(), lambda f: bytes(f.value))

    def watch(self, key: bytes) -> _FdbWatch:
        w = _FdbWatch(_bridge(self._loop, self._tr.watch(key), lambda f: f.wait()))
        self._watches.append(w)
        return w

    async def commit(self) -> None:
        await _bridge(self._loop, self._tr.commit(), lambda f: f.wait())

    async def on_error(self, exc: BaseException) -> None:
        if not isinstance(exc, errors.StoreError):
            raise exc
        try:
            await _bridge(self._loop, self._tr.on_error(exc.code), lambda f: f.wait())
        except errors.StoreError:
            raise exc from None
        self._user_version = 0
        self._watches.clear()

    def cancel(self) -> None:
        self._tr.cancel()


class FoundationDatabase:
    name = "foundationdb"

    def __init__(self, fdb: Any, db: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._fdb = fdb
        self._db = db
        self._loop = loop
        self._groups = TurnGroups(self.transact)

    def create_transaction(self) -> FoundationTransaction:
        return FoundationTransaction(self)

    async def transact(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        return await _metrics.run("foundationdb", self.create_transaction(), fn, args, kwargs)

    async def transact_grouped(self, fn: Callable[..., Awaitable[list[T]]], item: Any, **kwargs: Any) -> T:
        return await self._groups.run(fn, item, kwargs)

    async def close(self) -> None:
        await self._groups.close()
        # The network thread cannot be stopped and restarted in one process (fdb-facts.md §1).
        self._db = None


async def open_foundationdb(cluster_file: str) -> FoundationDatabase:
    fdb = load_bindings()
    db = fdb.open(cluster_file)
    db.options.set_transaction_timeout(_TIMEOUT_MS)
    db.options.set_transaction_retry_limit(_RETRY_LIMIT)
    loop = asyncio.get_running_loop()
    database = FoundationDatabase(fdb, db, loop)
    probe = db.create_transaction()
    try:
        await _bridge(loop, probe.get_read_version(), lambda f: f.wait())
    except errors.StoreError as exc:
        raise RuntimeError(f"FoundationDB at {cluster_file} is not reachable ({exc.code})") from exc
    return database
