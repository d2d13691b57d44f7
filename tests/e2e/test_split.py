"""The split shape, black box: one writer and two pushers as separate processes on one embedded store,
plus a janitor. They share nothing but the store file."""

from __future__ import annotations

import time

import pytest

from tests.clients.ntfy import poll, publish, subscribe
from tests.conftest import eventually

pytestmark = pytest.mark.slow


@pytest.fixture
def split(fleet):
    # A long safety poll: deliveries in these tests must come through bells, unless a test says otherwise.
    writer = fleet.start("upf_writer", node="w1", UPF_SAFETY_POLL_SECS="600")
    a = fleet.start("upf_pusher", node="pusherA", UPF_SAFETY_POLL_SECS="600")
    b = fleet.start("upf_pusher", node="pusherB", UPF_SAFETY_POLL_SECS="600")
    return fleet, writer, a, b


async def test_bell_delivers_across_processes(split):
    """Subscribe on pusher A, publish on the writer: A hears of it through its bell, not a poll."""
    _, writer, a, b = split
    async with subscribe(a.base, "splitT1", "ws") as sa, subscribe(b.base, "splitT1", "json") as sb:
        started = time.monotonic()
        sent = (await publish(writer.base, "splitT1", "via the bell")).json()
        assert (await sa.next_message(5)).id == sent["id"]
        assert (await sb.next_message(5)).id == sent["id"]
        assert time.monotonic() - started < 5  # the 600 s safety poll cannot have done it


async def test_kill9_pusher_then_resume_elsewhere(split):
    """Kill -9 pusher A mid-stream; resubscribe on B with since=<last id>: exactly the missed
    messages arrive, none twice."""
    _, writer, a, b = split
    received: list[str] = []
    async with subscribe(a.base, "splitT2", "json") as sa:
        for i in range(5):
            await publish(writer.base, "splitT2", f"m{i}")
        received += [f.id for f in await sa.messages(5)]
        a.kill9()
        missed = [(await publish(writer.base, "splitT2", f"m{i}")).json()["id"] for i in range(5, 12)]
    async with subscribe(b.base, "splitT2", "ws", f"since={received[-1]}") as sb:
        got = [f.id for f in await sb.messages(len(missed))]
        assert got == missed
        assert await sb.no_message_within(1.0), "a message arrived twice"


async def test_safety_poll_covers_a_lost_bell(fleet):
    """The poke is lost (the pusher's affinity is removed behind its back, so nobody is rung): the
    periodic safety poll still delivers."""
    from upf_keyspace import Settings, open_store

    writer = fleet.start("upf_writer", node="w2")
    p = fleet.start("upf_pusher", node="pusherS", UPF_SAFETY_POLL_SECS="1")
    async with subscribe(p.base, "lostBell1", "json") as s:
        store = await open_store(Settings(store_path=fleet.store, shard_count=8))
        try:
            await store.release(["lostBell1"], "pusherS")
            r = await publish(writer.base, "lostBell1", "still arrives")
            assert r.status_code == 200
        finally:
            await store.close()
        got = await s.next_message(10)
        assert got.id == r.json()["id"]


async def test_janitor_expires_ttl_and_sweeps_killed_node(split):
    """TTL'd messages disappear after expiry; a kill -9'd pusher's records are swept."""
    from upf_keyspace import Settings, keys, open_store

    fleet, writer, a, b = split
    fleet.start("upf_janitor", node="j1")
    await publish(writer.base, "ttlT", "short", headers={"TTL": "1"})
    await publish(writer.base, "ttlT", "long")
    async with subscribe(a.base, "sweepT", "json"):
        pass
    async with subscribe(a.base, "sweepT2", "json"):
        a.kill9()  # dies holding sweepT2
    store = await open_store(Settings(store_path=fleet.store, shard_count=8))
    try:

        async def records(tr):
            return (
                await tr.get(keys.liveness_key("pusherA")),
                await tr.get_range(*keys.reverse_affinity_range("pusherA")),
            )

        assert (await store.db.transact(records))[1], "the killed pusher held an affinity"

        async def swept() -> None:
            assert await store.db.transact(records) == (None, [])
            assert [f.message for f in await poll(b.base, "ttlT")] == ["long"]

        await eventually(swept, timeout=20, interval=0.3)
    finally:
        await store.close()


@pytest.mark.parametrize("server", ["upf", "granian"])
async def test_writer_and_janitor_in_one_process(fleet, server):
    """``upf`` with UPF_ROLES=writer,janitor (no pusher) on either server: it publishes (an X-Cache: no
    message is never replayed), its janitor runs its passes, its ``/metrics`` covers both roles, and
    SIGTERM ends it with 0."""
    import httpx

    wj = fleet.start("upf", roles="writer,janitor", node="wj" + server, UPF_WRITER_SERVER=server)
    p = fleet.start("upf_pusher", node="pusherWJ" + server)
    topic = "wjTopic" + server
    kept = (await publish(wj.base, topic, "kept")).json()
    await publish(wj.base, topic, "gone", headers={"X-Cache": "no"})
    assert [m.id for m in await poll(p.base, topic)] == [kept["id"]]
    async with httpx.AsyncClient(timeout=10) as c:

        async def janitor_passed() -> None:
            text = (await c.get(wj.base + "/metrics")).text
            assert 'upf_janitor_passes_total{result="ok"}' in text and "upf_writer_publishes_total" in text

        await eventually(janitor_passed, timeout=10)
    wj.proc.send_signal(15)
    assert wj.proc.wait(20) == 0
    log = wj.log()
    assert "Traceback" not in log
    assert ("front door listening role='writer'" in log) == (server == "upf")  # the server asked for
