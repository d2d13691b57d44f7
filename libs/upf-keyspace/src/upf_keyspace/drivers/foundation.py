"""The FoundationDB driver: the real ``foundationdb`` bindings (7.3 series, API version 730).

The bindings block; this bridges each FDB future into asyncio with ``on_ready`` and
``call_soon_threadsafe`` (fdb-facts.md §5, option b), so the event loop never waits on the network
thread. The callback only hops threads; the future is read on the loop, where it is already ready.
Transaction timeout and retry limit are set once, at open. Watches are returned as awaitables the
caller must pair with a timeout (a watch on an unreachable cluster never fires nor fails).

commit_unknown_result (1021) is retried by FoundationDB's rules, but a write body is not run twice
for it: every write commit of ``transact`` also sets a commit marker (keys: TX; CouchDB's
fabric2_txids), and the attempt after a 1021 reads it first. Present: that commit applied, and its
result is returned with its stamp. Absent: it never will (FoundationDB's guarantee once 1021 is
raised), so the body runs again. A timeout (1031) has no such guarantee and stays an error.

Unexercised on the machines this was written on: no libfdb_c or cluster can be installed there. The
contract suite runs against it wherever FDB_CLUSTER_FILE names a reachable cluster.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar, cast

from .. import errors, keys
from ..contract import WatchSet
from . import _metrics
from ._turns import TurnGroups

__all__ = ["FoundationDatabase", "open_foundationdb", "API_VERSION", "load_bindings"]

API_VERSION = 730
_TIMEOUT_MS = 5_000
_RETRY_LIMIT = 100
T = TypeVar("T")
_MARKER_VALUE = keys.commit_marker_value_incomplete()
_UNSET: Any = object()
_FAILED_WATCH_PAUSE = 0.05
log = logging.getLogger("upf.store.foundationdb")


def load_bindings() -> Any:
    """Import fdb and select API 730, or raise ``StoreOpenError`` saying why FoundationDB can't be used."""
    import fdb

    try:
        if not fdb.is_api_version_selected():
            fdb.api_version(API_VERSION)
    except Exception as exc:  # a missing libfdb_c raises a bare Exception (fdb-facts.md §1)
        raise errors.StoreOpenError(f"FoundationDB client library unavailable: {exc}") from exc
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
        detail = getattr(exc, "description", "")
        if isinstance(detail, bytes):  # the binding's description is a c_char_p: bytes
            detail = detail.decode("utf-8", "replace")
        return errors.StoreError(code, detail)
    return exc


def _discard(f: asyncio.Future[Any]) -> None:
    """Let go of a failed attempt's future: cancel it, or take its error (else asyncio logs 'Future
    exception was never retrieved' when it is collected)."""
    if not f.cancel() and not f.cancelled():
        f.exception()


def _retrieved(f: asyncio.Future[Any]) -> None:
    if not f.cancelled():
        f.exception()


def _settle(out: asyncio.Future[bytes], src: asyncio.Future[bytes]) -> None:
    """Pass the binding's versionstamp on to the future the body was handed."""
    if src.cancelled():
        out.cancel()
    elif out.done():
        src.exception()
    elif (exc := src.exception()) is not None:
        out.set_exception(exc)
    else:
        out.set_result(src.result())


class _FdbWatch:
    __slots__ = ("_future", "dropped")

    def __init__(self, future: asyncio.Future[Any]) -> None:
        self._future = future
        self.dropped = False
        """Its transaction's attempt failed: the binding fails it with that attempt's error."""

    def __await__(self) -> Any:
        return self._future.__await__()

    def done(self) -> bool:
        return self._future.done()

    def cancel(self) -> None:
        self._future.cancel()


class _FdbWatchSet:
    """``WatchSet`` over real watches: one per armed key, its callback on the loop when it fires. An
    arming replaces the key's earlier watch (cancelled: it never calls). A watch that fails calls after
    ``_FAILED_WATCH_PAUSE`` (the caller drains, finds nothing and re-arms: a failing cluster never
    makes it spin), unless its transaction's attempt failed (the attempt that commits arms the key) or
    the key was armed again meanwhile."""

    __slots__ = ("db", "keys", "callbacks", "armed", "closed", "_loop")

    def __init__(self, db: FoundationDatabase, keys: Sequence[bytes], callbacks: Sequence[Callable[[], None]]) -> None:
        if len(keys) != len(callbacks):
            raise ValueError("a watch set needs one callback per key")
        self.db = db
        self._loop = db._loop
        self.keys = list(keys)
        self.callbacks = list(callbacks)
        self.armed: dict[int, _FdbWatch] = {}
        self.closed = False

    def add(self, i: int, w: _FdbWatch) -> None:
        if self.closed:
            w.cancel()
            return
        old = self.armed.get(i)
        if old is not None:
            old.cancel()
        self.armed[i] = w
        w._future.add_done_callback(functools.partial(self._done, i, w))

    def _done(self, i: int, w: _FdbWatch, fut: asyncio.Future[Any]) -> None:
        if self.armed.get(i) is not w:
            if not fut.cancelled():
                fut.exception()  # retrieved: a replaced watch that failed is nobody's error
            return
        del self.armed[i]
        if fut.cancelled():  # its transaction's attempt was dropped: the caller arms again or fails
            return
        exc = fut.exception()
        if exc is None:
            self.callbacks[i]()
        else:  # judged later: the attempt's failure reaches its transaction after its watches'
            self._loop.call_later(_FAILED_WATCH_PAUSE, self._late, i, w, exc)

    def _late(self, i: int, w: _FdbWatch, exc: BaseException) -> None:
        if self.closed or w.dropped or i in self.armed:
            return
        log.warning("watch failed", extra={"key": self.keys[i].hex(), "error": repr(exc)})
        self.callbacks[i]()

    def cancel(self) -> None:
        self.closed = True
        armed, self.armed = self.armed, {}
        for w in armed.values():
            w.cancel()


_Unknown = tuple[Any, "asyncio.Future[bytes] | None", list[_FdbWatch]]
"""What an attempt whose commit raised 1021 handed out: its result, stamp future and watches."""


class FoundationTransaction:
    __slots__ = (
        "_db",
        "_tr",
        "_loop",
        "_user_version",
        "_watches",
        "_stamp",
        "_wrote",
        "_marker",
        "_result",
        "_unknown",
    )

    def __init__(self, db: FoundationDatabase, marker: bytes | None = None) -> None:
        self._db = db
        self._tr = db._db.create_transaction()
        self._loop = db._loop
        self._user_version = 0
        self._watches: list[_FdbWatch] = []
        self._stamp: asyncio.Future[bytes] | None = None
        self._wrote = False
        self._marker = marker
        """Set by ``transact``: the key a write commit also sets, so a 1021 can be resolved."""
        self._result: Any = _UNSET
        self._unknown: _Unknown | None = None

    async def _attempt(self, fn: Callable[..., Awaitable[T]], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
        """One attempt of ``transact``. After a 1021, the marker says whether that commit applied:
        then its result is the answer (its stamp the marker's), not a second run of ``fn``."""
        unknown = self._unknown
        if unknown is not None:
            assert self._marker is not None
            stamp = await self.get(self._marker, snapshot=True)
            self._unknown = None
            if stamp is not None:
                result, future, watches = unknown
                if future is not None and not future.done():
                    future.set_result(stamp[:10])
                for w in watches:  # the binding failed them with the 1021; a caller may never look
                    w._future.add_done_callback(_retrieved)
                return cast(T, result)
            self._drop(unknown)
        result = await fn(self, *args, **kwargs)
        self._result = result
        return result

    def _drop(self, attempt: _Unknown) -> None:
        _, stamp, watches = attempt
        if stamp is not None:
            _discard(stamp)
        for w in watches:
            w.dropped = True
            _discard(w._future)

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
        self._wrote = True
        self._tr.set(key, value)

    def clear(self, key: bytes) -> None:
        self._wrote = True
        self._tr.clear(key)

    def clear_range(self, begin: bytes, end: bytes) -> None:
        self._wrote = True
        self._tr.clear_range(begin, end)

    def add(self, key: bytes, param: bytes) -> None:
        self._wrote = True
        self._tr.add(key, param)

    def set_versionstamped_key(self, key: bytes, value: bytes) -> None:
        self._wrote = True
        self._tr.set_versionstamped_key(key, value)

    def set_versionstamped_value(self, key: bytes, value: bytes) -> None:
        self._wrote = True
        self._tr.set_versionstamped_value(key, value)

    def add_read_conflict_range(self, begin: bytes, end: bytes) -> None:
        self._tr.add_read_conflict_range(begin, end)

    def next_user_version(self) -> int:
        uv = self._user_version
        self._user_version += 1
        return uv

    def get_versionstamp(self) -> Awaitable[bytes]:
        """The driver's future, not the binding's: the marker may be what resolves it (after a
        1021), and a failed attempt's is cancelled rather than left failed."""
        if self._stamp is None:
            self._stamp = self._loop.create_future()
        return self._stamp

    def watch(self, key: bytes) -> _FdbWatch:
        w = _FdbWatch(_bridge(self._loop, self._tr.watch(key), lambda f: f.wait()))
        self._watches.append(w)
        return w

    def arm(self, ws: WatchSet, indexes: Sequence[int]) -> None:
        if not isinstance(ws, _FdbWatchSet) or ws.db is not self._db:
            raise TypeError("a watch set of another store")
        for i in indexes:
            ws.add(i, self.watch(ws.keys[i]))

    async def commit(self) -> None:
        fdb_stamp = None
        if self._wrote:  # a read-only commit writes no marker and has no stamp (2021)
            if self._marker is not None:
                self._tr.set_versionstamped_value(self._marker, _MARKER_VALUE)
            if self._stamp is not None:
                fdb_stamp = self._tr.get_versionstamp()  # before commit (fdb-facts.md §2)
        await _bridge(self._loop, self._tr.commit(), lambda f: f.wait())
        stamp = self._stamp
        if stamp is None or stamp.done():
            return
        if fdb_stamp is None:
            stamp.set_exception(errors.StoreError(errors.NO_COMMIT_VERSION))
            stamp.exception()  # retrieved: a read-only caller may never await it
            return
        # Key futures fake ``bytes``; take the real value (fdb-facts.md §2).
        bridged = _bridge(self._loop, fdb_stamp, lambda f: bytes(f.value))
        bridged.add_done_callback(functools.partial(_settle, stamp))

    async def on_error(self, exc: BaseException) -> None:
        """Back off and reset as FoundationDB decides, or raise the error that ends the loop: on_error's
        own when it fails (a timeout during the back-off, say), not the one it was given."""
        if not isinstance(exc, errors.StoreError):
            raise exc
        attempt: _Unknown = (self._result, self._stamp, self._watches)
        self._result, self._stamp, self._watches = _UNSET, None, []
        if exc.code == errors.COMMIT_UNKNOWN_RESULT and self._wrote and self._marker and attempt[0] is not _UNSET:
            self._unknown = attempt  # the next attempt reads the marker first
        else:
            self._drop(attempt)
        try:
            await _bridge(self._loop, self._tr.on_error(exc.code), lambda f: f.wait())
        except BaseException as ended:
            if self._unknown is not None:
                self._drop(self._unknown)
                self._unknown = None
            if isinstance(ended, errors.StoreError) and ended.code == exc.code:
                raise exc from None
            raise
        self._user_version = 0
        self._wrote = False

    def cancel(self) -> None:
        self._drop((None, self._stamp, self._watches))
        if self._unknown is not None:
            self._drop(self._unknown)
            self._unknown = None
        self._tr.cancel()


class FoundationDatabase:
    name = "foundationdb"

    def __init__(self, fdb: Any, db: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._fdb = fdb
        self._db = db
        self._loop = loop
        self._groups = TurnGroups(self.transact)

    def _open(self) -> None:
        if self._db is None:  # as the embedded driver answers a call after close
            raise errors.StoreError(errors.CLIENT_INVALID_OPERATION, "database closed")

    def create_transaction(self) -> FoundationTransaction:
        self._open()
        return FoundationTransaction(self)

    def watch_set(self, keys: Sequence[bytes], callbacks: Sequence[Callable[[], None]]) -> _FdbWatchSet:
        return _FdbWatchSet(self, keys, callbacks)

    async def transact(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        self._open()
        # The marker key is chosen once per call, outside the retry loop: every attempt sets the same one.
        tr = FoundationTransaction(self, keys.commit_marker_key(int(time.time()), os.urandom(16)))
        result: T = await _metrics.run("foundationdb", tr, FoundationTransaction._attempt, (fn, args, kwargs), {})
        return result

    async def transact_grouped(self, fn: Callable[..., Awaitable[list[T]]], item: Any, **kwargs: Any) -> T:
        return await self._groups.run(fn, item, kwargs)

    async def close(self) -> None:
        await self._groups.close()
        # The network thread cannot be stopped and restarted in one process (fdb-facts.md §1).
        self._db = None


async def open_foundationdb(cluster_file: str) -> FoundationDatabase:
    fdb = load_bindings()
    try:
        db = fdb.open(cluster_file)
    except Exception as exc:  # a cluster file that is missing or malformed: the binding's FDBError
        raise errors.StoreOpenError(f"FoundationDB cluster file {cluster_file} cannot be used: {exc}") from exc
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
