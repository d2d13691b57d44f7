"""The watch budget is O(K), not O(connections): a node opens one bell watch per shard however many
connections and topics it holds (the design's answer to FoundationDB's ~10k watches per client), plus
one process-wide watch on the auth version (upf_edge.gate) and the releaser's on the schedule bell."""

from __future__ import annotations

import asyncio

from upf_pusher_testkit import MS, Client, publish

from upf_keyspace import Store
from upf_pusher.server import Pusher


async def test_watches_stay_at_shard_count(pusher: Pusher, store: Store) -> None:
    """200 connections on 200 topics still arm exactly K (=4 here) bell watches, the auth watch and
    the schedule watch, and bells still deliver."""
    db = store.db
    budget = pusher.settings.shard_count + 2
    await asyncio.sleep(50 * MS)
    assert db._watch_count() == budget  # type: ignore[attr-defined]
    clients = [await Client("json").open(pusher.port, f"/budget{i}/json") for i in range(200)]
    try:
        for c in clients:
            assert (await c.next())["event"] == "open"
        assert db._watch_count() == budget  # type: ignore[attr-defined]
        sent = [await publish(store, f"budget{i}", f"m{i}") for i in (0, 57, 199)]
        for i, p in zip((0, 57, 199), sent, strict=True):
            assert (await clients[i].next_message())["id"] == p.id
        assert db._watch_count() == budget  # type: ignore[attr-defined]
    finally:
        for c in clients:
            await c.close()


async def test_read_pokes_are_cleared_off_the_delivery_path(pusher: Pusher, store: Store) -> None:
    """Drains only read the inbox; the pokes already read are cleared within about a second, and
    every message is still delivered once."""
    from upf_keyspace import keys

    client = await Client("json").open(pusher.port, "/clearme/json")
    try:
        assert (await client.next())["event"] == "open"
        sent = [await publish(store, "clearme", f"m{i}") for i in range(5)]
        assert [m["id"] for m in await client.messages(5)] == [p.id for p in sent]
        shard = keys.shard_of("clearme", pusher.settings.shard_count)

        async def left(tr):
            return await tr.get_range(*keys.inbox_range(pusher.settings.node_id, shard))

        assert len(await store.db.transact(left)) >= 1  # read, not cleared by the drain itself
        await asyncio.sleep(1200 * MS)  # past INBOX_CLEAR_SECS
        nudge = await publish(store, "clearme", "nudge")  # wakes the loop: it clears what it had read
        assert (await client.next_message())["id"] == nudge.id
        await asyncio.sleep(200 * MS)
        assert len(await store.db.transact(left)) <= 1  # at most the nudge's own poke, read but not yet cleared
        assert all(e["event"] != "message" for e in await client.quiet(300))
    finally:
        await client.close()
