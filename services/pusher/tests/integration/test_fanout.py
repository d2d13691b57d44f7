"""Local fan-out: subscribers of one topic at one cursor share the store read and the framed bytes."""

from __future__ import annotations

from typing import Any

from upf_pusher_testkit import Client, eventually, publish

from upf_keyspace import Store
from upf_pusher.hub import READ_BATCH
from upf_pusher.server import Pusher


async def test_one_read_serves_every_local_subscriber_at_a_cursor(pusher: Pusher, store: Store) -> None:
    """Twenty connections (ws and json) on one topic, all caught up at the same cursor: a publish is
    read from the store once for all of them, and each gets it exactly once in its own framing."""
    clients = [
        await Client("ws" if i % 2 else "json").open(pusher.port, "/shared/" + ("ws" if i % 2 else "json"))
        for i in range(20)
    ]
    reads: list[tuple[str, Any, int]] = []
    real = store.read_many

    async def counting(wants: Any) -> Any:
        reads.extend(wants)
        return await real(wants)

    try:
        for c in clients:
            assert (await c.next())["event"] == "open"
        await eventually(lambda: all(s.session.phase.name == "LIVE" for s in pusher.hub.subs))
        store.read_many = counting  # type: ignore[method-assign]
        sent = await publish(store, "shared", "to everyone")
        for c in clients:
            got = await c.next_message()
            assert (got["id"], got["message"]) == (sent.id, "to everyone")
        assert [w for w in reads if w[0] == "shared"] == [("shared", None, READ_BATCH)]  # one read, not twenty
        for c in clients:
            assert all(e["event"] != "message" for e in await c.quiet(200))
    finally:
        store.read_many = real  # type: ignore[method-assign]
        for c in clients:
            await c.close()
