"""X-Cache: no, black box: a writer, two pushers and a janitor as separate processes on one store file.
Delivered live on ws, json and sse (whichever pusher holds the subscriber), in every publish form;
never replayed by a poll or a reconnect with since=all; the reply has no ``expires``."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.clients.ntfy import error_body, poll, publish, subscribe

pytestmark = pytest.mark.slow


@pytest.fixture
def split(fleet):
    writer = fleet.start("upf_writer", node="w1", UPF_SAFETY_POLL_SECS="600")
    a = fleet.start("upf_pusher", node="pusherA", UPF_SAFETY_POLL_SECS="600")
    b = fleet.start("upf_pusher", node="pusherB", UPF_SAFETY_POLL_SECS="600")
    fleet.start("upf_janitor", node="j1")
    return writer, a, b


async def _publish_uncached(base: str, topic: str) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=10) as c:
        return [
            await c.post(f"{base}/{topic}", content=b"header", headers={"X-Cache": "no"}),
            await c.put(f"{base}/{topic}", content=b"query", params={"cache": "no"}),
            await c.post(base + "/", json={"topic": topic, "message": "json", "cache": "no"}),
        ]


async def test_cache_no_is_live_only(split):
    writer, a, b = split
    topic = "noCache1"
    kept = (await publish(writer.base, topic, "kept")).json()
    async with (
        subscribe(a.base, topic, "ws") as ws,
        subscribe(b.base, topic, "json") as js,
        subscribe(a.base, topic, "sse", "since=all") as sse,
    ):
        assert (await sse.next_message()).id == kept["id"]  # the cached one, replayed
        replies = await _publish_uncached(writer.base, topic)
        for r in replies:
            assert r.status_code == 200, r.text
            assert "expires" not in r.json(), r.text  # ntfy: not cached, so no expiry
        ids = [r.json()["id"] for r in replies]
        for stream in (ws, js, sse):
            got = await stream.messages(3)
            assert [f.id for f in got] == ids
            assert [f.message for f in got] == ["header", "query", "json"]
            assert all(f.expires == 0 for f in got)
            assert b'"expires"' not in b"".join(stream.raw_lines[-3:])

    # Never replayed: a poll, and a reconnect with since=all on every transport, on either pusher.
    assert [f.id for f in await poll(a.base, topic)] == [kept["id"]]
    assert [f.id for f in await poll(b.base, topic)] == [kept["id"]]
    for base, transport in ((a.base, "ws"), (b.base, "json"), (b.base, "sse")):
        async with subscribe(base, topic, transport, "since=all") as again:
            assert (await again.next_message()).id == kept["id"]
            assert await again.no_message_within(1.0), f"an X-Cache: no message was replayed on {transport}"
        async with subscribe(base, topic, transport, f"since={kept['id']}") as resumed:
            assert await resumed.no_message_within(0.5)


async def test_cache_no_then_a_later_subscriber_on_another_pusher(split):
    """Only subscribers connected when it lands get it: a subscriber that arrives later does not, even
    with since=all, while it is still in the store (UPF_NOCACHE_KEEP_SECS)."""
    writer, a, b = split
    async with subscribe(a.base, "noCache2", "json") as early:
        sent = (await publish(writer.base, "noCache2", "now only", headers={"X-Cache": "no"})).json()
        assert (await early.next_message()).id == sent["id"]
    async with subscribe(b.base, "noCache2", "json", "since=all") as late:
        assert await late.no_message_within(1.0)
        live = (await publish(writer.base, "noCache2", "live again", params={"cache": "no"})).json()
        assert (await late.next_message()).id == live["id"]


async def test_cache_no_with_a_delay_is_ntfys_40002(split):
    writer, a, _ = split
    for kw in ({"headers": {"X-Cache": "no", "X-Delay": "1h"}}, {"params": {"cache": "no", "in": "30m"}}):
        r = await publish(writer.base, "noCache3", "x", **kw)
        assert r.status_code == 400 and error_body(r)["code"] == 40002
    async with httpx.AsyncClient(timeout=10) as c:
        r = await c.post(writer.base + "/", content=json.dumps({"topic": "noCache3", "cache": "no", "delay": "1h"}))
    assert r.status_code == 400 and error_body(r)["code"] == 40002
    assert await poll(a.base, "noCache3") == []
