"""CPU used by the all-in-one program holding N idle WebSocket subscribers (not a test; a measurement).

Starts the all-in-one program (writer, pusher and janitor in one process, default intervals:
keepalives every 45 s, safety poll every 60 s) on a fresh embedded store, opens N idle ws
subscribers from a separate client process (one topic each, the idle_memory.py client), lets the
connects settle, then reads the server's CPU time (utime + stime of its process tree) over a window
that spans at least one keepalive pass and one safety poll.

    cd /work/wt/pusher && python3 -m uv run --locked python services/pusher/bench/idle_cpu.py --n 10000 --secs 60
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[2] / "bench"))

import idle_memory  # noqa: E402
import procs  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--secs", type=float, default=60.0, help="the measured window")
    ap.add_argument("--settle", type=float, default=5.0, help="seconds after the connects before the window opens")
    a = ap.parse_args()
    idle_memory.raise_fd_limit()
    with tempfile.TemporaryDirectory(prefix="upf-idlecpu-") as work:
        wd = Path(work)
        server, port = procs.start_upf_allinone(wd, wd / "upf.db")
        clients = None
        try:
            pids = procs.tree(server.pid)
            clients = idle_memory.run_clients("ws", port, a.n, 0)
            time.sleep(a.settle)
            cpu0, t0 = procs.tree_cpu(pids), time.monotonic()
            time.sleep(a.secs)
            cpu1, t1 = procs.tree_cpu(pids), time.monotonic()
            if not server.alive():
                raise RuntimeError(f"server exited: {server.log_tail()}")
            used = cpu1 - cpu0
            print(
                f"idle ws subscribers: {a.n}; window {t1 - t0:.1f} s; server CPU {used:.3f} s "
                f"= {100 * used / (t1 - t0):.3f}% of a core; {1e6 * used / a.n / (t1 - t0) * 60:.1f} us per subscriber-minute",
                flush=True,
            )
        finally:
            if clients is not None:
                idle_memory.stop(clients)
            server.stop()


if __name__ == "__main__":
    main()
