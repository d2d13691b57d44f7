"""Fixtures: one contract suite and the Store-level tests, run against every driver available here.

The FoundationDB run needs FDB_CLUSTER_FILE naming a reachable cluster and libfdb_c; without them
it is skipped with exactly that reason (there is no container engine to start one on these machines).
"""

from __future__ import annotations

import asyncio
import os
import struct
import uuid

import msgspec
import pytest
from fdb.tuple import Versionstamp

from upf_keyspace import Settings, Store, keys, open_store
from upf_keyspace.drivers.embedded import open_embedded

DRIVERS = ["embedded", pytest.param("foundationdb", marks=pytest.mark.fdb)]
"""The drivers a driver-parametrised fixture runs each test against."""


def _fdb_unavailable() -> str | None:
    cluster = os.environ.get("FDB_CLUSTER_FILE", "")
    if not cluster:
        return "FoundationDB not reachable: FDB_CLUSTER_FILE is not set and no container engine runs here"
    try:
        from upf_keyspace.drivers.foundation import load_bindings

        load_bindings()
    except RuntimeError as exc:
        return f"FoundationDB not reachable: {exc}"
    return None


@pytest.fixture(params=DRIVERS)
async def db(request, tmp_path):
    """A Database of each driver; keys written by a test live under ``prefix`` (see below)."""
    if request.param == "embedded":
        database = await open_embedded(str(tmp_path / "store.db"))
    else:
        reason = _fdb_unavailable()
        if reason:
            pytest.skip(reason)
        from upf_keyspace.drivers.foundation import open_foundationdb

        database = await open_foundationdb(os.environ["FDB_CLUSTER_FILE"])
    yield database
    if request.param == "foundationdb":

        async def wipe(tr):
            tr.clear_range(b"\x01test-", b"\x01test.")

        await database.transact(wipe)
    await database.close()


@pytest.fixture
async def pair(tmp_path):
    """Two handles on one file: each has its own wake socket, exactly as two processes would."""
    path = str(tmp_path / "store.db")
    a = await open_embedded(path)
    b = await open_embedded(path)
    yield a, b
    await a.close()
    await b.close()


@pytest.fixture
def prefix() -> bytes:
    """A fresh key prefix, so FoundationDB runs never see another run's keys."""
    return b"\x01test-" + uuid.uuid4().hex.encode() + b"/"


class PackableStamp(Versionstamp):
    """fdb.tuple's Versionstamp, packable without libfdb_c, so fdb.tuple.pack and pack_with_versionstamp
    (their framing, 0x33 code and offset) can be the tests' reference on the embedded store. The
    bindings' ``to_bytes`` first checks ``fdb.impl.Value``, which exists only once libfdb_c is loaded
    (fdb-facts.md section 1); this one writes the same documented 12 bytes: the 10-byte transaction
    version (10 x 0xFF while incomplete), then the user version big-endian. test_keys checks them
    against ``Versionstamp.from_bytes``, which needs no library."""

    def to_bytes(self) -> bytes:
        tr = self.tr_version if self.is_complete() else b"\xff" * 10
        return struct.pack(">10sH", tr, self.user_version)


@pytest.fixture(scope="session")
def stamp() -> type[PackableStamp]:
    """The packable Versionstamp class (a session fixture, so hypothesis tests may use it)."""
    return PackableStamp


_STORE_RUN = b"\x01upf-tests/store-run"
"""Set on a FoundationDB cluster while a Store test owns its upf root (see ``new_store``); outside the
range ``db`` wipes, so a contract test never takes it away from a run killed mid-test."""
_UPF_ROOT = (keys.ROOT, keys.strinc(keys.ROOT))


async def _claim_upf_root(database) -> None:
    """Clear the cluster's upf root for a Store test, unless a UPF store these tests did not write is
    there (its format key without the run marker, which only a run killed mid-test leaves behind)."""

    async def claim(tr):
        if await tr.get(_STORE_RUN) is None and await tr.get(keys.format_key()) is not None:
            return False
        tr.clear_range(*_UPF_ROOT)
        tr.set(_STORE_RUN, b"")
        return True

    if not await database.transact(claim):
        pytest.fail(
            f"the FoundationDB cluster of FDB_CLUSTER_FILE ({os.environ['FDB_CLUSTER_FILE']}) holds a UPF store "
            "these tests did not write: refusing to clear it (point FDB_CLUSTER_FILE at a cluster for tests)"
        )


async def _release_upf_root(tr) -> None:
    tr.clear_range(*_UPF_ROOT)
    tr.clear(_STORE_RUN)


@pytest.fixture(params=DRIVERS)
async def new_store(request, tmp_path):
    """Opens Stores of each driver (as ``db`` is parametrised): ``await new_store(shard_count=8)`` is
    ``open_store`` with those settings, every call another handle (another process of a fleet) on one
    store, closed after the test. Embedded: the file ``tmp_path / "upf.db"``. FoundationDB: the cluster
    FDB_CLUSTER_FILE names, whose upf root is cleared before and after the test: a Store's keys live
    under that fixed root, so they cannot take ``prefix`` as the contract suite's do, and one run at a
    time may use a cluster. A test of the embedded driver itself overrides the parameter:
    ``@pytest.mark.parametrize("new_store", ["embedded"], indirect=True)``."""
    root = None
    if request.param == "embedded":
        base = Settings(store_path=str(tmp_path / "upf.db"))
    else:
        reason = _fdb_unavailable()
        if reason:
            pytest.skip(reason)
        from upf_keyspace.drivers.foundation import open_foundationdb

        base = Settings(fdb_cluster_file=os.environ["FDB_CLUSTER_FILE"])
        root = await open_foundationdb(base.fdb_cluster_file)
        try:
            await _claim_upf_root(root)
        except BaseException:
            await root.close()
            raise
    opened: list[Store] = []

    async def open_one(**settings) -> Store:
        store = await open_store(msgspec.structs.replace(base, **settings))
        opened.append(store)
        return store

    yield open_one
    for store in opened:
        await store.close()  # closing again one a test closed itself is harmless
    if root is not None:
        await root.transact(_release_upf_root)
        await root.close()


@pytest.fixture
async def two_stores(new_store):
    """Two handles on one store (file or cluster): two processes of a fleet."""
    return await new_store(shard_count=4), await new_store(shard_count=4)


class Bells:
    """A node's bells as a test waits on them: ``store.bells`` with one event per shard."""

    def __init__(self, store: Store, node: str, shards: int) -> None:
        self.rang = [asyncio.Event() for _ in range(shards)]
        self.set = store.bells(node, [e.set for e in self.rang])

    async def wait(self, shard: int, timeout: float = 2) -> None:
        """Wait for ``shard``'s bell to ring, and take the ring."""
        await asyncio.wait_for(self.rang[shard].wait(), timeout)
        self.rang[shard].clear()


@pytest.fixture
def bells():
    """``bells(store, node, shards)``: a ``Bells``, its watch set cancelled after the test."""
    made: list[Bells] = []

    def make(store: Store, node: str, shards: int = 8) -> Bells:
        made.append(b := Bells(store, node, shards))
        return b

    yield make
    for b in made:
        b.set.cancel()
