"""The idle-CPU phase's measurement for one configuration, with settings overridden: how the timers'
shares of an idle all-in-one's CPU were found (BENCHMARKS.md, ninth pass). Not part of bench/run.py.

    python3 -m uv run python bench/idle_env.py                                  # 1 worker, 10,000 ws, 60 s
    python3 -m uv run python bench/idle_env.py --workers 2 --n 0
    python3 -m uv run python bench/idle_env.py UPF_SAFETY_POLL_SECS=3600 UPF_KEEPALIVE_SECS=3600
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import Shape, stop_popen
from phases.idle import cpu_pct_over, hold_idle_ws


def _setting(text: str) -> tuple[str, str]:
    name, eq, value = text.partition("=")
    if not eq or not name.startswith("UPF_"):
        raise argparse.ArgumentTypeError(f"expected UPF_NAME=value, got {text!r}")
    return name, value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("settings", nargs="*", type=_setting, help="UPF_NAME=value overrides for the all-in-one")
    ap.add_argument("--workers", type=int, default=1, choices=range(1, 9), metavar="1..8")
    ap.add_argument("--n", type=int, default=10_000, help="idle ws subscribers (0: none)")
    ap.add_argument("--secs", type=float, default=60.0, help="the measured window")
    args = ap.parse_args()
    if args.n < 0 or args.secs <= 0:
        ap.error("--n must be >= 0 and --secs > 0")
    extra = dict(args.settings)
    with tempfile.TemporaryDirectory() as d:
        shape = Shape(f"allinone_w{args.workers}", Path(d), **extra)
        try:
            time.sleep(3)  # start-up work out of the window, as the idle-CPU phase does
            clients = hold_idle_ws(int(shape.pusher.rsplit(":", 1)[1]), args.n) if args.n else None
            try:
                time.sleep(3)
                pct = cpu_pct_over(shape, args.secs)
            finally:
                if clients is not None:
                    stop_popen(clients)
            shape.check_alive()
        finally:
            shape.stop()
    shown = " ".join(f"{k}={v}" for k, v in extra.items()) or "defaults"
    print(f"UPF_WORKERS={args.workers}, {args.n} idle ws, {shown}: {pct}% of a core over {args.secs:g} s")


if __name__ == "__main__":
    main()
