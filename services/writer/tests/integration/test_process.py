"""Black-box: a real ``upf-writer`` process (granian, one worker) on 127.0.0.1, over real sockets.
What lands in the store is read back by opening the same embedded store file from the test."""

from __future__ import annotations

import base64
import json
import re
import socket
from pathlib import Path

import httpx
import pytest

from upf_keyspace import Settings, decode_id, open_store

from ..conftest import WriterProcess


def raw_request(port: int, request: bytes) -> tuple[int, bytes]:
    """Send bytes as they are (no client-side validation) and return (status, body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        try:
            s.sendall(request)
        except (BrokenPipeError, ConnectionResetError):
            pass
        data = b""
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            data += chunk
            head, sep, body = data.partition(b"\r\n\r\n")
            m = re.search(rb"content-length: *(\d+)", head, re.I)
            if sep and m and len(body) >= int(m.group(1)):
                break
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


async def read_store(w: WriterProcess, topic: str):
    store = await open_store(Settings(store_path=w.store_path))
    try:
        return await store.read_after(topic, None, 100)
    finally:
        await store.close()


async def test_publish_over_real_http(writer_process: WriterProcess) -> None:
    """curl-style UP publish and a WebPush binary publish reach the store with the answered ids."""
    w = writer_process
    async with httpx.AsyncClient(base_url=w.base_url) as c:
        r1 = await c.post("/upDEMO0001?up=1", content=b"hi there")
        body = bytes(range(200))
        r2 = await c.post("/upDEMO0001", content=body, headers={"content-encoding": "aes128gcm", "ttl": "30"})
    assert r1.status_code == 200 and r2.status_code == 201  # RFC 8030 for the Web Push request
    assert r1.headers["content-type"] == "application/json"
    rows = await read_store(w, "upDEMO0001")
    assert [r.stamp for r in rows] == [decode_id(r1.json()["id"]), decode_id(r2.json()["id"])]
    assert rows[0].envelope.message == "hi there"
    assert base64.b64decode(rows[1].envelope.message) == body
    assert rows[1].envelope.expires == rows[1].envelope.time + 30


async def test_bad_input_over_real_http(writer_process: WriterProcess) -> None:
    """413 (declared, undeclared and chunked), 400s, and nothing stored for any of them."""
    w = writer_process
    async with httpx.AsyncClient(base_url=w.base_url) as c:
        assert (await c.post("/t", content=b"a" * 4097)).json()["code"] == 41301
        assert (await c.post("/t.x", content=b"a")).json()["code"] == 40009
        assert (await c.post("/", content=b"{oops")).json()["code"] == 40024
        assert (await c.post("/", content=json.dumps({"topic": "t", "message": "x" * 4097}))).status_code == 413
    status, body = raw_request(w.port, b"POST /t HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000\r\n\r\n" + b"a" * 1000)
    assert status == 413 and json.loads(body)["code"] == 41301
    chunked = (
        b"POST /t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        + (b"1000\r\n" + b"a" * 4096 + b"\r\n") * 3
        + b"0\r\n\r\n"
    )
    status, body = raw_request(w.port, chunked)
    assert status == 413 and json.loads(body)["code"] == 41301
    past_any_cap = (  # 80 KiB chunked: past the front door's own body cap (64 KiB) too
        b"POST /t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        + (b"1000\r\n" + b"a" * 4096 + b"\r\n") * 20
        + b"0\r\n\r\n"
    )
    status, body = raw_request(w.port, past_any_cap)
    assert status == 413 and json.loads(body)["code"] == 41301
    assert await read_store(w, "t") == []


@pytest.mark.parametrize("server", ["upf", "granian"])
async def test_a_json_publish_within_its_limit_is_taken_past_64_kib(tmp_path: Path, server: str) -> None:
    """A JSON publish may be twice UPF_MAX_MESSAGE_BYTES: at its largest (64 KiB) that is past the front
    door's own body cap, which then follows the writer's limit; one byte over it is 413."""
    w = WriterProcess(tmp_path, server, UPF_MAX_MESSAGE_BYTES="65536")
    try:
        message = "m" * 65536
        body = json.dumps({"topic": "big", "message": message, "title": "t" * 1000}).encode()
        assert len(body) > 64 * 1024
        async with httpx.AsyncClient(base_url=w.base_url, timeout=30) as c:
            r = await c.post("/", content=body)
            assert r.status_code == 200, r.text
            over = await c.post("/", content=b" " * (2 * 65536 + 1 - len(body)) + body)
            assert over.status_code == 413
        rows = await read_store(w, "big")
        assert [r.envelope.message for r in rows] == [message]
    finally:
        w.stop()


async def test_a_large_body_written_whole_before_the_reply_is_read_gets_its_413(tmp_path: Path) -> None:
    """An attachment-sized PUT (ntfy's clients may send 15 MB) from a client that writes the whole body
    before it reads, as urllib3 and curl without ``Expect`` do: it reads ntfy's 413 JSON, not a reset,
    and nothing is stored. On UPF's front door, the writer's default server (and the all-in-one's)."""
    w = WriterProcess(tmp_path, "upf")
    try:
        n = 20_000_000
        with socket.create_connection(("127.0.0.1", w.port), timeout=30) as s:
            s.sendall(b"PUT /bigput HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % n)
            s.sendall(b"\0" * n)
            out = b""
            while chunk := s.recv(65536):
                out += chunk
        head, _, body = out.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 413 "), head
        assert json.loads(body) == {
            "code": 41301,
            "http": 413,
            "error": "message too large",
            "link": "https://ntfy.sh/docs/publish/#limitations",
        }
        status, _ = raw_request(w.port, b"GET /v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert status == 200  # the writer serves on
        assert await read_store(w, "bigput") == []
    finally:
        w.stop()


async def test_invalid_utf8_path_and_huge_headers(writer_process: WriterProcess) -> None:
    """A path of invalid UTF-8, percent-encoded or raw, and oversized header blocks are refused with a
    400/431 and nothing stored. UPF's front door answers each with ntfy's JSON (the path is refused by
    its head parser); under granian the percent-encoded path reaches the app (40009) and the rest is
    refused by granian itself with a bare 400/431 and a close."""
    w = writer_process
    own = w.server == "upf"
    status, body = raw_request(w.port, b"POST /%ff%fe HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi")
    assert status == 400 and json.loads(body)["code"] == (40000 if own else 40009)
    status, body = raw_request(w.port, b"POST /\xff\xfe HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi")
    assert status == 400 and (json.loads(body)["code"] == 40000 if own else body == b"")
    status, body = raw_request(
        w.port, b"POST /t HTTP/1.1\r\nHost: x\r\nX-Title: " + b"a" * 8000 + b"\r\nContent-Length: 2\r\n\r\nhi"
    )
    assert status == 413 and json.loads(body)["code"] == 41301  # a title over the message limit
    status, body = raw_request(
        w.port, b"POST /t HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 500_000 + b"\r\nContent-Length: 2\r\n\r\nhi"
    )
    assert status == 431 and (json.loads(body)["code"] == 43100 if own else body == b"")
    many = b"".join(b"X-H%d: v\r\n" % i for i in range(200))
    status, _ = raw_request(w.port, b"POST /t HTTP/1.1\r\nHost: x\r\n" + many + b"Content-Length: 2\r\n\r\nhi")
    assert status == 431
    assert await read_store(w, "t") == []
    async with httpx.AsyncClient(base_url=w.base_url) as c:  # still serving
        assert (await c.get("/__heartbeat__")).status_code == 200


@pytest.mark.parametrize("server", ["upf", "granian"])
def test_sigterm_stops_gracefully(tmp_path: Path, server: str) -> None:
    """SIGTERM: exit status 0, and the store was closed (by the program, or granian's worker's lifespan)."""
    w = WriterProcess(tmp_path, server)
    assert httpx.post(w.base_url + "/t", content=b"x").status_code == 200
    assert w.stop() == 0
    log = w.log()
    assert "writer store opened" in log and "writer store closed" in log
    assert ("front door stopped role='writer'" in log) == (server == "upf")  # the server asked for


def test_bad_settings_exit_2(tmp_path: Path) -> None:
    """A bad UPF_* value stops the program at once with status 2 and names the variable."""
    import subprocess
    import sys

    env = {"UPF_BIND": "nonsense", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-m", "upf_writer"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "UPF_BIND" in proc.stderr
