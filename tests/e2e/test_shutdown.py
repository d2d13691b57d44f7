"""Graceful shutdown, black-box: SIGTERM to a real role process while a WebSocket, a JSON stream and a
publish are open. The publish (fully sent, held in flight by a write lock the test takes on the store
file) gets its 200, the WebSocket gets close 1001, the JSON stream gets its last chunk, the pusher's
affinity is released, and the process exits 0 within UPF_SHUTDOWN_GRACE_SECS."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx
import pytest
import websockets

from tests.conftest import TIMEOUT_FACTOR, Process, free_port

GRACE = 4.0
EXIT_SLACK = 3.0
"""Past the grace: interpreter teardown, closing the store, a loaded machine."""


@dataclass
class Outcome:
    opened: asyncio.Event = field(default_factory=asyncio.Event)
    messages: list[str] = field(default_factory=list)
    end: str = ""
    """``ws 1001`` (a close frame and its code), ``last chunk`` (a clean end of the chunked body), or how
    the stream was cut."""


async def ws_stream(base: str, topic: str, out: Outcome) -> None:
    u = urlsplit(base)
    try:
        async with websockets.connect(
            f"ws://{u.hostname}:{u.port}/{topic}/ws", compression=None, open_timeout=10
        ) as ws:
            async for msg in ws:
                if '"open"' in msg:
                    out.opened.set()
                elif '"message"' in msg:
                    out.messages.append(msg)
    except websockets.ConnectionClosed as e:
        out.end = f"ws {e.rcvd.code}" if e.rcvd is not None else "ws cut without a close frame"
        return
    out.end = "ws closed"  # the iterator ends only on a normal close (1000/1001)
    with contextlib.suppress(Exception):
        out.end = f"ws {ws.close_code}"


async def json_stream(base: str, topic: str, out: Outcome) -> None:
    u = urlsplit(base)
    reader, writer = await asyncio.open_connection(u.hostname, u.port)
    try:
        writer.write(f"GET /{topic}/json HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        head = await reader.readuntil(b"\r\n\r\n")
        assert b" 200 " in head and b"chunked" in head.lower(), head
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                assert await reader.readexactly(2) == b"\r\n"
                out.end = "last chunk"
                return
            data = await reader.readexactly(size + 2)
            if b'"open"' in data:
                out.opened.set()
            elif b'"message"' in data:
                out.messages.append(data.decode())
    except (ConnectionError, asyncio.IncompleteReadError) as e:
        out.end = f"cut: {type(e).__name__}"
    finally:
        writer.close()


_HOLD_LOCK = """
import sys, lmdb
env = lmdb.open(sys.argv[1], subdir=False, map_size=1 << 40, max_dbs=3, max_readers=1024)
txn = env.begin(write=True)
print("held", flush=True)
sys.stdin.readline()
txn.abort()
env.close()
"""


@contextlib.contextmanager
def write_lock(store_path: str) -> Iterator[None]:
    """Hold the embedded store's write lock (an open LMDB write transaction in another process):
    every commit waits until it is released."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, store_path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        yield
    finally:
        assert proc.stdin is not None
        proc.stdin.write("\n")
        proc.stdin.close()
        proc.wait(10)


def role_env(fleet, **extra: str) -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("UPF_", "OTEL_"))}
    env.update(
        UPF_STORE_PATH=fleet.store,
        UPF_SHARD_COUNT="8",
        UPF_KEEPALIVE_SECS="2",
        UPF_HEARTBEAT_SECS="0.5",
        UPF_JANITOR_INTERVAL_SECS="0.5",
        UPF_SHUTDOWN_GRACE_SECS=str(GRACE),
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def start(fleet, name: str, module: str, **extra: str) -> Process:
    port = free_port()
    env = role_env(fleet, UPF_BIND=f"127.0.0.1:{port}", **extra)
    p = Process(name, [sys.executable, "-m", module], env, fleet.tmp / f"{name}.log", port, "/__lbheartbeat__")
    fleet.roles.append(p)  # stopped (and its log closed) by the fleet fixture
    return p.wait_ready()


async def wait_exit(proc: Process, bound: float) -> tuple[int, float]:
    t0 = time.monotonic()
    while proc.proc.poll() is None and time.monotonic() - t0 < bound * TIMEOUT_FACTOR + 5:
        await asyncio.sleep(0.05)
    return proc.proc.returncode, time.monotonic() - t0


async def sigterm_under_load(fleet, sub_role: Process, pub_role: Process, stopped: list[Process], topic: str) -> None:
    """Open a ws and a json stream on ``sub_role``, hold a publish to ``pub_role`` in flight, SIGTERM
    ``stopped``; check every outcome."""
    ws, js = Outcome(), Outcome()
    tasks = [
        asyncio.create_task(ws_stream(sub_role.base, topic, ws)),
        asyncio.create_task(json_stream(sub_role.base, topic + "j", js)),
    ]
    try:
        await asyncio.wait_for(asyncio.gather(ws.opened.wait(), js.opened.wait()), 10 * TIMEOUT_FACTOR)
        async with httpx.AsyncClient(timeout=30) as c:
            with write_lock(fleet.store):
                publish = asyncio.create_task(c.post(f"{pub_role.base}/{topic}", content=b"in flight"))
                await asyncio.sleep(0.5)
                assert not publish.done(), "the publish must still be in flight when SIGTERM arrives"
                t0 = time.monotonic()
                for p in stopped:
                    p.proc.send_signal(signal.SIGTERM)
                await asyncio.sleep(1.0)
                assert not publish.done()
            reply = await asyncio.wait_for(publish, 20)  # the lock is released: the commit goes through
        assert reply.status_code == 200, reply.text
        assert reply.json()["message"] == "in flight"
        if pub_role is sub_role:  # the pusher's front door: the connection's last reply says so
            assert reply.headers.get("connection") == "close", reply.headers
        await asyncio.wait_for(asyncio.gather(*tasks), GRACE * TIMEOUT_FACTOR + 5)
        assert ws.end == "ws 1001", ws.end
        assert js.end == "last chunk", js.end
        for p in stopped:
            code, _ = await wait_exit(p, GRACE + EXIT_SLACK)
            assert code == 0, p.log()
        took = time.monotonic() - t0
        assert took < (GRACE + EXIT_SLACK) * TIMEOUT_FACTOR, took
        assert "Traceback" not in "".join(p.log() for p in stopped)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@pytest.mark.parametrize("workers", ["1", "2"])
async def test_allinone_sigterm(fleet, workers):
    upf = start(fleet, "upf", "upf", UPF_NODE_ID="sd", UPF_WORKERS=workers)
    await sigterm_under_load(fleet, upf, upf, [upf], "sdAll" + workers)


@pytest.mark.parametrize("server", ["upf", "granian"])
async def test_split_pusher_and_writer_sigterm(fleet, server):
    """The standalone pusher and writer (on either server) each stop gracefully; the pusher releases
    its affinity."""
    from upf_keyspace import Settings, keys, open_store

    node = "sdP" + server[0]
    pusher = start(fleet, "pusher", "upf_pusher", UPF_NODE_ID=node)
    writer = start(fleet, "writer", "upf_writer", UPF_WRITER_SERVER=server)
    topic = "sdSplit" + server
    await sigterm_under_load(fleet, pusher, writer, [pusher, writer], topic)
    store = await open_store(Settings(store_path=fleet.store, shard_count=8))
    try:

        async def held(tr):
            return await tr.get_range(*keys.reverse_affinity_range(node))

        assert await store.db.transact(held) == [], "the stopped pusher's affinity must be released"
    finally:
        await store.close()


async def test_pusher_releases_affinity_so_bells_stop(fleet):
    """Subscribed topics name the pusher in the store while it runs; after SIGTERM none does."""
    from upf_keyspace import Settings, keys, open_store

    pusher = start(fleet, "pusher", "upf_pusher", UPF_NODE_ID="sdR")
    outs = [Outcome() for _ in range(3)]
    tasks = [asyncio.create_task(json_stream(pusher.base, f"sdRel{i}", o)) for i, o in enumerate(outs)]
    store = await open_store(Settings(store_path=fleet.store, shard_count=8))
    try:
        await asyncio.wait_for(asyncio.gather(*(o.opened.wait() for o in outs)), 10 * TIMEOUT_FACTOR)

        async def held(tr):
            return [await tr.get(keys.affinity_key(f"sdRel{i}", "sdR")) for i in range(3)], await tr.get_range(
                *keys.reverse_affinity_range("sdR")
            )

        before = await store.db.transact(held)
        assert len(before[1]) == 3, before
        pusher.proc.send_signal(signal.SIGTERM)
        code, took = await wait_exit(pusher, GRACE + EXIT_SLACK)
        assert code == 0 and took < (GRACE + EXIT_SLACK) * TIMEOUT_FACTOR, (code, took)
        assert [o.end for o in outs] == ["last chunk"] * 3
        after = await store.db.transact(held)
        assert after == ([None] * 3, []), after
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await store.close()


async def test_janitor_sigterm_exits_promptly(fleet):
    janitor = start(fleet, "janitor", "upf_janitor")
    async with httpx.AsyncClient(timeout=5) as c:  # a keep-alive ops connection left open
        assert (await c.get(janitor.base + "/__lbheartbeat__")).status_code == 200
        janitor.proc.send_signal(signal.SIGTERM)
        code, took = await wait_exit(janitor, GRACE + EXIT_SLACK)
    assert code == 0, janitor.log()
    assert took < (GRACE + EXIT_SLACK) * TIMEOUT_FACTOR, took


async def test_refuses_new_subscribes_while_stopping(fleet):
    """Between SIGTERM and exit the port no longer takes connections: a client tries another node."""
    pusher = start(fleet, "pusher", "upf_pusher", UPF_NODE_ID="sdN")
    out = Outcome()
    task = asyncio.create_task(json_stream(pusher.base, "sdNew", out))
    try:
        await asyncio.wait_for(out.opened.wait(), 10 * TIMEOUT_FACTOR)
        with write_lock(fleet.store):  # holds the affinity release, so the process is still stopping
            pusher.proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(task, 5 * TIMEOUT_FACTOR)
            assert out.end == "last chunk"
            assert pusher.proc.poll() is None, "still releasing its affinity"
            with pytest.raises(httpx.ConnectError):
                async with httpx.AsyncClient(timeout=2) as c:
                    await c.get(pusher.base + "/sdNew2/json?poll=1")
        code, _ = await wait_exit(pusher, GRACE + EXIT_SLACK)
        assert code == 0, pusher.log()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_stuck_store_still_exits_in_bounded_time(fleet):
    """The store never answers again (its write lock is held throughout): streams still end at once,
    and the process is gone within the grace plus the watchdog's slack (exit 70 if the watchdog ended it)."""
    from upf_edge.lifecycle import EXIT_OVERDUE, WATCHDOG_SLACK_SECS

    upf = start(fleet, "upf", "upf", UPF_NODE_ID="sdStuck", UPF_WORKERS="1")
    out = Outcome()
    task = asyncio.create_task(json_stream(upf.base, "sdStuck", out))
    try:
        await asyncio.wait_for(out.opened.wait(), 10 * TIMEOUT_FACTOR)
        async with httpx.AsyncClient(timeout=60) as c:
            with write_lock(fleet.store):
                publish = asyncio.create_task(c.post(f"{upf.base}/sdStuck", content=b"stuck"))
                await asyncio.sleep(0.5)
                upf.proc.send_signal(signal.SIGTERM)
                await asyncio.wait_for(task, 2 * TIMEOUT_FACTOR)
                assert out.end == "last chunk"
                code, took = await wait_exit(upf, GRACE + WATCHDOG_SLACK_SECS + 2)
                assert code in (0, EXIT_OVERDUE), upf.log()
                assert took < (GRACE + WATCHDOG_SLACK_SECS + 2) * TIMEOUT_FACTOR, took
                with pytest.raises(httpx.HTTPError):
                    await publish  # never committed, so never answered: cut with the process
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


_HANG_AT_START = """
import asyncio, runpy, sys
import upf_pusher.hub as hub

async def start(self):
    print("hub start hangs", flush=True)  # as a store call whose write lock another process holds
    await asyncio.Event().wait()

hub.Hub.start = start
runpy.run_module(sys.argv.pop(1), run_name="__main__")  # the role reads its own argv
"""


@pytest.mark.parametrize("module", ["upf", "upf_pusher"])
async def test_sigterm_while_the_start_hangs_still_exits_in_bounded_time(fleet, module):
    """A store call at start that never returns: SIGTERM gives up on the start, and the process is gone
    within the grace plus the watchdog's slack, not at the orchestrator's SIGKILL (the split pusher
    too: it had no handler before its start ended, so SIGTERM killed it with no stop at all)."""
    from upf_edge.lifecycle import EXIT_OVERDUE, WATCHDOG_SLACK_SECS

    port = free_port()
    env = role_env(fleet, UPF_BIND=f"127.0.0.1:{port}", UPF_WORKERS="1", UPF_NODE_ID="sdHang")
    argv = [sys.executable, "-c", _HANG_AT_START, module]
    p = Process("upfhang", argv, env, fleet.tmp / "upfhang.log", port, "/")
    fleet.roles.append(p)
    t0 = time.monotonic()
    while "hub start hangs" not in p.log():
        assert p.proc.poll() is None and time.monotonic() - t0 < 30 * TIMEOUT_FACTOR, p.log()
        await asyncio.sleep(0.1)
    p.proc.send_signal(signal.SIGTERM)
    code, took = await wait_exit(p, GRACE + WATCHDOG_SLACK_SECS)
    assert code in (0, EXIT_OVERDUE), (code, p.log())  # not -SIGTERM: the stop ran
    assert "start given up at a stop signal" in p.log()
    assert took < (GRACE + WATCHDOG_SLACK_SECS + 1) * TIMEOUT_FACTOR, took
    assert "Traceback" not in p.log()


async def test_supervisor_exits_70_when_a_workers_stop_failed(fleet):
    """A worker's stop cut by its watchdog (a publish stuck in its commit) is the supervisor's failed
    stop too: exit 70 as one process would, not 0."""
    from upf_edge.lifecycle import EXIT_OVERDUE

    upf = start(fleet, "upfw", "upf", UPF_NODE_ID="sdSup", UPF_WORKERS="2", UPF_SHUTDOWN_GRACE_SECS="1")
    async with httpx.AsyncClient(timeout=60) as c:
        with write_lock(fleet.store):
            publish = asyncio.create_task(c.post(f"{upf.base}/sdSupStuck", content=b"x"))
            await asyncio.sleep(0.5)
            upf.proc.send_signal(signal.SIGTERM)
            code, _ = await wait_exit(upf, 1 + 6 + 3)
        publish.cancel()
        await asyncio.gather(publish, return_exceptions=True)
    assert code == EXIT_OVERDUE, (code, upf.log())
