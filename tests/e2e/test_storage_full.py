"""A full store, black box: the all-in-one process on a store file with a size quota
(UPF_EMBEDDED_MAX_BYTES; the store then refuses writes with STORAGE_FULL, as on a full disk), and on a
real small filesystem where root may mount one. Publishes fill it with short-lived messages until refused."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.clients.ntfy import error_body, poll, subscribe

BODY = "x" * 3500


async def _publish(c: httpx.AsyncClient, base: str, topic: str, body: str, ttl: int | None = None) -> httpx.Response:
    return await c.post(f"{base}/{topic}", content=body.encode(), headers={"TTL": str(ttl)} if ttl else {})


async def _timed(c: httpx.AsyncClient, base: str, topic: str, body: str, ttl: int | None = None):
    started = time.monotonic()
    r = await _publish(c, base, topic, body, ttl)
    return r, time.monotonic() - started


async def test_full_store_answers_507_fast_reports_degraded_and_recovers(fleet):
    upf = fleet.start(
        "upf", node="allinone", UPF_EMBEDDED_MAX_BYTES=str(1536 * 1024), UPF_LIMIT_REQUEST_BURST="1000000"
    )
    async with httpx.AsyncClient(timeout=30) as c:
        kept = [(await _publish(c, upf.base, "upKEEP01", f"keep{i}")).json()["id"] for i in range(5)]
        acked = 0
        refused: list[tuple[httpx.Response, float]] = []
        for _ in range(100):  # 10 at a time until the store refuses
            replies = await asyncio.gather(*(_timed(c, upf.base, "upFILL01", BODY, ttl=4) for _ in range(10)))
            acked += sum(r.status_code == 200 for r, _ in replies)
            refused = [(r, secs) for r, secs in replies if r.status_code != 200]
            if refused:
                break
        assert refused and acked > 50
        for r, secs in refused:  # every refusal at once, as ntfy-style JSON
            assert error_body(r) == {"code": 50702, "http": 507, "error": "insufficient storage: the store is full"}
            assert secs < 2.0

        health = await c.get(f"{upf.base}/v1/health")
        assert (health.status_code, health.json()) == (503, {"healthy": False, "storage": "full"})
        heartbeat = await c.get(f"{upf.base}/__heartbeat__")
        assert heartbeat.status_code == 503 and heartbeat.json()["storage"] == "full"
        # Stored messages are still served, every acknowledged one, polled and streamed.
        assert [f.id for f in await poll(upf.base, "upKEEP01")] == kept
        async with subscribe(upf.base, "upKEEP01", "json", "since=all") as s:
            assert [f.id for f in await s.messages(5)] == kept

        # The janitor expires the 4 s messages, freeing space: publishes of the same size succeed
        # again and health recovers by itself (10 s after the last refusal).
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            r = await _publish(c, upf.base, "upFILL01", BODY, ttl=4)
            health = await c.get(f"{upf.base}/v1/health")
            if r.status_code == 200 and health.status_code == 200:
                break
            assert r.status_code in (200, 507), r.text
            await asyncio.sleep(0.5)
        assert r.status_code == 200 and health.status_code == 200, (r.text, health.text)
        assert (await c.get(f"{upf.base}/__heartbeat__")).status_code == 200
        assert (await _publish(c, upf.base, "upKEEP01", "after")).status_code == 200
        assert [f.message for f in await poll(upf.base, "upKEEP01")] == [f"keep{i}" for i in range(5)] + ["after"]
    log = upf.log_path.read_text(errors="replace")  # the whole log: log() keeps only its tail
    assert "Traceback" not in log
    assert 1 <= log.count("embedded store full: writes refused") <= 2


def _fill(path: Path) -> None:
    """Write ``path`` until its disk has no block left."""
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)


async def test_a_disk_filled_to_its_last_block_gives_its_reserve_back_and_recovers(fleet, tmp_path):
    """The store on a real filesystem that fills up (a 2 MB tmpfs). On a disk full to its last block
    even the janitor's deletions need new pages: a store without room for them never expired anything
    again, restarts included (a reviewer's long run, 2 of 3 times). The store now keeps a reserve once
    it is large enough to fill its disk, gives it back when the disk fills, grows no further while the
    disk has no room, and publishes resume as the 4 s messages expire."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"a small tmpfs could not be mounted (root and mount privileges needed): {mounted.stderr!r}")
    reserve = disk / "upf.db-reserve"
    try:
        upf = fleet.start(
            "upf",
            node="diskfull",
            UPF_STORE_PATH=str(disk / "upf.db"),
            UPF_WORKERS="1",
            UPF_JANITOR_INTERVAL_SECS="1",
            UPF_LIMIT_REQUEST_BURST="1000000",
        )
        async with httpx.AsyncClient(timeout=30) as c:
            while (disk / "upf.db").stat().st_size < 600 * 1024:  # past a quarter of the disk: worth a reserve
                assert (await _publish(c, upf.base, "upDISK00", BODY, ttl=60)).status_code == 200
            await asyncio.sleep(1.2)  # a commit a second later looks for it
            assert (await _publish(c, upf.base, "upDISK00", "x", ttl=60)).status_code == 200
            assert reserve.stat().st_size == 128 * 1024  # a sixteenth of the disk
            refused = 0
            for _ in range(200):  # 5 at a time until the disk refuses
                replies = await asyncio.gather(*(_publish(c, upf.base, "upDISK01", BODY, ttl=4) for _ in range(5)))
                assert all(r.status_code in (200, 507) for r in replies)
                refused = sum(r.status_code == 507 for r in replies)
                if refused:
                    break
            assert refused, "the disk never filled"
            for i in range(400):  # then small ones, to the last block the pin leaves
                r = await _publish(c, upf.base, "upDISK02", f"s{i}", ttl=4)
                assert r.status_code in (200, 507), r.text
                if r.status_code == 507:
                    break
            _fill(disk / "filler")  # and every block of the disk
            assert reserve.stat().st_size == 0  # given back
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                r = await _publish(c, upf.base, "upDISK01", BODY, ttl=4)
                if r.status_code == 200:
                    break
                assert r.status_code == 507, r.text
                await asyncio.sleep(0.5)
            assert r.status_code == 200, r.text
            assert [f.message for f in await poll(upf.base, "upDISK01")][-1] == BODY
        assert "reserve given back" in upf.log_path.read_text(errors="replace")
    finally:
        fleet.stop()
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


async def test_store_bytes_bound_answers_507_keeps_what_is_stored_and_recovers(fleet):
    """UPF_MAX_STORE_BYTES (issue 10's storage bound): once the fleet's stored message bytes reach it,
    publishes get 507 50702 (within the writers' one-second view of the total), nothing stored is lost,
    and publishes resume once the janitor has expired enough."""
    upf = fleet.start("upf", node="allinone", UPF_MAX_STORE_BYTES="20000", UPF_LIMIT_REQUEST_BURST="1000000")
    async with httpx.AsyncClient(timeout=30) as c:
        kept = [(await _publish(c, upf.base, "upBOUND01", f"keep{i}")).json()["id"] for i in range(3)]
        acked, refused = 0, None
        for _ in range(60):  # 1 KB messages that live 4 s, until refused
            r = await _publish(c, upf.base, "upBOUND02", "y" * 1000, ttl=4)
            if r.status_code != 200:
                refused = r
                break
            acked += 1
            await asyncio.sleep(0.05)
        assert refused is not None and 15 <= acked < 60, acked
        assert error_body(refused) == {"code": 50702, "http": 507, "error": "insufficient storage: the store is full"}
        assert [f.id for f in await poll(upf.base, "upBOUND01")] == kept  # nothing stored is touched
        assert len(await poll(upf.base, "upBOUND02")) == acked
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:  # the 4 s messages expire: the bound admits publishes again
            r = await _publish(c, upf.base, "upBOUND03", "z")
            if r.status_code == 200:
                break
            await asyncio.sleep(0.5)
        assert r.status_code == 200, r.text
        assert [f.id for f in await poll(upf.base, "upBOUND01")] == kept


def test_a_cli_write_on_a_full_disk_is_one_line_not_a_traceback(tmp_path):
    """``upf user add`` and the other writing commands on a store whose disk is full: exit 1 with the
    store's refusal on one line (they printed a 40-line traceback), and the store still opens."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"a small tmpfs could not be mounted (root and mount privileges needed): {mounted.stderr!r}")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UPF_", "FDB_"))}
    env.update(UPF_STORE_PATH=str(disk / "upf.db"), UPF_PASSWORD="pw", UPF_LOG_LEVEL="CRITICAL")

    def upf(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "upf", *args], env=env, capture_output=True, text=True, timeout=60)

    try:
        assert upf("user", "add", "bob").returncode == 0
        _fill(disk / "filler")
        for args in (("user", "add", "carl"), ("access", "bob", "up*", "rw"), ("token", "add", "bob")):
            r = upf(*args)
            assert (r.returncode, r.stderr) == (1, "upf: storage is full: the write was refused\n"), (args, r.stderr)
        (disk / "filler").unlink()
        assert upf("user", "list").stdout.startswith("user bob (user)")
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)
