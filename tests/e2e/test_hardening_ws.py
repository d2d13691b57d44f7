"""A WebSocket peer that pings and never reads (issue 14 #3), black box: a real all-in-one process.

Before: every ping's pong went into an unbounded buffer and reading never stopped (+28 MB/s here).
Now: a peer sending frames faster than a small budget is closed with 1008 (each frame costs parsing), of
the pongs owed at most one is pending, and reading stops while the peer does not read (the last two are
unit-tested in services/pusher/tests/unit/test_ws_backpressure.py). The server's RSS is read from /proc."""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import threading
import time
from pathlib import Path

import httpx

from tests.clients.ntfy import poll

RSS_BOUND_MB = 20
PING = bytes([0x89, 0x80 | 125]) + b"\0\0\0\0" + b"p" * 125
"""A masked ping with the largest payload a control frame may carry (mask 0: payload as is)."""


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def open_ws(port: int, topic: str, rcvbuf: int = 0) -> socket.socket:
    s = socket.socket()
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.connect(("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall(
        f"GET /{topic}/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    s.settimeout(5)
    head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(1)
    assert head.startswith(b"HTTP/1.1 101 "), head
    return s


class Flood(threading.Thread):
    """Send pings as fast as the socket takes them, never reading, for ``secs``; when the server cuts
    the connection, open another. Whole frames: a partial send is finished, never restarted (restarting
    corrupts the stream: the server then rightly fails it with 1002, and closing a socket with unread
    input makes the kernel answer with a reset, which is what an earlier attempt's client saw)."""

    def __init__(self, port: int, secs: float) -> None:
        super().__init__(daemon=True)
        self.port, self.secs = port, secs
        self.sent = 0
        self.cuts = 0

    def run(self) -> None:
        batch = PING * 500
        t0 = time.monotonic()
        while time.monotonic() - t0 < self.secs:
            s = open_ws(self.port, "upFLOOD0001")
            s.setblocking(False)
            pending = batch
            try:
                while time.monotonic() - t0 < self.secs:
                    try:
                        n = s.send(pending)
                    except BlockingIOError:
                        time.sleep(0.005)
                        continue
                    self.sent += n
                    pending = pending[n:] or batch
            except (ConnectionResetError, BrokenPipeError):
                self.cuts += 1
            finally:
                s.close()


def test_ping_flood_memory_is_bounded_and_others_are_served(fleet):
    upf = fleet.start("upf", node="flood", UPF_WORKERS="1")
    pid = upf.proc.pid
    before = rss_mb(pid)
    flood = Flood(upf.port, 6.0)
    flood.start()
    peak = before
    served = 0
    with httpx.Client(base_url=upf.base, timeout=5) as http:
        while flood.is_alive():
            peak = max(peak, rss_mb(pid))
            r = http.post("/upOTHER0001?up=1", content=f"m{served}")
            assert r.status_code == 200, r.text
            assert http.get("/v1/health").status_code == 200
            served += 1
            time.sleep(0.2)
    flood.join()
    peak = max(peak, rss_mb(pid))
    assert flood.sent > 2**20 and flood.cuts > 0, (flood.sent, flood.cuts)
    assert peak - before < RSS_BOUND_MB, f"RSS grew {peak - before:.1f} MB under {flood.sent >> 20} MB of pings"
    got = asyncio.run(poll(upf.base, "upOTHER0001"))
    assert served >= 10 and [m.message for m in got] == [f"m{i}" for i in range(served)]


def _read_all(s: socket.socket) -> bytes:
    chunks = []
    try:
        while c := s.recv(65536):
            chunks.append(c)
    except (TimeoutError, ConnectionResetError):
        pass
    return b"".join(chunks)


def test_a_burst_of_pings_is_closed_with_1008_and_a_few_are_answered(upf):
    """A few pings get a pong and the stream stays open; 200 at once get a close frame with 1008."""
    s = open_ws(upf.port, "upFLOOD0002")
    s.sendall(PING * 3)
    s.settimeout(5)
    got = b""
    while b"\x8a\x7dp" not in got:  # a pong, with the ping's payload (after the open frame)
        got += s.recv(65536)
    s.sendall(PING * 200)
    rest = _read_all(s)
    s.close()
    assert b"\x88" in rest and (1008).to_bytes(2, "big") + b"too many frames" in rest, rest[-80:]
    assert httpx.get(upf.base + "/v1/health", timeout=5).status_code == 200
