"""``upf backup`` / ``upf restore`` (issue 14 #9), black box: real processes, the CLI, real clients.

Publish, back up while serving, publish more, lose the store, restore into a new one: every message
from before the backup is there with its id, ``since=<old id>`` works, and a new message's id sorts
after every old one (ids never go backwards)."""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
import sys
from pathlib import Path

import httpx

from tests.clients.ntfy import poll
from tests.conftest import Fleet


def upf_cli(store: str, *argv: str, **env_extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UPF_", "OTEL_"))}
    env.update(UPF_STORE_PATH=store, **env_extra)
    return subprocess.run([sys.executable, "-m", "upf", *argv], env=env, capture_output=True, text=True, timeout=60)


def stamp(msg_id: str) -> bytes:
    """An id's bytes (ids are base64url of the 12-byte stamp, whose byte order is commit order)."""
    return base64.urlsafe_b64decode(msg_id + "=" * (-len(msg_id) % 4))


def test_backup_while_serving_then_restore_keeps_ids_and_new_ids_sort_after(tmp_path: Path) -> None:
    first = Fleet(tmp_path)
    try:
        upf = first.start("upf", node="bk", UPF_WORKERS="1")
        assert upf_cli(first.store, "user", "add", "phil", UPF_PASSWORD="secret-pw").returncode == 0
        with httpx.Client(base_url=upf.base, timeout=5) as http:
            before = [http.post("/upBACKUP0001?up=1", content=f"m{i}").json() for i in range(30)]
            before.append(http.post("/upBACKUP0002", content="titled", headers={"Title": "hello"}).json())
            done = upf_cli(first.store, "backup", str(tmp_path / "upf.backup"))
            assert done.returncode == 0, done.stderr
            after = http.post("/upBACKUP0001?up=1", content="after the backup").json()
        assert (tmp_path / "upf.backup").stat().st_mode & 0o777 == 0o600
    finally:
        first.stop()

    restored_dir = tmp_path / "restored"
    restored_dir.mkdir()
    second = Fleet(restored_dir)
    done = upf_cli(second.store, "restore", str(tmp_path / "upf.backup"))
    assert done.returncode == 0, done.stderr
    try:
        upf = second.start("upf", node="rs", UPF_WORKERS="1")
        got = asyncio.run(poll(upf.base, "upBACKUP0001,upBACKUP0002"))
        assert [(m.id, m.message, m.title) for m in got] == [
            (m["id"], m["message"], m.get("title", "")) for m in before
        ]
        assert after["id"] not in {m.id for m in got}  # published after the backup: not in it
        middle = before[10]["id"]
        assert [m.message for m in asyncio.run(poll(upf.base, "upBACKUP0001", since=middle))] == [
            f"m{i}" for i in range(11, 30)
        ]
        new = httpx.post(upf.base + "/upBACKUP0001?up=1", content="new", timeout=5).json()
        assert stamp(new["id"]) > max(stamp(m["id"]) for m in [*before, after])
        last_old = before[29]["id"]
        assert [m.message for m in asyncio.run(poll(upf.base, "upBACKUP0001", since=last_old))] == ["new"]
        users = upf_cli(second.store, "user", "list")
        assert "user phil (user)" in users.stdout
    finally:
        second.stop()


def test_restore_refuses_a_store_with_data_and_bad_files(tmp_path: Path) -> None:
    store = str(tmp_path / "upf.db")
    fleet = Fleet(tmp_path)
    try:
        upf = fleet.start("upf", node="bad", UPF_WORKERS="1")
        assert httpx.post(upf.base + "/upBAD0001?up=1", content="x", timeout=5).status_code == 200
        assert upf_cli(store, "backup", str(tmp_path / "b")).returncode == 0
    finally:
        fleet.stop()
    full = upf_cli(store, "restore", str(tmp_path / "b"))
    assert (full.returncode, full.stderr.strip()) == (1, "upf: the store is not empty: restore only into a new store")

    data = (tmp_path / "b").read_bytes()
    (tmp_path / "cut").write_bytes(data[:-3])
    (tmp_path / "junk").write_bytes(b"hello, not a backup\n")
    for name, error in [("cut", "truncated"), ("junk", "not a UPF backup file"), ("missing", "No such file")]:
        fresh = str(tmp_path / f"fresh-{name}.db")
        r = upf_cli(fresh, "restore", str(tmp_path / name))
        assert r.returncode == 1 and error in r.stderr, (name, r.stderr)
        assert not os.path.exists(fresh)  # checked before the store was opened: nothing was made
    bad_dir = upf_cli(store, "backup", str(tmp_path / "no-such-dir" / "b"))
    assert bad_dir.returncode == 1 and "No such file" in bad_dir.stderr
    assert upf_cli(store, "backup").returncode == 2  # no FILE: a usage error


def test_restore_goes_into_the_store_of_a_server_stopped_cleanly_a_moment_ago(tmp_path: Path) -> None:
    """A running server's store, empty of messages, passes as empty, so restore refuses it while a node
    heartbeats on it; a server stopped cleanly (SIGTERM) retires its node, so the restore right after
    the stop is not sent away for three heartbeats."""
    (tmp_path / "a").mkdir()
    source = Fleet(tmp_path / "a")
    try:
        upf = source.start("upf", node="src", UPF_WORKERS="1")
        assert httpx.post(upf.base + "/upRESTORE001?up=1", content="kept", timeout=5).status_code == 200
        assert upf_cli(source.store, "backup", str(tmp_path / "b")).returncode == 0
    finally:
        source.stop()
    (tmp_path / "c").mkdir()
    target = Fleet(tmp_path / "c")
    try:
        target.start("upf", node="target", UPF_WORKERS="1")  # serves an empty store
        running = upf_cli(target.store, "restore", str(tmp_path / "b"))
        assert running.returncode == 1 and "UPF node target uses this store" in running.stderr, running.stderr
    finally:
        target.stop()
    restored = upf_cli(target.store, "restore", str(tmp_path / "b"))
    assert restored.returncode == 0, restored.stderr
    second = Fleet(tmp_path / "c")
    try:
        upf = second.start("upf", node="after", UPF_WORKERS="1")
        assert [m.message for m in asyncio.run(poll(upf.base, "upRESTORE001"))] == ["kept"]
    finally:
        second.stop()
