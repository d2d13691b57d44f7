"""The split shape's pusher at given publish rates: its CPU per delivery, how many deliveries a fired
bell and a drain (a wake-up) covered (from its own ``/metrics``), and the loadgen's latency. Not part
of bench/run.py; how BENCHMARKS.md's thirty-third pass saw what share of a delivery at one subscriber
per topic is its rung shards', and the thirty-fourth what a wake-up costs.

Each rate starts a fresh writer + pusher on one embedded store and runs ``upf-loadgen run`` over
1,000 topics with one ws subscriber each for ``--secs``; a dirty loadgen verdict fails the run.

    python3 -m uv run python bench/split_bells.py --rates 2000,10000
    python3 -m uv run python bench/split_bells.py --rates 10000 --repeat 4   # alternate with a base tree's copy
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import LoadgenRun, Shape, lg_common
from procs import tree_cpu

_METRIC = re.compile(
    r"(upf_pusher_(?:bells|inbox_entries|inbox_drains|deliveries|safety_poll_deliveries)\w*)(\{[^}]*\})? (\S+)"
)


def pusher_counters(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in urllib.request.urlopen(url + "/metrics", timeout=10).read().decode().splitlines():
        m = _METRIC.match(line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def one(rate: int, secs: float, work: Path) -> str:
    shape = Shape("split", work)
    try:
        pid = shape.roles["pusher"].pid
        m0, c0 = pusher_counters(shape.pusher), tree_cpu([pid])
        lg = LoadgenRun(["run", *lg_common(shape, 1000, secs), "--rate", str(rate)], shape)
        rep = lg.wait(timeout=secs + 180)
        shape.check_alive()
        m1, c1 = pusher_counters(shape.pusher), tree_cpu([pid])
    finally:
        shape.stop()
    if rep.get("verdict") != "clean":
        raise SystemExit(f"loadgen at {rate}/s: {rep.get('verdict')}")
    d = {k: v - m0.get(k, 0.0) for k, v in m1.items()}
    safety = sum(v for k, v in d.items() if k.startswith("upf_pusher_safety_poll_deliveries"))
    delivered = sum(v for k, v in d.items() if k.startswith("upf_pusher_deliveries") and 'transport="ws"' in k)
    bells = sum(v for k, v in d.items() if k.startswith("upf_pusher_bells"))
    drains = sum(v for k, v in d.items() if k.startswith("upf_pusher_inbox_drains"))
    lat = rep.get("latency") or {}
    return (
        f"{rate}/s: {delivered:.0f} ws deliveries ({safety:.0f} by the safety poll), p50 {lat.get('p50_ms', 0):.1f} "
        f"p99 {lat.get('p99_ms', 0):.1f} ms, {bells:.0f} bells rang, "
        f"{delivered / max(bells, 1):.2f} deliveries per bell, "
        f"{drains:.0f} drains ({delivered / max(drains, 1):.1f} deliveries per drain), {(c1 - c0) / max(delivered, 1) * 1e6:.1f} us of pusher CPU per delivery"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="2000,10000", help="publishes/s, comma-separated")
    ap.add_argument("--secs", type=float, default=20.0)
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="split-bells-"))
    for _ in range(args.repeat):
        for rate in (int(r) for r in args.rates.split(",")):
            print(one(rate, args.secs, work), flush=True)


if __name__ == "__main__":
    main()
