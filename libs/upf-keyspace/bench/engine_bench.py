"""SQLite (WAL, synchronous=FULL) against LMDB (sync on commit) as the embedded store's engine, same
run, same rows: each publish is one affinity lookup (a range probe under the topic's C prefix) plus a
Q and an X insert, 256 publishes per durable commit; then range reads of Q (20 entries after a
cursor, one read transaction each), as a pusher's drain does.

    uv run python libs/upf-keyspace/bench/engine_bench.py [--publishes N] [--rounds R]

This measures the engines alone (no transaction layer, no asyncio): it bounded what the switch to
LMDB could buy; the end-to-end A/B that decided it is in BENCHMARKS.md. Figures drift between runs on shared machines; compare the ratios.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import tempfile
import time

import lmdb

from upf_keyspace import Envelope, encode_envelope, keys

BATCH = 256
TOPICS = 1000


def _rows(n: int):  # type: ignore[no-untyped-def]
    now = int(time.time())
    body = encode_envelope(Envelope(time=now, expires=now + 3600, message="x" * 100))
    for i in range(n):
        topic = f"topic{i % TOPICS}"
        stamp = i.to_bytes(10, "big") + b"\x00\x00"
        yield keys.affinity_range(topic), keys.queue_key(topic, stamp), body, keys.expiry_key(now + 3600, topic, stamp)


def _read_ranges() -> list[tuple[bytes, bytes]]:
    return [keys.queue_range(f"topic{t}") for t in range(TOPICS)]


def sqlite_round(path: str, n: int) -> tuple[float, float]:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("CREATE TABLE kv (k BLOB PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID")
    rows = list(_rows(n))
    start = time.perf_counter()
    for base in range(0, n, BATCH):
        conn.execute("BEGIN IMMEDIATE")
        for (cb, ce), qk, body, xk in rows[base : base + BATCH]:
            conn.execute("SELECT k, v FROM kv WHERE k >= ? AND k < ? LIMIT 1", (cb, ce)).fetchall()
            conn.execute("INSERT INTO kv VALUES (?, ?)", (qk, body))
            conn.execute("INSERT INTO kv VALUES (?, ?)", (xk, b""))
        conn.execute("COMMIT")
    write_rate = n / (time.perf_counter() - start)
    ranges = _read_ranges()
    start = time.perf_counter()
    for b, e in ranges:
        conn.execute("SELECT k, v FROM kv WHERE k > ? AND k < ? ORDER BY k LIMIT 20", (b, e)).fetchall()
    read_rate = len(ranges) / (time.perf_counter() - start)
    conn.close()
    return write_rate, read_rate


def lmdb_round(path: str, n: int) -> tuple[float, float]:
    env = lmdb.open(path, map_size=1 << 31, sync=True, metasync=True, max_dbs=0)
    rows = list(_rows(n))
    start = time.perf_counter()
    for base in range(0, n, BATCH):
        with env.begin(write=True) as txn:
            cur = txn.cursor()
            for (cb, ce), qk, body, xk in rows[base : base + BATCH]:
                if cur.set_range(cb) and cur.key() < ce:
                    cur.value()
                txn.put(qk, body)
                txn.put(xk, b"")
    write_rate = n / (time.perf_counter() - start)
    ranges = _read_ranges()
    start = time.perf_counter()
    for b, e in ranges:
        with env.begin() as txn:
            cur = txn.cursor()
            out = []
            if cur.set_range(b + b"\x00"):
                for k, v in cur:
                    if k >= e or len(out) >= 20:
                        break
                    out.append((k, v))
    read_rate = len(ranges) / (time.perf_counter() - start)
    env.close()
    return write_rate, read_rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--publishes", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3, help="alternate the engines this many times; medians are compared")
    args = ap.parse_args()
    res: dict[str, list[tuple[float, float]]] = {"sqlite": [], "lmdb": []}
    with tempfile.TemporaryDirectory() as d:
        for r in range(args.rounds):
            res["sqlite"].append(sqlite_round(os.path.join(d, f"s{r}.db"), args.publishes))
            res["lmdb"].append(lmdb_round(os.path.join(d, f"l{r}.lmdb"), args.publishes))
            (sw, sr), (lw, lr) = res["sqlite"][-1], res["lmdb"][-1]
            print(
                f"round {r + 1}: publishes/s sqlite {sw:8.0f} lmdb {lw:8.0f} ({lw / sw:.2f}x)   "
                f"range reads/s sqlite {sr:8.0f} lmdb {lr:8.0f} ({lr / sr:.2f}x)"
            )
    sw, lw = (statistics.median(w for w, _ in res[k]) for k in ("sqlite", "lmdb"))
    sr, lr = (statistics.median(r for _, r in res[k]) for k in ("sqlite", "lmdb"))
    print(
        f"publishes/s, {BATCH} per durable commit (median): sqlite {sw:10.0f}   lmdb {lw:10.0f}   lmdb/sqlite {lw / sw:5.2f}"
    )
    print(
        f"range reads/s, 20 rows each (median)        : sqlite {sr:10.0f}   lmdb {lr:10.0f}   lmdb/sqlite {lr / sr:5.2f}"
    )


if __name__ == "__main__":
    main()
