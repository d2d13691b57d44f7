"""A rolling restart under load, black-box: a split fleet (writer, two pushers, janitor) on one embedded
store; one publisher per topic sends seq 0,1,2,... (each awaited) at a few hundred messages a second in
all; one subscriber per topic (WebSocket or JSON stream) that, whenever its stream ends, resumes on a
pusher with ``since=<last id>``. Each pusher, the writer and the janitor get SIGTERM in turn and are
started again. The loadgen checker then finds no loss, no duplicate and no reordering in any topic.

A publish whose connection was refused (the writer between stop and start) was never sent and is
retried with the same seq; any other failure counts as "may or may not be stored" (the checker's rule),
and the test asserts it was not: graceful shutdown answers every publish it received.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections import Counter
from urllib.parse import urlsplit

import httpx
import websockets

from tests.conftest import TIMEOUT_FACTOR, Process, free_port
from upf_loadgen.checker import Published, check_topic
from upf_loadgen.follow import Follower

TOPICS = 20
RATE_PER_TOPIC = 15.0  # 300 messages/s in all
GRACE = "4"
SETTLE_SECS = 2.0
"""Steady publishing before, between and after the restarts."""
MAX_AMBIGUOUS_SHARE = 0.01
"""Publishes that failed after being sent: connections reset in the stopping writer's accept queue
(observed: 0-17 of ~3,300, each at the writer's restart, none of them stored)."""


class Role:
    """One role process that can be stopped with SIGTERM and started again on the same port and node."""

    def __init__(self, tmp, store: str, name: str, module: str, **extra: str) -> None:
        self.tmp, self.name, self.module = tmp, name, module
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("UPF_", "OTEL_"))}
        env.update(
            UPF_BIND=f"127.0.0.1:{self.port}",
            UPF_STORE_PATH=store,
            UPF_SHARD_COUNT="8",
            UPF_KEEPALIVE_SECS="2",
            UPF_HEARTBEAT_SECS="0.5",
            UPF_JANITOR_INTERVAL_SECS="0.5",
            UPF_SAFETY_POLL_SECS="5",
            UPF_SHUTDOWN_GRACE_SECS=GRACE,
            PYTHONUNBUFFERED="1",
        )
        env.update(extra)
        self.env = env
        self.proc: Process | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        self.proc = Process(
            self.name,
            [sys.executable, "-m", self.module],
            self.env,
            self.tmp / f"{self.name}.log",
            self.port,
            "/__lbheartbeat__",
        ).wait_ready()

    async def restart(self) -> None:
        """SIGTERM, wait for a clean exit (0, within the grace), start again."""
        assert self.proc is not None
        self.proc.proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        while self.proc.proc.poll() is None and time.monotonic() - t0 < 15 * TIMEOUT_FACTOR:
            await asyncio.sleep(0.05)
        assert self.proc.proc.returncode == 0, (self.name, self.proc.proc.returncode, self.proc.log())
        self.proc.stop()  # closes its log
        await asyncio.to_thread(self.start)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()


class Publisher:
    def __init__(self, writer: Role, topic: str) -> None:
        self.writer, self.topic = writer, topic
        self.sent = 0
        self.accepted: dict[int, str] = {}
        self.ambiguous = 0
        self.failed: set[int] = set()
        self.refused = 0
        self.why: Counter[str] = Counter()

    async def run(self, stop: asyncio.Event) -> None:
        # A new connection per publish: a refused connect is then certain never to have been sent.
        async with httpx.AsyncClient(timeout=20, limits=httpx.Limits(max_keepalive_connections=0)) as c:
            next_at = time.monotonic()
            while not stop.is_set():
                seq = self.sent
                while True:
                    try:
                        r = await c.post(f"{self.writer.base}/{self.topic}", content=str(seq).encode())
                    except httpx.ConnectError:
                        self.refused += 1
                        await asyncio.sleep(0.02)
                        continue
                    except httpx.HTTPError as e:
                        self.why[type(e).__name__] += 1
                        r = None
                    break
                self.sent = seq + 1
                if r is not None and r.status_code == 200:
                    self.accepted[seq] = r.json()["id"]
                else:
                    self.ambiguous += 1
                    self.failed.add(seq)
                    if r is not None:
                        self.why[f"{r.status_code} {r.text[:60]}"] += 1
                next_at += 1 / RATE_PER_TOPIC
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))


class Subscriber(Follower):
    def __init__(self, pushers: list[Role], topic: str, transport: str, first: int) -> None:
        super().__init__(topic)
        self.pushers, self.transport = pushers, transport
        self.at = first

    async def run(self) -> None:
        """Follow the topic forever: on any end, resume on the next pusher from the last id received."""
        while True:
            u = urlsplit(self.pushers[self.at % len(self.pushers)].base)
            self.at += 1
            try:
                await self.stream(str(u.hostname), int(u.port or 80), self.transport, open_timeout=5)
            except (TimeoutError, OSError, websockets.InvalidHandshake, websockets.InvalidStatus):
                await asyncio.sleep(0.05)


async def test_rolling_restart_loses_and_duplicates_nothing(tmp_path):
    store = str(tmp_path / "upf.db")
    writer = Role(tmp_path, store, "writer", "upf_writer")
    pushers = [Role(tmp_path, store, f"pusher{i}", "upf_pusher", UPF_NODE_ID=f"rr{i}") for i in range(2)]
    janitor = Role(tmp_path, store, "janitor", "upf_janitor")
    roles = [writer, *pushers, janitor]
    tasks: list[asyncio.Task] = []
    try:
        for r in roles:
            await asyncio.to_thread(r.start)
        topics = [f"rollT{i:02d}" for i in range(TOPICS)]
        subs = [Subscriber(pushers, t, "ws" if i % 2 else "json", i) for i, t in enumerate(topics)]
        tasks += [asyncio.create_task(s.run()) for s in subs]
        await asyncio.wait_for(asyncio.gather(*(s.opened.wait() for s in subs)), 20 * TIMEOUT_FACTOR)
        stop = asyncio.Event()
        pubs = [Publisher(writer, t) for t in topics]
        publishing = [asyncio.create_task(p.run(stop)) for p in pubs]
        tasks += publishing
        t0 = time.monotonic()
        await asyncio.sleep(SETTLE_SECS)
        for role in (pushers[0], pushers[1], writer, janitor):
            await role.restart()
            await asyncio.sleep(SETTLE_SECS)
        stop.set()
        await asyncio.gather(*publishing)
        elapsed = time.monotonic() - t0
        sent = sum(p.sent for p in pubs)

        def caught_up() -> bool:
            return all(set(p.accepted) <= set(s.seqs) for p, s in zip(pubs, subs, strict=True))

        deadline = time.monotonic() + 30 * TIMEOUT_FACTOR
        while not caught_up() and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        verdicts = [
            check_topic(
                Published(topic=p.topic, sent=p.sent, accepted=p.accepted),
                [s.received()],
            )
            for p, s in zip(pubs, subs, strict=True)
        ]
        print(
            f"rolling restart: {sent} sent in {elapsed:.1f} s, {sum(len(p.accepted) for p in pubs)} accepted, "
            f"{sum(p.ambiguous for p in pubs)} ambiguous, {sum(p.refused for p in pubs)} refused connects, "
            f"{sum(s.connects for s in subs)} subscribes, {sum(v.delivered for v in verdicts)} delivered; "
            f"failures: {dict(sum((p.why for p in pubs), Counter()))}"
        )
        bad = [v for v in verdicts if not v.clean]
        assert not bad, bad[:3]
        # A publish the server received gets its reply: a failed one was never stored (one reset in the
        # stopping writer's accept queue, which the kernel holds until the listening socket closes).
        stored_yet_failed = [(p.topic, seq) for p, s in zip(pubs, subs, strict=True) for seq in p.failed & set(s.seqs)]
        assert not stored_yet_failed, stored_yet_failed
        ambiguous = sum(p.ambiguous for p in pubs)
        assert ambiguous <= MAX_AMBIGUOUS_SHARE * sent, ambiguous
        assert sent / elapsed > 100, f"{sent} messages in {elapsed:.1f} s: not under load"
        assert all(s.connects >= 2 for s in subs), "every subscriber was moved by a pusher restart"
        for r in roles:
            assert r.starts == 2, r.name
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for r in roles:
            r.stop()
