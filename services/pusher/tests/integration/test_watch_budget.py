"""The watch budget is O(K), not O(connections): a node opens one bell watch per shard however many
connections and topics it holds (the design's answer to FoundationDB's ~10k watches per client)."""

from __future__ import annotations

import asyncio

from upf_pusher_testkit import MS, Client, publish

from upf_keyspace import Store
from upf_pusher.server import Pusher


async def test_watches_stay_at_shard_count(pusher: Pusher, store: Store) -> None:
    """200 connections on 200 topics still arm exactly K (=4 here) watches, and bells still deliver."""
    db = store.db
    await asyncio.sleep(50 * MS)
    assert db._watch_count() == pusher.settings.shard_count  # type: ignore[attr-defined]
    clients = [await Client("json").open(pusher.port, f"/budget{i}/json") for i in range(200)]
    try:
        for c in clients:
            assert (await c.next())["event"] == "open"
        assert db._watch_count() == pusher.settings.shard_count  # type: ignore[attr-defined]
        sent = [await publish(store, f"budget{i}", f"m{i}") for i in (0, 57, 199)]
        for i, p in zip((0, 57, 199), sent):
            assert (await clients[i].next_message())["id"] == p.id
        assert db._watch_count() == pusher.settings.shard_count  # type: ignore[attr-defined]
    finally:
        for c in clients:
            await c.close()
