"""A poll on a keep-alive connection ends its reply and keeps the connection for the next request, as
ntfy does: over real sockets, with pipelined requests, the connection cap, HTTP/1.0 and shutdown."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
from upf_pusher_testkit import MS, eventually, publish, raw_request

from upf_keyspace import Store
from upf_pusher.server import Pusher
from upf_pusher.transports import WRITE_HIGH, StreamSubscriber

POLL = b"GET /%s/%s?poll=1&since=all HTTP/1.1\r\nHost: x\r\n\r\n"


async def read_reply(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response off the stream: chunked or with a Content-Length."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 3000 * MS)
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
    body = b""
    if headers.get("transfer-encoding") == "chunked":
        while True:
            size = int((await asyncio.wait_for(reader.readuntil(b"\r\n"), 3000 * MS)).strip(), 16)
            data = await asyncio.wait_for(reader.readexactly(size + 2), 3000 * MS)
            if size == 0:
                break
            body += data[:-2]
    else:
        body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), 3000 * MS)
    return int(lines[0].split()[1]), headers, body


def messages(kind: str, body: bytes) -> list[str]:
    if kind == "json":
        return [json.loads(line)["message"] for line in body.splitlines()]
    if kind == "sse":
        return [json.loads(line[6:])["message"] for line in body.splitlines() if line.startswith(b"data: ")]
    return [line.decode() for line in body.splitlines()]


@pytest.mark.parametrize("kind", ["json", "sse", "raw"])
async def test_a_poll_keeps_the_connection_for_the_next_request(kind: str, pusher: Pusher, store: Store) -> None:
    """The reply has no ``Connection: close`` and ends with the last chunk; the same connection then
    answers a second poll and an ops request, and the poll's subscriber is forgotten by the hub."""
    await publish(store, "kp1", "one")
    await publish(store, "kp2", "two")
    reader, writer = await asyncio.open_connection("127.0.0.1", pusher.port)
    try:
        writer.write(POLL % (b"kp1", kind.encode()))
        status, headers, body = await read_reply(reader)
        assert status == 200 and "connection" not in headers and messages(kind, body) == ["one"]
        writer.write(POLL % (b"kp2", kind.encode()))
        status, headers, body = await read_reply(reader)
        assert status == 200 and messages(kind, body) == ["two"]
        writer.write(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await read_reply(reader))[::2] == (200, b'{"healthy":true}\n')
        await eventually(lambda: not pusher.hub.subs)
        assert pusher.hub.metrics.transports[kind].connections.value == 0
    finally:
        writer.close()


async def test_requests_pipelined_behind_a_poll_are_answered_in_order(pusher: Pusher, store: Store) -> None:
    """A poll, another poll and a health check sent in one write: three replies, in order, and the
    last request's ``Connection: close`` ends the connection."""
    await publish(store, "kq1", "first")
    await publish(store, "kq2", "second")
    reqs = (
        POLL % (b"kq1", b"json")
        + POLL % (b"kq2", b"json")
        + b"GET /v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    out = await raw_request(pusher.port, reqs)
    assert out.count(b"HTTP/1.1 200 OK") == 3
    assert out.index(b'"first"') < out.index(b'"second"') < out.index(b'{"healthy":true}')
    assert out.endswith(b'{"healthy":true}\n')


async def test_a_poll_that_asks_to_close_or_is_http_1_0_closes(pusher: Pusher, store: Store) -> None:
    """``Connection: close`` and HTTP/1.0 (no chunks: the body ends with the connection) still close."""
    await publish(store, "kc", "m")
    out = await raw_request(pusher.port, b"GET /kc/json?poll=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert b"Connection: close" in out and out.endswith(b"0\r\n\r\n")
    reader, writer = await asyncio.open_connection("127.0.0.1", pusher.port)
    try:
        writer.write(b"GET /kc/json?poll=1 HTTP/1.0\r\nHost: x\r\n\r\n")
        out = await asyncio.wait_for(reader.read(), 3000 * MS)  # returns at the server's close
        assert b"Connection: close" in out and b"Transfer-Encoding" not in out and out.endswith(b'"m"}\n')
    finally:
        writer.close()


async def test_a_kept_poll_connection_is_counted_once_against_the_cap(start_pusher, store: Store) -> None:
    """With one connection allowed per address, a connection that polled twice is still the one: a
    second connection is refused while it is open, and admitted once it closed (its count released
    once: two new ones are not both admitted)."""
    p = await start_pusher(max_connections_per_ip=1, limit_exempt=())
    reader, writer = await asyncio.open_connection("127.0.0.1", p.port)
    for _ in range(2):
        writer.write(POLL % (b"kcap", b"json"))
        assert (await read_reply(reader))[0] == 200
    refused = await raw_request(p.port, b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert refused.startswith(b"HTTP/1.1 429 ") and b"42903" in refused
    writer.close()
    await eventually(lambda: not p._http)
    r1, w1 = await asyncio.open_connection("127.0.0.1", p.port)
    try:
        w1.write(POLL % (b"kcap", b"json"))
        assert (await read_reply(r1))[0] == 200
        refused = await raw_request(p.port, b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert refused.startswith(b"HTTP/1.1 429 ")
    finally:
        w1.close()


async def test_a_kept_poll_connection_idles_out_and_closes_at_shutdown(
    start_pusher, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After its poll, the connection is an idle keep-alive connection: the idle timeout and the
    pusher's stop both close it."""
    from upf_edge import frontdoor

    monkeypatch.setattr(frontdoor, "IDLE_TIMEOUT", 0.3)
    monkeypatch.setattr(frontdoor, "SWEEP_SECS", 0.05)
    p = await start_pusher()
    reader, writer = await asyncio.open_connection("127.0.0.1", p.port)
    writer.write(POLL % (b"kidle", b"json"))
    assert (await read_reply(reader))[0] == 200
    assert await asyncio.wait_for(reader.read(), 3000 * MS) == b""  # the idle timeout closed it
    writer.close()
    reader, writer = await asyncio.open_connection("127.0.0.1", p.port)
    writer.write(POLL % (b"kidle", b"json"))
    assert (await read_reply(reader))[0] == 200
    await p.stop()
    assert await asyncio.wait_for(reader.read(), 3000 * MS) == b""
    writer.close()


async def test_more_than_a_buffer_of_requests_pipelined_behind_a_poll(pusher: Pusher, store: Store) -> None:
    """Past 64 KB of pipelined requests the poll stops reading; the front door resumes reading when
    the connection is back, and every request, also those sent after the pause, is answered (404s:
    answered by the parser itself, so nothing else resumes reading)."""
    await publish(store, "kbig", "m")
    nope = b"GET /v1/nope HTTP/1.1\r\nHost: x\r\n\r\n"
    n = 2000  # 74 KB
    reader, writer = await asyncio.open_connection("127.0.0.1", pusher.port)
    try:
        writer.write(POLL % (b"kbig", b"json") + nope * n)
        await asyncio.sleep(0.2)
        writer.write(b"GET /v1/nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        out = await asyncio.wait_for(reader.read(), 5000 * MS)  # the last request closes
    finally:
        writer.close()
    assert b'"m"' in out and out.count(b"HTTP/1.1 404 ") == n + 1 and out.endswith(b'"page not found"}\n')


def _unread_socket(port: int) -> socket.socket:
    """A client that reads nothing until told: a small receive buffer, so the server's fills."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    s.setblocking(False)
    return s


async def _drain(s: socket.socket, until: bytes, secs: float = 5.0) -> bytes:
    """Read ``s`` until ``until`` has arrived (the reply that ends the test's exchange)."""
    loop = asyncio.get_running_loop()
    out = b""
    deadline = loop.time() + secs
    while until not in out:
        assert loop.time() < deadline, f"no {until!r} in {len(out)} bytes"
        try:
            data = s.recv(65536)
        except BlockingIOError:
            await asyncio.sleep(0.005)
            continue
        assert data, "closed early"
        out += data
    return out


async def test_a_stream_behind_an_unread_poll_waits_and_then_keeps_its_backpressure(start_pusher, store: Store) -> None:
    """A poll whose reply the client does not read ends above the write buffer's high mark; asyncio
    says so only once, to the poll. The stream subscribe pipelined behind it must not start until the
    reply drains, and then it is paused and cut as slow like any stream whose client does not read
    (before the fix it started unpaused and its buffer grew without bound)."""
    p = await start_pusher(slow_subscriber_timeout_secs=0.5, subscriber_send_buffer_bytes=4096)
    for i in range(30):  # ~120 KB in one read batch: the poll's last write crosses WRITE_HIGH
        await publish(store, "kbp", f"{i}-" + "x" * 4000)
    s = _unread_socket(p.port)
    try:
        s.send(POLL % (b"kbp", b"json") + b"GET /kbp/json HTTP/1.1\r\nHost: x\r\n\r\n")
        await eventually(lambda: not p.hub.subs)  # the poll ended and gave the connection back
        await asyncio.sleep(0.3)
        assert not p.hub.subs, "the stream started while the poll's reply was still unread"
        out = await _drain(s, b'"event":"open"')  # reading drains the reply; then the stream starts
        assert out.count(b'"event":"message"') == 30
        await eventually(lambda: len(p.hub.subs) == 1)
        (sub,) = p.hub.subs
        assert isinstance(sub, StreamSubscriber) and not sub.session.poll
        for i in range(300):  # live messages the client no longer reads
            await publish(store, "kbp", f"live{i}-" + "x" * 1000)
        await eventually(lambda: sub not in p.hub.subs, timeout_ms=5000)  # paused, then cut as slow
        assert sub.transport.get_write_buffer_size() <= 4 * WRITE_HIGH
    finally:
        s.close()


async def test_pipelined_polls_a_client_does_not_read_are_not_all_answered_into_memory(
    start_pusher, store: Store
) -> None:
    """20 polls of ~80 KB each sent at once by a client that reads nothing: the front door answers
    the next one only once the previous reply has drained, so the server holds about one reply, not
    twenty (before the fix, ~1.6 MB and growing with every request sent). Read, they are all
    answered, in order."""
    p = await start_pusher(subscriber_send_buffer_bytes=4096)
    for i in range(20):
        await publish(store, "kamp", f"{i}-" + "x" * 4000)
    s = _unread_socket(p.port)
    last = b"GET /kamp/json?poll=1&since=all HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    try:
        s.send(POLL % (b"kamp", b"json") * 19 + last)
        await asyncio.sleep(0.5)
        held = [h.transport.get_write_buffer_size() for h in p._http]
        held += [sub.transport.get_write_buffer_size() for sub in p.hub.subs]
        assert max(held) < 2 * WRITE_HIGH, held
        out = b""
        while data := await asyncio.get_running_loop().run_in_executor(None, _recv_blocking, s):
            out += data
    finally:
        s.close()
    assert out.count(b"HTTP/1.1 200 OK") == 20 and out.count(b'"event":"message"') == 400


def _recv_blocking(s: socket.socket) -> bytes:
    s.settimeout(10)
    return s.recv(1 << 20)


@pytest.mark.parametrize("path", [b"/ksm/json?poll=1&since=all", b"/ksm/sse?poll=1", b"/k$bad/json"])
async def test_a_subscribe_with_a_body_never_runs_the_body_as_a_request(
    path: bytes, pusher: Pusher, store: Store
) -> None:
    """A GET subscribe declaring a body (here a whole second request, as a request smuggled through a
    proxy would be): the subscribe is answered, its connection closes, and the body is never parsed
    as the next request (before the fix the hidden request was answered, a publish stored)."""
    await publish(store, "ksm", "m")
    hidden = b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n"
    for framing in (b"Content-Length: %d\r\n" % len(hidden), b"Transfer-Encoding: chunked\r\n"):
        body = hidden if framing.startswith(b"Content") else b"%x\r\n%s\r\n0\r\n\r\n" % (len(hidden), hidden)
        out = await raw_request(pusher.port, b"GET %s HTTP/1.1\r\nHost: x\r\n%s\r\n%s" % (path, framing, body))
        assert out.count(b"HTTP/1.1 ") == 1 and b"healthy" not in out, out
        assert (b" 200 OK" in out) == (b"$" not in path)
