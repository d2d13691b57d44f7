"""Two trees' pushers side by side: the CPU per delivery of a base checkout's pusher and this tree's,
measured in the same seconds. Not part of bench/run.py; how BENCHMARKS.md's tenth pass was measured.

This machine's speed drifts by 20% and more from one minute to the next, so two runs of the same tree a
few minutes apart differ by more than most changes to the pusher. Here both pushers run at once: one
writer (this tree's) and both pushers on one embedded store, each pusher a node of its own under its
own ``upf-loadgen run`` at half the rate (its own topics, one ws subscriber each). Whatever the
machine does in those seconds, it does to both. An A/A run (this tree as both) gave head/base
0.994-1.034 over 3 rounds, while each pusher's own figure moved by 17% between rounds.

    python3 -m uv run python bench/ab_pushers.py --base /work/wt/base              # 3 rounds, 1,000/s
    python3 -m uv run python bench/ab_pushers.py --base ../upf-old --rate 2000 --rounds 5

``--base`` is a checkout of another commit with its own environment (``git worktree add ../base REV``,
then ``python3 -m uv sync --locked`` in it); its pusher must read this tree's store format. Every
loadgen run must be clean (no loss, duplicate or reordering), or the round is reported as failed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import procs
from harness import LOADGEN, lg_args
from procs import PY, ab_parser, checkout_python, print_ratios, tree_cpu


def one_round(base_py: str, rate: float, topics: int, secs: float, warm: float) -> dict[str, float]:
    """Microseconds of pusher CPU per delivery, by tree, over one window both pushers share."""
    work = Path(tempfile.mkdtemp(prefix="ab-pushers-"))
    store = work / "upf.db"
    started: list[procs.Proc] = []
    try:
        w, wport = procs.start_upf_writer(work, store)
        started.append(w)
        pushers: dict[str, tuple[procs.Proc, int]] = {}
        for name, py in (("base", base_py), ("head", PY)):
            p, port = procs.start_upf_pusher(work, store, python=py, node=f"ab-{name}")
            started.append(p)
            pushers[name] = (p, port)
        runs = {}
        for name, (_, port) in pushers.items():
            lg = lg_args(f"http://127.0.0.1:{wport}", f"http://127.0.0.1:{port}", topics, warm + secs + 3, size=200)
            argv = [LOADGEN, "run", *lg, "--rate", str(rate / 2), "--quiet", "--json", "-"]
            runs[name] = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        time.sleep(warm)  # subscribers connected, publishing under way
        c0 = {n: tree_cpu([p.pid]) for n, (p, _) in pushers.items()}
        t0 = time.monotonic()
        time.sleep(secs)
        c1 = {n: tree_cpu([p.pid]) for n, (p, _) in pushers.items()}
        dt = time.monotonic() - t0
        for name, r in runs.items():
            out, _ = r.communicate(timeout=warm + secs + 180)
            report = json.loads(out)
            bad = {k: v for k, v in report["violations"].items() if v}
            if bad:
                raise RuntimeError(f"{name}'s loadgen run was not clean: {bad}")
        for p, _ in pushers.values():
            if not p.alive():
                raise RuntimeError(f"{p.name} died: {p.log_tail()}")
        return {n: (c1[n] - c0[n]) / dt / (rate / 2) * 1e6 for n in c1}
    finally:
        for p in started:
            p.stop()


def main() -> None:
    ap = ab_parser(__doc__, secs=15.0, warm=12.0)
    ap.add_argument("--rate", type=float, default=1000.0, help="publishes/s in all (each pusher gets half)")
    ap.add_argument("--topics", type=int, default=500, help="topics per pusher, one ws subscriber each")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    base_py = checkout_python(ap, a.base)
    ratios = []
    for n in range(1, a.rounds + 1):
        us = one_round(base_py, a.rate, a.topics, a.secs, a.warm)
        ratios.append(us["head"] / us["base"])
        print(
            f"round {n}: pusher CPU us per delivery at {a.rate / 2:.0f}/s each: "
            f"base {us['base']:.1f}, head {us['head']:.1f}, head/base {ratios[-1]:.3f}",
            flush=True,
        )
    print_ratios(ratios)


if __name__ == "__main__":
    main()
