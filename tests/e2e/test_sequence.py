"""Sequence ids (ntfy v2.16: update, clear and delete a notification) and poll requests, black box:
real processes, real sockets, the test's own ntfy client."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.clients.ntfy import Frame, Stream, error_body, poll, publish, subscribe

STREAMS = ["ws", "json", "sse"]


async def _events(s: Stream, n: int) -> list[Frame]:
    """The next ``n`` frames that are not keepalives."""
    out: list[Frame] = []
    while len(out) < n:
        f = await s.next(10)
        if f.event != "keepalive":
            out.append(f)
    return out


@pytest.mark.parametrize("transport", STREAMS)
async def test_update_then_delete_in_order(upf, transport):
    """Publish with a sequence id (in the path), update it (header), delete it: a subscriber sees the
    three events in order, each carrying the sequence id; sse names the delete in an ``event:`` line."""
    topic = f"seqUpd{transport}"
    async with subscribe(upf.base, topic, transport) as s, httpx.AsyncClient(timeout=10) as c:
        first = await c.put(f"{upf.base}/{topic}/dl-1", content=b"10%")
        assert first.status_code == 200, first.text
        update = await publish(upf.base, topic, "90%", headers={"X-Sequence-ID": "dl-1"})
        gone = await c.delete(f"{upf.base}/{topic}/dl-1")
        assert gone.status_code == 200, gone.text
        got = await _events(s, 3)
    assert [(f.event, f.sequence_id, f.message) for f in got] == [
        ("message", "dl-1", "10%"),
        ("message", "dl-1", "90%"),
        ("message_delete", "dl-1", ""),
    ]
    assert [f.id for f in got] == [first.json()["id"], update.json()["id"], gone.json()["id"]]
    reply = gone.json()
    assert list(reply) == ["id", "sequence_id", "time", "expires", "event", "topic"]
    assert (reply["event"], reply["sequence_id"], reply["topic"]) == ("message_delete", "dl-1", topic)
    if transport == "sse":
        assert any(line.startswith(b"event: message_delete\ndata: {") for line in s.raw_lines), s.raw_lines
        assert any(line.startswith(b'data: {"id":') and b'"sequence_id":"dl-1"' in line for line in s.raw_lines)


async def test_clear_by_get_put_and_read_alias_then_replayed(upf):
    """``GET``/``PUT /{topic}/{sid}/clear`` and ``/read`` emit message_clear; like ntfy's cache, a poll
    replays them after the message, in order."""
    topic = "seqClear1"
    async with httpx.AsyncClient(timeout=10) as c:
        sent = await c.post(f"{upf.base}/{topic}", content=b"hello", params={"sid": "n1"})
        assert sent.json()["sequence_id"] == "n1"
        replies = [
            await c.get(f"{upf.base}/{topic}/n1/clear"),
            await c.put(f"{upf.base}/{topic}/n1/clear", content=b"ignored"),
            await c.get(f"{upf.base}/{topic}/n1/read"),
            await c.put(f"{upf.base}/{topic}/n1/read"),
        ]
    for r in replies:
        assert r.status_code == 200, r.text
        assert (r.json()["event"], r.json()["sequence_id"]) == ("message_clear", "n1")
        assert "message" not in r.json()
    frames = await poll(upf.base, topic)
    assert [(f.event, f.sequence_id) for f in frames] == [("message", "n1")] + [("message_clear", "n1")] * 4
    assert [f.id for f in frames] == [sent.json()["id"]] + [r.json()["id"] for r in replies]


async def test_sequence_id_forms_and_transport_names(upf):
    """``sequence_id``/``sid`` query, JSON ``sequence_id``, none at all (no field), and sequence ids named
    like a subscribe route: ``PUT /t/ws`` publishes, ``DELETE /t/json`` deletes, ``GET /t/json`` still
    subscribes."""
    topic = "seqForms1"
    async with subscribe(upf.base, topic, "json") as s, httpx.AsyncClient(timeout=10) as c:
        r1 = await c.post(f"{upf.base}/{topic}", content=b"a", params={"sequence_id": "q1"})
        r2 = await c.post(f"{upf.base}/", json={"topic": topic, "message": "b", "sequence_id": "j1"})
        r3 = await c.post(f"{upf.base}/{topic}", content=b"c")
        r4 = await c.put(f"{upf.base}/{topic}/ws", content=b"d")
        r5 = await c.post(f"{upf.base}/{topic}/auth", content=b"e")
        r6 = await c.delete(f"{upf.base}/{topic}/json")
        for r in (r1, r2, r3, r4, r5, r6):
            assert r.status_code == 200, r.text
        assert "sequence_id" not in r3.json()
        got = await _events(s, 6)
    assert [(f.event, f.sequence_id, f.message) for f in got] == [
        ("message", "q1", "a"),
        ("message", "j1", "b"),
        ("message", "", "c"),
        ("message", "ws", "d"),
        ("message", "auth", "e"),
        ("message_delete", "json", ""),
    ]


async def test_delete_of_an_unknown_sequence_id(upf):
    """As ntfy: no lookup, the event is sent and kept (the id is the publisher's; the message may have
    expired, or live on a device only)."""
    r = httpx.delete(f"{upf.base}/seqUnknown1/never-published", timeout=10)
    assert r.status_code == 200 and r.json()["event"] == "message_delete"
    assert [(f.event, f.sequence_id) for f in await poll(upf.base, "seqUnknown1")] == [
        ("message_delete", "never-published")
    ]


BAD = [
    ("POST", "/seqBad1", {"X-Sequence-ID": "x" * 65}, 400, 40049),
    ("POST", "/seqBad1", {"X-Sequence-ID": "a.b"}, 400, 40049),
    ("POST", "/seqBad1?sid=a%20b", {}, 400, 40049),
    ("PUT", "/seqBad1/a.b", {}, 400, 40049),
    ("PUT", "/seqBad1/" + "x" * 65, {}, 400, 40049),
    ("DELETE", "/seqBad1/a:b", {}, 400, 40049),
    ("DELETE", "/seqBad1/" + "y" * 65, {}, 400, 40049),
    ("GET", "/seqBad1/" + "z" * 65 + "/clear", {}, 400, 40049),
    ("PUT", "/seqBad1/a%2Cb/read", {}, 400, 40049),
    ("DELETE", "/bad.topic/s1", {}, 400, 40009),
    ("GET", "/bad.topic/s1/clear", {}, 400, 40009),
    ("PUT", "/" + "t" * 65 + "/s1", {}, 400, 40009),
    ("PATCH", "/seqBad1/s1", {}, 404, 40401),
    ("DELETE", "/seqBad1/s1/clear", {}, 404, 40401),
    ("POST", "/seqBad1", {"X-Poll-ID": "p" * 1025}, 413, 41301),
]


async def test_bad_inputs_store_nothing(upf):
    async with httpx.AsyncClient(timeout=10) as c:
        for method, path, headers, status, code in BAD:
            r = await c.request(method, upf.base + path, headers=headers, content=b"x" if method != "GET" else None)
            assert (r.status_code, error_body(r)["code"]) == (status, code), (method, path, r.text)
    assert await poll(upf.base, "seqBad1") == []


async def test_clear_and_delete_need_write_permission(fleet):
    """Anonymous read-only: subscribing works, clear and delete are 403 40301 and store nothing."""
    role = fleet.start("upf", node="readonly", UPF_AUTH_DEFAULT_ACCESS="read-only", UPF_WORKERS="1")
    async with httpx.AsyncClient(timeout=10) as c:
        for method, path in (
            ("DELETE", "/seqRo1/s1"),
            ("GET", "/seqRo1/s1/clear"),
            ("PUT", "/seqRo1/s1/read"),
            ("PUT", "/seqRo1/s1"),
        ):
            r = await c.request(method, role.base + path)
            assert (r.status_code, error_body(r)["code"]) == (403, 40301), (method, path)
    assert await poll(role.base, "seqRo1") == []


async def test_poll_request(upf):
    """``X-Poll-ID``: ntfy's poll_request event, body "New message", the poll id, no ``expires``."""
    async with subscribe(upf.base, "seqPoll1", "sse") as s:
        r = await publish(upf.base, "seqPoll1", "secret body", headers={"X-Poll-ID": "abc123", "Title": "t"})
        got = (await _events(s, 1))[0]
    reply = r.json()
    assert list(reply) == ["id", "time", "event", "topic", "message", "poll_id"]
    assert (reply["event"], reply["message"], reply["poll_id"]) == ("poll_request", "New message", "abc123")
    assert (got.id, got.event, got.message, got.poll_id, got.expires) == (
        reply["id"],
        "poll_request",
        "New message",
        "abc123",
        0,
    )
    assert any(line.startswith(b"event: poll_request\ndata: {") for line in s.raw_lines)


async def test_standalone_writer_takes_sequence_routes(fleet):
    """The writer alone (on UPF's front door, its default server) serves the same routes; a pusher on the
    store replays them."""
    writer = fleet.start("upf_writer", node="wseq")
    pusher = fleet.start("upf_pusher", node="pseq")
    async with httpx.AsyncClient(timeout=10) as c:
        rs = [
            await c.post(f"{writer.base}/seqSplit1/up-1", content=b"v1"),
            await c.get(f"{writer.base}/seqSplit1/up-1/clear"),
            await c.delete(f"{writer.base}/seqSplit1/up-1"),
        ]
        bad = await c.delete(f"{writer.base}/seqSplit1/a.b")
    assert [r.status_code for r in rs] == [200, 200, 200]
    assert (bad.status_code, error_body(bad)["code"]) == (400, 40049)
    for _ in range(50):
        frames = await poll(pusher.base, "seqSplit1")
        if len(frames) == 3:
            break
        await asyncio.sleep(0.1)
    assert [(f.event, f.sequence_id) for f in frames] == [
        ("message", "up-1"),
        ("message_clear", "up-1"),
        ("message_delete", "up-1"),
    ]
