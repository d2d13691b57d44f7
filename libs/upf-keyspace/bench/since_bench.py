"""Time per ``since=<time>`` position on one large topic: the old scan from the queue's start against
the time index, same store, same run. Builds the topic straight into the keyspace (big transactions).

    python3 -m uv run --locked python libs/upf-keyspace/bench/since_bench.py --messages 50000
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time

from upf_keyspace import Envelope, Settings, Since, keys, open_store
from upf_keyspace.envelope import decode_envelope, encode_envelope
from upf_keyspace.ops import read
from upf_keyspace.ops.publish import index_time


async def old_position(tr, topic: str, second: int) -> bytes | None:
    """The scan ``position`` did before the index (kept here only to measure against)."""
    begin, end = keys.queue_range(topic)
    cursor = None
    while True:
        rows = await tr.get_range(begin, end, limit=512, snapshot=True)
        for k, v in rows:
            if decode_envelope(v).time >= second:
                return cursor
            cursor = keys.unpack_queue_key(k)[1]
        if len(rows) < 512:
            return cursor
        begin = rows[-1][0] + b"\x00"


async def run(messages: int, per_second: int, repeats: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = await open_store(Settings(store_path=f"{tmp}/upf.db"))
        base = int(time.time()) - messages // per_second - 60
        t0 = time.perf_counter()
        for start in range(0, messages, 5000):

            async def body(tr, start=start):
                for i in range(start, min(messages, start + 5000)):
                    t = base + i // per_second
                    uv = tr.next_user_version()
                    env = Envelope(time=t, expires=t + 86400, message="x" * 100)
                    tr.set_versionstamped_key(keys.queue_key_incomplete("big", uv), encode_envelope(env))
                    index_time(tr, "big", t, uv)

            await store.db.transact(body)
        print(f"built {messages} messages in {time.perf_counter() - t0:.1f}s", flush=True)
        # since = 10 s before the newest message: the common "what did I miss" case, worst for the scan.
        second = base + messages // per_second - 10
        new_cur = await store.db.transact(read.position, "big", Since("time", time=second))
        old_cur = await store.db.transact(old_position, "big", second)
        assert new_cur == old_cur, "the index and the scan disagree"
        for name, fn, since in (
            ("old scan", old_position, int),
            ("index", read.position, lambda t: Since("time", time=t)),
        ):
            times = []
            for k in range(repeats):  # a different second each call: no cached range read is reused
                t = time.perf_counter()
                await store.db.transact(fn, "big", since(second - k))
                times.append(time.perf_counter() - t)
            print(
                f"{name:>9}: median {statistics.median(times) * 1e3:9.3f} ms  max {max(times) * 1e3:9.3f} ms  ({repeats} calls)"
            )
        await store.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--per-second", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    asyncio.run(run(a.messages, a.per_second, a.repeats))


if __name__ == "__main__":
    main()
