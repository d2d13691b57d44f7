"""ntfy's subscribe filters (id, message, title, priority, tags) and ``since=latest`` with uncached rows,
over real sockets against a real embedded store, on every transport."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from upf_pusher_testkit import MS, TRANSPORTS, raw_request

from upf_keyspace import Envelope, Published, Store
from upf_pusher.server import Pusher

pytestmark = pytest.mark.parametrize("transport", TRANSPORTS)


def path(topics: str, transport: str, query: str = "") -> str:
    return f"/{topics}/{transport}" + (f"?{query}" if query else "")


async def put(store: Store, topic: str, text: str, **fields: Any) -> Published:
    now = int(time.time())
    return await store.publish(topic, Envelope(time=now, expires=now + 600, message=text, **fields))


async def poll(clients: Any, port: int, transport: str, topic: str, query: str, **kw: Any) -> list[dict[str, Any]]:
    """Every event a poll returns, until the server ends it."""
    c = await clients(port, transport, path(topic, transport, "poll=1" + (f"&{query}" if query else "")), **kw)
    await asyncio.wait_for(c.closed.wait(), 3000 * MS)  # a poll ends its response
    out = []
    while not c.events.empty():
        out.append(c.events.get_nowait())
    return out


def texts(events: list[dict[str, Any]]) -> list[str]:
    return [e["message"] for e in events if e["event"] == "message"]


async def three(store: Store, topic: str) -> list[Published]:
    """The review's messages: one (high, a+b, T1), two (nothing), three (min, b)."""
    return [
        await put(store, topic, "one", priority=4, tags=("a", "b"), title="T1"),
        await put(store, topic, "two"),
        await put(store, topic, "three", priority=1, tags=("b",)),
    ]


QUERIES = [
    ("priority=high", ["one"]),
    ("priority=5,1", ["three"]),
    ("priority=4,min", ["one", "three"]),
    ("priority=default", ["two"]),
    ("prio=3", ["two"]),
    ("tags=a", ["one"]),
    ("tags=b", ["one", "three"]),
    ("tags=b,a", ["one"]),
    ("tags=c", []),
    ("title=T1", ["one"]),
    ("t=T1", ["one"]),
    ("message=two", ["two"]),
    ("m=three", ["three"]),
    ("tags=b&priority=1", ["three"]),
]


async def test_each_filter_on_a_poll(transport: str, pusher: Pusher, store: Store, clients) -> None:
    """A poll returns only the messages that pass every filter given (the review's repro, and aliases)."""
    await three(store, "filt")
    for query, want in QUERIES:
        assert texts(await poll(clients, pusher.port, transport, "filt", query)) == want, query


async def test_id_filter_and_header_forms_on_a_poll(transport: str, pusher: Pusher, store: Store, clients) -> None:
    """``id=`` is the message's id; every filter also reads its header form (X-Tags, X-Priority...)."""
    one, _, third = await three(store, "filt")
    assert texts(await poll(clients, pusher.port, transport, "filt", f"id={third.id}")) == ["three"]
    for headers, want in [
        ({"X-Tags": "b"}, ["one", "three"]),
        ({"X-Priority": "high"}, ["one"]),
        ({"X-Title": "T1"}, ["one"]),
        ({"X-Message": "two"}, ["two"]),
        ({"X-ID": one.id}, ["one"]),
        ({"Tags": "a"}, ["one"]),
        ({"Priority": "u=0, i"}, ["one", "two", "three"]),  # RFC 9218 (browsers, proxies): no filter, no 400
        ({"Priority": "u=0, i", "X-Priority": "1"}, ["three"]),
    ]:
        assert texts(await poll(clients, pusher.port, transport, "filt", "", headers=headers)) == want, headers
    # The header wins over the query parameter, as in ntfy's readParam.
    got = await poll(clients, pusher.port, transport, "filt", "tags=a", headers={"X-Tags": "b"})
    assert texts(got) == ["one", "three"]


async def test_filters_on_a_live_stream_and_its_backlog(transport: str, pusher: Pusher, store: Store, clients) -> None:
    """A stream with filters replays only the matching backlog (since=all), then sends only the
    matching live messages."""
    await three(store, "live")
    c = await clients(pusher.port, transport, path("live", transport, "since=all&tags=b&priority=1,4"))
    assert texts(await c.messages(2)) == ["one", "three"]
    await put(store, "live", "live-no", priority=4, tags=("a",))
    await put(store, "live", "live-yes", priority=1, tags=("b", "c"))
    await put(store, "live", "live-no-2")
    await put(store, "live", "live-yes-2", priority=4, tags=("b",))
    assert texts(await c.messages(2)) == ["live-yes", "live-yes-2"]
    assert await c.quiet() == []


async def test_title_and_message_filters_live_with_headers(
    transport: str, pusher: Pusher, store: Store, clients
) -> None:
    """Header-form filters on a live stream: exact matches only."""
    c = await clients(pusher.port, transport, path("hdr", transport), headers={"X-Title": "Alert", "X-Message": "on"})
    await put(store, "hdr", "on", title="alert")
    await put(store, "hdr", "on ", title="Alert")
    await put(store, "hdr", "off", title="Alert")
    await put(store, "hdr", "on", title="Alert")
    assert texts(await c.messages(1)) == ["on"]
    assert await c.quiet() == []


async def test_other_events_pass_the_filters(transport: str, pusher: Pusher, store: Store, clients) -> None:
    """Filters apply to ``message`` events only: a filtered subscriber still gets poll requests and
    message_delete / message_clear events (ntfy's queryFilter.Pass)."""
    c = await clients(pusher.port, transport, path("ev", transport, "priority=5"))
    await c.next()  # open
    await put(store, "ev", "skipped")
    await put(store, "ev", "New message", event="poll_request", poll_id="p1", nocache=True)
    await put(store, "ev", "", event="message_delete", sequence_id="s1")
    await put(store, "ev", "kept", priority=5)
    await put(store, "ev", "", event="message_clear", sequence_id="s1")
    got = [await c.next() for _ in range(4)]
    if transport == "raw":  # raw writes an empty line for every event but a message
        assert got == [{"event": "other"}] * 2 + [{"event": "message", "message": "kept"}, {"event": "other"}]
    else:
        assert [e["event"] for e in got] == ["poll_request", "message_delete", "message", "message_clear"]
        assert got[2]["message"] == "kept"
    assert await c.quiet() == []
    # A poll: the cached events pass too (the poll request is never cached).
    events = await poll(clients, pusher.port, transport, "ev", "priority=5")
    if transport == "raw":
        assert events == [{"event": "other"}, {"event": "message", "message": "kept"}, {"event": "other"}]
    else:
        assert [e["event"] for e in events] == ["message_delete", "message", "message_clear"]


async def test_an_invalid_priority_is_40007(transport: str, pusher: Pusher) -> None:
    """priority= with anything but ntfy's names and numbers is refused: 400, code 40007, ntfy's link."""
    upgrade = (
        "Upgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
        if transport == "ws"
        else ""
    )
    for query in ("priority=garbage", "priority=1,6", "p=0"):
        request = f"GET /t/{transport}?{query} HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, close\r\n{upgrade}\r\n"
        head, _, body = (await raw_request(pusher.port, request.encode())).partition(b"\r\n\r\n")
        assert head.split()[1] == b"400", query
        err = json.loads(body)
        assert err["code"] == 40007 and err["http"] == 400
        assert err["error"] == "invalid priority parameter"
        assert err["link"] == "https://ntfy.sh/docs/publish/#message-priority"
    request = f"GET /t/{transport}?poll=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Priority: nope\r\n{upgrade}\r\n"
    raw = await raw_request(pusher.port, request.encode())
    assert b" 400 " in raw.split(b"\r\n", 1)[0] and b"40007" in raw


async def test_since_latest_skips_an_uncached_newest_row(transport: str, pusher: Pusher, store: Store, clients) -> None:
    """since=latest is the newest message a subscriber is sent: the newest cached one, not an
    ``X-Cache: no`` message or a poll request on top of it (ntfy never stores those)."""
    await put(store, "nc", "cached1")
    await put(store, "nc", "cached2")
    await put(store, "nc", "uncached", nocache=True)
    assert texts(await poll(clients, pusher.port, transport, "nc", "since=latest")) == ["cached2"]
    c = await clients(pusher.port, transport, path("nc", transport, "since=latest"))
    assert texts(await c.messages(1)) == ["cached2"]
    assert await c.quiet() == []
    await put(store, "nc", "live-uncached", nocache=True)  # live: sent, as ever
    assert texts(await c.messages(1)) == ["live-uncached"]
    # After a poll request (X-Poll-ID), also never cached:
    await put(store, "pr", "cached1")
    await put(store, "pr", "New message", event="poll_request", poll_id="abc", nocache=True)
    assert texts(await poll(clients, pusher.port, transport, "pr", "since=latest")) == ["cached1"]
    s = await clients(pusher.port, transport, path("pr", transport, "since=latest"))
    assert texts(await s.messages(1)) == ["cached1"]
    assert await s.quiet() == []


async def test_since_latest_with_a_filter(transport: str, pusher: Pusher, store: Store, clients) -> None:
    """since=latest picks the newest cached message, then the filters apply to it (as ntfy's
    sendOldMessages does): a filter it fails leaves the poll empty."""
    await put(store, "lf", "old", priority=5)
    await put(store, "lf", "new", priority=2)
    assert texts(await poll(clients, pusher.port, transport, "lf", "since=latest&priority=2")) == ["new"]
    assert texts(await poll(clients, pusher.port, transport, "lf", "since=latest&priority=5")) == []
