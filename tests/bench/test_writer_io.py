"""bench/writer_io.py: its no-flush writer is the real writer (it answers and stores publishes, and its
commits show in /metrics, which the bench reads), and its disk figures are measured, not printed."""

from __future__ import annotations

import asyncio
import json
import sys
import urllib.request
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
try:
    import procs
    import writer_io
finally:
    sys.path.remove(str(BENCH))


async def _stored(store_path: Path, topic: str) -> list[str]:
    from upf_keyspace import Settings, open_store

    store = await open_store(Settings(store_path=str(store_path)))
    try:
        return [s.envelope.message for s in await store.read_after(topic, None)]
    finally:
        await store.close()


@pytest.mark.parametrize("variant", ["no flushes", "emulated log"])
def test_each_bound_writer_stores_what_it_answers_and_counts_its_commits(tmp_path, variant):
    store = tmp_path / "bound.db"
    code = writer_io._VARIANTS[variant]
    assert code is not None
    p, port = procs.start_upf_command("writer-io", [procs.PY, "-c", code], "io", "test-writer", tmp_path, store)
    try:
        before = writer_io.commit_tallies(port)
        for body in (b"one", b"two"):
            req = urllib.request.Request(f"http://127.0.0.1:{port}/upWRITERIO01", data=body, method="POST")
            with urllib.request.urlopen(req, timeout=10) as r:
                assert r.status == 200 and json.loads(r.read())["message"] == body.decode()
        after = writer_io.commit_tallies(port)
    finally:
        p.stop()
        procs.stop_all()
    assert after["batch_size_sum"] - before["batch_size_sum"] == 2  # a publish each, counted
    assert after["duration_seconds_count"] > before["duration_seconds_count"]
    assert asyncio.run(_stored(store, "upWRITERIO01")) == ["one", "two"]
    if variant == "emulated log":  # a record a commit was appended (a checkpoint may have cut it since)
        assert (tmp_path / "bound.db.wal").exists()


def test_the_disk_figures_are_timed_writes(tmp_path):
    got = writer_io._disk(tmp_path, 4, 3)
    assert set(got) == {"scattered", "contiguous", "second"}
    assert all(v > 0 for v in got.values())
    assert list(tmp_path.iterdir()) == []  # its file is gone
