"""The embedded store's files are private to UPF's user whatever the umask: directories it creates
0700, the store file and its lock file 0600; what already exists keeps its mode."""

from __future__ import annotations

import os
import stat

import pytest

from upf_keyspace.drivers._wake import wake_dir
from upf_keyspace.drivers.embedded import open_embedded


def _mode(path: str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def open_umask():
    """The loosest umask: nothing UPF creates may rely on the umask to be private."""
    old = os.umask(0)
    yield
    os.umask(old)


async def test_store_file_its_lock_file_and_directories_are_private(tmp_path, open_umask) -> None:
    os.chmod(tmp_path, 0o755)
    path = str(tmp_path / "a" / "b" / "upf.db")
    db = await open_embedded(path)
    try:

        async def body(tr):
            tr.set(b"\x01private/k", b"v")

        await db.transact(body)
        assert os.path.exists(path + "-lock")
        modes = {p: _mode(p) for p in (path, path + "-lock", path + ".mark")}
        assert modes == {p: 0o600 for p in modes}
        assert (_mode(str(tmp_path / "a")), _mode(str(tmp_path / "a" / "b")), _mode(wake_dir(path))) == (0o700,) * 3
        assert _mode(str(tmp_path)) == 0o755  # a directory that was there is left alone
    finally:
        await db.close()


async def test_an_existing_store_file_keeps_its_mode(tmp_path, open_umask) -> None:
    path = str(tmp_path / "upf.db")
    open(path, "wb").close()
    os.chmod(path, 0o640)
    db = await open_embedded(path)
    await db.close()
    assert _mode(path) == 0o640
