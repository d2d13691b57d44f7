"""Slow readers and kernel memory (issue 14 #8), black box: subscribers that never read, a real all-in-one
process, the kernel's view of its sockets from /proc/net/tcp.

Before: the kernel's send-buffer autotuning took ~800 KB per non-reading subscriber (so user space never
passed its 64 KB high-water mark and the slow cut never came), and a cut socket sat in FIN-WAIT-1 with
its data queued. Now: SO_SNDBUF is fixed (UPF_SUBSCRIBER_SEND_BUFFER_BYTES, 64 KB: the kernel doubles
it), the subscriber pauses, is cut after the slow timeout, and the cut is a reset: the socket is gone."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import httpx
import pytest

SUBS = 3
PER_SOCKET_BOUND = 300 * 1024
TCP_STATES = {"01": "ESTABLISHED", "04": "FIN_WAIT1", "05": "FIN_WAIT2", "06": "TIME_WAIT", "08": "CLOSE_WAIT"}


def server_sockets(port: int, peers: set[int]) -> list[tuple[str, int]]:
    """(state, bytes queued to send) of the server's end of each connection to ``peers``."""
    rows = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        local, remote = int(f[1].split(":")[1], 16), int(f[2].split(":")[1], 16)
        if local == port and remote in peers:
            rows.append((TCP_STATES.get(f[3], f[3]), int(f[4].split(":")[0], 16)))
    return rows


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads the kernel's socket table (Linux)")
def test_non_reading_subscribers_hold_bounded_kernel_memory_and_are_reset(fleet):
    upf = fleet.start("upf", node="slow", UPF_WORKERS="1", UPF_SLOW_SUBSCRIBER_TIMEOUT_SECS="2")
    subs = []
    for i in range(SUBS):
        s = socket.create_connection(("127.0.0.1", upf.port))
        s.sendall(f"GET /upSLOW{i:04d}/json HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        subs.append(s)
    peers = {s.getsockname()[1] for s in subs}
    time.sleep(0.5)
    peak = 0
    with httpx.Client(base_url=upf.base, timeout=5) as http:
        for n in range(250):  # 250 x 3 KB per subscriber: far more than any bounded buffer holds
            for i in range(SUBS):
                assert http.post(f"/upSLOW{i:04d}?up=1", content="x" * 3000).status_code == 200
            if n % 10 == 0:
                peak = max([peak, *(q for _, q in server_sockets(upf.port, peers))])
    assert 0 < peak < PER_SOCKET_BOUND, peak
    deadline = time.monotonic() + 10
    while server_sockets(upf.port, peers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert server_sockets(upf.port, peers) == []  # reset: no FIN-WAIT-1 with data queued
    for s in subs:
        s.settimeout(5)
        with pytest.raises(ConnectionResetError):
            while s.recv(1 << 20):
                pass
        s.close()
