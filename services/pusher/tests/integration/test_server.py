"""The front door over real sockets: routing, ops routes, errors, the direct handler, the ASGI fallback,
shutdown, affinity races."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from typing import Any

import websockets
from upf_pusher_testkit import MS, eventually, publish, raw_request, settings_for

from upf_edge import NO_BODY, Reply
from upf_keyspace import Store
from upf_pusher import __version__, transports
from upf_pusher.server import Pusher, serve


def status_and_body(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    return int(lines[0].split()[1]), headers, body


async def get(port: int, path: str, extra: str = "") -> tuple[int, dict[str, str], bytes]:
    return status_and_body(
        await raw_request(port, f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{extra}\r\n".encode())
    )


async def test_ws_without_upgrade_is_40016(pusher: Pusher) -> None:
    """GET /{topic}/ws without Upgrade: websocket is 400 with code 40016."""
    status, headers, body = await get(pusher.port, "/t/ws")
    assert status == 400 and headers["content-type"] == "application/json"
    assert json.loads(body)["code"] == 40016


async def test_unknown_path_without_fallback_is_ntfy_404(pusher: Pusher) -> None:
    """Without a fallback app, other paths get ntfy's 404 JSON."""
    status, _, body = await get(pusher.port, "/t")
    assert status == 404 and json.loads(body) == {"code": 40401, "http": 404, "error": "page not found"}


async def test_ops_routes(pusher: Pusher) -> None:
    """Health, load-balancer heartbeat, store heartbeat and version answer as documented."""
    assert (await get(pusher.port, "/v1/health"))[::2] == (200, b'{"healthy":true}\n')
    assert (await get(pusher.port, "/__lbheartbeat__"))[::2] == (200, b"{}\n")
    status, _, body = await get(pusher.port, "/__heartbeat__")
    assert status == 200 and json.loads(body)["store"] == "ok"
    status, _, body = await get(pusher.port, "/__version__")
    assert status == 200 and json.loads(body) == {"name": "upf-pusher", "version": __version__}


async def test_heartbeat_is_503_when_the_store_fails(pusher: Pusher, monkeypatch: Any) -> None:
    """__heartbeat__ reports 503, with ntfy's error JSON as every role does, when a store read fails."""

    async def broken(*a: Any, **k: Any) -> Any:
        raise RuntimeError("store down")

    monkeypatch.setattr(pusher.store, "read_after", broken)
    status, _, body = await get(pusher.port, "/__heartbeat__")
    assert status == 503 and json.loads(body) == {
        "code": 50301,
        "http": 503,
        "error": "service unavailable: store not responding",
    }


async def test_keep_alive_serves_requests_in_order(pusher: Pusher) -> None:
    """Pipelined requests on one connection are answered in order, the last one closes."""
    reqs = b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\nGET /__heartbeat__ HTTP/1.1\r\nHost: x\r\n\r\nGET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    out = await raw_request(pusher.port, reqs)
    assert out.count(b"HTTP/1.1 ") == 3
    assert out.index(b"healthy") < out.index(b'"store":"ok"') < out.index(b"40401")


async def test_invalid_utf8_path_is_400(pusher: Pusher) -> None:
    """A path that is not UTF-8 after percent-decoding is 400."""
    status, _, body = status_and_body(await raw_request(pusher.port, b"GET /%ff/json HTTP/1.1\r\nHost: x\r\n\r\n"))
    assert status == 400 and json.loads(body)["http"] == 400


async def test_garbage_is_400_and_closed(pusher: Pusher) -> None:
    """A malformed request line gets 400 and the connection is closed."""
    status, _, _ = status_and_body(await raw_request(pusher.port, b"HELLO\r\n\r\n"))
    assert status == 400


async def test_websocket_declines_compression_and_answers_pings(pusher: Pusher, store: Store) -> None:
    """The server never negotiates permessage-deflate, and answers a client's ping."""
    async with websockets.connect(f"ws://127.0.0.1:{pusher.port}/z/ws") as ws:  # offers deflate by default
        assert ws.response.headers.get("Sec-WebSocket-Extensions") is None
        assert json.loads(await ws.recv())["event"] == "open"
        pong = await ws.ping()
        await asyncio.wait_for(pong, 2000 * MS)
        await publish(store, "z", "after-ping")
        assert json.loads(await ws.recv())["message"] == "after-ping"


async def test_a_client_answering_fast_keepalives_stays_connected(start_pusher: Any, store: Store) -> None:
    """At the lowest keepalive (0.05 s: 20 pings a second) a real client that answers every ping is
    not closed as a flood: at the frame budget's 2 a second it was cut within ~4 s."""
    p = await start_pusher(keepalive_secs=0.05)
    ws = await websockets.connect(f"ws://127.0.0.1:{p.port}/fast/ws", ping_interval=None)
    try:
        assert json.loads(await ws.recv())["event"] == "open"
        await asyncio.sleep(5)  # ~100 pings answered
        await publish(store, "fast", "still-here")
        assert json.loads(await asyncio.wait_for(ws.recv(), 2000 * MS))["message"] == "still-here"
    finally:
        await ws.close()


async def test_stop_closes_subscribers_cleanly(start_pusher: Any, clients: Any) -> None:
    """On stop, a WebSocket gets close code 1001 and a stream gets its last chunk."""
    p = await start_pusher()
    ws = await websockets.connect(f"ws://127.0.0.1:{p.port}/s/ws")
    await ws.recv()
    stream = await clients(p.port, "json", "/s/json")
    await stream.next()
    await p.stop()
    await asyncio.wait_for(ws.wait_closed(), 2000 * MS)
    assert ws.close_code == 1001
    await asyncio.wait_for(stream.closed.wait(), 2000 * MS)
    await ws.close()


async def test_resubscribe_during_release_keeps_the_topic_held(pusher: Pusher, store: Store, clients: Any) -> None:
    """A subscriber arriving while the last one's release is in flight ends with the topic held."""
    hub = pusher.hub
    gate = asyncio.Event()
    real_release = store.release

    async def slow_release(topics: Any, node: str) -> None:
        await real_release(topics, node)
        await gate.wait()  # the release has committed; hold the worker here

    pusher.store.release = slow_release  # type: ignore[method-assign]
    try:
        a = await clients(pusher.port, "json", "/race/json")
        await a.next()
        await a.close()
        await eventually(lambda: "race" in hub._affinity and "race" not in hub.by_topic)
        b = await clients(pusher.port, "sse", "/race/sse")
        await b.next()
        gate.set()
        await eventually(lambda: "race" not in hub._affinity)
        assert (await publish(store, "race", "still-held")).poked == 1
        assert (await b.next_message())["message"] == "still-held"
    finally:
        gate.set()
        pusher.store.release = real_release  # type: ignore[method-assign]


# --- the ASGI fallback ------------------------------------------------------------------------------
class EchoApp:
    """A tiny ASGI app: echoes method, path, query and body; records its lifespan."""

    def __init__(self) -> None:
        self.lifespan: list[str] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    self.lifespan.append("startup")
                    scope["state"]["greeting"] = "hi"
                    await send({"type": "lifespan.startup.complete"})
                else:
                    self.lifespan.append("shutdown")
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        if scope["path"] == "/stream":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"part1", "more_body": True})
            await send({"type": "http.response.body", "body": b"part2"})
            return
        if scope["path"] == "/boom":
            raise RuntimeError("boom")
        out = json.dumps(
            {
                "method": scope["method"],
                "path": scope["path"],
                "raw_path": scope["raw_path"].decode(),
                "query": scope["query_string"].decode(),
                "body": body.decode(),
                "state": scope.get("state", {}).get("greeting"),
                "client": list(scope["client"]) if scope["client"] else None,
            }
        ).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": out})


async def test_fallback_gets_other_requests_with_their_bodies(start_pusher: Any) -> None:
    """Non-subscribe requests reach the fallback app with method, path, query, body and lifespan state."""
    app = EchoApp()
    p = await start_pusher(fallback=app)
    assert app.lifespan == ["startup"]
    raw = await raw_request(
        p.port, b"POST /up%41?up=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello"
    )
    status, headers, body = status_and_body(raw)
    got = json.loads(body)
    assert status == 200 and headers["content-length"] == str(len(body))
    assert got["method"] == "POST" and got["path"] == "/upA" and got["raw_path"] == "/up%41"
    assert (
        got["query"] == "up=1" and got["body"] == "hello" and got["state"] == "hi" and got["client"][0] == "127.0.0.1"
    )
    await p.stop()
    assert app.lifespan == ["startup", "shutdown"]


async def test_fallback_chunked_body_keep_alive_and_expect_continue(start_pusher: Any) -> None:
    """Chunked bodies decode, Expect: 100-continue gets its interim reply, keep-alive serves the next request."""
    p = await start_pusher(fallback=EchoApp())
    reqs = (
        b"PUT /t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n"
        b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
        b"GET /t/json HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"  # wait: that's a subscribe; use poll
    ).replace(b"/t/json HTTP", b"/t/json?poll=1 HTTP")
    out = await raw_request(p.port, reqs)
    assert out.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK")
    first = out[len(b"HTTP/1.1 100 Continue\r\n\r\n") :]
    _, _, rest = first.partition(b"\r\n\r\n")
    assert json.loads(rest[: rest.index(b"}") + 1])["body"] == "abcde"
    assert b"application/x-ndjson" in rest  # the poll on the same connection was served after


async def test_fallback_streaming_response_is_chunked(start_pusher: Any) -> None:
    """A response sent in several body messages goes out chunked."""
    p = await start_pusher(fallback=EchoApp())
    status, headers, body = status_and_body(
        await raw_request(p.port, b"GET /stream HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    )
    assert status == 200 and headers["transfer-encoding"] == "chunked"
    assert body == b"5\r\npart1\r\n5\r\npart2\r\n0\r\n\r\n"


async def test_fallback_body_over_limit_is_413(start_pusher: Any) -> None:
    """A request body over 64 KiB is refused with 413 before the app sees it."""
    p = await start_pusher(fallback=EchoApp())
    status, _, body = status_and_body(
        await raw_request(p.port, b"POST /t HTTP/1.1\r\nHost: x\r\nContent-Length: 70000\r\n\r\n")
    )
    assert status == 413 and json.loads(body)["http"] == 413
    big = b"8000\r\n" + b"a" * 0x8000 + b"\r\n"
    status, _, _ = status_and_body(
        await raw_request(p.port, b"POST /t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + big * 3)
    )
    assert status == 413


def _send_whole_then_read(port: int, head: bytes, body_bytes: int) -> bytes:
    """A client that writes a whole request body before it reads the reply (curl without ``Expect``,
    Go's client, urllib3): blocking sockets, in a thread."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head)
        chunk = b"\0" * 65536
        left = body_bytes
        while left > 0:
            left -= s.send(chunk[: min(left, len(chunk))])
        out = b""
        while data := s.recv(65536):
            out += data
        return out


async def test_a_body_refused_unread_still_gets_its_413_not_a_reset(
    start_pusher: Any, tmp_path: Any, store: Store
) -> None:
    """A body over the limit is answered at once and not read; a client still writing it must get the
    413, not a reset: the connection closes after the reply by half-closing and dropping what the peer
    still sends (a lingering close). Through the fallback's 413, the direct handler's and a 404."""
    n = 8 * 1024 * 1024
    p = await start_pusher(fallback=EchoApp())
    out = await asyncio.to_thread(
        _send_whole_then_read, p.port, b"POST /a/b HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % n, n
    )
    status, headers, body = status_and_body(out)
    assert status == 413 and json.loads(body)["http"] == 413 and headers["connection"] == "close"
    await eventually(lambda: not p._http)  # the peer closed: so did the server

    handler = RecordingHandler()
    h = await serve(settings_for(tmp_path), store, handler=handler, host="127.0.0.1", port=0)
    try:
        head = b"POST /t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1000000\r\n"
        status, headers, body = status_and_body(await asyncio.to_thread(_send_whole_then_read, h.port, head, n))
        assert status == 200 and headers["connection"] == "close"  # the handler answered its body as None
        assert handler.calls[-1] == ("POST", "t", None)
        head = b"PUT /a/b/c HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % n  # no route: 404
        status, headers, body = status_and_body(await asyncio.to_thread(_send_whole_then_read, h.port, head, n))
        assert status == 404 and json.loads(body)["code"] == 40401 and headers["connection"] == "close"
    finally:
        await h.stop()


async def test_a_lingering_close_ends_at_its_time_and_byte_limits(start_pusher: Any, monkeypatch: Any) -> None:
    """A peer that reads the reply and our FIN but never closes is closed after ``LINGER_SECS``; one
    that keeps sending is closed once ``LINGER_BYTES`` have come, whatever the time."""
    from upf_edge import frontdoor

    monkeypatch.setattr(frontdoor, "SWEEP_SECS", 0.05)
    monkeypatch.setattr(frontdoor, "LINGER_SECS", 0.3)
    p = await start_pusher(fallback=EchoApp())
    reader, writer = await asyncio.open_connection("127.0.0.1", p.port)
    try:
        writer.write(b"POST /a/b HTTP/1.1\r\nHost: x\r\nContent-Length: 70000\r\n\r\n")
        assert status_and_body(await asyncio.wait_for(reader.read(), 3))[0] == 413  # the reply, then our FIN
        assert p._http  # still open: it may send the body it was writing
        await eventually(lambda: not p._http)  # closed by the server after LINGER_SECS
    finally:
        writer.close()

    monkeypatch.setattr(frontdoor, "LINGER_SECS", 30.0)
    monkeypatch.setattr(frontdoor, "LINGER_BYTES", 256 * 1024)
    p = await start_pusher(fallback=EchoApp())
    reader, writer = await asyncio.open_connection("127.0.0.1", p.port)
    try:
        writer.write(b"POST /a/b HTTP/1.1\r\nHost: x\r\nContent-Length: 70000000\r\n\r\n")
        assert status_and_body(await asyncio.wait_for(reader.read(), 3))[0] == 413
        with contextlib.suppress(ConnectionError):
            for _ in range(16):  # 1 MiB, past the limit
                writer.write(b"\0" * 65536)
                await writer.drain()
        await eventually(lambda: not p._http)  # long before LINGER_SECS
    finally:
        writer.close()


async def test_fallback_error_is_500(start_pusher: Any) -> None:
    """An app that raises before responding gives a 500 JSON error."""
    p = await start_pusher(fallback=EchoApp())
    status, _, body = status_and_body(await raw_request(p.port, b"GET /boom HTTP/1.1\r\nHost: x\r\n\r\n"))
    assert status == 500 and json.loads(body)["http"] == 500


async def test_subscribe_and_ops_routes_take_precedence_over_the_fallback(start_pusher: Any, clients: Any) -> None:
    """With a fallback, subscribe and ops routes are still the pusher's own."""
    p = await start_pusher(fallback=EchoApp())
    assert (await get(p.port, "/v1/health"))[2] == b'{"healthy":true}\n'
    c = await clients(p.port, "json", "/mine/json")
    assert (await c.next())["event"] == "open"


async def test_a_failed_drain_keeps_the_next_safety_pass_full(start_pusher: Any, store: Store) -> None:
    """A drain error since the last full pass means that pass may have missed something: no skip; nor
    when the appends count cannot be read."""
    p = await start_pusher(safety_poll_secs=3600)
    await p.hub.safety_pass()
    skips = p.hub.metrics.safety_skips.value
    await p.hub.safety_pass()
    assert p.hub.metrics.safety_skips.value == skips + 1
    p.hub.drain_errors += 1
    await p.hub.safety_pass()
    assert p.hub.metrics.safety_skips.value == skips + 1
    await p.hub.safety_pass()
    assert p.hub.metrics.safety_skips.value == skips + 2
    await publish(store, "elsewhere", "x")  # any message into Q, on any topic, ends the skips
    await p.hub.safety_pass()
    assert p.hub.metrics.safety_skips.value == skips + 2
    await p.hub.safety_pass(force=True)
    assert p.hub.metrics.safety_skips.value == skips + 2
    real = p.store.appends

    async def unreadable() -> int:
        raise RuntimeError("store hiccup")

    p.store.appends = unreadable  # type: ignore[method-assign]
    try:
        await p.hub.safety_pass()  # the count unread: a full pass, which vouches for nothing after it
        await p.hub.safety_pass()
    finally:
        p.store.appends = real  # type: ignore[method-assign]
    assert p.hub.metrics.safety_skips.value == skips + 2
    await p.hub.safety_pass()
    assert p.hub.metrics.safety_skips.value == skips + 2
    await p.hub.safety_pass()
    assert p.hub.metrics.safety_skips.value == skips + 3


async def test_a_poll_whose_read_fails_retries_and_finishes(start_pusher: Any, store: Store) -> None:
    """A poll holds no topic, so no bell and no safety pass reaches it: a failed read is retried on a
    timer of its own, and the poll answers its message and ends (before the fix it waited forever
    after its head, and so did every request pipelined behind it)."""
    p = await start_pusher(safety_poll_secs=3600)
    await publish(store, "prf", "hello")
    real = p.store.read_many
    calls = 0

    async def flaky(wants: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls <= 2:
            raise RuntimeError("store hiccup")
        return await real(wants)

    p.store.read_many = flaky  # type: ignore[method-assign]
    try:
        poll = b"GET /prf/json?poll=1&since=all HTTP/1.1\r\nHost: x\r\n"
        out = await raw_request(p.port, poll + b"\r\n" + poll + b"Connection: close\r\n\r\n")
    finally:
        p.store.read_many = real  # type: ignore[method-assign]
    assert calls == 4 and out.count(b"HTTP/1.1 200 OK") == 2 and out.count(b'"hello"') == 2
    assert out.endswith(b"0\r\n\r\n") and not p.hub.subs


async def test_store_errors_during_a_drain_are_survived(
    start_pusher: Any, store: Store, clients: Any, caplog: Any
) -> None:
    """A failing store read is logged, the process carries on, and the safety poll delivers later."""
    p = await start_pusher(safety_poll_secs=0.2)
    c = await clients(p.port, "json", "/err/json")
    await c.next()
    real = store.read_many
    failures = 0

    async def flaky(wants: Any) -> Any:
        nonlocal failures
        if failures < 3:
            failures += 1
            raise RuntimeError("store hiccup")
        return await real(wants)

    p.store.read_many = flaky  # type: ignore[method-assign]
    try:
        await publish(store, "err", "eventually")
        assert (await c.next_message(5000))["message"] == "eventually"
        assert p.hub.drain_errors >= 1
        drained = [r for r in caplog.records if r.getMessage() == "drain read failed"]
        assert drained
        # A topic is a capability (whoever knows it can publish and subscribe): it is never logged.
        assert not any(v == "err" for r in drained for v in vars(r).values())
    finally:
        p.store.read_many = real  # type: ignore[method-assign]


async def test_http10_stream_is_not_chunked(pusher: Pusher, store: Store) -> None:
    """An HTTP/1.0 client gets the stream without chunked framing, delimited by the connection."""
    await publish(store, "old", "one")
    out = await raw_request(pusher.port, b"GET /old/json?poll=1 HTTP/1.0\r\n\r\n")
    status, headers, body = status_and_body(out)
    assert status == 200 and "transfer-encoding" not in headers
    assert json.loads(body)["message"] == "one"


async def test_request_body_that_never_arrives_is_cut_off(start_pusher: Any, monkeypatch: Any) -> None:
    """A fallback request whose body stalls is closed after the head timeout."""
    from upf_edge import frontdoor

    monkeypatch.setattr(frontdoor, "HEAD_TIMEOUT", 0.2)
    p = await start_pusher(fallback=EchoApp())
    out = await raw_request(p.port, b"POST /t HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc", timeout_ms=3000)
    assert out == b""


async def test_deadline_sweep_runs_only_while_a_connection_is_unrouted(start_pusher: Any, monkeypatch: Any) -> None:
    """No timer wakes an idle pusher; the first connection arms the sweep (its head timeout still
    fires), and the sweep stops once no unrouted connection is left."""
    from upf_edge import frontdoor

    monkeypatch.setattr(frontdoor, "HEAD_TIMEOUT", 0.2)
    monkeypatch.setattr(frontdoor, "SWEEP_SECS", 0.05)
    p = await start_pusher()
    assert p._sweeper is None
    reader, writer = await asyncio.open_connection("127.0.0.1", p.port)
    try:
        await eventually(lambda: p._sweeper is not None)
        assert await asyncio.wait_for(reader.read(), 3) == b""  # no head: cut off by the sweep
    finally:
        writer.close()
    await eventually(lambda: not p._http and p._sweeper is None)
    out = await raw_request(p.port, b"GET /t/json?poll=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status_and_body(out)[0] == 200
    await eventually(lambda: p._sweeper is None)


async def test_paused_subscriber_resumes_from_its_cursor_without_gaps(pusher: Pusher, store: Store) -> None:
    """A client that stops reading is paused; once it reads again it gets every message once, in order."""
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", pusher.port))
    try:
        await loop.sock_sendall(sock, b"GET /resume/json HTTP/1.1\r\nHost: x\r\n\r\n")
        await eventually(lambda: len(pusher.hub.subs) == 1 and next(iter(pusher.hub.subs)).session.phase.name == "LIVE")
        sub = next(iter(pusher.hub.subs))
        sub.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        ids = []
        for i in range(10):
            pubs = await asyncio.gather(*(publish(store, "resume", f"{i:02d}-{j:02d}" + "x" * 4000) for j in range(20)))
            ids += [p.id for p in sorted(pubs, key=lambda p: p.stamp)]
            await asyncio.sleep(20 * MS)
        await eventually(lambda: sub.session.paused, 3000)
        buf = b""
        got: list[str] = []
        deadline = loop.time() + 10000 * MS
        while len(got) < len(ids) and loop.time() < deadline:
            buf += await asyncio.wait_for(loop.sock_recv(sock, 65536), 5000 * MS)
            _, _, body = buf.partition(b"\r\n\r\n")
            got = []
            for line in dechunk(body).split(b"\n"):
                if line.startswith(b"{"):
                    ev = json.loads(line)
                    if ev["event"] == "message":
                        got.append(ev["id"])
        assert got == ids
    finally:
        sock.close()


def dechunk(body: bytes) -> bytes:
    out, pos = b"", 0
    while True:
        i = body.find(b"\r\n", pos)
        if i < 0:
            return out
        size = int(body[pos:i], 16)
        if size == 0 or len(body) < i + 2 + size + 2:
            return out
        out += body[i + 2 : i + 2 + size]
        pos = i + 2 + size + 2


# --- the direct handler (the writer's publish in the all-in-one program) ---------------------------
class RecordingHandler:
    """An ``upf_edge.Handler`` that records what it is called with and answers with it as JSON."""

    LIMIT = 8

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, bytes | None]] = []

    def wants(self, method: str, path: str) -> bool:
        return len(path) > 1 and path.rfind("/") == 0

    def body_limit(self, method: str, topic: str, headers: Any, query: bytes) -> int:
        return NO_BODY if method in ("GET", "HEAD") else self.LIMIT

    async def __call__(
        self, method: str, topic: str, headers: Any, query: bytes, body: bytes | None, client: str
    ) -> Reply:
        self.calls.append((method, topic, body))
        if topic == "boom":
            raise RuntimeError("boom")
        out = {"topic": topic, "query": query.decode(), "title": dict(headers).get(b"x-title", b"").decode()}
        return Reply(200, json.dumps(out).encode(), ((b"x-handled", b"1"),))


async def test_handler_is_called_directly_and_the_fallback_keeps_the_rest(tmp_path: Any, store: Store) -> None:
    """One-segment paths go to the handler (decoded topic, raw headers and query, whole body, chunked
    too); other paths still reach the fallback; keep-alive serves them in order on one connection."""
    handler, app = RecordingHandler(), EchoApp()
    p = await serve(settings_for(tmp_path), store, fallback=app, handler=handler, host="127.0.0.1", port=0)
    try:
        reqs = (
            b"POST /up%41?up=1 HTTP/1.1\r\nHost: x\r\nX-Title: hi\r\nContent-Length: 5\r\n\r\nhello"
            b"PUT /t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
            b"POST /a/b HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\nzz"
        )
        out = await raw_request(p.port, reqs)
        first, second, third = out.split(b"HTTP/1.1 ")[1:]
        status, headers, body = status_and_body(b"HTTP/1.1 " + first)
        assert status == 200 and headers["x-handled"] == "1" and headers["connection"] == "keep-alive"
        assert json.loads(body) == {"topic": "upA", "query": "up=1", "title": "hi"}
        assert status_and_body(b"HTTP/1.1 " + second)[0] == 200
        assert json.loads(status_and_body(b"HTTP/1.1 " + third)[2])["path"] == "/a/b"  # the fallback's
        assert handler.calls == [("POST", "upA", b"hello"), ("PUT", "t", b"abc")]
    finally:
        await p.stop()


async def test_handler_limits_head_and_failures(tmp_path: Any, store: Store) -> None:
    """A body over the handler's limit reaches it as None; HEAD gets the head only; a handler that
    raises gives ntfy's 500 JSON and a close."""
    handler = RecordingHandler()
    p = await serve(settings_for(tmp_path), store, handler=handler, host="127.0.0.1", port=0)
    try:
        await raw_request(
            p.port, b"POST /t HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\nConnection: close\r\n\r\n123456789"
        )
        assert handler.calls[-1] == ("POST", "t", None)
        out = await raw_request(p.port, b"HEAD /t?up=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        status, headers, body = status_and_body(out)
        assert status == 200 and int(headers["content-length"]) > 0 and body == b""
        assert handler.calls[-1] == ("HEAD", "t", b"")
        status, headers, body = status_and_body(await raw_request(p.port, b"GET /boom HTTP/1.1\r\nHost: x\r\n\r\n"))
        assert status == 500 and json.loads(body)["http"] == 500 and headers["connection"] == "close"
    finally:
        await p.stop()


async def test_idle_keep_alive_connection_is_closed(start_pusher: Any, monkeypatch: Any) -> None:
    """A keep-alive connection that sends nothing after its reply is closed by the server (the
    per-connection deadline enforced by the server's sweep)."""
    from upf_edge import frontdoor

    monkeypatch.setattr(frontdoor, "IDLE_TIMEOUT", 0.2)
    p = await start_pusher()
    reader, writer = await asyncio.open_connection("127.0.0.1", p.port)
    try:
        writer.write(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
        out = b""
        while chunk := await asyncio.wait_for(reader.read(65536), 5000 * MS):
            out += chunk
        assert out.startswith(b"HTTP/1.1 200 ") and b"Connection: keep-alive" in out
        assert reader.at_eof()
    finally:
        writer.close()


async def test_a_connection_made_once_the_stop_began_is_closed_unserved(start_pusher: Any) -> None:
    """A connection accepted before a stop whose transport is made after it began (the accept task
    is no longer cancelled) is closed as the stop's idle connections are: its request is not served."""
    p = await start_pusher()
    reader, writer = await asyncio.open_connection("127.0.0.1", p.port)
    try:
        await eventually(lambda: len(p._http) == 1)
        (served,) = p._http
        p.closing = True  # as stop() sets it; what follows is connection_made after that point
        reader2, writer2 = await asyncio.open_connection("127.0.0.1", p.port)
        writer2.write(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert await asyncio.wait_for(reader2.read(), 5000 * MS) == b""
        writer2.close()
        assert served in p._http and not served.transport.is_closing()  # made before: left to the stop
    finally:
        p.closing = False  # so that the fixture's stop runs in full
        writer.close()


def _client_frame(opcode: int, payload: bytes, fin: bool = True) -> bytes:
    """A masked client frame (RFC 6455 5.2), built by hand so that it can carry what no library sends."""
    mask = b"\x11\x22\x33\x44"
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    assert len(payload) < 126
    return bytes(((0x80 if fin else 0) | opcode, 0x80 | len(payload))) + mask + masked


async def _ws_upgrade(port: int, extra: str = "") -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        (
            "GET /utf/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{extra}\r\n"
        ).encode()
    )
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    return reader, writer, head


async def _close_code(reader: asyncio.StreamReader) -> int:
    """Read server frames until the close frame; its status code."""
    while True:
        b0, b1 = await asyncio.wait_for(reader.readexactly(2), 5)
        n = b1 & 0x7F
        if n == 126:
            n = int.from_bytes(await reader.readexactly(2), "big")
        data = await reader.readexactly(n)
        if b0 & 0x0F == 0x8:
            return int.from_bytes(data[:2], "big")


async def test_invalid_utf8_text_frame_closes_with_1007(pusher: Pusher) -> None:
    """RFC 6455 8.1: a text message that is not UTF-8 ends the connection with 1007, whole or
    fragmented (the bad byte in a continuation); valid text and binary messages are left alone."""
    for frames in (
        [_client_frame(0x1, b"ok \xff")],
        [_client_frame(0x1, "ok \u00e9".encode()[:-1], fin=False), _client_frame(0x0, b"\xff")],
    ):
        reader, writer, head = await _ws_upgrade(pusher.port)
        assert head.startswith(b"HTTP/1.1 101")
        writer.write(_client_frame(0x1, "fine \u00e9".encode()) + _client_frame(0x2, b"\xff\xfe"))
        writer.write(b"".join(frames))
        await writer.drain()
        assert await _close_code(reader) == 1007
        writer.close()


async def test_frames_pipelined_behind_the_upgrade_are_answered_after_the_101(pusher: Pusher) -> None:
    """A ping, then a close, sent with the upgrade request (before the 101 could arrive): the 101 comes
    first, then the pong, then the close's echo. The pong came before the 101, so the client could not
    read the head."""
    reader, writer = await asyncio.open_connection("127.0.0.1", pusher.port)
    writer.write(
        b"GET /early/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        + _client_frame(0x9, b"hi")
        + _client_frame(0x8, (1000).to_bytes(2, "big"))
    )
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 101"), head[:40]
        assert await asyncio.wait_for(reader.readexactly(4), 5) == b"\x8a\x02hi"
        assert await _close_code(reader) == 1000
        assert await asyncio.wait_for(reader.read(), 5) == b""  # then the server closes
    finally:
        writer.close()


async def test_two_websocket_keys_are_400_not_an_exception(pusher: Pusher, caplog: Any) -> None:
    """Two Sec-WebSocket-Key headers: a 400 handshake error, no traceback."""
    reader, writer, head = await _ws_upgrade(pusher.port, "Sec-WebSocket-Key: AAAAAAAAAAAAAAAAAAAAAA==\r\n")
    assert head.split(b" ", 2)[1] == b"400"
    assert b"\r\nsec-websocket-version: 13\r\n" in head.lower()  # RFC 6455 4.4, as gorilla (ntfy) answers
    writer.close()
    assert "Traceback" not in caplog.text and "MultipleValuesError" not in caplog.text


async def test_a_websocket_peer_gone_silent_is_dropped_and_a_live_one_is_not(
    start_pusher: Any, monkeypatch: Any
) -> None:
    """ntfy's read deadline: a WebSocket peer that sends nothing, not even the pongs of our keepalive
    pings, for the keepalive interval + WS_PONG_WAIT_SECS is dropped (before, it stayed until TCP gave
    up, ~15 minutes, holding its session, its topics' affinity and its subscription count). A client
    that answers the pings (websockets does) stays."""
    monkeypatch.setattr(transports, "WS_PONG_WAIT_SECS", 0.6)
    p = await start_pusher(keepalive_secs=0.3)
    reader, writer, head = await _ws_upgrade(p.port)  # this raw client never answers a ping
    assert head.startswith(b"HTTP/1.1 101")
    live = await websockets.connect(f"ws://127.0.0.1:{p.port}/alive/ws")
    try:
        out = b""
        while chunk := await asyncio.wait_for(reader.read(65536), 5):  # pings, then the server's reset
            out += chunk
    except ConnectionResetError:
        pass
    finally:
        writer.close()
    assert out.count(b"\x89\x00") >= 2 and p.hub.metrics.silent_closes.value == 1  # pinged, then dropped
    await asyncio.sleep(1.0)  # well past the deadline for the live client too
    assert json.loads(await asyncio.wait_for(live.recv(), 1))["event"] == "open"
    assert live.state is websockets.protocol.State.OPEN and len(p.hub.subs) == 1
    await live.close()


async def test_cors_preflight_on_every_path_and_origin_on_every_reply(pusher: Pusher) -> None:
    """ntfy answers OPTIONS anywhere with 200 and its Allow-Methods/-Headers, and every reply (ops,
    errors, handler replies) allows any origin; a preflight keeps the connection for the next request."""
    req = b"OPTIONS %s HTTP/1.1\r\nHost: x\r\nOrigin: https://a.example\r\nAccess-Control-Request-Method: POST\r\n\r\n"
    for path in (b"/t", b"/t/json", b"/v1/health", b"/"):
        raw = await raw_request(
            pusher.port, req % path + b"GET /v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        first, _, second = raw.partition(b"HTTP/1.1 200 OK\r\nContent-Type: application/json")
        status, headers, body = status_and_body(first)
        assert (status, body) == (200, b"")
        assert headers["access-control-allow-origin"] == "*"
        assert headers["access-control-allow-methods"] == "GET, PUT, POST, PATCH, DELETE"
        assert headers["access-control-allow-headers"] == "*"
        assert b"Access-Control-Allow-Origin: *" in second and second.endswith(b'{"healthy":true}\n')
    assert (await get(pusher.port, "/t"))[1]["access-control-allow-origin"] == "*"  # an error reply
    # a preflight that declares a body is answered, and the connection closed (the body is never read)
    raw = await raw_request(pusher.port, b"OPTIONS /t HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nGET /")
    assert raw.startswith(b"HTTP/1.1 200 ") and raw.count(b"HTTP/1.1") == 1 and b"Connection: close" in raw


async def test_an_auth_change_during_a_limited_subscribe_is_applied_before_it_attaches(
    start_pusher: Any, store: Store, monkeypatch: Any
) -> None:
    """A subscribe that waits on the store (an authenticated one) is not among the open streams the
    re-check of an auth change closes; it is checked again before it attaches, and its subscription
    count is handed back."""
    import base64

    from upf_edge.access import hash_password
    from upf_keyspace.auth import Permission, User

    await store.add_user("phil", User(role="user", password_hash=hash_password("pw")))
    await store.set_access("phil", "up*", Permission.READ_ONLY)
    p = await start_pusher(auth_default_access="deny-all", limit_exempt=())  # loopback is exempt by default
    cls = type(p.limiter)  # slotted: patched on the class
    real_open, real_close = cls.open_subscription, cls.close_subscription
    closed: list[str | None] = []

    async def open_then_revoke(self: Any, visitor: str | None, node: str) -> None:
        await real_open(self, visitor, node)
        before = p.gate.authorizer
        await store.reset_access("phil", "up*")
        await eventually(lambda: p.gate.authorizer is not before)

    def close(self: Any, visitor: str | None, node: str) -> None:
        closed.append(visitor)
        real_close(self, visitor, node)

    monkeypatch.setattr(cls, "open_subscription", open_then_revoke)
    monkeypatch.setattr(cls, "close_subscription", close)
    auth = "Basic " + base64.b64encode(b"phil:pw").decode()
    status, _, body = await get(p.port, "/up1/json", f"Authorization: {auth}\r\n")
    assert status == 403 and json.loads(body)["code"] == 40301
    assert closed == ["user:phil"] and not p.hub.subs


async def test_a_subscriber_revoked_before_its_reply_began_gets_the_refusal(
    start_pusher: Any, store: Store, monkeypatch: Any
) -> None:
    """An auth change while the store is still resolving a subscribe's cursors: nothing was written
    yet, so the client gets the 403 a new subscribe gets, not a bare end of the connection."""
    import base64

    from upf_edge.access import hash_password
    from upf_keyspace.auth import Permission, User

    await store.add_user("phil", User(role="user", password_hash=hash_password("pw")))
    await store.set_access("phil", "up*", Permission.READ_ONLY)
    p = await start_pusher(auth_default_access="deny-all")
    held = asyncio.Event()
    real = store.subscribe_live

    async def slow_subscribe(*args: Any, **kwargs: Any) -> Any:
        held.set()
        await asyncio.sleep(1.0)  # the store is slow: the revocation lands meanwhile
        return await real(*args, **kwargs)

    monkeypatch.setattr(store, "subscribe_live", slow_subscribe)
    auth = "Basic " + base64.b64encode(b"phil:pw").decode()
    reply = asyncio.create_task(get(p.port, "/up1/json", f"Authorization: {auth}\r\n"))
    await asyncio.wait_for(held.wait(), 5)
    await store.reset_access("phil", "up*")
    status, _, body = await asyncio.wait_for(reply, 5)
    assert status == 403 and json.loads(body)["code"] == 40301
    await eventually(lambda: not p.hub.subs)
