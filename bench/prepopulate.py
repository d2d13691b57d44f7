"""Pre-populate an embedded store: one stored message (a 100-byte body) on each of N topics named
``<prefix><index, 7 digits>``, written through the keyspace library's ordinary publish (the same
transaction the writer runs), many publishes in flight so group commit keeps it quick.

    python bench/prepopulate.py --store /tmp/x/upf.db --topics 100000
"""

from __future__ import annotations

import argparse
import asyncio
import time

from upf_keyspace import Envelope, Settings, open_store


async def populate(path: str, topics: int, prefix: str, concurrency: int) -> float:
    store = await open_store(Settings(store_path=path))
    now = int(time.time())
    env = Envelope(
        time=now, expires=now + 7 * 86400, message=("lg:0:0:" + "abcdefghijklmnopqrstuvwxyz0123456789" * 3)[:100]
    )
    counter = iter(range(topics))

    async def worker() -> None:
        for i in counter:
            await store.publish(f"{prefix}{i:07d}", env)

    t0 = time.perf_counter()
    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        await store.close()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", required=True)
    ap.add_argument("--topics", type=int, default=100_000)
    ap.add_argument("--prefix", default="upTOPIC")
    ap.add_argument("--concurrency", type=int, default=512)
    a = ap.parse_args()
    secs = asyncio.run(populate(a.store, a.topics, a.prefix, a.concurrency))
    print(f"{a.topics} topics in {secs:.1f}s", flush=True)


if __name__ == "__main__":
    main()
