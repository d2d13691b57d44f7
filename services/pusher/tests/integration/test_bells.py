"""How the hub hears its bells: one watch set for the node's K bells, whose callback for a shard marks
it rung and wakes the loop at once (no task and no loop handle per rung shard per wake-up), and the
same deliveries whichever driver's watch set rings it (the FoundationDB one, run here over the
embedded store's watches)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from upf_pusher_testkit import Client, publish, settings_for

from upf_keyspace import Store
from upf_keyspace.drivers.embedded.transaction import EmbeddedTransaction
from upf_keyspace.drivers.foundation import _FdbWatch, _FdbWatchSet
from upf_pusher.hub import Hub


async def test_a_bells_callback_marks_its_shard_rung_and_wakes_the_loop_at_once(tmp_path: Any, store: Store) -> None:
    hub = Hub(settings_for(tmp_path), store)
    rang = hub.metrics.bells.value  # the cells are process-wide
    hub._wake = asyncio.get_running_loop().create_future()
    ring = hub._bell_callback(2)
    assert hub._rung == set()
    ring()
    assert hub._rung == {2}  # in the same loop iteration
    assert hub._wake.done()
    ring()  # a second ring before the loop ran: one shard, counted twice, the wake already set
    assert hub._rung == {2}
    assert hub.metrics.bells.value == rang + 2


async def test_bells_rung_through_the_foundationdb_watch_set_still_deliver(
    start_pusher: Any, store: Store, monkeypatch: Any
) -> None:
    """The store hands the hub FoundationDB's watch set, over the embedded store's awaitable watches:
    messages still arrive by bell (not by the safety poll), once each, in order."""
    fdb_like = SimpleNamespace(_loop=asyncio.get_running_loop())  # what the set takes of its database
    monkeypatch.setattr(store.db, "watch_set", lambda keys, callbacks: _FdbWatchSet(fdb_like, keys, callbacks))  # type: ignore[arg-type]  # a stand-in
    arm = EmbeddedTransaction.arm

    def arm_either(tr: EmbeddedTransaction, ws: Any, indexes: Any) -> None:
        if not isinstance(ws, _FdbWatchSet):
            return arm(tr, ws, indexes)
        for i in indexes:
            ws.add(i, _FdbWatch(tr.watch(ws.keys[i]).future))

    monkeypatch.setattr(EmbeddedTransaction, "arm", arm_either)
    pusher = await start_pusher()
    safety = pusher.hub.metrics.safety.value
    rang = pusher.hub.metrics.bells.value
    client = await Client("json").open(pusher.port, "/opaque/json")
    try:
        assert (await client.next())["event"] == "open"
        sent = []
        for i in range(5):
            sent.append(await publish(store, "opaque", f"m{i}"))
            await asyncio.sleep(0.02)  # one wake-up each: every one rings a re-armed bell
        assert [m["id"] for m in await client.messages(5)] == [p.id for p in sent]
        assert all(e["event"] != "message" for e in await client.quiet(200))
        assert pusher.hub.metrics.safety.value == safety  # by bell, not by the safety poll
        assert pusher.hub.metrics.bells.value >= rang + 5
    finally:
        await client.close()
