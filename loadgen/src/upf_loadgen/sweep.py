"""A sweep: runs at increasing rates, one point each, until the knee (where delivery stops keeping up)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import msgspec

from .report import Knee, RunReport, SweepPoint, SweepReport, find_knee
from .runner import run_scenario
from .scenario import Scenario, new_run_id

__all__ = ["run_sweep", "sweep_point"]

log = logging.getLogger("upf_loadgen")


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
