"""Two trees' all-in-one programs in alternating runs: the CPU of all the program's processes per
publish-and-delivery at a fixed rate (1,000 topics, one ws subscriber each), as the ``pubdeliver``
phase prices it. Not part of bench/run.py; how BENCHMARKS.md's twelfth pass was measured.

Unlike bench/ab_pushers.py the two cannot share a window (each is a whole program on the machine's
two cores), so each pair runs base then head, back to back, on fresh stores: the machine's drift
within a pair is small against its drift between pairs, and the pairs are compared, not the runs.

    python3 -m uv run python bench/ab_allinone.py --base /work/wt/base                # 3 pairs, 2,000/s
    python3 -m uv run python bench/ab_allinone.py --base ../upf-old --workers 2 --pairs 5

``--base`` is a checkout of another commit with its own environment (``git worktree add ../base REV``,
then ``python3 -m uv sync --locked`` in it). Every loadgen run must be clean (no loss, duplicate or
reordering), or the pair is reported as failed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import procs
from harness import LOADGEN, lg_args
from procs import PY, ab_parser, checkout_python, print_ratios, tree_cpu


def one_run(
    python: str, workers: int, rate: float, topics: int, secs: float, warm: float
) -> tuple[float, float, float]:
    """CPU microseconds per publish-and-delivery over the window, and the run's p50 and p99 (ms)."""
    work = Path(tempfile.mkdtemp(prefix="ab-allinone-"))
    p, port = procs.start_upf_allinone(work, work / "upf.db", python=python, UPF_WORKERS=str(workers))
    try:
        url = f"http://127.0.0.1:{port}"
        argv = [
            LOADGEN,
            "run",
            *lg_args(url, url, topics, warm + secs + 2),
            "--rate",
            str(rate),
            "--quiet",
            "--json",
            "-",
        ]
        run = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        time.sleep(warm)  # subscribers connected, publishing under way
        c0, t0 = tree_cpu([p.pid]), time.monotonic()
        time.sleep(secs)
        c1, dt = tree_cpu([p.pid]), time.monotonic() - t0
        out, _ = run.communicate(timeout=warm + secs + 180)
        report = json.loads(out)
        bad = {k: v for k, v in report["violations"].items() if v}
        if bad or report["throughput"]["delivered"] < report["throughput"]["expected_deliveries"]:
            raise RuntimeError(f"the loadgen run was not clean: {bad or 'undelivered messages'}")
        if not p.alive():
            raise RuntimeError(f"{p.name} died: {p.log_tail()}")
        latency = report["latency"]
        return (c1 - c0) / dt / rate * 1e6, float(latency["p50_ms"]), float(latency["p99_ms"])
    finally:
        p.stop()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = ab_parser(__doc__, secs=15.0, warm=4.0)
    ap.add_argument("--workers", type=int, default=1, help="UPF_WORKERS of both programs")
    ap.add_argument("--rate", type=float, default=2000.0, help="publishes/s")
    ap.add_argument("--topics", type=int, default=1000, help="topics, one ws subscriber each")
    ap.add_argument("--pairs", type=int, default=3)
    a = ap.parse_args()
    base_py = checkout_python(ap, a.base)
    ratios = []
    for n in range(1, a.pairs + 1):
        base, base_p50, base_p99 = one_run(base_py, a.workers, a.rate, a.topics, a.secs, a.warm)
        head, head_p50, head_p99 = one_run(PY, a.workers, a.rate, a.topics, a.secs, a.warm)
        ratios.append(head / base)
        print(
            f"pair {n}: UPF_WORKERS={a.workers} at {a.rate:.0f}/s, CPU us per publish-and-delivery: "
            f"base {base:.1f} (p50/p99 {base_p50:.1f}/{base_p99:.1f} ms), "
            f"head {head:.1f} (p50/p99 {head_p50:.1f}/{head_p99:.1f} ms), "
            f"head/base {ratios[-1]:.3f}",
            flush=True,
        )
    print_ratios(ratios)


if __name__ == "__main__":
    main()
