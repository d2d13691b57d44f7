"""Subscribers over real sockets against a real embedded store, on every transport."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import pytest
from upf_pusher_testkit import MS, TRANSPORTS, eventually, publish, raw_request

from upf_keyspace import Envelope, Store
from upf_keyspace.msgid import decode_id
from upf_pusher.hub import READ_BATCH
from upf_pusher.server import Pusher
from upf_pusher.transports import WRITE_HIGH

pytestmark = pytest.mark.parametrize("transport", TRANSPORTS)


def path(topics: str, transport: str, query: str = "") -> str:
    return f"/{topics}/{transport}" + (f"?{query}" if query else "")


async def test_open_comes_first_then_published_messages(transport: str, pusher: Pusher, store: Store, clients) -> None:
    """A subscriber gets the open event at once, then each message published to its topic."""
    c = await clients(pusher.port, transport, path("upAAAA", transport))
    first = await c.next()
    if transport == "raw":
        assert first == {"event": "other"}
    else:
        assert first["event"] == "open" and first["topic"] == "upAAAA" and isinstance(first["time"], int)
    pub = await publish(store, "upAAAA", "hello")
    msg = await c.next_message()
    assert msg["message"] == "hello"
    if transport != "raw":
        assert msg["id"] == pub.id and msg["topic"] == "upAAAA" and msg["event"] == "message"


async def test_since_all_replays_the_backlog(transport: str, pusher: Pusher, store: Store, clients) -> None:
    """since=all sends what was published before the connect, oldest first, then live messages."""
    await publish(store, "t", "one")
    await publish(store, "t", "two")
    c = await clients(pusher.port, transport, path("t", transport, "since=all"))
    assert [m["message"] for m in await c.messages(2)] == ["one", "two"]
    await publish(store, "t", "three")
    assert (await c.next_message())["message"] == "three"


async def test_since_none_skips_the_backlog(transport: str, pusher: Pusher, store: Store, clients) -> None:
    """Without since, a stream starts at the end of the queue."""
    await publish(store, "t", "old")
    c = await clients(pusher.port, transport, path("t", transport))
    await c.next()
    await publish(store, "t", "new")
    assert (await c.next_message())["message"] == "new"


async def test_since_id_resumes_after_it(transport: str, pusher: Pusher, store: Store, clients) -> None:
    """since=<id> sends exactly the messages after that id."""
    first = await publish(store, "t", "one")
    await publish(store, "t", "two")
    await publish(store, "t", "three")
    c = await clients(pusher.port, transport, path("t", transport, f"since={first.id}"))
    assert [m["message"] for m in await c.messages(2)] == ["two", "three"]
    assert await c.quiet() == []


async def test_cursor_from_another_topic_is_a_global_position(
    transport: str, pusher: Pusher, store: Store, clients
) -> None:
    """An id from topic B is a position in topic A too: A's messages after it, not before."""
    await publish(store, "a", "before")
    marker = await publish(store, "b", "marker")
    await publish(store, "a", "after")
    c = await clients(pusher.port, transport, path("a", transport, f"since={marker.id}"))
    assert (await c.next_message())["message"] == "after"
    assert await c.quiet() == []


async def test_multi_topic_connection_replays_in_commit_order(
    transport: str, pusher: Pusher, store: Store, clients
) -> None:
    """One connection for several topics replays them merged in stamp order, then streams them all."""
    for i, t in enumerate(["a", "b", "a", "c", "b"]):
        await publish(store, t, f"{t}{i}")
    c = await clients(pusher.port, transport, path("a,b,c", transport, "since=all"))
    assert [m["message"] for m in await c.messages(5)] == ["a0", "b1", "a2", "c3", "b4"]
    await publish(store, "c", "live-c")
    await publish(store, "a", "live-a")
    got = {m["message"] for m in await c.messages(2)}
    assert got == {"live-c", "live-a"}


async def test_every_subscriber_of_a_topic_gets_every_message(
    transport: str, pusher: Pusher, store: Store, clients
) -> None:
    """Fan-out: subscribers on this transport and on the others all receive the message."""
    subs = [await clients(pusher.port, t, path("fan", t)) for t in (transport, *TRANSPORTS)]
    for s in subs:
        await s.next()
    await publish(store, "fan", "to-all")
    for s in subs:
        assert (await s.next_message())["message"] == "to-all"


async def test_one_topic_and_several_topic_subscribers_of_a_topic_share_its_read_rounds(
    transport: str, pusher: Pusher, store: Store, clients
) -> None:
    """A read round writes a one-topic connection's rows at once and gathers a several-topic one's
    across the round's reads: a burst over two topics reaches each exactly once, in each topic's order."""
    only_a = [await clients(pusher.port, transport, path("a", transport)) for _ in range(3)]
    both = await clients(pusher.port, transport, path("a,b", transport))
    only_b = await clients(pusher.port, transport, path("b", transport))
    for c in (*only_a, both, only_b):
        await c.next()  # open
    texts = [f"{'ab'[i % 2]}{i}" for i in range(40)]
    await asyncio.gather(*(publish(store, t[0], t) for t in texts))
    want_a = [t for t in texts if t[0] == "a"]
    want_b = [t for t in texts if t[0] == "b"]

    def assert_in_commit_order(msgs: list[dict]) -> None:  # ids are stamps; raw carries none to check
        if transport != "raw":
            ordered = sorted(msgs, key=lambda m: decode_id(m["id"]) or b"")
            assert [m["message"] for m in msgs] == [m["message"] for m in ordered]

    for c in only_a:
        got = await c.messages(len(want_a))
        assert sorted(m["message"] for m in got) == sorted(want_a)
        assert_in_commit_order(got)
        assert await c.quiet() == []
    got = await only_b.messages(len(want_b))
    assert sorted(m["message"] for m in got) == sorted(want_b)
    assert await only_b.quiet() == []
    got = await both.messages(len(texts))
    assert sorted(m["message"] for m in got) == sorted(texts)
    for topic in "ab":
        mine = [m for m in got if m["message"][0] == topic]
        assert_in_commit_order(mine)
    assert await both.quiet() == []


async def test_poll_returns_the_backlog_and_closes(transport: str, pusher: Pusher, store: Store, clients) -> None:
    """poll=1 sends the stored messages without an open event and ends the response."""
    first = await publish(store, "p", "one")
    await publish(store, "p", "two")
    c = await clients(pusher.port, transport, path("p", transport, "poll=1"))
    assert [(await c.next())["message"] for _ in range(2)] == ["one", "two"]
    await asyncio.wait_for(c.closed.wait(), 3000 * MS)
    c2 = await clients(pusher.port, transport, path("p", transport, f"poll=1&since={first.id}"))
    assert (await c2.next())["message"] == "two"
    await asyncio.wait_for(c2.closed.wait(), 3000 * MS)
    assert c2.events.empty()


async def test_keepalives_arrive(transport: str, start_pusher, clients) -> None:
    """Every HTTP stream gets keepalive events at the configured interval (raw: empty lines); /ws gets
    ping frames instead, as ntfy sends them, and no keepalive JSON (read off the raw socket)."""
    p = await start_pusher(keepalive_secs=0.2)
    if transport == "ws":
        reader, writer = await asyncio.open_connection("127.0.0.1", p.port)
        writer.write(
            b"GET /k/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        try:
            assert b" 101 " in await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)
            b0, n = await asyncio.wait_for(reader.readexactly(2), 2)
            assert b0 == 0x81 and b'"event":"open"' in await reader.readexactly(n)  # open: a text frame
            for _ in range(2):  # then only empty pings, one per interval
                assert await asyncio.wait_for(reader.readexactly(2), 2) == b"\x89\x00"
        finally:
            writer.close()
        return
    c = await clients(p.port, transport, path("k", transport))
    await c.next()  # open
    ev = await c.next(2000)
    assert ev["event"] == ("other" if transport == "raw" else "keepalive")
    if transport != "raw":
        assert ev["topic"] == "k" and len(ev["id"]) == 12


async def test_affinity_follows_local_subscribers(transport: str, pusher: Pusher, store: Store, clients) -> None:
    """Subscribing holds the topic for this node (publishes poke it); the last leaving releases it."""
    c = await clients(pusher.port, transport, path("aff", transport))
    await c.next()
    assert (await publish(store, "aff", "x")).poked == 1
    await c.close()
    await eventually(lambda: not pusher.hub.by_topic and not pusher.hub._affinity)
    assert (await publish(store, "aff", "y")).poked == 0


async def test_a_topic_shared_then_left_keeps_serving_who_stays(
    transport: str, pusher: Pusher, store: Store, clients
) -> None:
    """One subscriber, a second, the first leaves, a third comes: each publish reaches exactly who is
    there, the topic stays held until the last one leaves (one subscriber is kept without a set)."""
    a = await clients(pusher.port, transport, path("share", transport))
    await a.next()
    b = await clients(pusher.port, "ws", path("share", "ws"))
    await b.next()
    await publish(store, "share", "both")
    assert (await a.next_message())["message"] == "both" and (await b.next_message())["message"] == "both"
    await a.close()
    await eventually(lambda: pusher.hub.by_topic.get("share") is not None and len(pusher.hub.subs) == 1)
    assert (await publish(store, "share", "b-only")).poked == 1
    assert (await b.next_message())["message"] == "b-only"
    c = await clients(pusher.port, transport, path("share", transport))
    await c.next()
    await publish(store, "share", "b-and-c")
    assert (await b.next_message())["message"] == "b-and-c" and (await c.next_message())["message"] == "b-and-c"
    await b.close()
    await c.close()
    await eventually(lambda: not pusher.hub.by_topic and not pusher.hub._affinity)
    assert (await publish(store, "share", "nobody")).poked == 0


async def test_safety_poll_delivers_without_a_poke(transport: str, start_pusher, store: Store, clients) -> None:
    """A message whose poke was lost (affinity gone) still arrives through the safety poll."""
    p = await start_pusher(safety_poll_secs=0.2)
    c = await clients(p.port, transport, path("sp", transport))
    await c.next()
    await store.release(["sp"], p.settings.node_id)
    assert (await publish(store, "sp", "unpoked")).poked == 0
    assert (await c.next_message(3000))["message"] == "unpoked"


async def test_safety_passes_with_nothing_new_are_skipped_and_a_lost_poke_still_arrives(
    transport: str, start_pusher, store: Store, clients
) -> None:
    """An idle node's safety pass is one read: with no message into Q since the last full pass it is
    skipped (all but every SAFETY_FULL_EVERY-th); the first message whose poke is lost ends the run of
    skips and arrives through the next pass."""
    from upf_pusher import hub

    p = await start_pusher(safety_poll_secs=0.05)
    c = await clients(p.port, transport, path("skip", transport))
    await c.next()
    reads = 0
    real = p.store.read_many

    async def counted(wants):  # type: ignore[no-untyped-def]
        nonlocal reads
        reads += len(wants)
        return await real(wants)

    p.store.read_many = counted  # type: ignore[method-assign]
    skips = p.hub.metrics.safety_skips.value
    await eventually(lambda: p.hub.metrics.safety_skips.value >= skips + hub.SAFETY_FULL_EVERY + 2, 5000)
    passes = p.hub.metrics.safety_skips.value - skips
    assert 1 <= reads <= passes // (hub.SAFETY_FULL_EVERY - 1) + 1  # only the periodic full passes read
    await store.release(["skip"], p.settings.node_id)
    assert (await publish(store, "skip", "unpoked")).poked == 0
    assert (await c.next_message(3000))["message"] == "unpoked"


async def test_node_swept_as_dead_holds_its_topics_again(transport: str, start_pusher, store: Store, clients) -> None:
    """When the janitor swept this node, the next heartbeat re-holds its topics and re-drains."""
    p = await start_pusher(heartbeat_secs=0.1)
    c = await clients(p.port, transport, path("hb", transport))
    await c.next()
    node = p.settings.node_id
    await store.sweep_node(node, now=2**40, max_age=0)
    assert (await publish(store, "hb", "lost-poke")).poked == 0
    assert (await c.next_message(3000))["message"] == "lost-poke"

    async def poked() -> int:
        return (await publish(store, "hb", "probe")).poked

    for _ in range(100):
        if await poked():
            break
        await asyncio.sleep(20 * MS)
    else:
        raise AssertionError("the node never held its topic again")


async def test_client_that_never_reads_is_paused_then_closed(transport: str, start_pusher, store: Store) -> None:
    """A subscriber that stops reading is paused (its buffer stays bounded) and closed after the timeout."""
    p = await start_pusher(slow_subscriber_timeout_secs=0.5)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", p.port))
    try:
        if transport == "ws":
            req = (
                "GET /slow/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
            )
        else:
            req = f"GET /slow/{transport} HTTP/1.1\r\nHost: x\r\n\r\n"
        await asyncio.get_running_loop().sock_sendall(sock, req.encode())
        await eventually(lambda: len(p.hub.subs) == 1 and next(iter(p.hub.subs)).session.phase.name == "LIVE")
        sub = next(iter(p.hub.subs))
        sub.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        body = "x" * 4000
        bound = WRITE_HIGH + READ_BATCH * 4200 + 8192
        peak = 0
        for _ in range(20):
            pubs = await asyncio.gather(*(publish(store, "slow", body) for _ in range(20)))
            last = max(x.stamp for x in pubs)
            for _ in range(100):  # until the drain caught up with the burst, or the socket pushed back
                peak = max(peak, sub.transport.get_write_buffer_size())
                if sub.session.paused or sub.session.cursor("slow") == last:
                    break
                await asyncio.sleep(10 * MS)
            if sub.session.paused:
                break
        assert sub.session.paused, "the subscriber was never paused"
        for _ in range(10):  # keep publishing while it is paused: nothing more is buffered
            await publish(store, "slow", body)
            peak = max(peak, sub.transport.get_write_buffer_size())
        assert peak <= bound
        await eventually(lambda: sub not in p.hub.subs, 3000)
        assert sub.transport.is_closing()
    finally:
        sock.close()


async def test_bad_since_is_40008(transport: str, pusher: Pusher) -> None:
    """An unparseable since is 400 with ntfy's error code 40008."""
    out = await raw_request(
        pusher.port, f"GET /t/{transport}?since=yesterday HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
    )
    assert_error(out, 400, 40008)


async def test_invalid_topic_is_40009(transport: str, pusher: Pusher) -> None:
    """A topic outside ntfy's regex is 400 with code 40009."""
    out = await raw_request(
        pusher.port, f"GET /ok,b%24d/{transport} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
    )
    assert_error(out, 400, 40009)


async def test_huge_headers_are_431(transport: str, pusher: Pusher) -> None:
    """A request head over 16 KB is refused with 431 and ntfy-style error JSON."""
    out = await raw_request(pusher.port, f"GET /t/{transport} HTTP/1.1\r\nX-Big: {'a' * 17000}\r\n\r\n".encode())
    assert_error(out, 431, 43100)


def assert_error(raw: bytes, http: int, code: int) -> None:
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 %d " % http), head
    assert b"Content-Type: application/json" in head
    got = json.loads(body)
    assert {k: got[k] for k in ("code", "http")} == {"code": code, "http": http} and got["error"]
    assert set(got) <= {"code", "http", "error", "link"}  # ntfy's body; "link" where ntfy links its docs


async def test_latency_is_recorded_once_per_delivery_however_many_share_a_frame(
    transport: str, pusher: Pusher, store: Store, clients
) -> None:
    """Fan-out records each message's latency once per frame kind with its deliveries as the weight:
    the histogram still counts one observation per delivered message, per transport."""
    subs = [await clients(pusher.port, t, path("lat", t)) for t in (transport, transport, transport, "ws")]
    for s in subs:
        await s.next()
    latency = {t: pusher.hub.metrics.transports[t].latency for t in TRANSPORTS}
    before = {t: (h.count, h.sum) for t, h in latency.items()}
    now = time.time()
    for text in ("one", "two"):
        env = Envelope(time=int(now), expires=int(now) + 600, message=text, published_ms=int(now * 1000) - 50)
        await store.publish("lat", env)
    for s in subs:
        assert [m["message"] for m in await s.messages(2)] == ["one", "two"]
    want = {t: 0 for t in TRANSPORTS}
    want[transport] += 6
    want["ws"] += 2
    for t, h in latency.items():
        assert h.count - before[t][0] == want[t]
        if want[t]:  # each observation at least the 50 ms the publish was backdated by
            assert h.sum - before[t][1] >= want[t] * 0.05 and h.max >= 0.05
