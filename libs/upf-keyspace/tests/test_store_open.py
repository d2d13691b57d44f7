"""Opening the embedded store: a path that cannot hold one is ``StoreOpenError`` (a setting to fix:
the entry points exit 2 and no supervisor restarts them), a failure of the moment stays what it was
(a restart may cure it)."""

from __future__ import annotations

import errno

import lmdb
import pytest

from upf_keyspace import StoreOpenError
from upf_keyspace.drivers.embedded import database, open_embedded


async def test_a_directory_is_a_store_open_error_naming_the_path(tmp_path) -> None:
    path = tmp_path / "upf.db"
    path.mkdir()
    with pytest.raises(StoreOpenError, match=f"UPF_STORE_PATH {path} cannot be opened: Is a directory"):
        await open_embedded(str(path))


@pytest.mark.parametrize(
    "failure",
    [OSError(errno.EMFILE, "Too many open files"), lmdb.ReadersFullError("mdb_txn_begin: MDB_READERS_FULL")],
    ids=["no-descriptors", "readers-full"],
)
async def test_a_failure_of_the_moment_is_not_a_setting_to_fix(tmp_path, monkeypatch, failure) -> None:
    def fail(path: str) -> None:
        raise failure

    monkeypatch.setattr(database, "_open_file", fail)
    with pytest.raises(type(failure)) as raised:
        await open_embedded(str(tmp_path / "upf.db"))
    assert not isinstance(raised.value, StoreOpenError)
