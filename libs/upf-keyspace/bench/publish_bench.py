"""Publish transactions per second on the embedded store (LMDB, group commit, synced on commit, many
concurrent publishers), beside a bare SQLite baseline measured in the same run: the same rows (a Q
and an X entry plus one affinity read per publish) written 256 publishes per durable commit
(synchronous=FULL). The baseline is the one issue 9 set; it stays SQLite after the switch to LMDB.

    uv run python libs/upf-keyspace/bench/publish_bench.py [--publishes N] [--concurrency C] [--rounds R]
        [--gc-thresholds G0,G1,G2] [--loop uvloop|asyncio] [--json F]

bench/run.py runs it as its ``store`` phase (``--json``), with ``--gc-thresholds`` set to the collector
policy every UPF process applies once it serves (``upf_edge.gcpolicy``): the store never runs under
CPython's defaults in UPF, and at those the collections (gen0 every 700 net allocations), with 1,024 publishers'
transactions alive, cost the loop thread 15-25 us per publish and most of the run-to-run spread. Without
the flag the collector keeps CPython's defaults (the figures before 2026-12-02). The store's event loop
is uvloop, the loop every UPF process runs (``upf_edge.loop``), unless ``--loop asyncio`` (the figures
before 2026-12-02; 1.5-5% fewer publishes/s in two alternating pairs of 3 rounds on 2026-12-02).

Figures drift between runs on shared machines; the ratio is the number to compare.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sqlite3
import statistics
import tempfile
import threading
import time
from collections.abc import Callable

from upf_keyspace import Envelope, Settings, encode_envelope, keys, open_store


def baseline(path: str, n: int, batch: int = 256) -> float:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("CREATE TABLE kv (k BLOB PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID")
    now = int(time.time())
    body = encode_envelope(Envelope(time=now, expires=now + 3600, message="x" * 100))
    start = time.perf_counter()
    for base in range(0, n, batch):
        conn.execute("BEGIN IMMEDIATE")
        for i in range(base, min(n, base + batch)):
            topic = f"topic{i % 1000}"
            stamp = i.to_bytes(10, "big") + b"\x00\x00"
            conn.execute("SELECT k FROM kv WHERE k >= ? AND k < ?", keys.affinity_range(topic)).fetchall()
            conn.execute("INSERT INTO kv VALUES (?, ?)", (keys.queue_key(topic, stamp), body))
            conn.execute("INSERT INTO kv VALUES (?, ?)", (keys.expiry_key(now + 3600, topic, stamp), b""))
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - start
    conn.close()
    return n / elapsed


def _thread_cpu(native_id: int) -> float:
    """A thread's CPU seconds from /proc (0 where there is no /proc)."""
    try:
        with open(f"/proc/self/task/{native_id}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def store_rate(path: str, n: int, concurrency: int, freeze: bool) -> tuple[float, float, float, float]:
    """Publishes/s, and CPU us per publish: the whole process, the event loop thread, the committer.
    The split says which thread bounds the rate; it is steadier than the rate on a shared machine."""
    store = await open_store(Settings(store_path=path))
    if freeze:  # as UPF's processes do once they serve: what opening left leaves every later collection
        gc.collect()
        gc.freeze()
    committer = next((t for t in threading.enumerate() if t.name == "upf-store-committer"), None)
    committer_id = committer.native_id if committer is not None and committer.native_id else 0
    now = int(time.time())
    env = Envelope(time=now, expires=now + 3600, message="x" * 100)
    counter = iter(range(n))

    async def worker() -> None:
        for i in counter:
            await store.publish(f"topic{i % 1000}", env)

    cpu0, loop0, commit0 = time.process_time(), time.thread_time(), _thread_cpu(committer_id)
    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - start
    cpu, loop_cpu = time.process_time() - cpu0, time.thread_time() - loop0
    commit_cpu = _thread_cpu(committer_id) - commit0
    await store.close()
    return n / elapsed, cpu / n * 1e6, loop_cpu / n * 1e6, commit_cpu / n * 1e6


def _loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop]:
    if name == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return asyncio.new_event_loop


def _thresholds(raw: str) -> list[int]:
    try:
        out = [int(x) for x in raw.split(",")]
    except ValueError:
        out = []
    if len(out) != 3 or min(out) < 0:
        raise argparse.ArgumentTypeError(f"want three counts G0,G1,G2 (such as 20000,10,10), got {raw!r}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--publishes", type=int, default=20000)
    ap.add_argument("--concurrency", type=int, default=1024)
    ap.add_argument(
        "--rounds", type=int, default=3, help="alternate baseline and store this many times; medians are compared"
    )
    ap.add_argument(
        "--gc-thresholds",
        type=_thresholds,
        default=[],
        help="G0,G1,G2: set the collector's thresholds (and freeze after each store opens) as UPF's processes do",
    )
    ap.add_argument(
        "--loop",
        choices=("uvloop", "asyncio"),
        default="uvloop",
        help="the store's event loop: uvloop, as UPF's processes run it (default), or asyncio's own",
    )
    ap.add_argument("--json", help="also write the per-round figures here (bench/run.py reads them)")
    args = ap.parse_args()
    thresholds: list[int] = args.gc_thresholds
    if thresholds:
        gc.set_threshold(*thresholds)
    bases, rates, cpus, loops, commits = [], [], [], [], []
    with tempfile.TemporaryDirectory() as d:
        for r in range(args.rounds):
            bases.append(baseline(os.path.join(d, f"baseline{r}.db"), args.publishes))
            with asyncio.Runner(loop_factory=_loop_factory(args.loop)) as runner:
                rate, cpu_us, loop_us, commit_us = runner.run(
                    store_rate(os.path.join(d, f"store{r}.db"), args.publishes, args.concurrency, bool(thresholds))
                )
            rates.append(rate)
            cpus.append(cpu_us)
            loops.append(loop_us)
            commits.append(commit_us)
            print(f"round {r + 1}: baseline {bases[-1]:8.0f}/s   store {rate:8.0f}/s   ratio {rate / bases[-1]:.2f}")
    base, rate, cpu_us = statistics.median(bases), statistics.median(rates), statistics.median(cpus)
    print(f"bare SQLite, 256 publishes per durable commit (median) : {base:10.0f} publishes/s")
    print(
        f"embedded store, {args.concurrency} concurrent publishers, {args.loop} (median): {rate:10.0f} publishes/s"
        f"  ({cpu_us:.0f} us CPU per publish: loop thread {statistics.median(loops):.0f},"
        f" committer {statistics.median(commits):.0f})"
    )
    print(f"ratio store / baseline                                 : {rate / base:10.2f}  (goal >= 0.50)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "publishes": args.publishes,
                    "concurrency": args.concurrency,
                    "gc_thresholds": thresholds,
                    "loop": args.loop,
                    "baseline_per_s": bases,
                    "store_per_s": rates,
                    "cpu_us_per_publish": cpus,
                    "loop_us_per_publish": loops,
                    "committer_us_per_publish": commits,
                },
                f,
            )


if __name__ == "__main__":
    main()
