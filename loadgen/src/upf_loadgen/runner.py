"""Orchestration: workers that connect subscribers and run publishers, and a parent that starts them
together, prints the live line and merges their results into one report.

With ``procs == 1`` the worker runs on the parent's event loop; with more it runs in processes
started with "spawn", because one Python core is quickly saturated by thousands of frames per
second and the report must say whether loadgen or the server was the limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import multiprocessing as mp
import os
import queue
import resource
import signal
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from .checker import TopicVerdict, Violations, check_topic
from .http11 import Pool, check_loopback, parse_endpoint
from .metrics import LiveStats, new_histogram
from .publishers import Publisher
from .report import (
    Cpu,
    Drain,
    Knee,
    PublishFailures,
    RunReport,
    Subscriptions,
    SweepPoint,
    SweepReport,
    Throughput,
    find_knee,
    latency_summary,
)
from .scenario import Scenario, new_run_id, publish_schedule, split_topics, topic_name
from .subscribers import Subscriber

__all__ = ["SetupError", "run_scenario", "run_sweep", "sweep_point", "WorkerResult", "raise_fd_limit"]

log = logging.getLogger("upf_loadgen")

_START_DELAY = 0.3
"""head start the parent gives workers between "go" and the first publish"""
_PUBLISH_GRACE = 1.0
"""a publisher that fell behind may keep going this long past the duration, then stops"""
_DRAIN_POLL = 0.02
_MAX_SAMPLES = 5
_SATURATED_PCT = 90.0


class SetupError(Exception):
    """The run could not start (bad endpoint, subscribers not connected); nothing was measured."""


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


def _cpu_self() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


# ---------------------------------------------------------------------------------------------- worker


async def _worker(scn: Scenario, wid: int, indices: list[int], emit: Emit, wait_start: Callable[[], Awaitable[float | None]]) -> None:
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
    for s in failed[:_MAX_SAMPLES]:
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
    pubs: list[Publisher] = []
    for i, name in zip(indices, names):
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
        end = start_at + scn.duration + _PUBLISH_GRACE
        await asyncio.gather(*(p.run(pool, start_at, end) for p in pubs))
        publish_end = time.monotonic()
        delivered_during_load = stats.delivered
        backlog_at_stop = max(0, expected_now() - stats.delivered)
        phase_box[0] = "drain"

        accepted_by_topic = {p.topic: p.accepted for p in pubs}
        pending = list(subs)
        drain_deadline = publish_end + scn.drain_timeout
        while True:
            pending = [s for s in pending if s.missing(accepted_by_topic[s.topic])]
            if not pending or all(s.ended.is_set() for s in pending):
                break
            if time.monotonic() >= drain_deadline:
                break
            await asyncio.sleep(_DRAIN_POLL)
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
        bad_frames=[f"{s.topic}/{s.sub}: {s.bad_frame}" for s in subs if s.bad_frame][:_MAX_SAMPLES],
        pool_waits=pool.waits,
        pool_connections=pool.opened,
        latency=stats.latency.encode(),
        publish_latency=stats.publish_latency.encode(),
        load_cpu_secs=load_cpu,
        load_wall_secs=load_wall,
    )


async def _guarded(coro: Awaitable[None], wid: int, emit: Emit) -> None:
    try:
        await coro
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which aborts the run
        log.debug("worker failed", exc_info=True)
        emit(("error", wid, f"{type(exc).__name__}: {exc}"))


def _worker_process(scn_raw: bytes, wid: int, indices: list[int], out_q: Any, ctl_q: Any) -> None:
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
                return ctl_q.get(timeout=limit)
            except queue.Empty:
                return None

        return await asyncio.to_thread(get)

    asyncio.run(_guarded(_worker(scn, wid, indices, emit, wait_start), wid, emit))


# ---------------------------------------------------------------------------------------------- parent


class _Live:
    """Prints one line per second once every worker has reported that second."""

    def __init__(self, workers: int, enabled: bool) -> None:
        self.workers = workers
        self.enabled = enabled
        self.by_n: dict[int, dict[int, Tick]] = {}
        self.prev = (0, 0, 0)
        self.prev_t = 0.0

    def tick(self, wid: int, t: Tick) -> None:
        got = self.by_n.setdefault(t.n, {})
        got[wid] = t
        if len(got) < self.workers:
            return
        del self.by_n[t.n]
        now = max(x.t for x in got.values())
        span = now - self.prev_t
        if span < 0.25:
            return  # the final partial second is too short for a meaningful rate
        offered = sum(x.offered for x in got.values())
        accepted = sum(x.accepted for x in got.values())
        delivered = sum(x.delivered for x in got.values())
        expected = sum(x.expected for x in got.values())
        po, pa, pd = self.prev
        self.prev_t = now
        self.prev = (offered, accepted, delivered)
        if not self.enabled:
            return
        hist = new_histogram()
        for x in got.values():
            hist.decode_and_add(x.latency)
        p99 = hist.get_value_at_percentile(99) / 1000.0 if hist.get_total_count() else 0.0
        phase = "drain" if all(x.phase == "drain" for x in got.values()) else "load"
        log.info(
            "%6.1fs %-5s offered %6.0f/s  accepted %6.0f/s  delivered %6.0f/s  backlog %7d  p99 %8.2f ms",
            now,
            phase,
            (offered - po) / span,
            (accepted - pa) / span,
            (delivered - pd) / span,
            max(0, expected - delivered),
            p99,
        )


def _check_endpoints(scn: Scenario) -> None:
    for name, url in (("writer", scn.writer), ("pusher", scn.pusher)):
        try:
            ep = parse_endpoint(url)
        except ValueError as exc:
            raise SetupError(f"bad {name} URL: {exc}") from exc
        if not scn.allow_remote and not check_loopback(ep):
            raise SetupError(f"{name} URL is not a loopback address; pass --allow-remote to load another host")


async def run_scenario(scn: Scenario) -> RunReport:
    """One full run: connect, publish for the duration, drain, check. Raises SetupError only for
    invalid configuration; subscribers that fail to connect give a "setup_failed" report."""
    try:
        scn.validate()
    except ValueError as exc:
        raise SetupError(str(exc)) from exc
    _check_endpoints(scn)
    if not scn.run_id:
        scn = msgspec.structs.replace(scn, run_id=new_run_id())
    raise_fd_limit()
    started_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    wall0 = time.monotonic()
    ru0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    slices = split_topics(scn.topics, scn.procs)
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[tuple[str, int, Any]] = asyncio.Queue()

    if scn.procs == 1:
        box: asyncio.Future[float | None] = loop.create_future()

        async def wait_start() -> float | None:
            return await box

        task = asyncio.create_task(_guarded(_worker(scn, 0, slices[0], events.put_nowait, wait_start), 0, events.put_nowait))

        def start_all(value: float | None) -> None:
            if not box.done():
                box.set_result(value)

        try:
            results, error = await _supervise(scn, events, start_all, 1)
        finally:
            if not task.done():
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    else:
        results, error = await _run_processes(scn, slices, events, loop)

    wall = time.monotonic() - wall0
    ru1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    user = (ru1[0].ru_utime - ru0[0].ru_utime) + (ru1[1].ru_utime - ru0[1].ru_utime)
    sys_ = (ru1[0].ru_stime - ru0[0].ru_stime) + (ru1[1].ru_stime - ru0[1].ru_stime)
    return _merge(scn, results, error, started_at, wall, user, sys_)


async def _supervise(
    scn: Scenario, events: asyncio.Queue[tuple[str, int, Any]], start_all: Callable[[float | None], None], workers: int
) -> tuple[list[WorkerResult], str]:
    """The parent's side of the protocol: wait for every worker to be ready, start them together
    (or abort them all), relay ticks to the live line, collect results. Every wait is bounded."""
    live = _Live(workers, scn.live)
    ready: dict[int, Ready] = {}
    results: dict[int, WorkerResult] = {}
    error = ""
    decided = False
    deadline = time.monotonic() + scn.connect_timeout + 60.0
    while len(results) < workers:
        if not decided and len(ready) == workers:
            decided = True
            if any(r.failed for r in ready.values()):
                error = "subscribers failed to connect"
                start_all(None)
            else:
                at = time.monotonic() + _START_DELAY
                start_all(at)
                deadline = at + scn.duration + _PUBLISH_GRACE + scn.publish_timeout + scn.drain_timeout + 30.0
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            error = error or "workers did not finish in time"
            if not decided:
                decided = True
                start_all(None)
            break
        try:
            kind, wid, payload = await asyncio.wait_for(events.get(), remaining)
        except asyncio.TimeoutError:
            continue
        if kind == "ready":
            ready[wid] = msgspec.msgpack.decode(payload, type=Ready)
        elif kind == "tick":
            live.tick(wid, msgspec.msgpack.decode(payload, type=Tick))
        elif kind == "result":
            results[wid] = msgspec.msgpack.decode(payload, type=WorkerResult)
        elif kind == "error":
            if wid in results:
                continue  # it already delivered its result; a failure on the way out changes nothing
            error = error or f"worker {wid} failed: {payload}"
            results.setdefault(wid, WorkerResult(worker=wid, ready=ready.get(wid) or _no_ready(), started=False))
            if not decided:
                decided = True
                start_all(None)
    return [results[k] for k in sorted(results)], error


def _no_ready() -> Ready:
    return Ready(wanted=0, connected=0, failed=0, connect_secs=0.0, failure_samples=[])


async def _run_processes(
    scn: Scenario, slices: list[list[int]], events: asyncio.Queue[tuple[str, int, Any]], loop: asyncio.AbstractEventLoop
) -> tuple[list[WorkerResult], str]:
    ctx = mp.get_context("spawn")
    out_q = ctx.Queue()
    ctl_qs = [ctx.Queue() for _ in slices]
    raw = msgspec.msgpack.encode(scn)
    procs = [
        ctx.Process(target=_worker_process, args=(raw, wid, idx, out_q, ctl_qs[wid]), daemon=True, name=f"upf-loadgen-{wid}")
        for wid, idx in enumerate(slices)
    ]
    stop = threading.Event()

    def bridge() -> None:
        while not stop.is_set():
            try:
                item = out_q.get(timeout=0.1)
            except queue.Empty:
                continue
            except (EOFError, OSError):
                return
            loop.call_soon_threadsafe(events.put_nowait, item)

    for p in procs:
        p.start()
    thread = threading.Thread(target=bridge, name="upf-loadgen-bridge", daemon=True)
    thread.start()
    def start_all(value: float | None) -> None:
        for q in ctl_qs:
            q.put(value)

    async def watchdog() -> None:
        # a worker that dies (OOM, signal) never reports; tell the supervisor instead of waiting it out
        reported: set[int] = set()
        while True:
            await asyncio.sleep(0.5)
            for wid, p in enumerate(procs):
                if wid not in reported and p.exitcode not in (None, 0):
                    reported.add(wid)
                    events.put_nowait(("error", wid, f"worker process exited with code {p.exitcode}"))

    dog = asyncio.create_task(watchdog())
    clean_exit = False
    try:
        result = await _supervise(scn, events, start_all, len(procs))
        clean_exit = True
        return result
    finally:
        dog.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await dog
        for p in procs:
            if clean_exit:
                await asyncio.to_thread(p.join, 10.0)
            if p.is_alive():
                p.terminate()
                await asyncio.to_thread(p.join, 5.0)
        stop.set()
        await asyncio.to_thread(thread.join, 2.0)
        for q in (out_q, *ctl_qs):
            q.close()
            q.join_thread()


def _merge(
    scn: Scenario, results: list[WorkerResult], error: str, started_at: str, wall: float, user: float, sys_: float
) -> RunReport:
    lat = new_histogram()
    pub_lat = new_histogram()
    violations = Violations()
    topics: list[TopicVerdict] = []
    failures: Counter[str] = Counter()
    fail_samples: list[str] = []
    sub_samples: list[str] = []
    bad_frames: list[str] = []
    for r in results:
        if r.latency:
            lat.decode_and_add(r.latency)
        if r.publish_latency:
            pub_lat.decode_and_add(r.publish_latency)
        for tv in r.topics:
            violations.add(tv.violations)
        topics.extend(r.topics)
        failures.update(r.failures)
        fail_samples.extend(r.failure_samples)
        sub_samples.extend(r.ready.failure_samples)
        bad_frames.extend(r.bad_frames)
    topics.sort(key=lambda tv: tv.topic)
    s = lambda f: sum(f(r) for r in results)  # noqa: E731
    offered, accepted, delivered = s(lambda r: r.offered), s(lambda r: r.accepted), s(lambda r: r.delivered)
    publish_secs = max((r.publish_secs for r in results), default=0.0) or scn.duration
    subs = scn.subs_per_topic
    throughput = Throughput(
        target_rate=scn.rate,
        publish_secs=round(publish_secs, 3),
        offered=offered,
        accepted=accepted,
        rejected=s(lambda r: r.rejected),
        errors=s(lambda r: r.errors),
        expected_deliveries=s(lambda r: r.expected),
        delivered=delivered,
        delivered_during_load=s(lambda r: r.delivered_during_load),
        offered_per_s=round(offered / publish_secs, 1),
        accepted_per_s=round(accepted / publish_secs, 1),
        delivered_per_s=round(s(lambda r: r.delivered_during_load) / publish_secs / subs, 1),
        pool_waits=s(lambda r: r.pool_waits),
        pool_connections=s(lambda r: r.pool_connections),
    )
    drain = Drain(
        secs=round(max((r.drain_secs for r in results), default=0.0), 3),
        complete=all(r.drain_complete for r in results),
        backlog_at_stop=s(lambda r: r.backlog_at_stop),
        backlog_left=s(lambda r: r.backlog_left),
    )
    cores = os.cpu_count() or 1
    worker_pct = [round(100.0 * r.load_cpu_secs / r.load_wall_secs, 1) if r.load_wall_secs else 0.0 for r in results]
    cpu = Cpu(
        cores=cores,
        wall_secs=round(wall, 3),
        user_secs=round(user, 3),
        sys_secs=round(sys_, 3),
        pct_of_wall=round(100.0 * (user + sys_) / wall, 1) if wall else 0.0,
        pct_of_machine=round(100.0 * (user + sys_) / wall / cores, 1) if wall else 0.0,
        worker_load_pct=worker_pct,
        saturated=any(p >= _SATURATED_PCT for p in worker_pct),
    )
    subscriptions = Subscriptions(
        transport=scn.transport,
        wanted=s(lambda r: r.ready.wanted),
        connected=s(lambda r: r.ready.connected),
        failed=s(lambda r: r.ready.failed),
        connect_secs=round(max((r.ready.connect_secs for r in results), default=0.0), 3),
        disconnects=s(lambda r: r.disconnects),
        reconnects=s(lambda r: r.reconnects),
        failure_samples=sub_samples[:_MAX_SAMPLES],
        bad_frame_samples=bad_frames[:_MAX_SAMPLES],
    )
    started = bool(results) and all(r.started for r in results) and len(results) == scn.procs
    if error or not started:
        verdict, code, reason = "setup_failed", 2, error or "run did not start"
    elif violations.total():
        verdict, code, reason = "violations", 1, ""
    elif accepted == 0:
        verdict, code, reason = "setup_failed", 2, "no publish was accepted"
    elif scn.strict and (throughput.rejected or throughput.errors or subscriptions.disconnects or not drain.complete):
        verdict, code, reason = "degraded", 1, "strict: failed publishes, disconnects or an unfinished drain"
    else:
        verdict, code, reason = "clean", 0, ""
    return RunReport(
        ok=code == 0,
        verdict=verdict,
        exit_code=code,
        reason=reason,
        started_at=started_at,
        scenario=scn,
        throughput=throughput,
        latency=latency_summary(lat),
        publish_latency=latency_summary(pub_lat),
        drain=drain,
        violations=violations,
        topics_total=len(topics),
        topics_clean=sum(1 for tv in topics if tv.clean),
        topics=topics,
        publish_failures=PublishFailures(by_kind=dict(failures), samples=fail_samples[:_MAX_SAMPLES], bad_replies=s(lambda r: r.bad_replies)),
        subscriptions=subscriptions,
        cpu=cpu,
    )


# ----------------------------------------------------------------------------------------------- sweep


def sweep_point(r: RunReport) -> SweepPoint:
    return SweepPoint(
        rate=r.scenario.rate,
        offered_per_s=r.throughput.offered_per_s,
        accepted_per_s=r.throughput.accepted_per_s,
        delivered_per_s=r.throughput.delivered_per_s,
        p50_ms=r.latency.p50_ms,
        p90_ms=r.latency.p90_ms,
        p95_ms=r.latency.p95_ms,
        p99_ms=r.latency.p99_ms,
        max_ms=r.latency.max_ms,
        drain_secs=r.drain.secs,
        violations=r.violations.total(),
        rejected=r.throughput.rejected,
        errors=r.throughput.errors,
        loadgen_cpu_pct=r.cpu.pct_of_wall,
        loadgen_saturated=r.cpu.saturated,
        verdict=r.verdict,
    )


async def run_sweep(
    base: Scenario,
    rates: list[float],
    *,
    tolerance: float = 0.05,
    p99_bound_ms: float = 250.0,
    pause: float = 2.0,
    stop_after_knee: bool = False,
    on_point: Callable[[SweepPoint], None] | None = None,
) -> SweepReport:
    runs: list[RunReport] = []
    points: list[SweepPoint] = []
    knee: Knee | None = None
    code = 0
    for i, rate in enumerate(rates):
        if i and pause > 0:
            await asyncio.sleep(pause)
        scn = msgspec.structs.replace(base, rate=float(rate), run_id=new_run_id())
        log.info("sweep step: %.0f/s", rate)
        r = await run_scenario(scn)
        runs.append(r)
        if r.verdict == "setup_failed":
            code = 2
            break
        p = sweep_point(r)
        points.append(p)
        if on_point is not None:
            on_point(p)
        if r.verdict == "violations":
            code = max(code, 1)
        knee = find_knee(points, tolerance, p99_bound_ms)
        if knee is not None and stop_after_knee:
            break
    if code != 2 and not points:
        code = 2
    return SweepReport(
        ok=code == 0,
        exit_code=code,
        tolerance=tolerance,
        p99_bound_ms=p99_bound_ms,
        points=points,
        knee=knee,
        runs=runs,
    )

