"""Descriptors and connections (issue 14 #2), black box: real all-in-one processes, real sockets.

Out of descriptors, accepting pauses and logs one line per interval (before: ~4,000 tracebacks a second
with asyncio's loop; uvloop's silently closed waiting clients), and everyone is served once the flood
ends. One address may hold ``UPF_MAX_CONNECTIONS_PER_IP`` connections; the next gets 429 (42903)."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import Process, free_port

NOFILE = 256


def _stream(port: int, topic: str) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(f"GET /{topic}/json HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    return s


def _first_response(s: socket.socket) -> tuple[int, bytes]:
    data = b""
    while b"\r\n\r\n" not in data or (not data.startswith(b"HTTP/1.1 200") and b"}" not in data):
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    return int(data.split(b" ", 2)[1]), data.partition(b"\r\n\r\n")[2]


@pytest.mark.parametrize("uvloop", ["1", "0"])
def test_out_of_descriptors_backs_off_logs_once_and_recovers(tmp_path: Path, uvloop: str) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UPF_", "OTEL_"))}
    env.update(
        UPF_BIND=f"127.0.0.1:{port}", UPF_STORE_PATH=str(tmp_path / "upf.db"), UPF_WORKERS="1", UPF_SHARD_COUNT="8",
        UPF_UVLOOP=uvloop, PYTHONUNBUFFERED="1",
    )  # fmt: skip
    lowered = (
        "import resource, runpy; resource.setrlimit(resource.RLIMIT_NOFILE, "
        f"({NOFILE}, {NOFILE})); runpy.run_module('upf', run_name='__main__')"
    )
    upf = Process("upf", [sys.executable, "-c", lowered], env, tmp_path / "upf.log", port, "/v1/health")
    try:
        upf.wait_ready()
        held = [_stream(port, f"upEMF{i:05d}") for i in range(NOFILE + 150)]  # the kernel's backlog takes the rest
        time.sleep(3)
        assert len(os.listdir(f"/proc/{upf.proc.pid}/fd")) >= NOFILE - 1  # it did run out
        for s in held:
            s.close()
        deadline = time.monotonic() + 10
        while True:  # served again once the flood's descriptors are free
            try:
                r = httpx.post(upf.base + "/upAFTER0001?up=1", content="hi", timeout=2)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "not served after the flood ended"
                time.sleep(0.2)
        assert r.status_code == 200 and httpx.get(upf.base + "/v1/health", timeout=2).json() == {"healthy": True}
        log = upf.log()
        paused = log.count("accept paused: out of descriptors")
        assert 1 <= paused <= 2, log  # one line per 10 s interval, not one per attempt
        assert "Traceback" not in log and len(log.splitlines()) < 30
    finally:
        upf.stop()


def test_connections_per_address_are_capped_with_429(fleet) -> None:
    upf = fleet.start(
        "upf", node="cap", UPF_WORKERS="1", UPF_MAX_CONNECTIONS_PER_IP="5", UPF_LIMIT_EXEMPT="192.0.2.1/32"
    )
    held = [_stream(upf.port, f"upCAP{i:05d}") for i in range(5)]
    for s in held:
        assert _first_response(s)[0] == 200
    refused = _stream(upf.port, "upCAP99999")
    status, body = _first_response(refused)
    assert status == 429 and json.loads(body.split(b"\n")[0]) == {
        "code": 42903, "http": 429, "error": "limit reached: too many open connections", "link": "https://ntfy.sh/docs/publish/#limitations",
    }  # fmt: skip
    assert refused.recv(4096) == b""  # and closed
    refused.close()
    held.pop().close()
    time.sleep(0.3)
    again = _stream(upf.port, "upCAP99999")
    assert _first_response(again)[0] == 200  # a freed slot is reusable
    again.close()
    for s in held:
        s.close()


def test_loopback_is_exempt_by_default(fleet) -> None:
    upf = fleet.start("upf", node="capx", UPF_WORKERS="1", UPF_MAX_CONNECTIONS_PER_IP="2")
    held = [_stream(upf.port, f"upCAPX{i:04d}") for i in range(4)]
    assert [_first_response(s)[0] for s in held] == [200] * 4
    for s in held:
        s.close()
