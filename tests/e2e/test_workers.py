"""UPF_WORKERS, black box: the all-in-one as worker processes on one port, each its own pusher node.

Which worker serves a connection is read from the kernel (/proc: the accepted socket's inode among a
worker's file descriptors), so the tests can place a subscriber on one worker and a publish on the other.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import msgspec
import pytest

from tests.conftest import TIMEOUT_FACTOR, Role

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads worker sockets from Linux's /proc")

WORKER_LINE = re.compile(r"^upf: worker (\d+) pid (\d+)$", re.M)


def worker_pids(role: Role) -> dict[int, int]:
    """The newest pid of each worker index, from the supervisor's start lines."""
    return {int(i): int(pid) for i, pid in WORKER_LINE.findall(role.log_path.read_text(errors="replace"))}


def wait_for(check, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout * TIMEOUT_FACTOR
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.05)
    raise TimeoutError(what)


def listening_pids(port: int, pids: list[int]) -> set[int]:
    inodes = {ino for ino, local, _, state in _tcp_rows() if local == port and state == "0A"}
    return {pid for pid in pids if inodes & _socket_inodes(pid)}


def serving_pid(server_port: int, client_port: int, pids: list[int], timeout: float = 5.0) -> int:
    """The worker holding the server side of the connection from ``client_port``."""

    def find() -> int | None:
        inodes = {ino for ino, local, remote, _ in _tcp_rows() if local == server_port and remote == client_port}
        for pid in pids:
            if inodes & _socket_inodes(pid):
                return pid
        return None

    return wait_for(find, timeout, f"no worker accepted the connection from port {client_port}")


def _tcp_rows() -> list[tuple[int, int, int, str]]:
    rows = []
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            rows.append((int(f[9]), int(f[1].rsplit(":", 1)[1], 16), int(f[2].rsplit(":", 1)[1], 16), f[3]))
    return rows


def _socket_inodes(pid: int) -> set[int]:
    out = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(int(target[8:-1]))
    return out


class Sub:
    """A /json subscriber on a raw connection, so the test knows (and can choose) the worker serving it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pid: int) -> None:
        self.reader, self.writer, self.pid = reader, writer, pid

    async def frame(self, timeout: float = 10.0) -> dict:
        size = int((await asyncio.wait_for(self.reader.readuntil(b"\r\n"), timeout)).split(b";")[0], 16)
        if size == 0:
            raise EOFError("stream ended")
        data = await self.reader.readexactly(size + 2)
        return msgspec.json.decode(data[:-2])

    async def message(self, timeout: float = 10.0) -> dict:
        while True:
            f = await self.frame(timeout)
            if f["event"] == "message":
                return f

    def close(self) -> None:
        self.writer.close()


async def connect_to(port: int, pids: list[int] | None, want: int | None = None, tries: int = 200):
    """Open connections until one lands on worker ``want`` (any worker when None; not looked up without pids)."""
    for _ in range(tries):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        if pids is None:
            return reader, writer, 0
        pid = await asyncio.to_thread(serving_pid, port, writer.get_extra_info("sockname")[1], pids)
        if want is None or pid == want:
            return reader, writer, pid
        writer.close()
    raise AssertionError(f"no connection landed on worker pid {want} in {tries} tries")


async def subscribe_on(port: int, pids: list[int] | None, path: str, want: int | None = None) -> Sub:
    reader, writer, pid = await connect_to(port, pids, want)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert head.startswith(b"HTTP/1.1 200"), head
    sub = Sub(reader, writer, pid)
    assert (await sub.frame())["event"] == "open"
    return sub


async def publish_on(port: int, pids: list[int], want: int, topic: str, body: str) -> dict:
    reader, writer, _ = await connect_to(port, pids, want)
    try:
        data = body.encode()
        writer.write(f"POST /{topic} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 200"), head
        length = int(re.search(rb"(?i)content-length: (\d+)", head).group(1))  # type: ignore[union-attr]
        return msgspec.json.decode(await reader.readexactly(length))
    finally:
        writer.close()


def start_workers(fleet, node: str, **extra: str) -> tuple[Role, dict[int, int]]:  # type: ignore[no-untyped-def]
    role = fleet.start("upf", node=node, UPF_WORKERS="2", **extra)
    pids = wait_for(lambda: p if len(p := worker_pids(role)) == 2 else None, 20, "two worker start lines")
    wait_for(lambda: listening_pids(role.port, list(pids.values())) == set(pids.values()), 30, "both workers listening")
    return role, pids


async def test_two_workers_serve_one_port_and_deliver_across_each_other(fleet):
    """Connections land on both workers (two pids, two nodes); a message published through one worker
    reaches a subscriber held by the other, through the store."""
    role, workers = start_workers(fleet, "wk")
    pids = list(workers.values())
    subs = [await subscribe_on(role.port, pids, f"/spread{i}/json") for i in range(20)]
    assert {s.pid for s in subs} == set(pids), "every connection landed on one worker"
    for s in subs:
        s.close()

    a, b = pids
    sub = await subscribe_on(role.port, pids, "/across1/json", want=a)
    sent = await publish_on(role.port, pids, b, "across1", "from the other worker")
    got = await sub.message()
    assert (got["id"], got["message"]) == (sent["id"], "from the other worker")
    sub.close()

    nodes = re.findall(r"upf started .* node='([^']+)'", role.log())
    assert sorted(set(nodes)) == ["wk-w0", "wk-w1"]


async def test_metrics_through_the_shared_port_count_every_worker(fleet):
    """Whichever worker answers ``/metrics`` adds the others' counters (each as of the last scrape it
    answered), so successive scrapes never go backwards: before, each showed its own worker's alone."""
    from prometheus_client.parser import text_string_to_metric_families

    role, workers = start_workers(fleet, "wm", UPF_HEARTBEAT_SECS="1")
    a, b = pids = [workers[0], workers[1]]
    for i in range(3):
        await publish_on(role.port, pids, a, "upMETRICS", f"a{i}")
    for i in range(5):
        await publish_on(role.port, pids, b, "upMETRICS", f"b{i}")

    async def scrape(want: int) -> tuple[float, set[str]]:
        reader, writer, _ = await connect_to(role.port, pids, want)
        try:
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            raw = await asyncio.wait_for(reader.read(), 10)
        finally:
            writer.close()
        head, _, body = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        if b"transfer-encoding: chunked" in head.lower():
            body = b"".join(re.findall(rb"[0-9a-fA-F]+\r\n(.*?)\r\n", body, re.S))
        stored, names = 0.0, set()
        for fam in text_string_to_metric_families(body.decode()):
            names.add(fam.name)
            for sample in fam.samples:
                if sample.name == "upf_writer_publishes_total" and sample.labels.get("result") == "stored":
                    stored = sample.value
        return stored, names

    first, names = await scrape(a)  # b's part: its start snapshot, or its last heartbeat's
    assert first in (3, 8) and "upf_janitor_passes" in names  # worker 0 (a) runs the janitor
    second, names = await scrape(b)
    assert second == 8 and "upf_janitor_passes" in names  # a's counters, janitor's included, from its scrape
    assert (await scrape(a))[0] == 8
    # A scraper that keeps its connection reaches one worker only: the others' heartbeats keep it current.
    for i in range(4):
        await publish_on(role.port, pids, b, "upMETRICS", f"later{i}")
    deadline = time.monotonic() + 10
    while (seen := (await scrape(a))[0]) != 12 and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert seen == 12


async def test_kill9_a_worker_under_load_then_resume_exactly_once(fleet):
    """kill -9 of one worker while publishing: the other keeps serving, the supervisor restarts the dead
    one, and subscribers that resume with since=<last id> get every message exactly once, in order."""
    role, workers = start_workers(fleet, "wk9")
    pids = list(workers.values())
    topics, per_topic = [f"load{i}" for i in range(6)], 40
    victim = pids[0]
    received: dict[str, list[dict]] = {t: [] for t in topics}
    killed = asyncio.Event()

    async def follow(topic: str, first: Sub) -> None:
        sub: Sub | None = first
        deadline = time.monotonic() + 60 * TIMEOUT_FACTOR
        while len(received[topic]) < per_topic and time.monotonic() < deadline:
            try:
                if sub is None:
                    since = received[topic][-1]["id"] if received[topic] else "all"
                    sub = await subscribe_on(role.port, None, f"/{topic}/json?since={since}")
                received[topic].append(await sub.message(timeout=15))
            except (TimeoutError, EOFError, ConnectionError, asyncio.IncompleteReadError, OSError):
                if sub is not None:
                    sub.close()
                sub = None
                await asyncio.sleep(0.05)
        if sub is not None:
            sub.close()

    async def publish_all(topic: str) -> None:
        async with httpx.AsyncClient(base_url=role.base, timeout=5) as c:
            for seq in range(per_topic):
                for _ in range(200):
                    try:
                        r = await c.post(f"/{topic}", content=str(seq), headers={"Idempotency-Key": f"{topic}-{seq}"})
                        if r.status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    await asyncio.sleep(0.05)
                else:
                    raise AssertionError(f"publish {seq} never succeeded")
                await asyncio.sleep(0.02)
                if seq == per_topic // 3 and not killed.is_set():
                    killed.set()
                    os.kill(victim, signal.SIGKILL)

    # half the subscribers on the worker that will die, half on the survivor
    firsts = [await subscribe_on(role.port, pids, f"/{t}/json", want=pids[i % 2]) for i, t in enumerate(topics)]
    await asyncio.wait_for(
        asyncio.gather(*(follow(t, s) for t, s in zip(topics, firsts, strict=True)), *(publish_all(t) for t in topics)),
        90 * TIMEOUT_FACTOR,
    )
    assert killed.is_set()
    for t in topics:
        assert [f["message"] for f in received[t]] == [str(i) for i in range(per_topic)], t
        assert len({f["id"] for f in received[t]}) == per_topic

    restarted = wait_for(lambda: p if (p := worker_pids(role).get(0)) not in (None, victim) else None, 30, "restart")
    survivors = [restarted, pids[1]]
    wait_for(lambda: restarted in listening_pids(role.port, survivors), 30, "the restarted worker listening")
    sub = await subscribe_on(role.port, survivors, "/afterRestart/json", want=restarted)
    sent = await publish_on(role.port, survivors, pids[1], "afterRestart", "again")
    assert (await sub.message())["id"] == sent["id"]
    sub.close()
    assert role.proc.poll() is None


async def test_a_hung_worker_is_killed_and_restarted(fleet):
    """A worker whose loop stops (SIGSTOP: a frozen process) stops beating on its pipe: the supervisor
    kills it after UPF_WORKER_WATCHDOG_SECS and restarts it. Before, it stayed, taking half the new
    connections, and a hang while it held the store's write turn stopped every publish on the host."""
    role, workers = start_workers(fleet, "wkhang", UPF_WORKER_WATCHDOG_SECS="2")
    pids = list(workers.values())
    victim = workers[0]
    time.sleep(1.0)  # a beat or two seen: the watch is armed
    os.kill(victim, signal.SIGSTOP)
    restarted = wait_for(lambda: p if (p := worker_pids(role).get(0)) not in (None, victim) else None, 20, "restart")
    with pytest.raises(ProcessLookupError):
        os.kill(victim, 0)  # killed, and reaped
    assert "unresponsive" in role.log()
    survivors = [restarted, pids[1]]
    wait_for(lambda: restarted in listening_pids(role.port, survivors), 30, "the restarted worker listening")
    sub = await subscribe_on(role.port, survivors, "/afterHang/json", want=pids[1])
    sent = await publish_on(role.port, survivors, restarted, "afterHang", "again")
    assert (await sub.message())["id"] == sent["id"]
    sub.close()
    # a worker that is only idle is never killed: the survivor kept its pid through all of this
    assert worker_pids(role)[1] == pids[1]


def test_sigterm_to_the_supervisor_stops_every_worker(fleet):
    """SIGTERM to the parent: every worker stops, then the parent exits 0, in bounded time."""
    role, workers = start_workers(fleet, "wkstop")
    role.proc.send_signal(signal.SIGTERM)
    assert role.proc.wait(20 * TIMEOUT_FACTOR) == 0
    for pid in workers.values():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert "front door stopped" in role.log()


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_busy_port_stops_the_supervisor_at_start(fleet, tmp_path, workers):
    """Workers share the port with each other only: a port another server holds fails at start, as it
    does for one process, instead of joining that server's SO_REUSEPORT group. One process says so in
    the same line, before anything started: no traceback, nothing left running on a closed store."""
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # even one that would share
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("UPF_")}
        env.update(UPF_WORKERS=workers, UPF_BIND=f"127.0.0.1:{port}", UPF_STORE_PATH=str(tmp_path / "upf.db"))
        out = subprocess.run(
            [sys.executable, "-m", "upf"], env=env, capture_output=True, text=True, timeout=60 * TIMEOUT_FACTOR
        )
    assert out.returncode == 1, out.stderr
    assert "UPF_BIND" in out.stderr and "upf: worker" not in out.stdout
    said = [line for line in out.stderr.splitlines() if line.startswith("upf:")]  # the rest is the log
    assert said[0].startswith(f"upf: cannot bind UPF_BIND 127.0.0.1:{port}: ") and len(said) == 1, out.stderr
    assert "Traceback" not in out.stderr


def test_a_busy_port_stops_upf_pusher_at_start_in_one_line(fleet, tmp_path) -> None:
    """The split role as ``upf``: a busy port is one line and exit 1, no traceback (it bound before
    starting anything, so nothing runs on)."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("UPF_")}
        env.update(UPF_BIND=f"127.0.0.1:{port}", UPF_STORE_PATH=str(tmp_path / "upf.db"))
        out = subprocess.run(
            [sys.executable, "-m", "upf_pusher"], env=env, capture_output=True, text=True, timeout=60 * TIMEOUT_FACTOR
        )
    assert out.returncode == 1, out.stderr
    said = [line for line in out.stderr.splitlines() if line.startswith("upf-pusher:")]
    assert said == [f"upf-pusher: cannot bind UPF_BIND 127.0.0.1:{port}: [Errno 98] Address already in use"], out.stderr
    assert "Traceback" not in out.stderr
