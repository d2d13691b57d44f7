"""The standalone writer's synced writes: what the disk's flushes cost a publish, and the disk itself.

Why: ``bench/writer_layers.py`` shows the writer on its front door well below the bare ceiling with its
core not fully used. A closed loop of clients that each await their commit waits on the group
commit's ``fdatasync``s; with the committer's commits running back to back, the physical commit is
the stage that bounds publishes/s (BENCHMARKS.md, thirtieth pass). This prices that stage, in two
parts:

- ``disk``: synced writes on the filesystem under the store (a temporary file beside it): N 4 KiB
  pages at scattered offsets and one ``fdatasync``, the same N pages as one contiguous write, and a
  second one-page synced write right after the first flush (LMDB's commit writes its dirty pages, at
  the offsets its free list hands out, flushes them, then writes its meta page through an ``O_DSYNC``
  descriptor);
- ``writer``: ``upf-writer`` on its front door (``bench/writer_layers.py``'s ``door``, on one core,
  64 keep-alive connections, 1,000 topics) in alternating rounds, as shipped and with LMDB's syncs
  turned off (``sync=False, metasync=False``, patched in by the process that starts it: no setting
  offers it). The second is not a configuration anyone may run (an OS crash could corrupt the file):
  it is the bound on what any change to the flushes could give. Each round prints publishes/s, CPU us
  per publish, the core's busy share, and from the writer's own ``/metrics`` the publishes per
  physical commit and a commit's mean duration (applying the batch, LMDB's writes and flushes).

With ``--stalls SECS``, first a one-page write and ``fdatasync`` every 10 ms for SECS seconds, with
their latency's median, tail and maximum, and how many took over 50 and 100 ms: a shared virtual disk
can hold a flush for a tenth of a second several times a minute, and each such stall holds every
publish of the commit it lands in (the p99 of a run at a low rate, a few thousand publishes, can be
one stall: BENCHMARKS.md, forty-fourth pass).

With ``--log``, a third writer in the rounds: the I/O a write-ahead log in front of LMDB would do,
emulated (``_WAL``: each commit's record appended and flushed, LMDB flushed at a checkpoint a second
with a reader held at it). Another bound, not a configuration: it has no recovery.

Not part of bench/run.py (it turns a durability guarantee off).

    python3 -m uv run python bench/writer_io.py                  # 3 rounds of 4 s, and the disk
    python3 -m uv run python bench/writer_io.py --rounds 5 --skip-disk
    python3 -m uv run python bench/writer_io.py --rounds 3 --skip-disk --log
    python3 -m uv run python bench/writer_io.py --stalls 60 --skip-disk --rounds 0
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import procs
from harness import SERVER_CPUS, disk_stalls, pubdrive
from procs import PY

_CONNS = 64
_TOPICS = 1000
_PAGE = 4096
_NOSYNC = (
    "import lmdb, runpy\n"
    "_open = lmdb.open\n"
    "lmdb.open = lambda *a, **k: _open(*a, **{**k, 'sync': False, 'metasync': False})\n"
    "runpy.run_module('upf_writer', run_name='__main__')\n"
)
"""``python -m upf_writer`` with LMDB's flushes off: the store opens its file through ``lmdb.open``."""
_WAL = (
    "import lmdb, os, runpy, time\n"
    "_open = lmdb.open\n"
    "lmdb.open = lambda *a, **k: _open(*a, **{**k, 'sync': False, 'metasync': False})\n"
    "from upf_keyspace.drivers.embedded import committer\n"
    "_commit = committer._Committer._commit_batch\n"
    "st = {'fd': None, 'at': time.monotonic(), 'held': None}\n"
    "def _commit_batch(self, f, batch, **kw):\n"
    "    done = _commit(self, f, batch, **kw)\n"
    "    if st['fd'] is None:\n"
    "        st['fd'] = os.open(f.path + '.wal', os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)\n"
    "    if done:\n"
    "        os.write(st['fd'], bytes(450 * sum(p.weight for p in batch) // 7 + 64))\n"
    "        os.fdatasync(st['fd'])\n"
    "    if time.monotonic() - st['at'] > 1.0:\n"
    "        st['at'] = time.monotonic()\n"
    "        txn = f.env.begin(write=True)\n"
    "        try:\n"
    "            f.env.sync(True)\n"
    "            os.ftruncate(st['fd'], 0)\n"
    "            if st['held'] is not None:\n"
    "                st['held'].abort()\n"
    "            st['held'] = f.env.begin()\n"
    "        finally:\n"
    "            txn.abort()\n"
    "    return done\n"
    "committer._Committer._commit_batch = _commit_batch\n"
    "runpy.run_module('upf_writer', run_name='__main__')\n"
)
"""The writer's I/O as a write-ahead log in front of LMDB would make it, emulated: LMDB unsynced; each
commit appends a record of ~450 bytes a publish (a grouped publish weighs 7) and flushes it; once a
second a checkpoint flushes LMDB under its write lock and holds a reader at that snapshot, which keeps
LMDB from reusing the pages a crash would fall back to (without it an OS crash could corrupt the
file). No recovery: it prices the I/O only, a bound like the no-flush writer."""
_VARIANTS = {"shipped": None, "no flushes": _NOSYNC, "emulated log": _WAL}
_COMMIT = re.compile(r'^upf_store_commit_(batch_size|duration_seconds)_(sum|count)\{driver="embedded"\} (\S+)$', re.M)


def _disk(work: Path, n: int, rounds: int) -> dict[str, float]:
    """Mean us of: ``n`` scattered pages and a flush, ``n`` contiguous pages and a flush, and a
    one-page synced write right after the scattered flush (``rounds`` of each)."""
    path = work / "disk.test"
    size = 32 << 20
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    dfd = os.open(path, os.O_RDWR | os.O_DSYNC)
    try:
        os.pwrite(fd, b"\0" * size, 0)
        os.fsync(fd)
        page = b"x" * _PAGE
        pages = size // _PAGE
        scattered = contiguous = second = 0.0
        for i in range(rounds):
            t0 = time.perf_counter()
            for _ in range(n):
                os.pwrite(fd, page, random.randrange(2, pages) * _PAGE)
            os.fdatasync(fd)
            t1 = time.perf_counter()
            os.pwrite(dfd, page[:120], 32 if i % 2 else _PAGE + 32)  # as LMDB's meta page, alternating
            t2 = time.perf_counter()
            os.pwrite(fd, page * n, random.randrange(2, pages - n) * _PAGE)
            os.fdatasync(fd)
            t3 = time.perf_counter()
            scattered += t1 - t0
            second += t2 - t1
            contiguous += t3 - t2
    finally:
        os.close(dfd)
        os.close(fd)
        path.unlink()
    return {k: v / rounds * 1e6 for k, v in (("scattered", scattered), ("contiguous", contiguous), ("second", second))}


def commit_tallies(port: int) -> dict[str, float]:
    """The writer's commit tallies so far (0 before its first commit)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    got = dict.fromkeys(("batch_size_sum", "batch_size_count", "duration_seconds_sum", "duration_seconds_count"), 0.0)
    got.update((f"{m[1]}_{m[2]}", float(m[3])) for m in _COMMIT.finditer(text))
    return got


def _round(variant: str, work: Path, secs: float) -> dict[str, float]:
    store = work / f"{variant.replace(' ', '-')}-{time.monotonic_ns()}.db"
    code = _VARIANTS[variant]
    if code is None:
        p, port = procs.start_upf_writer(work, store, SERVER_CPUS, UPF_WRITER_SERVER="upf")
    else:
        argv = [PY, "-c", code]
        p, port = procs.start_upf_command("writer-io", argv, "io", "bench-writer", work, store, SERVER_CPUS)
    try:
        before = commit_tallies(port)
        d = pubdrive(f"http://127.0.0.1:{port}", [p.pid], secs=secs, conns=_CONNS, topics=_TOPICS)
        after = commit_tallies(port)
    finally:
        p.stop()
    if d.errors or d.non_200 or d.cpu_us_per_publish is None:
        raise SystemExit(f"{variant}: {d.errors} errors, answers other than 200: {d.non_200}")
    commits = after["batch_size_count"] - before["batch_size_count"]
    return {
        "per_s": d.ok_per_s,
        "cpu_us": d.cpu_us_per_publish,
        "busy": d.ok_per_s * d.cpu_us_per_publish / 1e6,
        "batch": (after["batch_size_sum"] - before["batch_size_sum"]) / commits,
        "commit_ms": (after["duration_seconds_sum"] - before["duration_seconds_sum"]) / commits * 1e3,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--secs", type=float, default=4.0)
    ap.add_argument("--skip-disk", action="store_true")
    ap.add_argument("--stalls", type=float, default=0.0, help="first time one-page flushes for this many seconds")
    ap.add_argument("--log", action="store_true", help="a third writer: the write-ahead log's I/O, emulated (_WAL)")
    a = ap.parse_args()
    if not 0 <= a.stalls <= 3600 or a.rounds < 0:
        ap.error("--stalls is 0 to 3600 seconds, --rounds at least 0")
    work = Path(tempfile.mkdtemp(prefix="upf-writer-io-"))
    try:
        if a.stalls:
            st = disk_stalls(work, a.stalls, "start")
            print(
                f"one-page flushes every 10 ms for {a.stalls:g} s under {work}: {st.flushes}, median "
                f"{st.median_ms:.2f} ms, p99 {st.p99_ms:.2f}, p99.9 {st.p999_ms:.2f}, max {st.max_ms:.1f}; "
                f"{st.over_50} over 50 ms, {st.over_100} over 100 ms",
                flush=True,
            )
        if not a.skip_disk:
            print(f"disk under {work} (mean of 100 each, us):")
            print(
                "| pages | scattered + fdatasync | contiguous + fdatasync | one-page O_DSYNC write after the scattered flush |"
            )
            print("|---|---|---|---|")
            for n in (1, 10, 50):
                r = _disk(work, n, 100)
                print(f"| {n} | {r['scattered']:,.0f} | {r['contiguous']:,.0f} | {r['second']:,.0f} |", flush=True)
        variants = ("shipped", "no flushes", "emulated log") if a.log else ("shipped", "no flushes")
        got: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
        for i in range(a.rounds):
            for v in variants if i % 2 == 0 else tuple(reversed(variants)):
                r = _round(v, work, a.secs)
                got[v].append(r)
                print(
                    f"round {i + 1} {v}: {r['per_s']:,.0f}/s, {r['cpu_us']:.1f} us, core busy {r['busy']:.2f}, "
                    f"{r['batch']:.1f} publishes per commit, {r['commit_ms']:.2f} ms per commit",
                    flush=True,
                )
    finally:
        procs.stop_all()
        shutil.rmtree(work, ignore_errors=True)
    if not a.rounds:
        return
    print(
        f"\nmedians of {a.rounds} rounds (writer on CPU {min(SERVER_CPUS)}, {_CONNS} connections, as fast as answered):"
    )
    print(
        "| writer | publishes/s | CPU us per publish | core busy | publishes per commit | ms per commit | commit ms per publish |"
    )
    print("|---|---|---|---|---|---|---|")
    for v in variants:
        med = {k: statistics.median(r[k] for r in got[v]) for k in got[v][0]}
        per = statistics.median(r["commit_ms"] / r["batch"] for r in got[v]) * 1e3
        print(
            f"| {v} | {med['per_s']:,.0f} | {med['cpu_us']:.1f} | {med['busy']:.2f} | {med['batch']:.1f} | "
            f"{med['commit_ms']:.2f} | {per:.1f} us |"
        )


if __name__ == "__main__":
    sys.exit(main())
