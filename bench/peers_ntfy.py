"""The real ntfy server for benchmarks beside UPF: starts the cached ntfy build, prints its address, waits.

    python3 -m uv run python bench/peers_ntfy.py                  # prints http://127.0.0.1:PORT, runs until ^C
    python3 -m uv run python bench/peers_ntfy.py --duration 600 --cache memory --json

The binary is the one the peer tests build once per machine (tests/peers/ntfy.py: ntfy v2.13.0 into
``${XDG_CACHE_HOME:-~/.cache}/upf-peers``), built here first when missing; where it cannot be had, this
says why and exits 3. The config matches what UPF is benchmarked with: the 4096-byte message limit, a
45 s keepalive, retention of four weeks, no auth, and no rate limiting for loopback clients (every
visitor limit raised, 127.0.0.1 exempt), so the figures measure the server, not its limiter.

The first stdout line is the base URL (or, with --json, one JSON object with ``base``, ``pid``,
``binary``, ``version``, ``config``); the server is stopped (by its PID) on SIGINT, SIGTERM or after
--duration. Loopback only.
"""

from __future__ import annotations

import argparse
import json
import resource
import signal
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.peers.ntfy import NTFY_VERSION, NtfyServer, Unavailable, ensure_ntfy


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=0, help="stop after this many seconds (0: until signalled)")
    ap.add_argument(
        "--cache",
        choices=("file", "memory"),
        default="file",
        help="ntfy's message cache: an SQLite file (as deployed) or in memory",
    )
    ap.add_argument(
        "--cache-batch-size",
        type=int,
        default=0,
        help="ntfy's cache-batch-size (0: each message written synchronously, its default)",
    )
    ap.add_argument("--keepalive-secs", type=int, default=45)
    ap.add_argument("--workdir", type=Path, default=None, help="config, cache and log here (default: a temp dir)")
    ap.add_argument("--json", action="store_true", help="print one JSON line instead of the bare URL")
    args = ap.parse_args()

    try:
        binary = ensure_ntfy()
    except Unavailable as e:
        print(f"peers_ntfy: ntfy {NTFY_VERSION} is not available here: {e}", file=sys.stderr)
        return 3

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # inherited: many held subscribers

    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):  # before the server starts: it is always stopped by its PID
        signal.signal(sig, lambda *_: done.set())
    tmp = None if args.workdir else tempfile.TemporaryDirectory(prefix="upf-bench-ntfy-")
    workdir = args.workdir or Path(tmp.name)
    extra: dict[str, object] = {
        "cache-batch-size": args.cache_batch_size,
        "visitor-subscription-limit": 10_000_000,
        "visitor-request-limit-burst": 10_000_000,
        "visitor-message-daily-limit": 1_000_000_000,
        "visitor-attachment-daily-bandwidth-limit": "10G",
        "global-topic-limit": 100_000_000,
        "log-level": "error",
    }
    server = NtfyServer(binary, workdir, keepalive_secs=args.keepalive_secs, cache_file=args.cache == "file", **extra)
    try:
        server.wait_ready()
        info = {
            "base": server.base,
            "pid": server.proc.pid,
            "binary": str(binary),
            "version": NTFY_VERSION,
            "config": str(server.config_path),
        }
        print(json.dumps(info) if args.json else server.base, flush=True)
        done.wait(args.duration or None)
    finally:
        server.stop()
        if tmp is not None:
            tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
