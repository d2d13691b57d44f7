"""The shipped ingress (deploy/ingress) under the real nginx, in front of fake upstreams.

These run without the UPF services: small fake writer and pusher servers record what reaches them, so
the tests prove the shipped routing rules, WebSocket upgrade, unbuffered streaming, balancing and
failover. test_ingress_e2e.py repeats the important parts against the real services.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import queue
import re
import resource
import shutil
import signal
import socketserver
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from tests.deploy.conftest import render_ingress_config, wait_for_port

HOLD_SECS = 2.0
"""How long a fake pusher waits between the two chunks of a stream."""

FLOOD_CHUNK = 64 * 1024
FLOOD_BYTES = 96 * 1024 * 1024
"""A stream far larger than every socket buffer between the pusher and a subscriber that stopped reading."""

WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class FakeUpstream:
    """A threaded HTTP/1.1 server that answers with its own name and records every request head.

    Stream paths (/json, /sse, /raw) on a pusher get a chunked response: one chunk at once, a second one
    HOLD_SECS later. A WebSocket upgrade is completed by hand and answered with one text frame.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.flooded: queue.Queue[int] = queue.Queue()
        self.lock = threading.Lock()
        upstream = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                upstream._handle(self)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handle(self, h: socketserver.StreamRequestHandler) -> None:
        h.connection.settimeout(30)
        line = h.rfile.readline().decode("latin-1").rstrip("\r\n")
        if not line:
            return
        method, target, _ = line.split(" ", 2)
        headers: dict[str, str] = {}
        while (raw := h.rfile.readline().decode("latin-1").rstrip("\r\n")) != "":
            key, _, value = raw.partition(":")
            headers[key.strip().lower()] = value.strip()
        if (length := int(headers.get("content-length", "0"))) > 0:
            h.rfile.read(length)
        with self.lock:
            self.requests.append((method, target, headers))
        label = f"{self.name} {method} {target}"
        path = target.partition("?")[0]
        if headers.get("upgrade", "").lower() == "websocket":
            accept = base64.b64encode(hashlib.sha1((headers["sec-websocket-key"] + WS_GUID).encode()).digest()).decode()
            h.wfile.write(
                (
                    "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                    f"Sec-WebSocket-Accept: {accept}\r\n\r\n"
                ).encode()
            )
            payload = label.encode()
            h.wfile.write(bytes([0x81, len(payload)]) + payload)  # one unmasked text frame (< 126 bytes)
            h.wfile.flush()
            h.rfile.read(1)  # hold the tunnel until the client closes it
        elif self.name.startswith("pusher") and path.startswith("/flood"):
            self._flood(h)
        elif self.name.startswith("pusher") and path.rsplit("/", 1)[-1] in ("json", "sse", "raw"):
            h.wfile.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n"
            )
            for n, chunk in enumerate((f"first {label}\n".encode(), b"second\n")):
                if n:
                    time.sleep(HOLD_SECS)
                h.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                h.wfile.flush()
            h.wfile.write(b"0\r\n\r\n")
            h.wfile.flush()
        else:
            body = f"{label}\n".encode()
            h.wfile.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            h.wfile.flush()

    def _flood(self, h: socketserver.StreamRequestHandler) -> None:
        """Write FLOOD_BYTES as fast as the connection takes them; record how much went out before the
        writes stalled (a stall means backpressure from the subscriber reached this server)."""
        h.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n")
        h.wfile.flush()
        chunk = b"%x\r\n%s\r\n" % (FLOOD_CHUNK, b"x" * FLOOD_CHUNK)
        h.connection.settimeout(1.0)
        sent = 0
        try:
            while sent < FLOOD_BYTES:
                h.connection.sendall(chunk)
                sent += FLOOD_CHUNK
        except OSError:  # TimeoutError: stalled; a reset: the test gave up and closed
            pass
        finally:
            self.flooded.put(sent)


@pytest.fixture
def fake() -> Iterator[Callable[[str], FakeUpstream]]:
    made: list[FakeUpstream] = []

    def make(name: str) -> FakeUpstream:
        made.append(FakeUpstream(name))
        return made[-1]

    yield make
    for upstream in made:
        upstream.stop()


def get(
    url: str, target: str, method: str = "GET", body: bytes | None = None, *, first_line: bool = False
) -> tuple[int, str]:
    """One request with the exact request target given (no client-side path normalisation)."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=20)
    try:
        conn.request(method, target, body=body)
        response = conn.getresponse()
        return response.status, (response.readline() if first_line else response.read()).decode()
    finally:
        conn.close()


@pytest.fixture
def ingress(fake, start_ingress):
    writer, pusher_a, pusher_b = fake("writer"), fake("pusher-a"), fake("pusher-b")
    return start_ingress([writer.port], [pusher_a.port, pusher_b.port]), writer, pusher_a, pusher_b


TOPIC = "upDEMO0001"
LONGEST = "t" * 64

TO_PUSHER = [
    f"/{TOPIC}/json",
    f"/{TOPIC}/sse",
    f"/{TOPIC}/raw",
    f"/{TOPIC}/json?since=all&poll=1",
    f"/{LONGEST}/json",
    "/a,b_c,D-9/json",
    f"/{TOPIC},upOTHER00001,x/sse",
]

TO_WRITER = [
    ("POST", f"/{TOPIC}"),
    ("PUT", f"/{TOPIC}/json"),  # sequence ids (ntfy v2.16) may be named like a subscribe route
    ("POST", f"/{TOPIC}/sse"),
    ("DELETE", f"/{TOPIC}/ws"),
    ("DELETE", f"/{TOPIC}/seq-1"),
    ("PUT", f"/{TOPIC}/seq-1/clear"),
    ("GET", f"/{TOPIC}/seq-1/read"),
    ("PUT", f"/{TOPIC}?up=1"),
    ("GET", f"/{TOPIC}?up=1"),
    ("GET", f"/{TOPIC}/auth"),
    ("GET", "/a,b/auth"),
    ("GET", "/v1/health"),
    ("GET", "/__lbheartbeat__"),
    ("GET", "/__heartbeat__"),
    ("GET", "/__version__"),
    ("GET", "/"),
    ("GET", f"/{'t' * 65}/json"),  # topic too long
    ("GET", "/up.bad/json"),  # '.' is not a topic character
    ("GET", "/a,/json"),  # empty topic in the list
    ("GET", f"/{TOPIC}/json/more"),
    ("GET", f"/{TOPIC}/jsonx"),
    ("GET", f"/{TOPIC}/JSON"),  # routes are case-sensitive, like ntfy's
    ("GET", "//json"),
]


@pytest.mark.parametrize("target", TO_PUSHER)
def test_subscription_paths_go_to_a_pusher(ingress, target: str) -> None:
    """/{topics}/json|sse|raw, with 1-64-char topics, comma lists and query strings, reach a pusher."""
    url, *_ = ingress
    status, body = get(url.url, target, first_line=True)
    assert status == 200
    assert body == f"first {body.split()[1]} GET {target}\n" and body.split()[1] in ("pusher-a", "pusher-b"), body


@pytest.mark.parametrize(("method", "target"), TO_WRITER)
def test_everything_else_goes_to_a_writer(ingress, method: str, target: str) -> None:
    """Publishes, the UnifiedPush check, /auth, ops endpoints and every non-matching path reach a writer."""
    url, writer, *_ = ingress
    status, body = get(url.url, target, method, body=b"hi" if method in ("POST", "PUT") else None)
    assert status == 200
    assert body.startswith(f"writer {method} "), body


def test_websocket_is_upgraded_through_to_a_pusher(ingress) -> None:
    """/{topic}/ws is a WebSocket all the way: the pusher sees the Upgrade and Connection headers."""
    url, _, pusher_a, pusher_b = ingress
    with ws_connect(f"{url.ws_url}/{TOPIC}/ws", open_timeout=10) as ws:
        frame = ws.recv(timeout=10)
    assert re.fullmatch(rf"pusher-[ab] GET /{TOPIC}/ws", frame)
    seen = [h for _, target, h in pusher_a.requests + pusher_b.requests if target == f"/{TOPIC}/ws"]
    assert len(seen) == 1
    assert seen[0]["upgrade"].lower() == "websocket"
    assert seen[0]["connection"].lower() == "upgrade"
    assert "x-forwarded-for" in seen[0]


def test_stream_frames_are_not_buffered(ingress) -> None:
    """The first chunk of a stream reaches the client while the pusher is still holding the second."""
    url, *_ = ingress
    host, port = url.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=20)
    try:
        started = time.monotonic()
        conn.request("GET", f"/{TOPIC}/json")
        response = conn.getresponse()
        first = response.readline()
        first_at = time.monotonic() - started
        second = response.readline()
        second_at = time.monotonic() - started
    finally:
        conn.close()
    assert first.startswith(b"first pusher-")
    assert second == b"second\n"
    assert first_at < HOLD_SECS / 2, f"first frame arrived after {first_at:.2f}s: buffered"
    assert second_at >= HOLD_SECS * 0.9


def test_a_slow_subscriber_pushes_back_on_the_pusher(ingress) -> None:
    """With buffering off, a subscriber that stops reading stalls the pusher's writes within a few socket
    buffers. (Buffered, nginx would spool the stream to disk - up to 1 GB per connection - and the pusher
    would never see a slow subscriber to close.)"""
    url, _, pusher_a, pusher_b = ingress
    host, port = url.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("GET", "/flood0001/raw")
        response = conn.getresponse()  # headers only; the body is never read
        assert response.status == 200
        sent = None
        deadline = time.monotonic() + 60
        while sent is None and time.monotonic() < deadline:
            for upstream in (pusher_a, pusher_b):
                try:
                    sent = upstream.flooded.get(timeout=0.1)
                except queue.Empty:
                    continue
    finally:
        conn.close()
    assert sent is not None, "the pusher's writes never stalled: the stream is being buffered"
    # Observed: about 8 MB of socket buffers on loopback. Unbuffered, the bound is the kernel's buffers.
    assert sent < 40 * 1024 * 1024, f"{sent} bytes left the pusher for a subscriber that reads nothing"


def test_plain_streams_and_publishes_use_the_right_connection_headers(ingress) -> None:
    """A JSON stream is proxied as one request per connection; publishes reuse the writer pool."""
    url, writer, pusher_a, pusher_b = ingress
    get(url.url, f"/{TOPIC}/json", first_line=True)
    get(url.url, f"/{TOPIC}", "POST", b"hello")
    (stream_headers,) = [h for _, t, h in pusher_a.requests + pusher_b.requests if t == f"/{TOPIC}/json"]
    assert stream_headers["connection"].lower() == "close"
    assert "upgrade" not in stream_headers
    (publish_headers,) = [h for m, _, h in writer.requests if m == "POST"]
    assert "connection" not in publish_headers  # empty Connection: keepalive pool to the writers
    assert publish_headers["x-forwarded-for"] == "127.0.0.1"


def test_concurrent_streams_spread_over_the_pushers(ingress) -> None:
    """least_conn: a second stream opened while the first is held goes to the other pusher."""
    url, _, pusher_a, pusher_b = ingress
    results: list[str] = []

    def subscribe(topic: str) -> None:
        results.append(get(url.url, f"/{topic}/json", first_line=True)[1])

    first = threading.Thread(target=subscribe, args=("upSPREAD0001",))
    first.start()
    deadline = time.monotonic() + 5
    while not (pusher_a.requests or pusher_b.requests) and time.monotonic() < deadline:
        time.sleep(0.01)
    subscribe("upSPREAD0002")
    first.join()
    served_by = sorted(body.split()[1] for body in results)
    assert served_by == ["pusher-a", "pusher-b"]


def test_a_dead_pusher_is_skipped(fake, start_ingress, free_port) -> None:
    """A pusher that refuses connections costs nothing: every subscribe lands on the live one."""
    writer, live = fake("writer"), fake("pusher-live")
    ingress = start_ingress([writer.port], [free_port(), live.port])
    for n in range(4):
        status, body = get(ingress.url, f"/upDEAD{n:07d}/raw", first_line=True)
        assert status == 200
        assert body.startswith("first pusher-live"), body


def _stream_location(routes: str) -> str:
    match = re.search(r'location ~ "[^"]*\(ws\|json\|sse\|raw\)\$" \{(.*?)\n\}', routes, re.S)
    assert match, "the stream location is missing from upf-routes.conf"
    return match.group(1)


def _seconds(value: str) -> int:
    number, unit = re.fullmatch(r"(\d+)([smh]?)", value).groups()  # type: ignore[union-attr]
    return int(number) * {"": 1, "s": 1, "m": 60, "h": 3600}[unit]


def test_stream_route_keeps_idle_streams_and_never_buffers(repo: Path) -> None:
    """The shipped stream rules: no buffering either way, and an idle timeout far above the keepalive.

    The pusher's keepalive default is 45 s and the ntfy app gives up after 77 s; nginx's own default read
    timeout (60 s) would cut an idle stream whenever one keepalive runs late.
    """
    block = _stream_location((repo / "deploy/ingress/upf-routes.conf").read_text())
    directives = dict(re.findall(r"^\s*(proxy_\w+)\s+([^;]+);", block, re.M))
    assert directives["proxy_buffering"] == "off"
    assert directives["proxy_request_buffering"] == "off"
    assert directives["proxy_http_version"] == "1.1"
    assert _seconds(directives["proxy_read_timeout"]) >= 10 * 45
    assert _seconds(directives["proxy_send_timeout"]) >= 10 * 45


def test_shipped_config_passes_nginx_t(repo: Path, tmp_path: Path, render_ingress_config, nginx_test) -> None:
    """`nginx -t` accepts the shipped nginx.conf with its rule files, upstreams pointed at local ports."""
    conf = render_ingress_config(tmp_path, [18080], [18081, 18082], 18090)
    result = nginx_test(conf)
    assert result.returncode == 0, result.stderr
    assert "test is successful" in result.stderr
    assert str(repo / "deploy/ingress/upf-routes.conf") in conf.read_text()


def test_metrics_are_not_served_by_the_public_ingress(ingress) -> None:
    """/metrics is answered 404 with ntfy's error body by the ingress itself and never reaches a role
    (the collector scrapes each role on the internal network instead)."""
    url, writer, pusher_a, pusher_b = ingress
    status, body = get(url.url, "/metrics")
    assert status == 404
    assert json.loads(body) == {"code": 40401, "http": 404, "error": "page not found"}
    assert not any(t.startswith("/metrics") for up in (writer, pusher_a, pusher_b) for _, t, _ in up.requests)


def test_access_log_names_routes_never_topics(ingress) -> None:
    """A topic is a capability: after publishes, subscribes, /auth and ?auth= requests the access log
    holds the routes' shapes and statuses, and no topic or query string."""
    url, *_ = ingress
    secret = "upSECRETtopic0042"
    for method, target in [
        ("POST", f"/{secret}?up=1&auth=c2VjcmV0"),
        ("GET", f"/{secret}/json?poll=1&since=all"),
        ("GET", f"/{secret},upOTHERsecret99/sse"),
        ("GET", f"/{secret}/auth"),
        ("GET", "/v1/health"),
    ]:
        status, _ = get(url.url, target, method, body=b"hi" if method == "POST" else None, first_line=True)
        assert status == 200
    log_path = url.workdir / "access.log"
    deadline = time.monotonic() + 5
    while log_path.read_text().count("\n") < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    text = log_path.read_text()
    assert '"POST /{topic}" 200' in text and '"GET /{topics}/json" 200' in text and '"GET /{topics}/sse" 200' in text
    assert '"GET /{topics}/auth" 200' in text and '"GET /v1/health" 200' in text
    for leak in ("SECRET", "OTHERsecret", "auth=", "since=", "?"):
        assert leak not in text, text


# --- stopping and reloading -------------------------------------------------------------------------


def main_context(conf: str) -> str:
    """nginx.conf's main context: what stands before the first block."""
    return conf.split("events {", 1)[0]


def shutdown_timeout(repo: Path) -> int:
    (value,) = re.findall(r"^worker_shutdown_timeout\s+(\S+);", main_context(shipped_nginx_conf(repo)), re.M)
    return _seconds(value)


def shipped_nginx_conf(repo: Path) -> str:
    return (repo / "deploy/ingress/nginx.conf").read_text()


def test_graceful_stop_and_reload_are_bounded(repo: Path) -> None:
    """worker_shutdown_timeout in the main context, a few seconds: a graceful stop (the image's
    STOPSIGNAL SIGQUIT) or a reload would otherwise wait for streams that never end."""
    assert 1 <= shutdown_timeout(repo) <= 10
    stop = [a for w, a in instructions_of(repo / "deploy/containers/ingress.Containerfile") if w == "STOPSIGNAL"]
    assert stop == ["SIGQUIT"]


def instructions_of(path: Path) -> list[tuple[str, str]]:
    """A Containerfile's one-line instructions (USER, STOPSIGNAL ...): (INSTRUCTION, arguments)."""
    out = []
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#") and not line.startswith(" "):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def held_websocket(url: str) -> Any:
    """A WebSocket through the ingress that the fake pusher holds open until the client closes it."""
    return ws_connect(f"{url}/{TOPIC}/ws", open_timeout=10)


def test_graceful_stop_with_an_open_websocket_ends_in_time(repo: Path, ingress) -> None:
    """SIGQUIT (what `compose stop` sends the ingress) with a WebSocket held open: nginx closes it and
    exits after worker_shutdown_timeout instead of waiting for the stream to end."""
    url, *_ = ingress
    bound = shutdown_timeout(repo)
    with held_websocket(url.ws_url) as ws:
        assert ws.recv(timeout=10).startswith("pusher-")  # the tunnel is up
        started = time.monotonic()
        url.proc.send_signal(signal.SIGQUIT)
        try:
            url.proc.wait(timeout=bound + 10)
        except subprocess.TimeoutExpired:
            pytest.fail(f"nginx still running {bound + 10}s after SIGQUIT with one open WebSocket")
        took = time.monotonic() - started
    assert took <= bound + 5, f"the graceful stop took {took:.1f}s"


def test_reload_picks_up_a_new_config_and_closes_old_streams_in_time(repo: Path, ingress) -> None:
    """`nginx -s reload` (what the docs say to run after scaling): new requests are served at once by the
    new workers, and a WebSocket held by an old worker is closed within worker_shutdown_timeout."""
    url, *_ = ingress
    bound = shutdown_timeout(repo)
    with held_websocket(url.ws_url) as ws:
        assert ws.recv(timeout=10).startswith("pusher-")  # the tunnel is up
        started = time.monotonic()
        url.proc.send_signal(signal.SIGHUP)
        time.sleep(0.5)
        status, body = get(url.url, "/v1/health")
        assert (status, body.split()[0]) == (200, "writer")
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=bound + 10)
        took = time.monotonic() - started
    assert took <= bound + 5, f"the old worker held the WebSocket {took:.1f}s after the reload"
    assert url.proc.poll() is None, "the reload stopped nginx"


# --- running as the image's user --------------------------------------------------------------------


def image_user(repo: Path) -> tuple[int, int]:
    (user,) = [a for w, a in instructions_of(repo / "deploy/containers/ingress.Containerfile") if w == "USER"]
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and gid.isdigit(), f"USER {user}: numeric, so a runtime can check it is not root"
    return int(uid), int(gid)


def test_ingress_image_gives_its_user_what_nginx_writes(repo: Path, nginx_bin: str) -> None:
    """The image runs nginx as a non-root user (no `user` directive, which only a root master could act
    on), and hands that user the pid file's directory and Debian's compiled temp paths."""
    uid, _ = image_user(repo)
    assert uid != 0
    conf = shipped_nginx_conf(repo)
    assert not re.search(r"^\s*user\s", conf, re.M), "a `user` directive is ignored (with a warning) when not root"
    (pid,) = re.findall(r"^pid\s+(\S+);", main_context(conf), re.M)
    built = subprocess.run([nginx_bin, "-V"], capture_output=True, text=True, timeout=30).stderr
    temp_paths = re.findall(r"--http-\w+-temp-path=(\S+)", built)
    assert temp_paths, built
    containerfile = (repo / "deploy/containers/ingress.Containerfile").read_text().replace("\\\n", " ")
    owned = {
        path
        for command in re.findall(r"install -d -o www-data -g www-data [^&]*", containerfile)
        for path in command.split()
        if path.startswith("/")
    }
    assert str(Path(pid).parent) in owned, (pid, owned)
    assert set(temp_paths) <= owned, (temp_paths, owned)


def test_shipped_config_runs_and_reloads_as_the_image_user(repo: Path, nginx_bin: str, fake, free_port) -> None:
    """The shipped config under the image's non-root uid (the tests' own uid when they do not run as root),
    its pid and temp files in a directory that uid owns as in the image: it starts without a warning,
    serves, takes `nginx -s reload` from that same user (`compose exec ingress nginx -s reload`), and stops."""
    uid, gid = image_user(repo)
    as_user: list[str] = []
    wanted = int(re.findall(r"^worker_rlimit_nofile\s+(\d+);", shipped_nginx_conf(repo), re.M)[0])
    # A container's hard descriptor limit comes from its runtime (Docker and podman: 524288 or more); a
    # lower one here makes the workers' setrlimit fail, which nginx logs as an alert and goes on.
    limit_too_low = resource.getrlimit(resource.RLIMIT_NOFILE)[1] < wanted
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: cannot start nginx as the image's user")
        as_user = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups"]
    else:
        uid = os.geteuid()
    writer, pusher = fake("writer"), fake("pusher")
    base = Path(tempfile.mkdtemp(prefix="upf-ingress-user-"))  # reachable by that uid, unlike tmp_path
    proc = None
    try:
        base.chmod(0o755)
        state = base / "var" / "lib" / "nginx"
        state.mkdir(parents=True)
        if os.geteuid() == 0:
            os.chown(state, uid, gid)
        state.chmod(0o750)
        port = free_port()
        conf = render_ingress_config(state, [writer.port], [pusher.port], port)
        command = [nginx_bin, "-p", str(state), "-c", str(conf), "-e", str(state / "error.log")]
        proc = subprocess.Popen(
            [*as_user, *command, "-g", "daemon off;"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        wait_for_port(port, 10, proc)
        master = Path(f"/proc/{proc.pid}/status").read_text()
        assert re.search(rf"^Uid:\s+{uid}\s", master, re.M), master
        assert get(f"http://127.0.0.1:{port}", "/v1/health")[0] == 200
        reload = subprocess.run([*as_user, *command, "-s", "reload"], capture_output=True, text=True, timeout=30)
        assert reload.returncode == 0, reload.stderr
        time.sleep(0.5)
        assert get(f"http://127.0.0.1:{port}", "/v1/health")[0] == 200
        proc.send_signal(signal.SIGQUIT)
        _, stderr = proc.communicate(timeout=20)
        assert proc.returncode == 0, stderr
        log = stderr.decode() + (state / "error.log").read_text()
        if limit_too_low:
            log = re.sub(r".*\[alert\].*setrlimit\(RLIMIT_NOFILE.*\n", "", log)
        assert not re.search(r"\[(warn|alert|emerg|crit)\]", log), log
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(base)
