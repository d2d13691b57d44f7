"""store: the embedded store alone (no HTTP), publish transactions/s against bare SQLite writing the
same rows in batches of 256, alternating in one process run (libs/upf-keyspace/bench/publish_bench.py)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import msgspec
from harness import run_to_end
from procs import PY, REPO
from schema import Config, StoreBench

from upf_edge.gcpolicy import GC_THRESHOLDS

PUBLISHES = 20_000
CONCURRENCY = 1024


def phase_store(cfg: Config, work: Path) -> StoreBench:
    with tempfile.TemporaryDirectory(prefix="store-", dir=work) as d:
        out = Path(d) / "store.json"
        r = run_to_end(
            [
                PY,
                str(REPO / "libs/upf-keyspace/bench/publish_bench.py"),
                "--publishes",
                str(PUBLISHES),
                "--concurrency",
                str(CONCURRENCY),
                "--gc-thresholds",  # as every UPF process runs once it serves
                ",".join(map(str, GC_THRESHOLDS)),
                "--loop",  # the loop UPF's processes run (upf_edge.loop)
                "uvloop",
                "--rounds",
                str(max(cfg.rounds, 2)),
                "--json",
                str(out),
            ],
            timeout=600,
        )
        if r.returncode != 0:
            raise RuntimeError(f"publish_bench failed: {r.stderr[-2000:]}")
        return msgspec.json.decode(out.read_bytes(), type=StoreBench)
