"""Profile UPF under one of the bench's loads with py-spy, and print where the samples went.

Not part of bench/run.py (py-spy slows the target down); this is how the findings in BENCHMARKS.md
were produced. py-spy is not a dependency of the workspace: it is run with ``uv tool run``.

    python3 -m uv run python bench/profile.py writer-ingest      # the writer saturated by pubdrive
    python3 -m uv run python bench/profile.py allinone --rate 750 # all-in-one under loadgen
    python3 -m uv run python bench/profile.py allinone --rate 2000 --workers 2   # each worker profiled
    python3 -m uv run python bench/profile.py split --rate 500 --idle   # wall-clock, incl. lock waits
    python3 -m uv run python bench/profile.py fanout              # split pusher, 10 topics x 100 subs

Each run prints, per profiled process, its threads' share of the samples, then the functions by
inclusive share ("self+callees") and by own share (leaf), with file:line.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import procs
from harness import wait_workers
from procs import PY, REPO

LOADGEN = str(Path(PY).parent / "upf-loadgen")


def _uv_tool_run() -> list[str]:
    """``uvx``, or ``uv tool run`` through whichever Python has uv (the workspace venv does not)."""
    if shutil.which("uvx"):
        return ["uvx"]
    if shutil.which("uv"):
        return ["uv", "tool", "run"]
    return [shutil.which("python3") or "python3", "-m", "uv", "tool", "run"]


def py_spy(pid: int, secs: float, out: Path, idle: bool, rate: int) -> subprocess.Popen[bytes]:
    argv = [
        *_uv_tool_run(),
        "py-spy",
        "record",
        "-p",
        str(pid),
        "-d",
        str(int(secs)),
        "-r",
        str(rate),
        "-f",
        "raw",
        "-o",
        str(out),
        "--threads",
    ]
    if idle:
        argv.append("--idle")
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=REPO)


def thread_cpu(pid: int) -> dict[str, tuple[str, int, int]]:
    """tid -> (comm, utime, stime) in clock ticks, from /proc/<pid>/task."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            comm = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            raw = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        f = raw[raw.rindex(")") + 2 :].split()
        out[tid] = (comm, int(f[11]), int(f[12]))
    return out


def thread_report(before: dict[str, tuple[str, int, int]], after: dict[str, tuple[str, int, int]], secs: float) -> str:
    tick = os.sysconf("SC_CLK_TCK")
    rows = []
    for tid, (comm, u, s) in after.items():
        if tid in before:
            du, ds = (u - before[tid][1]) / tick / secs * 100, (s - before[tid][2]) / tick / secs * 100
            if du + ds >= 0.5:
                rows.append(f"  tid {tid} {comm:18s} user {du:5.1f}%  sys {ds:5.1f}%  of a core")
    return "\n".join(rows)


def report(path: Path, top: int) -> str:
    incl: collections.Counter[str] = collections.Counter()
    leaf: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        stack, n_s = line.rsplit(" ", 1)
        n = int(n_s)
        frames = stack.split(";")
        total += n
        threads[frames[0]] += n
        seen = set()
        for f in frames[1:]:
            # "func (path/to/file.py:123)" -> "func (file.py:123)"
            name, _, loc = f.partition(" (")
            key = f"{name} ({loc.rsplit('/', 1)[-1]}" if loc else name
            if key not in seen:
                seen.add(key)
                incl[key] += n
        name, _, loc = frames[-1].partition(" (")
        leaf[f"{name} ({loc.rsplit('/', 1)[-1]}" if loc else name] += n
    out = [f"{total} samples"]
    out += [f"  {100 * c / total:5.1f}%  {t}" for t, c in threads.most_common()]
    out.append("inclusive:")
    out += [f"  {100 * c / total:5.1f}%  {k}" for k, c in incl.most_common(top)]
    out.append("own (leaf):")
    out += [f"  {100 * c / total:5.1f}%  {k}" for k, c in leaf.most_common(top // 2)]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenario", choices=("writer-ingest", "bare-ingest", "allinone", "split", "fanout"))
    ap.add_argument("--rate", type=float, default=750.0, help="loadgen publishes/s (allinone, split)")
    ap.add_argument("--topics", type=int, default=1000)
    ap.add_argument("--secs", type=float, default=8.0, help="seconds profiled")
    ap.add_argument("--idle", action="store_true", help="include waiting threads (wall-clock view)")
    ap.add_argument("--sample-rate", type=int, default=200)
    ap.add_argument("--top", type=int, default=50)
    ap.add_argument("--workers", type=int, default=1, help="allinone: UPF_WORKERS; each worker is profiled")
    ap.add_argument(
        "--threads-only", action="store_true", help="no py-spy: only each thread's CPU from /proc (undisturbed)"
    )
    ap.add_argument("--keep", action="store_true", help="keep the work directory (py-spy raw files, server logs)")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="upf-profile-"))
    store = work / "upf.db"
    targets: dict[str, int] = {}
    load: subprocess.Popen[str] | None = None
    try:
        if a.scenario in ("writer-ingest", "bare-ingest"):
            if a.scenario == "writer-ingest":
                p, port = procs.start_upf_writer(work, store, {0})
            else:
                p, port = procs.start_bare_asgi(work, {0})
            time.sleep(0.5)
            kids = [c for c in procs.tree(p.pid) if c != p.pid]
            targets["granian-worker" if kids else "server"] = kids[-1] if kids else p.pid
            load = subprocess.Popen(
                [
                    PY,
                    str(REPO / "bench" / "pubdrive.py"),
                    "--url",
                    f"http://127.0.0.1:{port}",
                    "--duration",
                    str(a.secs + 4),
                    "--topics",
                    str(a.topics),
                ],
                stdout=subprocess.DEVNULL,
                text=True,
                preexec_fn=lambda: __import__("os").sched_setaffinity(0, {1}),
            )
        else:
            if a.scenario == "allinone":
                p, port = procs.start_upf_allinone(work, store, UPF_WORKERS=str(a.workers))
                if a.workers > 1:
                    wait_workers(p, port, a.workers)
                    for i, kid in enumerate(procs.children(p.pid)):
                        targets[f"upf worker {i}"] = kid
                else:
                    targets["upf"] = p.pid
                writer = pusher = f"http://127.0.0.1:{port}"
            else:
                w, wport = procs.start_upf_writer(work, store)
                pu, pport = procs.start_upf_pusher(work, store)
                kids = [c for c in procs.tree(w.pid) if c != w.pid]
                targets["writer(granian worker)"] = kids[-1] if kids else w.pid
                targets["pusher"] = pu.pid
                writer, pusher = f"http://127.0.0.1:{wport}", f"http://127.0.0.1:{pport}"
            extra = (
                ["--topics", "10", "--subs-per-topic", "100", "--rate", "100"]
                if a.scenario == "fanout"
                else ["--topics", str(a.topics), "--rate", str(a.rate)]
            )
            load = subprocess.Popen(
                [
                    LOADGEN,
                    "run",
                    "--writer",
                    writer,
                    "--pusher",
                    pusher,
                    "--duration",
                    str(a.secs + 4),
                    "--message-size",
                    "100",
                    "--quiet",
                    *extra,
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        time.sleep(3.0)  # subscribers connected, load running
        before = {name: thread_cpu(pid) for name, pid in targets.items()}
        t0 = time.monotonic()
        if a.threads_only:
            time.sleep(a.secs)
        spies = (
            {}
            if a.threads_only
            else {
                name: (py_spy(pid, a.secs, work / f"{name}.raw", a.idle, a.sample_rate), work / f"{name}.raw")
                for name, pid in targets.items()
            }
        )
        for spy, _ in spies.values():
            spy.wait(a.secs + 60)
        after = {name: thread_cpu(pid) for name, pid in targets.items()}
        secs = time.monotonic() - t0
        for name in targets:
            print(
                f"=== {a.scenario}: {name}: CPU per thread over {secs:.1f}s{'' if a.threads_only else ' (py-spy attached)'} ==="
            )
            print(thread_report(before[name], after[name], secs))
            if name in spies:
                spy, out = spies[name]
                print(f"--- py-spy {'(wall-clock, --idle)' if a.idle else '(on-CPU)'}")
                print(
                    report(out, a.top)
                    if out.exists()
                    else f"py-spy failed: {spy.stderr.read().decode() if spy.stderr else ''}"
                )
        if load is not None:
            out_text = load.communicate(timeout=120)[0] if load.stdout else ""
            load = None
            if out_text:
                print(
                    "\n".join(
                        line
                        for line in out_text.splitlines()
                        if line.startswith(("latency", "correctness", "throughput", "VERDICT"))
                    )
                )
    finally:
        if load is not None and load.poll() is None:
            load.terminate()
            load.wait(10)
        procs.stop_all()
        if a.keep:
            print(f"raw profiles and logs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
