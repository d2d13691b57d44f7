"""Resident memory per idle subscriber connection, per transport (not a test; a measurement).

For each of: a baseline (a bare asyncio.Protocol server holding idle TCP connections), and the pusher
on ws, json and sse, this starts a FRESH server process (memory freed by one kind of connection would
hide the next one's cost), opens N idle connections to it from a separate client process, and prints
the server's resident-memory delta (VmRSS from /proc/<pid>/status) divided by N.

The pusher runs on a real embedded store in a temporary directory, one topic per connection (each
connection holds its topic: one affinity write each), keepalives and the safety poll pushed out so the
connections stay idle. WebSocket clients offer permessage-deflate, as OkHttp and browsers do; the
server must decline it. Once open, a WebSocket client answers each ping with a masked pong, as every
client must (RFC 6455 5.5.2): bench/run.py's idle-CPU phase holds its subscribers with these clients,
so its keepalives include the pongs coming back.

    cd /work/main && python3 -m uv run python services/pusher/bench/idle_memory.py            # N=10000
    python3 -m uv run python services/pusher/bench/idle_memory.py --n 2000 --kinds ws,json
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.abspath(__file__)
KINDS = ("baseline", "ws", "json", "sse")
WARMUP = 50


def raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 1 << 20
    want = min(want, 1 << 20)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def vm_rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def use_uvloop(enabled: bool) -> str:
    if not enabled:
        return "asyncio"
    try:
        import uvloop  # type: ignore[import-not-found]
    except ImportError:
        return "asyncio (uvloop not installed)"
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return "uvloop"


# --- server processes -------------------------------------------------------------------------------
class _Hold(asyncio.Protocol):
    __slots__ = ("transport",)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        pass


async def serve_baseline() -> None:
    server = await asyncio.get_running_loop().create_server(_Hold, "127.0.0.1", 0, backlog=4096)
    print(server.sockets[0].getsockname()[1], flush=True)
    await asyncio.Event().wait()


async def serve_pusher(store_dir: str) -> None:
    from upf_keyspace import Settings, open_store
    from upf_pusher.server import serve

    settings = Settings(
        store_path=os.path.join(store_dir, "upf.db"),
        node_id="bench",
        keepalive_secs=3600.0,
        safety_poll_secs=3600.0,
        heartbeat_secs=3600.0,
        slow_subscriber_timeout_secs=3600.0,
    )
    store = await open_store(settings)
    pusher = await serve(settings, store, host="127.0.0.1", port=0)
    print(pusher.port, flush=True)
    await asyncio.Event().wait()


# --- client process ---------------------------------------------------------------------------------
def request_bytes(kind: str, i: int) -> bytes:
    topic = f"upBENCH{i:07d}"
    if kind == "ws":
        return (
            f"GET /{topic}/ws HTTP/1.1\r\nHost: bench\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
            "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n"
            "User-Agent: ntfy/1.0 (bench)\r\n\r\n"
        ).encode()
    if kind in ("json", "sse"):
        return f"GET /{topic}/{kind} HTTP/1.1\r\nHost: bench\r\nUser-Agent: ntfy/1.0 (bench)\r\n\r\n".encode()
    return b""


_PONG = b"\x8a\x80" + os.urandom(4)  # a masked, empty pong: one for every connection will do


def _pings(buf: bytes) -> tuple[int, bytes]:
    """The whole server frames at the front of ``buf`` that are pings, and the bytes left after its last
    whole frame (server frames are unmasked, RFC 6455 5.2)."""
    pings = 0
    while len(buf) >= 2:
        n, at = buf[1] & 0x7F, 2
        if n == 126:
            n, at = int.from_bytes(buf[2:4], "big"), 4
        elif n == 127:
            n, at = int.from_bytes(buf[2:10], "big"), 10
        if len(buf) < at + n:
            break
        pings += buf[0] & 0x0F == 0x9
        buf = buf[at + n :]
    return pings, buf


class _Client(asyncio.Protocol):
    """Counts a connection as established once the server has sent its open event (or, for the
    baseline, once connected); a ws client then answers the server's pings."""

    def __init__(self, kind: str, i: int, done: asyncio.Future[None]) -> None:
        self.kind, self.i, self.done, self.buf = kind, i, done, b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        if self.kind == "baseline":
            self.done.set_result(None)
        else:
            transport.write(request_bytes(self.kind, self.i))  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        if self.done.done():
            if self.kind == "ws":
                pings, self.buf = _pings(self.buf + data)
                if pings:
                    self.transport.write(_PONG * pings)  # type: ignore[attr-defined]
            return
        self.buf += data
        if b'"open"' in self.buf:
            head, _, frames = self.buf.partition(b"\r\n\r\n")
            if self.kind == "ws" and b"permessage-deflate" in head.lower():
                self.done.set_exception(RuntimeError("server accepted permessage-deflate"))
            else:
                self.done.set_result(None)
            self.buf = _pings(frames)[1] if self.kind == "ws" else b""  # the open event's frame, read

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(ConnectionError("closed before open"))


async def client(kind: str, port: int, n: int, start: int) -> None:
    loop = asyncio.get_running_loop()
    transports = []
    batch = 256
    for lo in range(start, start + n, batch):
        futs = []
        for i in range(lo, min(lo + batch, start + n)):
            done: asyncio.Future[None] = loop.create_future()
            t, _ = await loop.create_connection(lambda i=i, done=done: _Client(kind, i, done), "127.0.0.1", port)
            transports.append(t)
            futs.append(done)
        await asyncio.wait_for(asyncio.gather(*futs), 60)
    print("ready", len(transports), flush=True)
    await loop.run_in_executor(None, sys.stdin.read)  # hold until the parent closes stdin
    for t in transports:
        t.close()


# --- the parent -------------------------------------------------------------------------------------
def spawn(*args: str, stdin: int | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, HERE, *args], stdout=subprocess.PIPE, stdin=stdin, text=True, preexec_fn=raise_fd_limit
    )


def run_clients(kind: str, port: int, n: int, start: int) -> subprocess.Popen[str]:
    c = spawn("--client", kind, "--port", str(port), "--n", str(n), "--start", str(start), stdin=subprocess.PIPE)
    assert c.stdout is not None
    line = c.stdout.readline()
    if not line.startswith("ready"):
        c.kill()
        raise RuntimeError(f"client for {kind} failed: {line!r}")
    return c


def stop(p: subprocess.Popen[str]) -> None:
    if p.stdin:
        p.stdin.close()
    p.terminate()
    try:
        p.wait(10)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def measure(kind: str, n: int, settle: float, uvloop: bool) -> tuple[int, int]:
    with tempfile.TemporaryDirectory(prefix="upf-bench-") as store_dir:
        args = ["--serve", "baseline" if kind == "baseline" else "pusher", "--store", store_dir]
        if uvloop:
            args.append("--uvloop")
        server = spawn(*args)
        try:
            assert server.stdout is not None
            port = int(server.stdout.readline())
            warm = run_clients(kind, port, WARMUP, 10_000_000)  # first-use allocations, then let go
            stop(warm)
            time.sleep(settle)
            before = vm_rss_kb(server.pid)
            clients = run_clients(kind, port, n, 0)
            time.sleep(settle)
            after = vm_rss_kb(server.pid)
            stop(clients)
            return before, after
        finally:
            stop(server)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--settle", type=float, default=2.0, help="seconds to wait before reading VmRSS")
    ap.add_argument("--uvloop", action="store_true", help="run the servers on uvloop (if installed)")
    ap.add_argument("--serve", choices=("baseline", "pusher"), help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    ap.add_argument("--client", choices=KINDS, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    raise_fd_limit()
    if a.serve:
        use_uvloop(a.uvloop)
        asyncio.run(serve_baseline() if a.serve == "baseline" else serve_pusher(a.store))
        return
    if a.client:
        asyncio.run(client(a.client, a.port, a.n, a.start))
        return
    loop_name = "uvloop" if a.uvloop else "asyncio"
    print(f"idle connections: N={a.n}, server loop: {loop_name}, python {sys.version.split()[0]}")
    print(f"{'kind':<10}{'RSS before':>14}{'RSS after':>14}{'per conn':>14}")
    for kind in a.kinds.split(","):
        before, after = measure(kind, a.n, a.settle, a.uvloop)
        per = (after - before) * 1024 / a.n
        print(f"{kind:<10}{before / 1024:>11.1f} MB{after / 1024:>11.1f} MB{per / 1024:>11.2f} KB", flush=True)


if __name__ == "__main__":
    main()
