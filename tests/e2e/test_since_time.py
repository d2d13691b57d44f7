"""since=<unix time> on a large topic, black box: the store is filled before the process starts
(straight into the keyspace), then real clients poll and stream over HTTP."""

from __future__ import annotations

import asyncio
import time

import httpx

from tests.clients.ntfy import poll, subscribe
from upf_keyspace import Envelope, Settings, keys, open_store
from upf_keyspace.envelope import encode_envelope
from upf_keyspace.ops.publish import index_time

MESSAGES = 60_000
PER_SECOND = 10


async def _fill(path: str, topic: str, messages: int = MESSAGES) -> int:
    store = await open_store(Settings(store_path=path, shard_count=8))
    base = int(time.time()) - messages // PER_SECOND - 30
    try:
        for start in range(0, messages, 5000):

            async def body(tr, start=start):
                for i in range(start, start + 5000):
                    t = base + i // PER_SECOND
                    uv = tr.next_user_version()
                    env = Envelope(time=t, expires=t + 86400, message=f"m{i}")
                    tr.set_versionstamped_key(keys.queue_key_incomplete(topic, uv), encode_envelope(env))
                    tr.set_versionstamped_key(keys.expiry_key_incomplete(env.expires, topic, uv), b"")
                    index_time(tr, topic, t, uv)

            await store.db.transact(body)
    finally:
        await store.close()
    return base


async def test_poll_and_stream_since_unix_time_on_a_large_topic(fleet):
    base = await _fill(fleet.store, "upBIGTIME01")
    upf = fleet.start("upf", node="allinone")
    since = base + MESSAGES // PER_SECOND - 2  # the last two seconds: 20 messages
    started = time.monotonic()
    frames = await poll(upf.base, "upBIGTIME01", since=str(since))
    assert time.monotonic() - started < 2.0
    assert [f.message for f in frames] == [f"m{i}" for i in range(MESSAGES - 20, MESSAGES)]
    assert all(f.time >= since for f in frames)

    # A stream with since=<time> gets the same 20, then what is published next; health stays quick.
    async with subscribe(upf.base, "upBIGTIME01", "json", f"since={since}") as s:
        got = await s.messages(20)
        assert [f.message for f in got] == [f"m{i}" for i in range(MESSAGES - 20, MESSAGES)]
        async with httpx.AsyncClient(timeout=5) as c:
            r = await c.post(f"{upf.base}/upBIGTIME01", content=b"live")
            assert r.status_code == 200
            health = await asyncio.wait_for(c.get(f"{upf.base}/v1/health"), 1.0)
            assert health.status_code == 200
        assert (await s.next_message()).message == "live"


HUGE = 500_000


async def test_health_answers_within_100_ms_while_time_polls_run_on_a_500k_topic(fleet):
    """Hardening finding 1 as the issue bounds it: polls with since=<time> on a 500,000-message topic
    (before the time index, each scanned the queue from its start on the event loop: 95 s at 720,000)
    run back to back from one client while another asks /v1/health; every health answer comes
    within 100 ms."""
    base = await _fill(fleet.store, "upHUGETIME1", HUGE)
    upf = fleet.start("upf", node="allinone", UPF_WORKERS="1")
    since = base + HUGE // PER_SECOND - 1  # the last second: 10 messages
    want = [f"m{i}" for i in range(HUGE - 10, HUGE)]
    stop = asyncio.Event()
    polls = 0

    async def poller() -> None:
        nonlocal polls
        while not stop.is_set():
            frames = await poll(upf.base, "upHUGETIME1", since=str(since))
            assert [f.message for f in frames] == want
            polls += 1

    pollers = [asyncio.create_task(poller()) for _ in range(1)]
    waits = []
    try:
        async with httpx.AsyncClient(timeout=5) as c:
            await asyncio.sleep(0.5)  # the polls are under way
            for _ in range(40):
                started = time.monotonic()
                r = await c.get(f"{upf.base}/v1/health")
                waits.append(time.monotonic() - started)
                assert r.status_code == 200 and r.json()["healthy"] is True
                await asyncio.sleep(0.05)
    finally:
        stop.set()
        await asyncio.gather(*pollers)
    print(f"health max {max(waits) * 1000:.1f} ms over {len(waits)}, {polls} polls")
    assert polls >= 20  # the polls really ran alongside
    assert max(waits) < 0.1, sorted(waits)[-5:]
