"""CPU per publish of the writer's plain-function front on the real embedded store, in-process: the
all-in-one's publish path without HTTP. ``--in-flight`` publishes are awaited together, which sets
how many transactions a physical commit carries (1: every publish pays a whole commit).

    uv run python services/writer/bench/front_publish.py [--in-flight 64] [--publishes 10000] [--profile]

Compare trees by running it alternately in each (each with its own venv); one run's figure alone
drifts by 10-20% on a shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import tempfile
import time
from typing import Any

HEADERS = [(b"content-type", b"text/plain"), (b"host", b"x")]
TOPICS = 1000


async def main(in_flight: int, publishes: int, profile: bool) -> None:
    os.environ["UPF_STORE_PATH"] = os.path.join(tempfile.mkdtemp(prefix="front-publish-"), "s.db")
    from upf_keyspace.settings import load_settings
    from upf_keyspace.store import open_store
    from upf_writer.app import _gate  # the gate and limiter exactly as the served app takes them
    from upf_writer.context import WriterContext
    from upf_writer.front import WriterFront

    settings = load_settings()
    store = await open_store(settings)
    ctx = WriterContext(settings, store)
    async with _gate(ctx, store):
        await _measure(WriterFront(ctx, frozenset()), in_flight, publishes, profile)
    await store.close()


async def _measure(front: Any, in_flight: int, publishes: int, profile: bool) -> None:
    body = b"x" * 100

    async def one(i: int) -> None:
        reply = await front.publish(f"upAUTH{i % TOPICS}", HEADERS, b"", body, "127.0.0.1")
        assert reply.status == 200, reply

    async def run(count: int) -> None:
        for i in range(0, count, in_flight):
            await asyncio.gather(*(one(i + j) for j in range(in_flight)))

    await run(2048)  # warm: caches, the write log, the committer
    prof = cProfile.Profile() if profile else None
    c0 = time.process_time()
    if prof:
        prof.enable()
    await run(publishes)
    if prof:
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)
    else:
        print(f"{(time.process_time() - c0) / publishes * 1e6:.1f} us CPU per publish ({in_flight} in flight)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--in-flight", type=int, default=64)
    ap.add_argument("--publishes", type=int, default=10_000)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    asyncio.run(main(a.in_flight, a.publishes, a.profile))
