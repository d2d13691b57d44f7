"""Two trees' standalone writers, and the bare granian ceiling, in alternating rounds: the ``rounds``
phase's ingest (bench/pubdrive.py, 64 keep-alive connections, 1,000 topics, server on CPU 0, driver on
CPU 1) with a base tree beside the head. Not part of bench/run.py; how BENCHMARKS.md's forty-third
pass measured a change to the writer's front door.

Why: the host's speed moves within minutes (bare granian's rate by 20% between two quick runs), so
a writer change priced by two runs far apart measures the hour. Each round runs the ceiling, then
base and head in turn (the order alternating round by round), each on a fresh store.

    python3 -m uv run python bench/ab_writer.py --base /tmp/base               # 6 rounds of 5 s
    python3 -m uv run python bench/ab_writer.py --base /tmp/base --rounds 10 --secs 4

``--base`` is a checkout of another commit with its own environment (``git worktree add /tmp/base
REV``, then ``python3 -m uv sync --locked`` in it). Every publish must answer 200.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import procs
from harness import SERVER_CPUS, pubdrive
from procs import PY, ab_parser, checkout_python, print_ratios
from schema import Drive


def one_run(python: str | None, secs: float, conns: int, topics: int) -> Drive:
    """One drive of bare granian (``python`` None) or of a tree's ``upf-writer`` on a fresh store."""
    work = Path(tempfile.mkdtemp(prefix="ab-writer-"))
    try:
        if python is None:
            p, port = procs.start_bare_asgi(work, SERVER_CPUS)
        else:
            p, port = procs.start_upf_writer(work, work / "upf.db", SERVER_CPUS, python=python)
        try:
            d = pubdrive(f"http://127.0.0.1:{port}", [p.pid], secs=secs, conns=conns, topics=topics)
        finally:
            p.stop()
        if not d.ok or d.errors or d.non_200:
            raise RuntimeError(f"not every publish answered 200: {d.ok} did, {d.non_200 or d.errors}")
        assert d.cpu_us_per_publish is not None  # set whenever a publish was answered
        return d
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = ab_parser(__doc__, secs=5.0, warm=None)  # bench/pubdrive.py warms up for 1 s
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--topics", type=int, default=1000)
    a = ap.parse_args()
    base_py = checkout_python(ap, a.base)
    rows: dict[str, list[Drive]] = {"bare": [], "base": [], "head": []}
    ratios = []
    for n in range(1, a.rounds + 1):
        order = [("base", base_py), ("head", PY)]
        for name, python in [("bare", None), *(order if n % 2 else order[::-1])]:
            rows[name].append(one_run(python, a.secs, a.connections, a.topics))
        bare, base, head = (rows[k][-1] for k in ("bare", "base", "head"))
        ratios.append(head.ok_per_s / base.ok_per_s)
        print(
            f"round {n}: bare {bare.ok_per_s:,.0f}/s, base {base.ok_per_s:,.0f}/s ({base.ok_per_s / bare.ok_per_s:.3f} "
            f"of bare, {base.cpu_us_per_publish:.1f} us), head {head.ok_per_s:,.0f}/s "
            f"({head.ok_per_s / bare.ok_per_s:.3f}, {head.cpu_us_per_publish:.1f} us), head/base {ratios[-1]:.3f}",
            flush=True,
        )
    for k in ("bare", "base", "head"):
        rates = [d.ok_per_s for d in rows[k]]
        cpu = [d.cpu_us_per_publish for d in rows[k] if d.cpu_us_per_publish is not None]
        print(f"{k}: median {statistics.median(rates):,.0f}/s, {statistics.median(cpu):.1f} us CPU per publish")
    print_ratios(ratios)


if __name__ == "__main__":
    main()
