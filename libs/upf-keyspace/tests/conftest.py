"""Fixtures: one contract suite, run against every driver available here.

The FoundationDB run needs FDB_CLUSTER_FILE naming a reachable cluster and libfdb_c; without them
it is skipped with exactly that reason (there is no container engine to start one on these machines).
"""

from __future__ import annotations

import os
import struct
import uuid

import pytest
from fdb.tuple import Versionstamp

from upf_keyspace import Settings, open_store
from upf_keyspace.drivers.embedded import open_embedded


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


@pytest.fixture(params=["embedded", pytest.param("foundationdb", marks=pytest.mark.fdb)])
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


@pytest.fixture
async def two_stores(tmp_path):
    """Two stores on one file: two processes of a fleet."""
    settings = Settings(store_path=str(tmp_path / "upf.db"), shard_count=4)
    a, b = await open_store(settings), await open_store(settings)
    yield a, b
    await a.close()
    await b.close()
