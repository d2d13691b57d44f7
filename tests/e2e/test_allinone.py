"""The all-in-one program, black box: real process, real sockets, a real ntfy-style client."""

from __future__ import annotations

import asyncio
import base64
import json
import socket

import httpx
import pytest

from tests.clients.ntfy import error_body, poll, publish, subscribe
from tests.clients.raw import exchange
from upf import __version__ as upf_version

TRANSPORTS = ["ws", "json", "sse", "raw"]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_publish_then_receive(upf, transport):
    """A message published while subscribed arrives on every transport, framed as ntfy frames it."""
    async with subscribe(upf.base, "upTRANSPORT01", transport) as s:
        r = await publish(upf.base, "upTRANSPORT01", "hello\nworld", params={"up": "1"})
        assert r.status_code == 200
        sent = r.json()
        got = await s.next_message()
        if transport == "raw":
            assert got.message == "hello world"  # newlines become spaces on /raw
        else:
            assert (got.id, got.message, got.topic) == (sent["id"], "hello\nworld", "upTRANSPORT01")
            assert isinstance(got.time, int) and got.expires > got.time


async def test_offline_replay_since_all_and_since_id(upf):
    """Published while nobody listens: since=all replays all, since=<id> exactly what came after."""
    ids = [(await publish(upf.base, "offline1", f"m{i}")).json()["id"] for i in range(4)]
    async with subscribe(upf.base, "offline1", "json", "since=all") as s:
        assert [f.message for f in await s.messages(4)] == ["m0", "m1", "m2", "m3"]
    async with subscribe(upf.base, "offline1", "ws", f"since={ids[1]}") as s:
        got = await s.messages(2)
        assert [f.id for f in got] == ids[2:]
        assert await s.no_message_within(0.5)


async def test_cursor_from_another_topic(upf):
    """The app sends one topic's last id as the cursor for every topic: a global position."""
    await publish(upf.base, "curB", "b-old")
    marker = (await publish(upf.base, "curA", "a")).json()["id"]
    await publish(upf.base, "curB", "b-new")
    frames = await poll(upf.base, "curB", since=marker)
    assert [f.message for f in frames] == ["b-new"]


async def test_unknown_id_means_all(upf):
    """A cursor that is not one of our ids (an old ntfy id) replays everything, as ntfy does."""
    await publish(upf.base, "unk1", "x")
    frames = await poll(upf.base, "unk1", since="abcdefABCDEF")
    assert [f.message for f in frames] == ["x"]


@pytest.mark.parametrize("transport", ["json", "ws"])
async def test_an_id_from_the_future_still_gets_what_comes_next(upf, transport):
    """A 16-character id past every stamp the store has made (a foreign one, a microsecond time, one
    from before a FoundationDB cluster was wiped): no backlog, and the next messages come live; they
    were held back until the store's stamps passed it."""
    topic = f"futureId{transport}"
    await publish(upf.base, topic, "before")
    async with subscribe(upf.base, topic, transport, "since=1796688900000000") as s:
        assert await s.no_message_within(0.3)
        await publish(upf.base, topic, "after")
        assert (await s.next_message()).message == "after"


async def test_multi_topic_connection(upf):
    """One connection for several topics (as the app opens it): each message carries its own topic,
    cached ones come merged in publish order."""
    await publish(upf.base, "multiA", "a1")
    await publish(upf.base, "multiB", "b1")
    async with subscribe(upf.base, "multiA,multiB", "json", "since=all") as s:
        first = await s.messages(2)
        assert [(f.topic, f.message) for f in first] == [("multiA", "a1"), ("multiB", "b1")]
        await publish(upf.base, "multiB", "b2")
        await publish(upf.base, "multiA", "a2")
        live = await s.messages(2)
        assert [(f.topic, f.message) for f in live] == [("multiB", "b2"), ("multiA", "a2")]


async def test_fan_out_to_every_subscriber(upf):
    """Every subscriber of a topic gets every message, whatever its transport."""
    async with (
        subscribe(upf.base, "fan1", "ws") as a,
        subscribe(upf.base, "fan1", "json") as b,
        subscribe(upf.base, "fan1", "sse") as c,
    ):
        ids = [(await publish(upf.base, "fan1", f"m{i}")).json()["id"] for i in range(3)]
        for s in (a, b, c):
            assert [f.id for f in await s.messages(3)] == ids


async def test_unifiedpush_binary_round_trip(upf):
    """An aes128gcm body that is not UTF-8 arrives as standard base64, byte for byte."""
    body = bytes(range(256)) * 4
    async with subscribe(upf.base, "upBINARY0001", "ws") as s:
        r = await publish(upf.base, "upBINARY0001", body, headers={"Content-Encoding": "aes128gcm"})
        assert r.status_code == 200 and r.json()["encoding"] == "base64"
        got = await s.next_message()
        assert got.encoding == "base64" and base64.b64decode(got.message) == body


async def test_unifiedpush_endpoint_check_and_auth(upf):
    async with httpx.AsyncClient(base_url=upf.base) as c:
        assert (await c.get("/upCHECK00001", params={"up": "1"})).json() == {"unifiedpush": {"version": 1}}
        assert (await c.get("/a,b/auth")).json() == {"success": True}
        assert (await c.get("/v1/health")).json() == {"healthy": True}
        assert (await c.get("/__version__")).json() == {"name": "upf", "version": upf_version}  # not its pusher's


async def test_poll_returns_and_closes(upf):
    await publish(upf.base, "poll1", "p")
    async with subscribe(upf.base, "poll1", "json", "poll=1&since=all") as s:
        assert (await s.next()).message == "p"
        with pytest.raises(EOFError):
            await s.next(5)


async def test_a_poll_keeps_its_connection_for_the_next_request(upf):
    """As ntfy's server does: after a poll's reply, the client's connection serves its next request,
    so a client that polls topic after topic and publishes between them holds one connection."""
    local_ports = set()
    async with httpx.AsyncClient(base_url=upf.base, limits=httpx.Limits(max_connections=1)) as c:
        for topic in ("keptA", "keptB", "keptA"):
            r = await c.post(f"/{topic}", content=f"to {topic}")
            assert r.status_code == 200
            local_ports.add(r.extensions["network_stream"].get_extra_info("client_addr")[1])
            r = await c.get(f"/{topic}/json", params={"poll": "1", "since": "all"})
            assert r.status_code == 200 and "connection" not in r.headers
            lines = r.text.splitlines()
            assert lines and all(json.loads(line)["message"] == f"to {topic}" for line in lines)
            local_ports.add(r.extensions["network_stream"].get_extra_info("client_addr")[1])
    assert len(local_ports) == 1


# --- bad input: a clear error, and nothing stored is lost ------------------------------------------


async def test_oversized_body_is_413_and_not_stored(upf):
    await publish(upf.base, "big1", "kept")
    r = await publish(upf.base, "big1", b"x" * 4097, params={"up": "1"})
    assert r.status_code == 413 and error_body(r)["http"] == 413
    assert [f.message for f in await poll(upf.base, "big1")] == ["kept"]


@pytest.mark.parametrize("topic", ["has.dot", "x" * 65, "bad%20space"])
async def test_invalid_topic_is_400(upf, topic):
    r = await publish(upf.base, topic, "x")
    assert r.status_code == 400 and error_body(r)["code"] == 40009


async def test_bad_since_is_400(upf):
    async with httpx.AsyncClient(base_url=upf.base) as c:
        r = await c.get("/t1/json", params={"since": "yesterday-ish"})
    assert r.status_code == 400 and error_body(r)["code"] == 40008


async def test_malformed_json_publish_is_400(upf):
    async with httpx.AsyncClient(base_url=upf.base) as c:
        r = await c.post("/", content=b'{"topic": "t1", "message": ')
    assert r.status_code == 400 and error_body(r)["code"] == 40024


def test_invalid_utf8_in_path_is_400(upf):
    resp, closed = exchange(upf.port, b"GET /\xff\xfe/json HTTP/1.1\r\nHost: x\r\n\r\n")
    assert resp.startswith(b"HTTP/1.1 400") and closed  # refused, and the connection closed


def test_huge_headers_get_431(upf):
    resp, closed = exchange(upf.port, b"GET /t1/json HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n")
    assert resp.startswith(b"HTTP/1.1 431") and closed


async def test_client_that_never_reads_is_closed_and_nothing_lost(fleet):
    """A subscriber that stops reading is paused (Q is the buffer) and then closed; the process stays
    healthy and everything stays stored for its resume with since=."""
    upf = fleet.start("upf", node="slow", UPF_SLOW_SUBSCRIBER_TIMEOUT_SECS="1")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    sock.connect(("127.0.0.1", upf.port))
    sock.sendall(b"GET /slow1/json HTTP/1.1\r\nHost: x\r\n\r\n")
    big = "y" * 4000
    async with httpx.AsyncClient(base_url=upf.base, timeout=10) as c:
        ids = [(await c.post("/slow1", content=big)).json()["id"] for _ in range(1500)]
        await asyncio.sleep(3)  # never read: well past the 1 s slow-subscriber timeout
        assert (await c.get("/v1/health")).status_code == 200
    # Now read: a connection the server closed ends (EOF) after its buffered bytes; one it kept
    # would resume streaming and never end.
    sock.settimeout(2)
    received, closed = 0, False
    try:
        while True:
            data = sock.recv(1 << 20)
            if not data:
                closed = True
                break
            received += len(data)
    except TimeoutError:
        closed = False
    except ConnectionResetError:
        closed = True
    sock.close()
    assert closed, "a subscriber that never reads was never closed"
    assert received < 1500 * 4000, "everything was buffered for it: the server did not apply backpressure"
    frames = await poll(upf.base, "slow1")
    assert [f.id for f in frames] == ids
