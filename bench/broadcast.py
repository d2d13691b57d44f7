"""The fan-out ceiling: a bare ``websockets`` asyncio server broadcasting frames of a given size to N
connected clients, as fast as the clients take them.

Server process (``--serve``): accepts N WebSocket clients (compression off, as UPF's pusher
declines it), then, for ``--duration`` seconds, calls ``websockets.broadcast`` with one frame to all of
them, pausing only while some connection's write buffer is over 256 KB (so it measures sending, not
buffering). It then waits until every write buffer is empty and prints one JSON line with the frames
it sent and its own CPU (user+sys) over that window. The caller reads the server's CPU from /proc as
well; both are reported.

Client process (``--clients``): N raw asyncio connections that do the WebSocket handshake and then
count received bytes only (every frame has the same length, so frames = bytes / frame length):
counting costs the client almost nothing, so the server is the side being measured.

    python bench/broadcast.py --n 1000 --frame-bytes 230 --duration 5     # runs both, prints JSON
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import gc
import json
import os
import resource
import subprocess
import sys
import time

HERE = os.path.abspath(__file__)
HIGH_WATER = 256 * 1024


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def frame_len(payload: int) -> int:
    """Bytes on the wire of an unmasked server->client text frame with this payload length."""
    return payload + (2 if payload < 126 else 4 if payload < 65536 else 10)


# --- server -----------------------------------------------------------------------------------------
async def serve(n: int, payload: int, duration: float) -> None:
    from websockets.asyncio.server import broadcast
    from websockets.asyncio.server import serve as ws_serve

    conns: set = set()
    all_in = asyncio.Event()

    async def handler(ws) -> None:
        conns.add(ws)
        if len(conns) >= n:
            all_in.set()
        try:
            await ws.wait_closed()
        finally:
            conns.discard(ws)

    message = ('{"id":"AAAAAAAAAAIAAAAA","event":"message","message":"' + "x" * payload)[: payload - 2] + '"}'
    assert len(message) == payload, (len(message), payload)
    async with ws_serve(handler, "127.0.0.1", 0, compression=None, ping_interval=None, max_queue=None) as server:
        port = (
            server.sockets[0].getsockname()[1]
            if hasattr(server, "sockets")
            else list(server.server.sockets)[0].getsockname()[1]
        )
        print(port, flush=True)
        await asyncio.wait_for(all_in.wait(), 120)
        targets = list(conns)
        transports = [c.transport for c in targets]
        # warm-up: a few frames, so first-use costs are not measured
        for _ in range(20):
            broadcast(targets, message)
        while any(t.get_write_buffer_size() for t in transports):
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.2)
        # The collector policy UPF's roles run with (upf_edge.gcpolicy), so the ratio compares like with like.
        gc.collect()
        gc.freeze()
        gc.set_threshold(20_000, 10, 10)
        cpu0, t0 = _cpu(), time.perf_counter()
        sent = 0
        end = t0 + duration
        while time.perf_counter() < end:
            for _ in range(8):
                broadcast(targets, message)
                sent += 1
            while max(t.get_write_buffer_size() for t in transports) > HIGH_WATER:
                await asyncio.sleep(0.0005)
            await asyncio.sleep(0)
        while any(t.get_write_buffer_size() for t in transports):
            await asyncio.sleep(0.001)
        cpu1, t1 = _cpu(), time.perf_counter()
        print(
            json.dumps(
                {
                    "broadcasts": sent,
                    "frames_sent": sent * len(targets),
                    "secs": round(t1 - t0, 3),
                    "server_cpu_self": round(cpu1 - cpu0, 3),
                }
            ),
            flush=True,
        )
        # stay up until the parent has read the clients' counts and closes stdin
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


# --- clients ----------------------------------------------------------------------------------------
class _Counter(asyncio.Protocol):
    def __init__(self, ready: asyncio.Future[None]) -> None:
        self.ready = ready
        self.head = b""
        self.bytes = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        key = base64.b64encode(os.urandom(16)).decode()
        transport.write(  # type: ignore[attr-defined]  # a stream connection: a Transport
            f"GET / HTTP/1.1\r\nHost: bench\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
        )

    def data_received(self, data: bytes) -> None:
        if not self.ready.done():
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            if not self.head.startswith(b"HTTP/1.1 101"):
                self.ready.set_exception(RuntimeError(self.head[:100].decode(errors="replace")))
                return
            self.bytes += len(self.head) - end - 4
            self.head = b""
            self.ready.set_result(None)
            return
        self.bytes += len(data)


async def clients(port: int, n: int) -> None:
    loop = asyncio.get_running_loop()
    protos: list[_Counter] = []
    for lo in range(0, n, 200):
        futs = []
        for _ in range(lo, min(n, lo + 200)):
            fut: asyncio.Future[None] = loop.create_future()
            _, p = await loop.create_connection(lambda fut=fut: _Counter(fut), "127.0.0.1", port)
            protos.append(p)
            futs.append(fut)
        await asyncio.wait_for(asyncio.gather(*futs), 60)
    print("ready", flush=True)
    # report on request: each line on stdin asks for the byte count
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while await reader.readline():
        print(sum(p.bytes for p in protos), flush=True)


# --- parent -----------------------------------------------------------------------------------------
def run(
    n: int,
    payload: int,
    duration: float,
    server_cpus: set[int] | None = None,
    client_cpus: set[int] | None = None,
    cpu_reader=None,
) -> dict[str, float]:
    """Start server and clients, broadcast, return the figures. ``cpu_reader(pid)`` (optional) reads
    the server's CPU seconds from outside (the bench's /proc reader)."""

    def spawn(args: list[str], cpus: set[int] | None) -> subprocess.Popen[str]:
        def pre() -> None:
            raise_fd_limit()
            if cpus:
                os.sched_setaffinity(0, cpus)

        return subprocess.Popen(
            [sys.executable, HERE, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=pre,
            start_new_session=True,
        )

    server = spawn(["--serve", "--n", str(n), "--payload", str(payload), "--duration", str(duration)], server_cpus)
    cl = None
    try:
        assert server.stdout and server.stdin
        port = int(server.stdout.readline())
        cl = spawn(["--clients", "--port", str(port), "--n", str(n)], client_cpus)
        assert cl.stdout and cl.stdin
        if cl.stdout.readline().strip() != "ready":
            raise RuntimeError("broadcast clients failed to connect")
        outer0 = cpu_reader(server.pid) if cpu_reader else 0.0
        line = server.stdout.readline()
        outer1 = cpu_reader(server.pid) if cpu_reader else 0.0
        res = json.loads(line)
        fl = frame_len(payload)
        prev, stable = -1, 0
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the last frames may still be in socket buffers
            cl.stdin.write("\n")
            cl.stdin.flush()
            got = int(cl.stdout.readline())
            if got == prev:
                stable += 1
                if stable >= 2:
                    break
            else:
                stable = 0
            prev = got
            time.sleep(0.05)
        warm = 20 * n * fl
        delivered = (prev - warm) / fl
        cpu = (outer1 - outer0) if cpu_reader else res["server_cpu_self"]
        res.update(
            connections=n,
            payload_bytes=payload,
            frame_bytes=fl,
            frames_delivered=round(delivered),
            server_cpu_secs=round(cpu, 3),
            frames_per_cpu_sec=round(delivered / cpu, 1) if cpu > 0 else 0.0,
            frames_per_sec=round(delivered / res["secs"], 1),
        )
        return res
    finally:
        for p in (cl, server):
            if p is None:
                continue
            try:
                if p.stdin:
                    p.stdin.close()
            except OSError:
                pass
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--payload", type=int, default=230, help="frame payload bytes")
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--clients", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    raise_fd_limit()
    if a.serve:
        asyncio.run(serve(a.n, a.payload, a.duration))
    elif a.clients:
        asyncio.run(clients(a.port, a.n))
    else:
        print(json.dumps(run(a.n, a.payload, a.duration)))


if __name__ == "__main__":
    main()
