"""The writer's instructions per publish, in process, under callgrind: the loop thread and the store's
committer counted apart.

Wall-clock and CPU-time figures are noise on a shared machine; instruction counts are not. This runs
``WriterFront.publish`` (the writer's whole publish path without HTTP: headers, ingest, limits, the
store transaction, the reply) on a fresh embedded store, ``--concurrency`` publishes at a time over
1,000 topics, in a child process under ``valgrind --tool=callgrind --separate-threads=yes`` with
instrumentation off. After ``--warm`` publishes it turns instrumentation on (callgrind's client
requests, through the tiny C library bench/instr_delivery.py builds with gcc), runs ``--publishes``
more, and dumps. It prints the Ir per publish of the event loop's thread and of the other threads (the
group commit's thread: applying a batch, the LMDB commit). Every publish must answer 200.

    python3 -m uv run --locked python bench/instr_publish.py                    # 64 at a time
    python3 -m uv run --locked python bench/instr_publish.py --concurrency 8    # smaller batches
    python3 -m uv run --locked python bench/instr_publish.py --keep /tmp/cg     # keep the dumps, a file per thread

How transactions group into commits depends on the two threads' timing under callgrind, so compare
two versions by alternating runs: at 64 at a time, runs of one tree agree within ~0.2%. Needs
valgrind, gcc and valgrind's headers. Takes ~40 s.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from instr_delivery import _TOGGLE_C

HERE = Path(__file__).resolve().parent

_CHILD = r"""
import asyncio, ctypes, sys
import uvloop

lib, warm, n, concurrency = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
sys.path.insert(0, sys.argv[5])
from inproc import open_front

cg = ctypes.CDLL(lib)
HEADERS = [(b"content-type", b"text/plain"), (b"host", b"x")]


async def main() -> None:
    front, close = await open_front()

    async def one(i: int) -> None:
        r = await front.publish(f"upINSTR{i % 1000:04d}", HEADERS, b"", b"x" * 100, "127.0.0.1")
        if r.status != 200:
            raise SystemExit(f"publish answered {r.status}: {r.body!r}")

    async def run(count: int) -> None:
        for i in range(0, count, concurrency):
            await asyncio.gather(*(one(i + j) for j in range(min(concurrency, count - i))))

    await run(warm)
    cg.cg_start()
    await run(n)
    cg.cg_stop()
    await close()


uvloop.run(main())
"""


def _totals(path: Path) -> int:
    m = re.search(r"^totals:\s*(\d+)", path.read_text(), re.M)
    return int(m.group(1)) if m else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--publishes", type=int, default=1024)
    ap.add_argument("--warm", type=int, default=1024)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--keep", type=Path, help="copy the callgrind dumps into this directory (for callgrind_annotate)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="upf-instr-publish-") as d:
        work = Path(d)
        (work / "cgtoggle.c").write_text(_TOGGLE_C)
        lib = work / "cgtoggle.so"
        subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(lib), str(work / "cgtoggle.c")], check=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("UPF_", "OTEL_"))}
        # A quota sizes LMDB's map (twice it): valgrind cannot map the 1 TiB reserved without one.
        env.update(UPF_STORE_PATH=str(work / "store" / "upf.db"), UPF_EMBEDDED_MAX_BYTES=str(256 << 20))
        out = work / "cg.out"
        argv = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            "--separate-threads=yes",
            f"--callgrind-out-file={out}",
            sys.executable,
            "-c",
            _CHILD,
            str(lib),
            str(args.warm),
            str(args.publishes),
            str(args.concurrency),
            str(HERE),
        ]
        done = subprocess.run(argv, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            sys.stderr.write(done.stderr[-3000:])
            raise SystemExit(f"the child exited {done.returncode}")
        # One file per thread and dump (<out>-<thread> at exit, <out>.<n>-<thread> for cg_stop's dump,
        # which holds the calling thread only). Instrumentation was on only in the window, so every
        # count in any of them is the window's.
        by_thread: dict[int, int] = {}
        for f in work.glob("cg.out*-*"):
            thread = int(f.name.rsplit("-", 1)[1])
            by_thread[thread] = by_thread.get(thread, 0) + _totals(f)
            if args.keep is not None:
                args.keep.mkdir(parents=True, exist_ok=True)
                shutil.copy(f, args.keep / f.name)
    if not by_thread:
        raise SystemExit("no callgrind dump of the measured window")
    loop_ir = by_thread.get(1, 0)
    other_ir = sum(v for t, v in by_thread.items() if t != 1)
    n = args.publishes
    print(
        f"publishes={n} concurrency={args.concurrency}: loop thread {loop_ir / n:,.0f} Ir per publish, "
        f"other threads (the committer) {other_ir / n:,.0f} Ir per publish, "
        f"together {(loop_ir + other_ir) / n:,.0f}"
    )


if __name__ == "__main__":
    main()
