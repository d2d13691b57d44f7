"""Orchestration, the parent's side: start the workers (phases.py) together, print the live line, and
merge their results into one report (merge.py). Sweeps over rates: sweep.py.

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
import queue
import resource
import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec

from .http11 import check_loopback, parse_endpoint
from .merge import merge_results
from .metrics import new_histogram
from .phases import PUBLISH_GRACE, Ready, Tick, WorkerResult, raise_fd_limit, run_worker, worker, worker_process
from .report import RunReport
from .scenario import Scenario, new_run_id, split_topics

__all__ = ["SetupError", "run_scenario", "WorkerResult", "raise_fd_limit"]

log = logging.getLogger("upf_loadgen")

_START_DELAY = 0.3
"""head start the parent gives workers between "go" and the first publish"""


class SetupError(Exception):
    """The run could not start (bad endpoint, subscribers not connected); nothing was measured."""


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
    started_at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    wall0 = time.monotonic()
    ru0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    slices = split_topics(scn.topics, scn.procs)
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[tuple[str, int, Any]] = asyncio.Queue()

    if scn.procs == 1:
        box: asyncio.Future[float | None] = loop.create_future()

        async def wait_start() -> float | None:
            return await box

        task = asyncio.create_task(
            run_worker(worker(scn, 0, slices[0], events.put_nowait, wait_start), 0, events.put_nowait)
        )

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
    return merge_results(scn, results, error, started_at, wall, user, sys_)


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
                deadline = at + scn.duration + PUBLISH_GRACE + scn.publish_timeout + scn.drain_timeout + 30.0
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            error = error or "workers did not finish in time"
            if not decided:
                decided = True
                start_all(None)
            break
        try:
            kind, wid, payload = await asyncio.wait_for(events.get(), remaining)
        except TimeoutError:
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
        ctx.Process(
            target=worker_process, args=(raw, wid, idx, out_q, ctl_qs[wid]), daemon=True, name=f"upf-loadgen-{wid}"
        )
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
