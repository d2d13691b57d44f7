"""Idle CPU and cross-process watch latency of the embedded store, for this tree and (optionally) an
older copy of the package in the same run.

    uv run python libs/upf-keyspace/bench/wake_bench.py [--seconds 30] [--rounds 20] [--old-src DIR]

Idle: child processes open a store and hold 64 watches (as a pusher does) or none, then do nothing;
their CPU is read from /proc/<pid>/stat over ``--seconds``, all children side by side. Latency: a
child holds a watch, this process commits a change, the child reports when the watch fired; the
figure runs from the start of the commit, so it includes the commit's fsync.
``--old-src`` is a directory holding an ``upf_keyspace`` package to compare against (for example
``git archive`` of an older commit's ``libs/upf-keyspace/src``). Compare ratios within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

CHILD = textwrap.dedent(
    """
    import asyncio, sys, time
    from upf_keyspace.drivers.embedded import open_embedded

    async def main(path, watches, mode):
        db = await open_embedded(path)
        async def arm(tr):
            return [tr.watch(b"\\x01bench/bell/%d" % i) for i in range(watches)]
        held = await db.transact(arm)
        print("ready", flush=True)
        if mode == "idle":
            await asyncio.sleep(3600)
        while True:  # latency: report each wake of watch 0, then re-arm it
            await held[0]
            woke = time.time()
            print(woke, flush=True)
            held[0] = await db.transact(lambda tr: _one(tr))
            print("rearmed", flush=True)

    async def _one(tr):
        return tr.watch(b"\\x01bench/bell/0")

    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
    """
)


def _spawn(src: str, path: str, watches: int, mode: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=src)
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, path, str(watches), mode],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def _cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


async def _set(db, key: bytes, value: bytes) -> None:
    async def body(tr):
        tr.set(key, value)

    await db.transact(body)


async def _latency(trees: list[tuple[str, str]], d: str, rounds: int) -> dict[str, list[float]]:
    """Alternate commits between the trees' children, so both see the same machine load."""
    from upf_keyspace.drivers.embedded import open_embedded

    runs = []
    for label, src in trees:
        path = os.path.join(d, f"lat-{label.replace(' ', '_')}.db")
        runs.append((label, await open_embedded(path), _spawn(src, path, 1, "latency")))
    out: dict[str, list[float]] = {label: [] for label, _ in trees}
    try:
        for i in range(rounds):
            for label, db, proc in runs:
                assert proc.stdout is not None
                await asyncio.sleep(0.02)
                committed = time.time()
                await _set(db, b"\x01bench/bell/0", str(i).encode())
                woke = float(await asyncio.to_thread(proc.stdout.readline))
                out[label].append((woke - committed) * 1000)
                assert (await asyncio.to_thread(proc.stdout.readline)).strip() == "rearmed"
    finally:
        for _, db, proc in runs:
            proc.kill()
            proc.wait()
            await db.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--old-src", default="", help="a directory holding an older upf_keyspace package")
    args = ap.parse_args()
    new_src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    trees = [("this tree", new_src)] + ([("old", os.path.abspath(args.old_src))] if args.old_src else [])
    hz = os.sysconf("SC_CLK_TCK")
    with tempfile.TemporaryDirectory() as d:
        children = []
        for label, src in trees:
            for watches in (64, 0):
                path = os.path.join(d, f"{label.replace(' ', '_')}-{watches}.db")
                children.append((label, watches, _spawn(src, path, watches, "idle")))
        time.sleep(1.0)  # past start-up
        start = {p.pid: _cpu_ticks(p.pid) for _, _, p in children}
        time.sleep(args.seconds)
        for label, watches, p in children:
            used = (_cpu_ticks(p.pid) - start[p.pid]) / hz
            print(
                f"idle, {watches:2d} watches, {label:9s}: {used / args.seconds * 100:6.2f}% of a core over {args.seconds:.0f} s"
            )
            p.kill()
            p.wait()
        for label, ms in asyncio.run(_latency(trees, d, args.rounds)).items():
            print(
                f"cross-process watch latency, {label:9s}: median {statistics.median(ms):6.2f} ms, "
                f"max {max(ms):6.2f} ms over {len(ms)} commits"
            )


if __name__ == "__main__":
    main()
