"""The worker side of a run, in its phases: connect the subscribers, wait for the parent's start, publish
on schedule for the duration, drain, and check what arrived. A worker runs on the parent's event loop
(``procs == 1``) or in a spawned process (``worker_process``), and reports through ``emit``: "ready",
one "tick" a second, then "result" (or "error").
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import queue
import resource
import signal
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from .checker import TopicVerdict, check_topic
from .http11 import Pool, parse_endpoint
from .metrics import LiveStats
from .publishers import Publisher
from .scenario import Scenario, publish_schedule, topic_name
from .subscribers import Subscriber

__all__ = ["Ready", "Tick", "WorkerResult", "Emit", "raise_fd_limit", "worker", "run_worker", "worker_process"]

log = logging.getLogger("upf_loadgen")

PUBLISH_GRACE = 1.0
"""a publisher that fell behind may keep going this long past the duration, then stops"""
_DRAIN_POLL = 0.02
MAX_SAMPLES = 5


class Ready(msgspec.Struct, kw_only=True):
    wanted: int
    connected: int
    failed: int
    connect_secs: float
    failure_samples: list[str]


class Tick(msgspec.Struct, kw_only=True):
    n: int
    t: float
    """seconds since the start of publishing"""
    phase: str
    offered: int
    accepted: int
    delivered: int
    expected: int
    latency: bytes


class WorkerResult(msgspec.Struct, kw_only=True):
    worker: int
    ready: Ready
    started: bool
    topics: list[TopicVerdict] = []
    offered: int = 0
    accepted: int = 0
    rejected: int = 0
    errors: int = 0
    delivered: int = 0
    delivered_during_load: int = 0
    expected: int = 0
    publish_secs: float = 0.0
    drain_secs: float = 0.0
    drain_complete: bool = True
    backlog_at_stop: int = 0
    backlog_left: int = 0
    failures: dict[str, int] = {}
    failure_samples: list[str] = []
    bad_replies: int = 0
    disconnects: int = 0
    reconnects: int = 0
    bad_frames: list[str] = []
    pool_waits: int = 0
    pool_connections: int = 0
    latency: bytes = b""
    publish_latency: bytes = b""
    load_cpu_secs: float = 0.0
    load_wall_secs: float = 0.0


Emit = Callable[[tuple[str, int, Any]], None]


def raise_fd_limit() -> None:
    """Thousands of subscriber sockets need more than the usual soft limit of 1024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def settle_gc() -> None:
    """Freeze the connected subscribers out of the cyclic collector and raise its gen0 threshold (CPython's
    700) to 20,000. Why: at 3,000/s a full collection over the run's records held this worker's GIL for up
    to 100 ms, and every frame that arrived meanwhile was timed late; the server's latency is what is
    measured, not this process's collector (the same policy as the servers', upf_edge.gcpolicy)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 10, 10)


def _cpu_self() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


async def worker(
    scn: Scenario, wid: int, indices: list[int], emit: Emit, wait_start: Callable[[], Awaitable[float | None]]
) -> None:
    writer_ep = parse_endpoint(scn.writer)
    pusher_ep = parse_endpoint(scn.pusher)
    stats = LiveStats()
    names = [topic_name(scn.run_id, i) for i in indices]
    subs_by_topic: dict[str, list[Subscriber]] = {}
    subs: list[Subscriber] = []
    for name in names:
        group = [
            Subscriber(
                topic=name,
                sub=j,
                transport=scn.transport,
                pusher=pusher_ep,
                message_size=scn.message_size,
                binary=scn.binary,
                stats=stats,
                reconnects=scn.reconnects,
                connect_timeout=scn.connect_timeout,
            )
            for j in range(scn.subs_per_topic)
        ]
        subs_by_topic[name] = group
        subs.extend(group)
    tasks: list[asyncio.Task[None]] = []
    pool = Pool(writer_ep, scn.pool_size)
    try:
        ready = await _connect_all(scn, subs, tasks)
        settle_gc()
        emit(("ready", wid, msgspec.msgpack.encode(ready)))
        start_at = await wait_start()
        if start_at is None or ready.failed:
            emit(("result", wid, msgspec.msgpack.encode(WorkerResult(worker=wid, ready=ready, started=False))))
            return
        result = await _load(scn, wid, indices, names, subs, subs_by_topic, stats, pool, start_at, emit, ready)
    finally:
        await _close_all(subs, tasks)
        await pool.aclose()
    emit(("result", wid, msgspec.msgpack.encode(result)))


async def _connect_all(scn: Scenario, subs: list[Subscriber], tasks: list[asyncio.Task[None]]) -> Ready:
    t0 = time.monotonic()
    sem = asyncio.Semaphore(scn.connect_concurrency)

    async def one(sub: Subscriber) -> None:
        async with sem:
            tasks.append(asyncio.create_task(sub.run()))
            await sub.settled.wait()

    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(asyncio.gather(*(one(s) for s in subs)), scn.connect_timeout)
    failed = [s for s in subs if not s.opened.is_set()]
    samples = []
    for s in failed[:MAX_SAMPLES]:
        why = s.failure or "no open frame within the connect timeout"
        if s.bad_frame:
            why += f" (first unusable frame: {s.bad_frame})"
        samples.append(f"{s.topic}/{s.sub}: {why}")
    return Ready(
        wanted=len(subs),
        connected=len(subs) - len(failed),
        failed=len(failed),
        connect_secs=time.monotonic() - t0,
        failure_samples=samples,
    )


async def _close_all(subs: list[Subscriber], tasks: list[asyncio.Task[None]]) -> None:
    await asyncio.gather(*(s.close() for s in subs), return_exceptions=True)
    if tasks:
        _, pending = await asyncio.wait(tasks, timeout=5.0)
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.wait(pending, timeout=2.0)


async def _load(
    scn: Scenario,
    wid: int,
    indices: list[int],
    names: list[str],
    subs: list[Subscriber],
    subs_by_topic: dict[str, list[Subscriber]],
    stats: LiveStats,
    pool: Pool,
    start_at: float,
    emit: Emit,
    ready: Ready,
) -> WorkerResult:
    failures: Counter[str] = Counter()
    samples: list[str] = []
    pubs = _publishers(scn, indices, names, pool, stats, failures, samples)
    phase_box = ["load"]

    def expected_now() -> int:
        return stats.accepted * scn.subs_per_topic

    tick_no = [0]

    def send_tick() -> None:
        tick_no[0] += 1
        tick = Tick(
            n=tick_no[0],
            t=time.monotonic() - start_at,
            phase=phase_box[0],
            offered=stats.offered,
            accepted=stats.accepted,
            delivered=stats.delivered,
            expected=expected_now(),
            latency=stats.latency.encode(),
        )
        emit(("tick", wid, msgspec.msgpack.encode(tick)))

    async def ticker() -> None:
        while True:
            delay = start_at + tick_no[0] + 1 - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            send_tick()

    delay = start_at - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)
    cpu0 = _cpu_self()
    wall0 = time.monotonic()
    tick_task = asyncio.create_task(ticker())
    try:
        end = start_at + scn.duration + PUBLISH_GRACE
        await asyncio.gather(*(p.run(pool, start_at, end) for p in pubs))
        publish_end = time.monotonic()
        delivered_during_load = stats.delivered
        backlog_at_stop = max(0, expected_now() - stats.delivered)
        phase_box[0] = "drain"

        accepted_by_topic = {p.topic: p.accepted for p in pubs}
        pending = await _drain(subs, accepted_by_topic, publish_end + scn.drain_timeout)
        drain_end = time.monotonic()
    finally:
        tick_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await tick_task
    send_tick()  # the last, partial second
    load_cpu = _cpu_self() - cpu0
    load_wall = time.monotonic() - wall0

    verdicts = [check_topic(p.published(), [s.received() for s in subs_by_topic[p.topic]]) for p in pubs]
    expected = sum(len(p.accepted) for p in pubs) * scn.subs_per_topic
    return WorkerResult(
        worker=wid,
        ready=ready,
        started=True,
        topics=verdicts,
        offered=stats.offered,
        accepted=stats.accepted,
        rejected=stats.rejected,
        errors=stats.errors,
        delivered=sum(v.delivered for v in verdicts),
        delivered_during_load=delivered_during_load,
        expected=expected,
        publish_secs=max(scn.duration, publish_end - start_at),
        drain_secs=drain_end - publish_end,
        drain_complete=not pending,
        backlog_at_stop=backlog_at_stop,
        backlog_left=sum(s.missing(accepted_by_topic[s.topic]) for s in pending),
        failures=dict(failures),
        failure_samples=samples,
        bad_replies=sum(p.bad_replies for p in pubs),
        disconnects=sum(s.disconnects for s in subs),
        reconnects=sum(s.reconnects for s in subs),
        bad_frames=[f"{s.topic}/{s.sub}: {s.bad_frame}" for s in subs if s.bad_frame][:MAX_SAMPLES],
        pool_waits=pool.waits,
        pool_connections=pool.opened,
        latency=stats.latency.encode(),
        publish_latency=stats.publish_latency.encode(),
        load_cpu_secs=load_cpu,
        load_wall_secs=load_wall,
    )


def _publishers(
    scn: Scenario,
    indices: list[int],
    names: list[str],
    pool: Pool,
    stats: LiveStats,
    failures: Counter[str],
    samples: list[str],
) -> list[Publisher]:
    """One publisher per topic of this worker, on the schedule that spreads the rate over all topics."""
    pubs: list[Publisher] = []
    for i, name in zip(indices, names, strict=True):
        phase, period, count = publish_schedule(i, scn.topics, scn.rate, scn.duration)
        pubs.append(
            Publisher(
                topic=name,
                prefix=pool.ep.prefix,
                phase=phase,
                period=period,
                count=count,
                message_size=scn.message_size,
                binary=scn.binary,
                timeout=scn.publish_timeout,
                stats=stats,
                failures=failures,
                samples=samples,
            )
        )
    return pubs


async def _drain(subs: list[Subscriber], accepted_by_topic: dict[str, Any], deadline: float) -> list[Subscriber]:
    """The drain phase: wait until every subscriber has what its topic accepted, has ended, or the
    deadline passes; returns the subscribers still missing messages."""
    pending = list(subs)
    while True:
        pending = [s for s in pending if s.missing(accepted_by_topic[s.topic])]
        if not pending or all(s.ended.is_set() for s in pending):
            return pending
        if time.monotonic() >= deadline:
            return pending
        await asyncio.sleep(_DRAIN_POLL)


async def run_worker(coro: Awaitable[None], wid: int, emit: Emit) -> None:
    try:
        await coro
    except Exception as exc:
        log.debug("worker failed", exc_info=True)
        emit(("error", wid, f"{type(exc).__name__}: {exc}"))


def worker_process(scn_raw: bytes, wid: int, indices: list[int], out_q: Any, ctl_q: Any) -> None:
    """Entry point of a spawned worker process."""
    # Ctrl-C is the parent's to handle; it terminates the workers it started
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise_fd_limit()
    scn = msgspec.msgpack.decode(scn_raw, type=Scenario)
    limit = scn.connect_timeout + 120.0

    def emit(ev: tuple[str, int, Any]) -> None:
        out_q.put(ev)

    async def wait_start() -> float | None:
        def get() -> float | None:
            try:
                start: float | None = ctl_q.get(timeout=limit)
                return start
            except queue.Empty:
                return None

        return await asyncio.to_thread(get)

    asyncio.run(run_worker(worker(scn, wid, indices, emit, wait_start), wid, emit))
