"""Pushpin as a peer in the fan-out round: CPU per delivered item of a production push proxy, measured
the way the bench measures UPF's pusher and the bare broadcast.

Pushpin (Debian's ``pushpin`` package; installed with apt-get when missing and allowed) runs from a
private config on free loopback ports, pinned to the server CPU. A tiny GRIP origin (a thread here)
answers every ``GET /stream/<channel>`` with ``Grip-Hold: stream`` and ``Grip-Channel: <channel>``, so
each client connection becomes one held HTTP stream on one channel. The driver (``--drive``, pinned to
the driver CPU) opens the streams a few at a time (one run that opened 200 at once stalled here), then
publishes items of UPF's frame size at a fixed rate through Pushpin's HTTP publish API, round-robin
over the channels, and waits until every stream has every item of its channel. Pushpin's CPU (all of
its processes) is read from /proc between the driver's ``start`` and ``stop`` lines: publishing and
draining, as for the broadcast.

    python bench/pushpin_peer.py --channels 5 --streams 20 --rate 200 --secs 3     # prints JSON
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import procs

SYSTEM_CONF = Path("/etc/pushpin/pushpin.conf")
INTERNAL_CONF = Path("/usr/lib/pushpin/internal.conf")
ZURL_CONF = Path("/etc/zurl.conf")
MARK = b"@"  # first byte of every item; chunk-size lines are hex, so counting it counts items


class PeerError(RuntimeError):
    """Pushpin or its driver failed: ``reason`` says what in a few words; the message adds the logs."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def failure_reason(exc: BaseException) -> str:
    """A failed run's cause in one line, for the results (the whole message goes to the bench's log)."""
    if isinstance(exc, PeerError):
        return exc.reason
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]


def ensure_pushpin() -> str:
    """The pushpin binary, installing Debian's package when missing and this process may; '' if not."""
    if shutil.which("pushpin"):
        return shutil.which("pushpin") or ""
    if os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=600)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "pushpin"],
            env=env,
            capture_output=True,
            timeout=900,
        )
    return shutil.which("pushpin") or ""


class _Origin(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        channel = self.path.rsplit("/", 1)[-1]
        body = b"open\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Grip-Hold", "stream")
        self.send_header("Grip-Channel", channel)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def write_config(
    d: Path, http_port: int, publish_port: int, zmq_ports: list[int], origin_port: int
) -> tuple[Path, Path]:
    """The system configs (Pushpin's and its zurl's) with private ports, run and log directories, no
    rate limit below the load, and zurl allowed to reach the loopback origin (its default denies it)."""
    run_dir = d / "run"
    zurl = ZURL_CONF.read_text().replace("ipc:///var/run/zurl/", f"ipc://{run_dir}/")
    zurl = re.sub(r"(?m)^deny=.*$", "deny=", zurl)
    (d / "zurl.conf").write_text(zurl)
    internal = INTERNAL_CONF.read_text().replace("ipc:///var/run/zurl/", f"ipc://{run_dir}/")
    (d / "internal.conf").write_text(internal)
    text = SYSTEM_CONF.read_text()
    values = {
        "include": str(d / "internal.conf"),
        "rundir": str(d / "run"),
        "logdir": str(d / "log"),
        "ipc_prefix": f"bench-{os.getpid()}-",
        "http_port": str(http_port),
        "push_in_http_port": str(publish_port),
        "push_in_spec": f"tcp://127.0.0.1:{zmq_ports[0]}",
        "push_in_sub_specs": f"tcp://127.0.0.1:{zmq_ports[1]}",
        "command_spec": f"tcp://127.0.0.1:{zmq_ports[2]}",
        "routesfile": "routes",
        "message_rate": "1000000",
        "message_hwm": "1000000",
        "log_level": "1",
        "updates_check": "off",
    }
    for key, value in values.items():
        text, n = re.subn(rf"(?m)^{key}=.*$", f"{key}={value}", text)
        if n == 0:
            raise RuntimeError(f"{SYSTEM_CONF} has no {key}= line")
    (d / "run").mkdir(exist_ok=True)
    (d / "log").mkdir(exist_ok=True)
    (d / "routes").write_text(f"* 127.0.0.1:{origin_port}\n")
    conf = d / "pushpin.conf"
    conf.write_text(text)
    return conf, d / "zurl.conf"


def wait_port(pp: procs.Proc, port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pp.alive():
            raise PeerError("pushpin exited at start", pp.log_tail())
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise PeerError(f"pushpin not listening on {port} after {timeout:g} s", pp.log_tail())


def run(
    channels: int,
    streams: int,
    rate: float,
    secs: float,
    payload: int,
    work: Path,
    server_cpus: set[int] | None,
    driver_cpus: set[int] | None,
) -> dict[str, Any]:
    binary = ensure_pushpin()
    if not binary:
        return {"skipped": "pushpin is not installed and could not be installed (apt-get as root)"}
    for path in (SYSTEM_CONF, INTERNAL_CONF, ZURL_CONF):
        if not path.exists():
            return {"skipped": f"{path} missing: not Debian's pushpin package"}
    d = Path(tempfile.mkdtemp(prefix="pushpin-", dir=work))
    origin = ThreadingHTTPServer(("127.0.0.1", 0), _Origin)
    threading.Thread(target=origin.serve_forever, daemon=True).start()
    http_port, publish_port = procs.free_port(), procs.free_port()
    conf, zconf = write_config(
        d, http_port, publish_port, [procs.free_port() for _ in range(3)], origin.server_address[1]
    )
    (d / "run").mkdir(exist_ok=True)
    zurl = procs.Proc(
        "zurl", [shutil.which("zurl") or "zurl", f"--config={zconf}"], None, d / "zurl.log", server_cpus, cwd=d
    )
    pp = procs.Proc("pushpin", [binary, "--config", str(conf)], None, d / "pushpin.log", server_cpus, cwd=d)
    roots = [pp.pid, zurl.pid]
    drv: subprocess.Popen[str] | None = None
    try:
        wait_port(pp, http_port)
        wait_port(pp, publish_port)

        def pre() -> None:
            if driver_cpus:
                os.sched_setaffinity(0, driver_cpus)

        drv = subprocess.Popen(
            [
                procs.PY,
                __file__,
                "--drive",
                "--port",
                str(http_port),
                "--publish-port",
                str(publish_port),
                "--channels",
                str(channels),
                "--streams",
                str(streams),
                "--rate",
                str(rate),
                "--secs",
                str(secs),
                "--payload",
                str(payload),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=pre,
            start_new_session=True,
        )
        assert drv.stdout is not None
        cpu0 = cpu1 = 0.0
        t0 = t1 = 0.0
        th0: dict[str, float] = {}
        th1: dict[str, float] = {}
        result: dict[str, Any] = {}
        deadline = time.monotonic() + secs + 120
        for line in drv.stdout:
            line = line.strip()
            if line == "start":
                cpu0, t0, th0 = procs.tree_cpu(roots), time.monotonic(), procs.tree_thread_cpu(roots)
            elif line == "stop":
                cpu1, t1, th1 = procs.tree_cpu(roots), time.monotonic(), procs.tree_thread_cpu(roots)
            elif line.startswith("{"):
                result = json.loads(line)
            if time.monotonic() > deadline:
                break
        drv.wait(30)
        if not result:
            err = drv.stderr.read() if drv.stderr else ""
            last = err.strip().splitlines()[-1] if err.strip() else f"exit status {drv.returncode}"
            raise PeerError(f"the driver failed ({last})", f"{err}\n{pp.log_tail()}")
        if not pp.alive():
            raise PeerError("pushpin exited during the run", pp.log_tail())
        cpu = cpu1 - cpu0
        result.update(
            cpu_secs=round(cpu, 3),
            window_secs=round(t1 - t0, 2),
            rss_kb=procs.tree_rss_kb(roots),
            cpu_us_per_item=round(1e6 * cpu / result["delivered"], 1) if result["delivered"] else None,
            items_per_cpu_sec=round(result["delivered"] / cpu, 1) if cpu > 0 else None,
            cpu_secs_by_thread={
                k: round(v - th0.get(k, 0.0), 3) for k, v in th1.items() if v - th0.get(k, 0.0) > 0.005
            },
            version=subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip(),
        )
        return result
    finally:
        if drv is not None and drv.poll() is None:
            drv.kill()
            drv.wait(5)
        pp.stop()
        zurl.stop()
        origin.shutdown()
        origin.server_close()
        shutil.rmtree(d, ignore_errors=True)


# --- the driver process -----------------------------------------------------------------------------
class _Stream(asyncio.Protocol):
    def __init__(self, channel: str, opened: asyncio.Future[None]) -> None:
        self.channel, self.opened, self.items, self.head = channel, opened, 0, b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        transport.write(f"GET /stream/{self.channel} HTTP/1.1\r\nHost: bench\r\n\r\n".encode())  # type: ignore[attr-defined]  # a stream connection: a Transport

    def data_received(self, data: bytes) -> None:
        if not self.opened.done():
            self.head += data
            if b"open\n" in self.head:
                self.opened.set_result(None)
                self.items += self.head.split(b"open\n", 1)[1].count(MARK)
            return
        self.items += data.count(MARK)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.opened.done():
            self.opened.set_exception(ConnectionError("stream closed before its first event"))


async def _publisher(port: int, items: list[bytes], rate: float, secs: float, conns: int = 4) -> int:
    """POST one item per request at ``rate`` per second for ``secs``, ``conns`` at a time (Pushpin's
    publish endpoint answers ``Connection: close``: one connection per publish)."""
    total = int(rate * secs)
    sent = 0
    start = time.monotonic()

    async def one(k: int) -> None:
        nonlocal sent
        for i in range(k, total, conns):
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            body = items[i % len(items)]
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(
                b"POST /publish/ HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
            )
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"publish failed: {head[:200]!r}")
            await reader.read()
            writer.close()
            sent += 1

    await asyncio.gather(*(one(k) for k in range(conns)))
    return sent


async def drive(a: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    per_channel = a.streams // a.channels
    names = [f"ch{c}" for c in range(a.channels)]
    clients: list[_Stream] = []
    for lo in range(0, per_channel * a.channels, 10):  # a few at a time
        batch = []
        for i in range(lo, min(lo + 10, per_channel * a.channels)):
            opened: asyncio.Future[None] = loop.create_future()
            _, proto = await loop.create_connection(
                lambda i=i, o=opened: _Stream(names[i % a.channels], o), "127.0.0.1", a.port
            )
            clients.append(proto)
            batch.append(opened)
        try:
            await asyncio.wait_for(asyncio.gather(*batch), 30)
        except TimeoutError:
            raise SystemExit(f"streams {lo}-{lo + len(batch) - 1} not answered by pushpin within 30 s") from None
    await asyncio.sleep(0.5)  # subscriptions settle in the handler
    content = (MARK + b"x" * max(0, a.payload - 2) + b"\n").decode()
    items = [
        json.dumps({"items": [{"channel": n, "formats": {"http-stream": {"content": content}}}]}).encode()
        for n in names
    ]
    print("start", flush=True)
    t0 = time.monotonic()
    sent = await _publisher(a.publish_port, items, a.rate, a.secs)
    pub_secs = time.monotonic() - t0
    expected = sent * per_channel
    deadline = time.monotonic() + 30
    while sum(c.items for c in clients) < expected and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    print("stop", flush=True)
    delivered = sum(c.items for c in clients)
    print(
        json.dumps(
            {
                "channels": a.channels,
                "streams": len(clients),
                "rate": a.rate,
                "published": sent,
                "publish_secs": round(pub_secs, 2),
                "expected": expected,
                "delivered": delivered,
                "item_bytes": a.payload,
            }
        ),
        flush=True,
    )
    for c in clients:
        c.transport.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--channels", type=int, default=5)
    ap.add_argument("--streams", type=int, default=20)
    ap.add_argument("--rate", type=float, default=200.0, help="publishes per second (each to one channel)")
    ap.add_argument("--secs", type=float, default=3.0)
    ap.add_argument("--payload", type=int, default=200, help="bytes per item (UPF's frame payload)")
    ap.add_argument("--drive", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--publish-port", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.drive:
        asyncio.run(drive(a))
        return
    work = Path(tempfile.mkdtemp(prefix="upf-pushpin-"))
    try:
        print(json.dumps(run(a.channels, a.streams, a.rate, a.secs, a.payload, work, None, None)))
    finally:
        procs.stop_all()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
