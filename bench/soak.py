"""Soak: a split fleet (writer, pushers, janitor on one embedded store) for N minutes at a steady publish
rate while subscribers churn, to show memory and descriptors stay flat and nothing is lost.

    python3 -m uv run --locked python bench/soak.py                       # 20 min at 1,000/s (half the knee)
    python3 -m uv run --locked python bench/soak.py --minutes 2 --rate 100

- Publishing: one sequential publisher per topic (seq 0,1,2,..., each awaited, as loadgen does), paced so
  the topics together send ``--rate`` messages a second, through loadgen's keep-alive pool.
- Churn: one subscriber per topic (half WebSocket, half JSON stream) holds its stream for a random time
  (exponential, mean ``--hold`` seconds), drops it, and resumes on a random pusher with
  ``since=<last id>``; so connections open and close continuously over the whole run.
- Every ``--sample`` seconds: RSS (VmRSS) and open descriptors of each role's process tree.
- At the end: publishing stops, the subscribers catch up (or ``--drain`` seconds pass), and loadgen's
  checker rules every topic (loss, duplicates, reordering, gaps, id mismatch). A table goes to stdout,
  everything to ``bench/results/soak/soak-<UTC time>.json``. Exit status 1 on any violation.

"Flat" is judged from the second sample (after warm-up) to the last: the growth of each role's RSS and
descriptors is printed beside the table. Every process started is stopped at the end, by its PID.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import websockets

from upf_loadgen.checker import Published, Violations, check_topic
from upf_loadgen.follow import Follower
from upf_loadgen.http11 import HttpError, Pool, parse_endpoint

sys.path.insert(0, str(Path(__file__).resolve().parent))
import procs

RESULTS = procs.REPO / "bench" / "results" / "soak"


def open_fds(pid: int) -> int:
    n = 0
    for p in procs.tree(pid):
        with contextlib.suppress(OSError):
            n += len(os.listdir(f"/proc/{p}/fd"))
    return n


class Publisher:
    def __init__(self, pool: Pool, topic: str, per_sec: float) -> None:
        self.pool, self.topic, self.interval = pool, topic, 1.0 / per_sec
        self.sent = 0
        self.accepted: dict[int, str] = {}
        self.failed = 0

    async def run(self, stop: asyncio.Event) -> None:
        next_at = time.monotonic() + random.uniform(0, self.interval)
        while not stop.is_set():
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            seq = self.sent
            self.sent += 1
            try:
                status, body = await self.pool.request("POST", f"/{self.topic}", str(seq).encode())
            except (HttpError, OSError, asyncio.IncompleteReadError):
                status, body = 0, b""
            if status == 200:
                self.accepted[seq] = json.loads(body)["id"]
            else:
                self.failed += 1
            next_at = max(next_at + self.interval, time.monotonic() - 1.0)  # no burst after a stall


class Subscriber(Follower):
    """Holds each stream a random time (exponential, mean ``hold``), then resumes on a random pusher."""

    def __init__(self, pushers: list[str], topic: str, ws: bool, hold: float) -> None:
        super().__init__(topic)
        self.pushers, self.ws, self.hold = pushers, ws, hold
        self.errors = 0

    async def run(self) -> None:
        while True:
            host, port = random.choice(self.pushers).rsplit(":", 1)
            stream = asyncio.ensure_future(self.stream(host, int(port), "ws" if self.ws else "json"))
            try:
                await asyncio.wait_for(asyncio.shield(stream), random.expovariate(1.0 / self.hold))
            except TimeoutError:
                pass  # held long enough: churn
            except (OSError, websockets.InvalidHandshake, asyncio.IncompleteReadError):
                self.errors += 1
                await asyncio.sleep(0.1)
            finally:
                stream.cancel()
                with contextlib.suppress(BaseException):
                    await stream


def table(samples: list[dict], roles: list[str]) -> str:
    head = (
        f"{'t (s)':>7} "
        + " ".join(f"{r + ' MB':>12} {r + ' fd':>10}" for r in roles)
        + f" {'subscribes':>10} {'sent':>9}"
    )
    rows = [head]
    for s in samples:
        rows.append(
            f"{s['t']:>7.0f} "
            + " ".join(f"{s['roles'][r]['rss_mb']:>12.1f} {s['roles'][r]['fds']:>10}" for r in roles)
            + f" {s['connected']:>10} {s['sent']:>9}"
        )
    return "\n".join(rows)


async def soak(args: argparse.Namespace, workdir: Path) -> int:
    store = workdir / "soak.db"
    common = dict(UPF_SHARD_COUNT="16", UPF_LOG_LEVEL="WARNING", UPF_LIMIT_REQUEST_BURST="1000000")
    writer, wport = procs.start_upf_writer(workdir, store, **common)
    roles: dict[str, procs.Proc] = {"writer": writer}
    pushers: list[str] = []
    for i in range(args.pushers):
        p, port = procs._start_role("upf_pusher", f"pusher{i}", f"soak-p{i}", workdir, store, None, dict(common))
        roles[f"pusher{i}"] = p
        pushers.append(f"127.0.0.1:{port}")
    janitor, _ = procs._start_role("upf_janitor", "janitor", "soak-j", workdir, store, None, dict(common))
    roles["janitor"] = janitor
    names = list(roles)

    topics = [f"soak{i:05d}" for i in range(args.topics)]
    subs = [Subscriber(pushers, t, i % 2 == 0, args.hold) for i, t in enumerate(topics)]
    tasks = [asyncio.create_task(s.run()) for s in subs]
    await asyncio.wait_for(asyncio.gather(*(s.opened.wait() for s in subs)), 60)
    pool = Pool(parse_endpoint(f"http://127.0.0.1:{wport}"), args.connections)
    pubs = [Publisher(pool, t, args.rate / args.topics) for t in topics]
    stop = asyncio.Event()
    publishing = [asyncio.create_task(p.run(stop)) for p in pubs]
    samples: list[dict] = []
    t0 = time.monotonic()
    end = t0 + args.minutes * 60
    print(
        f"soak: {args.minutes} min at {args.rate}/s over {args.topics} topics, {args.pushers} pushers, "
        f"hold ~{args.hold}s; workdir {workdir}",
        flush=True,
    )
    while True:
        now = time.monotonic()
        samples.append(
            {
                "t": now - t0,
                "roles": {
                    n: {"rss_mb": procs.tree_rss_kb([p.pid]) / 1024, "fds": open_fds(p.pid)} for n, p in roles.items()
                },
                "connected": sum(s.connects for s in subs),
                "sent": sum(p.sent for p in pubs),
            }
        )
        print(
            table(samples[-1:], names).splitlines()[1 if len(samples) > 1 else 0]
            if len(samples) > 1
            else table(samples, names),
            flush=True,
        )
        dead = [n for n, p in roles.items() if not p.alive()]
        if dead:
            print(f"soak: role(s) died: {dead}", flush=True)
            break
        if now >= end:
            break
        await asyncio.sleep(min(args.sample, max(0.0, end - now)))
    stop.set()
    await asyncio.gather(*publishing)
    elapsed = time.monotonic() - t0
    drain_until = time.monotonic() + args.drain
    while time.monotonic() < drain_until and not all(
        set(p.accepted) <= set(s.seqs) for p, s in zip(pubs, subs, strict=True)
    ):
        await asyncio.sleep(0.5)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await pool.aclose()

    total = Violations()
    for p, s in zip(pubs, subs, strict=True):
        v = check_topic(
            Published(topic=p.topic, sent=p.sent, accepted=p.accepted),
            [s.received()],
        )
        total.add(v.violations)
    sent = sum(p.sent for p in pubs)
    accepted = sum(len(p.accepted) for p in pubs)
    base = samples[1] if len(samples) > 2 else samples[0]
    growth = {
        n: {
            "rss_mb": samples[-1]["roles"][n]["rss_mb"] - base["roles"][n]["rss_mb"],
            "fds": samples[-1]["roles"][n]["fds"] - base["roles"][n]["fds"],
        }
        for n in names
    }
    result = {
        "args": vars(args),
        "elapsed_s": elapsed,
        "sent": sent,
        "accepted": accepted,
        "failed": sum(p.failed for p in pubs),
        "rate": sent / elapsed,
        "subscribes": sum(s.connects for s in subs),
        "subscribe_errors": sum(s.errors for s in subs),
        "violations": {f: getattr(total, f) for f in total.__struct_fields__},
        "clean": total.total() == 0,
        "growth_from_second_sample": growth,
        "samples": samples,
    }
    print()
    print(table(samples, names))
    print(
        f"\nsent {sent} in {elapsed:.0f} s ({sent / elapsed:.0f}/s), accepted {accepted}, failed {result['failed']}; "
        f"{result['subscribes']} subscribes ({result['subscribe_errors']} refused or failed)"
    )
    print(
        "growth since the second sample: "
        + ", ".join(f"{n} {g['rss_mb']:+.1f} MB {g['fds']:+d} fd" for n, g in growth.items())
    )
    print(f"checker: {result['violations']} -> {'CLEAN' if result['clean'] else 'VIOLATIONS'}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"soak-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    out.write_text(json.dumps(result, indent=1))
    print(f"written: {out.relative_to(procs.REPO)}")
    return 0 if result["clean"] else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=20.0)
    ap.add_argument("--rate", type=float, default=1000.0, help="publishes per second in all (default: half the knee)")
    ap.add_argument("--topics", type=int, default=0, help="default: rate / 5 (5 publishes per topic per second)")
    ap.add_argument("--pushers", type=int, default=2)
    ap.add_argument("--hold", type=float, default=5.0, help="mean seconds a subscriber holds a stream before churning")
    ap.add_argument("--sample", type=float, default=10.0, help="seconds between RSS/descriptor samples")
    ap.add_argument("--connections", type=int, default=64, help="publisher keep-alive pool size")
    ap.add_argument("--drain", type=float, default=60.0, help="seconds subscribers get to catch up at the end")
    args = ap.parse_args()
    args.topics = args.topics or max(1, int(args.rate / 5))
    with tempfile.TemporaryDirectory(prefix="upf-soak-") as tmp:
        try:
            return asyncio.run(soak(args, Path(tmp)))
        finally:
            procs.stop_all()


if __name__ == "__main__":
    sys.exit(main())
