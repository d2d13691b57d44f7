"""The FoundationDB driver's own logic, run against a small fake of the binding objects it touches.

No libfdb_c or cluster exists on these machines, so this does not test FoundationDB: the fake
(``FakeCluster``: ``create_transaction``; transactions recording mutations and applying them at
commit; futures with ``on_ready``/``wait``/``value``/``cancel``; errors with ``code`` and
``description``) only plays the parts of its behaviour the driver's logic reacts to, as fdb-facts.md
describes them: a commit that raises commit_unknown_result (1021) after it applied, or without;
``on_error`` that backs off or fails; the versionstamp future that resolves after a successful
commit and fails otherwise (2021 read-only, 2020 failed commit, 1025 reset); watches failed with the
commit's error. What it checks is the driver's: the commit marker, the replay after a 1021, the
error ``on_error`` raises, and that no future is left failed with nobody to retrieve it.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
import types
from typing import Any

import pytest

from upf_keyspace import errors, keys
from upf_keyspace.drivers import foundation
from upf_keyspace.telemetry import REGISTRY

RETRYABLE = {errors.NOT_COMMITTED, errors.COMMIT_UNKNOWN_RESULT, errors.TRANSACTION_TOO_OLD}
PLACEHOLDER = b"\xff" * 10


class FakeError(Exception):
    def __init__(self, code: int) -> None:
        self.code = code
        self.description = f"fake error {code}"


class FakeFuture:
    """Ready once resolved; callbacks run as the binding runs them (at once if ready, else later)."""

    def __init__(self) -> None:
        self.ready = False
        self._value: Any = None
        self._error: FakeError | None = None
        self._callbacks: list[Any] = []

    def resolve(self, value: Any = None, error: int | None = None) -> None:
        if self.ready:
            return
        self.ready = True
        self._value = value
        self._error = None if error is None else FakeError(error)
        callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            cb(self)

    def on_ready(self, cb: Any) -> None:
        if self.ready:
            cb(self)
        else:
            self._callbacks.append(cb)

    def wait(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._value

    @property
    def value(self) -> Any:
        return self.wait()

    def cancel(self) -> None:
        self.resolve(error=1101)  # operation_cancelled


def ready(value: Any = None, error: int | None = None) -> FakeFuture:
    f = FakeFuture()
    f.resolve(value, error)
    return f


class FakeTransaction:
    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster
        self.snapshot = self
        self._reset()

    def _reset(self) -> None:
        self.mutations: list[tuple[str, bytes, bytes]] = []
        self.stamps: list[FakeFuture] = []
        self.watches: list[FakeFuture] = []

    def _fail_pending(self, code: int) -> None:
        for f in self.stamps + self.watches:
            f.resolve(error=code)

    def get(self, key: bytes) -> FakeFuture:
        self.cluster.reads.append(key)
        if self.cluster.read_fails:
            return ready(error=self.cluster.read_fails.pop(0))
        return ready(self.cluster.data.get(key))

    def set(self, key: bytes, value: bytes) -> None:
        self.mutations.append(("set", key, value))

    def clear(self, key: bytes) -> None:
        self.mutations.append(("clear", key, b""))

    def clear_range(self, begin: bytes, end: bytes) -> None:
        self.mutations.append(("clear_range", begin, end))

    def add(self, key: bytes, param: bytes) -> None:
        self.mutations.append(("add", key, param))

    def set_versionstamped_key(self, key: bytes, value: bytes) -> None:
        self.mutations.append(("vs_key", key, value))

    def set_versionstamped_value(self, key: bytes, value: bytes) -> None:
        self.mutations.append(("vs_value", key, value))

    def get_versionstamp(self) -> FakeFuture:
        f = FakeFuture()
        self.stamps.append(f)
        return f

    def watch(self, key: bytes) -> FakeFuture:
        f = FakeFuture()
        self.watches.append(f)
        return f

    def commit(self) -> FakeFuture:
        cluster = self.cluster
        cluster.commits.append(list(self.mutations))
        if not self.mutations:  # read-only: nothing sent, no commit version
            for f in self.stamps:
                f.resolve(error=errors.NO_COMMIT_VERSION)
            return ready()
        outcome = cluster.outcomes.pop(0) if cluster.outcomes else "ok"
        if outcome in ("ok", "applied-1021"):
            stamp = cluster.apply(self.mutations)
        if outcome == "ok":
            for f in self.stamps:
                f.resolve(stamp)
            return ready()
        code = {"applied-1021": 1021, "lost-1021": 1021, "1020": 1020}[outcome]
        for f in self.stamps:
            f.resolve(error=2020)  # transaction_invalid_version
        for f in self.watches:
            f.resolve(error=code)
        return ready(error=code)

    def on_error(self, code: int) -> FakeFuture:
        fails = self.cluster.on_error_fails.get(code)
        if fails is not None:
            return ready(error=fails)
        if code not in RETRYABLE:
            return ready(error=code)
        self._fail_pending(errors.TRANSACTION_CANCELLED)
        self._reset()
        return ready()

    def cancel(self) -> None:
        self._fail_pending(errors.TRANSACTION_CANCELLED)


class FakeCluster:
    """``fdb.open``'s database: what ``FoundationDatabase`` calls ``create_transaction`` on."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}
        self.version = 1_000
        self.outcomes: list[str] = []
        """How the next write commits end: "ok", "applied-1021", "lost-1021" or "1020"."""
        self.on_error_fails: dict[int, int] = {}
        self.read_fails: list[int] = []
        self.reads: list[bytes] = []
        """Codes the next reads fail with."""
        self.commits: list[list[tuple[str, bytes, bytes]]] = []
        self.stamps: list[bytes] = []
        self.transactions: list[FakeTransaction] = []

    def create_transaction(self) -> FakeTransaction:
        tr = FakeTransaction(self)
        self.transactions.append(tr)
        return tr

    def apply(self, mutations: list[tuple[str, bytes, bytes]]) -> bytes:
        self.version += 7
        stamp = self.version.to_bytes(8, "big") + b"\x00\x01"
        self.stamps.append(stamp)
        for op, key, value in mutations:
            if op == "set":
                self.data[key] = value
            elif op == "clear":
                self.data.pop(key, None)
            elif op == "clear_range":
                for k in [k for k in self.data if key <= k < value]:
                    del self.data[k]
            elif op == "vs_key":
                at = int.from_bytes(key[-4:], "little")
                assert key[at : at + 10] == PLACEHOLDER
                self.data[key[:at] + stamp + key[at + 10 : -4]] = value
            elif op == "vs_value":
                at = int.from_bytes(value[-4:], "little")
                assert value[at : at + 10] == PLACEHOLDER
                self.data[key] = value[:at] + stamp + value[at + 10 : -4]
            else:
                raise AssertionError(op)
        return stamp

    def markers(self) -> dict[bytes, bytes]:
        begin, end = keys.prefix_range(keys.Prefix.COMMIT_MARKER)
        return {k: v for k, v in self.data.items() if begin <= k < end}

    def queue(self, topic: str) -> list[bytes]:
        begin, end = keys.queue_range(topic)
        return sorted(k for k in self.data if begin <= k < end)


@pytest.fixture
def cluster() -> FakeCluster:
    return FakeCluster()


@pytest.fixture
async def db(cluster):
    fake_fdb = types.SimpleNamespace()  # the module: only get_range reaches for it, these tests do not
    return foundation.FoundationDatabase(fake_fdb, cluster, asyncio.get_running_loop())


def publisher():
    """A body like a publish: a versionstamped append, and the commit's stamp handed out."""
    runs = []

    async def publish(tr, topic: str, message: bytes):
        runs.append(1)
        uv = tr.next_user_version()
        tr.set_versionstamped_key(keys.queue_key_incomplete(topic, uv), message)
        return uv, tr.get_versionstamp()

    return publish, runs


async def test_an_unknown_result_that_applied_returns_the_first_result_with_the_markers_stamp(db, cluster):
    """A 1021 after a commit that applied: the body ran once, one message was stored, and the stamp
    handed out is that commit's, read back from the marker."""
    publish, runs = publisher()
    cluster.outcomes = ["applied-1021"]
    uv, stamp = await db.transact(publish, "t", b"m")
    assert len(runs) == 1
    assert [keys.unpack_queue_key(k)[1] for k in cluster.queue("t")] == [cluster.stamps[0] + uv.to_bytes(2, "big")]
    assert await asyncio.wait_for(stamp, 1) == cluster.stamps[0]
    assert len(cluster.stamps) == 1  # the replay committed nothing
    assert list(cluster.markers().values()) == [cluster.stamps[0]]


async def test_an_unknown_result_that_did_not_apply_runs_the_body_again(db, cluster):
    """A 1021 after a commit that did not apply: the retry asks the marker first, finds none, and
    runs the body again; one message stored, and one marker, the second commit's."""
    publish, runs = publisher()
    cluster.outcomes = ["lost-1021"]
    uv, stamp = await db.transact(publish, "t", b"m")
    assert len(runs) == 2
    assert [keys.prefix_of(k) for k in cluster.reads] == [keys.Prefix.COMMIT_MARKER]
    assert list(cluster.markers()) == cluster.reads
    assert [keys.unpack_queue_key(k)[1] for k in cluster.queue("t")] == [cluster.stamps[0] + uv.to_bytes(2, "big")]
    assert await asyncio.wait_for(stamp, 1) == cluster.stamps[0]


async def test_a_second_unknown_result_is_resolved_by_the_same_marker(db, cluster):
    """1021 (lost), then 1021 again (applied): the third attempt finds the second's marker."""
    publish, runs = publisher()
    cluster.outcomes = ["lost-1021", "applied-1021"]
    _, stamp = await db.transact(publish, "t", b"m")
    assert len(runs) == 2 and len(cluster.queue("t")) == 1
    assert await asyncio.wait_for(stamp, 1) == cluster.stamps[0]


async def test_a_failed_marker_read_is_retried_before_the_body(db, cluster):
    """The marker read after a 1021 fails (too old, retryable): the next attempt reads it again
    rather than running the body."""
    publish, runs = publisher()
    cluster.outcomes = ["applied-1021"]
    cluster.read_fails = [errors.TRANSACTION_TOO_OLD]
    _, stamp = await db.transact(publish, "t", b"m")
    assert len(runs) == 1 and len(cluster.queue("t")) == 1
    assert await asyncio.wait_for(stamp, 1) == cluster.stamps[0]


async def test_a_write_commit_sets_one_marker_and_a_read_only_one_none(db, cluster):
    """The marker: TX / the call's second / 16 random bytes -> the commit's stamp. A read-only
    transaction writes none, and its stamp future fails with 2021."""
    t0 = int(time.time())

    async def read(tr):
        await tr.get(b"\x01x")
        return tr.get_versionstamp()

    stamp = await db.transact(read)
    assert cluster.commits == [[]] and cluster.markers() == {}
    with pytest.raises(errors.StoreError) as raised:
        await stamp
    assert raised.value.code == errors.NO_COMMIT_VERSION

    async def write(tr):
        tr.set(b"\x01x", b"1")

    await db.transact(write)
    ((key, value),) = cluster.markers().items()
    second, txid = keys.unpack_commit_marker_key(key)
    assert t0 <= second <= time.time() and len(txid) == 16
    assert value == cluster.stamps[-1]


async def test_a_failing_on_error_raises_its_own_error(db, cluster):
    """A conflict, then on_error itself fails (a timeout during the back-off): the 1031 is raised and
    counted, not the 1020 it was given."""
    cluster.outcomes = ["1020"]
    cluster.on_error_fails = {errors.NOT_COMMITTED: errors.TRANSACTION_TIMED_OUT}
    before = REGISTRY.value("upf.store.failures", driver="foundationdb", code="1031")

    async def write(tr):
        tr.set(b"\x01x", b"1")

    with pytest.raises(errors.StoreError) as raised:
        await db.transact(write)
    assert raised.value.code == errors.TRANSACTION_TIMED_OUT
    assert REGISTRY.value("upf.store.failures", driver="foundationdb", code="1031") == before + 1


async def test_no_future_is_left_failed_with_nobody_to_retrieve_it(db, cluster, caplog):
    """Stamps and watches of attempts that failed (a conflict, a body error, a failed back-off) and the
    stamp of a read-only commit: none logs 'Future exception was never retrieved'."""
    caplog.set_level(logging.ERROR, logger="asyncio")

    async def write(tr, fail: Exception | None = None):
        tr.set(b"\x01x", b"1")
        stamp, bell = tr.get_versionstamp(), tr.watch(b"\x01bell")
        if fail is not None:
            raise fail
        return stamp, bell

    cluster.outcomes = ["1020"]  # retried: the first attempt's stamp and watch fail
    stamp, bell = await db.transact(write)
    assert await asyncio.wait_for(stamp, 1) == cluster.stamps[-1]
    bell.cancel()

    async def read_only(tr):
        return tr.get_versionstamp(), await tr.get(b"\x01x")

    await db.transact(read_only)  # a publish whose items were all duplicates: the stamp is never awaited

    with pytest.raises(ValueError):
        await db.transact(write, ValueError("body"))  # cancelled

    cluster.outcomes = ["applied-1021"]  # replayed: its watch carries the 1021, and is dropped unawaited
    await db.transact(write)

    cluster.outcomes = ["1020"]
    cluster.on_error_fails = {errors.NOT_COMMITTED: errors.TRANSACTION_TIMED_OUT}
    with pytest.raises(errors.StoreError):
        await db.transact(write)  # the loop ends in on_error

    for _ in range(5):
        await asyncio.sleep(0)  # the bridges' call_soon_threadsafe hops
    cluster.transactions.clear()
    gc.collect()
    await asyncio.sleep(0)
    assert [r.getMessage() for r in caplog.records if "never retrieved" in r.getMessage()] == []


async def test_a_call_after_close_is_the_contracts_error_not_an_attribute_error(db) -> None:
    """As the embedded driver answers it: a StoreError a caller handles, not a bug."""

    async def body(tr):
        return None

    await db.close()
    for call in (lambda: db.transact(body), lambda: db.transact_grouped(body, 1)):
        with pytest.raises(errors.StoreError) as info:
            await call()
        assert info.value.code == errors.CLIENT_INVALID_OPERATION
    with pytest.raises(errors.StoreError):
        db.create_transaction()


def test_a_binding_errors_description_is_text() -> None:
    """The binding's FDBError.description is a c_char_p (bytes); StoreError.detail is text."""
    err = FakeError(errors.NOT_COMMITTED)
    err.description = b"Transaction not committed due to conflict with another transaction"  # type: ignore[assignment]
    wrapped = foundation._wrap(err)
    assert isinstance(wrapped, errors.StoreError)
    assert wrapped.detail == "Transaction not committed due to conflict with another transaction"


async def test_a_cluster_file_fdb_cannot_open_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(path: str) -> None:
        raise FakeError(2104)  # connection_string_invalid

    monkeypatch.setattr(foundation, "load_bindings", lambda: types.SimpleNamespace(open=refuse))
    with pytest.raises(RuntimeError, match=r"FoundationDB cluster file /nowhere/fdb\.cluster cannot be used"):
        await foundation.open_foundationdb("/nowhere/fdb.cluster")


async def _settle_loop() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_watch_set_calls_each_armed_key_once_and_an_arming_replaces_the_last(db, cluster):
    """A fired watch calls its key's callback once; arming a key again cancels its earlier watch (whose
    firing then calls nothing); an unarmed key's callback never runs; a cancelled set calls nothing."""
    calls: list[int] = []
    ws = db.watch_set([b"k0", b"k1", b"k2"], [lambda i=i: calls.append(i) for i in range(3)])

    async def arm(tr, indexes):
        tr.arm(ws, indexes)

    await db.transact(arm, [0, 1])
    first = cluster.transactions[-1].watches
    assert len(first) == 2 and sorted(ws.armed) == [0, 1]
    first[0].resolve()
    await _settle_loop()
    assert calls == [0] and sorted(ws.armed) == [1]
    await db.transact(arm, [1])  # armed again while armed: the first watch on k1 is cancelled
    second = cluster.transactions[-1].watches
    first[1].resolve()  # a late firing of the replaced watch
    await _settle_loop()
    assert calls == [0]
    second[0].resolve()
    await _settle_loop()
    assert calls == [0, 1] and ws.armed == {}
    await db.transact(arm, [0, 2])
    third = cluster.transactions[-1].watches
    ws.cancel()
    for f in third:
        f.resolve()
    await _settle_loop()
    assert calls == [0, 1] and ws.armed == {}
    await db.transact(arm, [0])  # a cancelled set is never armed again
    cluster.transactions[-1].watches[0].resolve()
    await _settle_loop()
    assert calls == [0, 1]


async def test_a_failed_watch_in_a_set_calls_late_and_a_dropped_attempts_watch_not_at_all(db, cluster, caplog):
    """A watch the cluster fails calls its callback after a pause (a caller re-drains and re-arms, never
    spins), with a warning; the watches of an attempt whose commit failed are dropped with it: only
    the attempt that committed arms the key."""
    calls: list[int] = []
    ws = db.watch_set([b"k0"], [lambda: calls.append(0)])

    async def arm(tr):
        tr.arm(ws, [0])

    await db.transact(arm)
    with caplog.at_level(logging.WARNING, logger="upf.store.foundationdb"):
        cluster.transactions[-1].watches[0].resolve(error=errors.TOO_MANY_WATCHES)
        await _settle_loop()
        assert calls == []  # not at once
        await asyncio.sleep(foundation._FAILED_WATCH_PAUSE + 0.1)
    assert calls == [0]
    assert [r.getMessage() for r in caplog.records] == ["watch failed"]

    async def arm_and_write(tr):
        tr.set(b"k-other", b"1")
        tr.arm(ws, [0])

    cluster.outcomes = ["1020", "ok"]
    await db.transact(arm_and_write)
    attempts = cluster.transactions[-1]
    assert len(ws.armed) == 1
    await asyncio.sleep(foundation._FAILED_WATCH_PAUSE + 0.1)
    assert calls == [0]  # the failed attempt's watch neither called nor rang late
    attempts.watches[-1].resolve()
    await _settle_loop()
    assert calls == [0, 0]


async def test_a_watch_set_refuses_a_callback_count_unlike_its_keys_and_another_databases_transaction(db, cluster):
    with pytest.raises(ValueError, match="one callback per key"):
        db.watch_set([b"k0", b"k1"], [lambda: None])
    other = foundation.FoundationDatabase(types.SimpleNamespace(), FakeCluster(), asyncio.get_running_loop())
    ws = other.watch_set([b"k0"], [lambda: None])

    async def arm(tr):
        tr.arm(ws, [0])

    with pytest.raises(TypeError, match="another store"):
        await db.transact(arm)
    assert ws.armed == {}
