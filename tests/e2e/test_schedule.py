"""Scheduled delivery (X-Delay / X-At / X-In), black box: a writer, two pushers and a janitor as
separate processes on one store file. The delay bounds are settings; here the minimum is 2 s so the
tests need not wait ntfy's 10 s."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from tests.clients.ntfy import error_body, poll, publish, subscribe

pytestmark = pytest.mark.slow

MIN = "2"


@pytest.fixture
def split(fleet):
    writer = fleet.start("upf_writer", node="w1", UPF_DELAY_MIN_SECS=MIN)
    a = fleet.start("upf_pusher", node="pusherA", UPF_SAFETY_POLL_SECS="600", UPF_RELEASE_POLL_SECS="0.05")
    b = fleet.start("upf_pusher", node="pusherB", UPF_SAFETY_POLL_SECS="600", UPF_RELEASE_POLL_SECS="0.3")
    fleet.start("upf_janitor", node="j1")
    return writer, a, b


async def _sleep_until(unix: float) -> None:
    await asyncio.sleep(max(0.0, unix - time.time()))


async def test_released_once_though_a_pusher_is_killed_at_release(split):
    """Pusher A (the eager releaser, and the holder of one subscriber) is killed -9 just as the message
    falls due: B releases it if A had not, and every subscriber sees it exactly once, with the id and
    time of the publish reply; so does a poll and a reconnect with since=all."""
    writer, a, b = split
    topic = "sched1"
    async with subscribe(a.base, topic, "json") as on_a, subscribe(b.base, topic, "ws") as on_b:
        before = (await publish(writer.base, topic, "before")).json()
        assert (await on_a.next_message()).id == before["id"]
        assert (await on_b.next_message()).id == before["id"]
        r = await publish(writer.base, topic, "scheduled", headers={"X-Delay": "3s"})
        assert r.status_code == 200, r.text
        sched = r.json()
        assert sched["time"] - time.time() > 1.5  # the reply's time is the delivery time
        assert [f.id for f in await poll(b.base, topic)] == [before["id"]]  # hidden until then
        await _sleep_until(sched["time"] - 0.05)
        a.kill9()
        got = await on_b.next_message(10)
        assert (got.id, got.time, got.message) == (sched["id"], sched["time"], "scheduled")
        assert await on_b.no_message_within(2.0), "the scheduled message arrived twice"
    # The subscriber A held resumes on B: it gets the message once, by the id it will ack with.
    async with subscribe(b.base, topic, "sse", f"since={before['id']}") as resumed:
        assert (await resumed.next_message()).id == sched["id"]
        assert await resumed.no_message_within(1.0)
    assert [f.id for f in await poll(b.base, topic)] == [before["id"], sched["id"]]
    # since=<the scheduled id> resumes after its release: nothing again.
    async with subscribe(b.base, topic, "json", f"since={sched['id']}") as after:
        assert await after.no_message_within(1.0)


async def test_every_form_of_the_delay(split):
    """Header names, query names and the JSON field; durations, a unix time and natural forms."""
    writer, a, _ = split
    now = int(time.time())
    async with httpx.AsyncClient(timeout=10) as c:
        cases = [
            (await c.post(f"{writer.base}/sched2", content=b"h", headers={"X-In": "1h"}), now + 3600),
            (await c.post(f"{writer.base}/sched2", content=b"q", params={"delay": "10m"}), now + 600),
            (await c.put(f"{writer.base}/sched2", content=b"u", params={"at": str(now + 7200)}), now + 7200),
            (await c.post(f"{writer.base}/sched2", content=b"n", headers={"X-At": "in 2 hours"}), now + 7200),
            (await c.post(f"{writer.base}/sched2", content=b"d", headers={"X-Delay": "2 days"}), now + 172_800),
            (await c.post(writer.base + "/", json={"topic": "sched2", "message": "j", "delay": "30s"}), now + 30),
        ]
    for r, due in cases:
        assert r.status_code == 200, r.text
        body = r.json()
        assert due <= body["time"] <= due + 2, (body, due)
        assert body["expires"] > body["time"]
    assert await poll(a.base, "sched2") == []


async def test_bad_delays_are_ntfys_400s_and_store_nothing(split):
    writer, a, _ = split
    bad = [
        ({"X-Delay": "1s"}, 40005),  # under UPF_DELAY_MIN_SECS
        ({"X-Delay": "-1m"}, 40005),
        ({"X-At": str(int(time.time()) + 400_000)}, 40006),  # past UPF_DELAY_MAX_SECS (3 days)
        ({"X-In": "4d"}, 40006),
        ({"X-Delay": "banana"}, 40004),
        ({"X-Delay": "1e3s"}, 40004),
        ({"X-Delay": "9" * 30}, 40004),
    ]
    for headers, code in bad:
        r = await publish(writer.base, "sched3", "x", headers=headers)
        assert r.status_code == 400, (headers, r.text)
        assert error_body(r)["code"] == code, (headers, r.text)
    async with httpx.AsyncClient(timeout=10) as c:
        r = await c.post(writer.base + "/", content=json.dumps({"topic": "sched3", "delay": "soon"}))
        assert (r.status_code, error_body(r)["code"]) == (400, 40004)
        r = await c.post(writer.base + "/", content=json.dumps({"topic": "sched3", "delay": 30}))
        assert (r.status_code, error_body(r)["code"]) == (400, 40024)  # ntfy's field is a string
    await asyncio.sleep(2.5)  # past any due time a wrongly stored one could have had
    assert await poll(a.base, "sched3") == []
    from upf_keyspace import Settings, open_store

    store = await open_store(Settings(store_path=a.env["UPF_STORE_PATH"], shard_count=8))
    try:
        assert await store.next_due() is None
    finally:
        await store.close()


async def test_a_releaser_hears_a_scheduling_at_once_and_polls_for_nothing(fleet):
    """The releaser sleeps on the schedule bell, not a timer: with its backstop poll at 10 minutes, a
    message scheduled through another process still comes out when due."""
    writer = fleet.start("upf_writer", node="w2", UPF_DELAY_MIN_SECS=MIN)
    pusher = fleet.start("upf_pusher", node="pusherC", UPF_SAFETY_POLL_SECS="600", UPF_RELEASE_POLL_SECS="600")
    async with subscribe(pusher.base, "sched5", "json") as s:
        await asyncio.sleep(1.0)  # the releaser has looked (nothing scheduled) and sleeps
        sent = (await publish(writer.base, "sched5", "bell", headers={"X-Delay": "2s"})).json()
        got = await asyncio.wait_for(s.next_message(10), 10)  # keepalives must not stretch the wait
        assert (got.id, got.message) == (sent["id"], "bell")
        assert time.time() - sent["time"] < 2.0, "released long after it was due"


async def test_all_in_one_with_two_workers_delivers_once(fleet):
    """The all-in-one program: each worker is a pusher node with its own releaser; they race for the
    due message and the subscriber still gets it once."""
    upf = fleet.start("upf", node="aio", UPF_DELAY_MIN_SECS="1", UPF_WORKERS="2", UPF_RELEASE_POLL_SECS="0.05")
    async with subscribe(upf.base, "sched4", "ws") as s:
        sent = [(await publish(upf.base, "sched4", f"m{i}", params={"in": "2s"})).json() for i in range(3)]
        got = await s.messages(3, timeout=10)
        assert [f.id for f in got] == [m["id"] for m in sent]
        assert await s.no_message_within(1.5)
    assert [f.message for f in await poll(upf.base, "sched4")] == ["m0", "m1", "m2"]
