"""Merging the workers' results into one run report, and the run's verdict."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable

from .checker import TopicVerdict, Violations
from .metrics import new_histogram
from .phases import MAX_SAMPLES, WorkerResult
from .report import Cpu, Drain, PublishFailures, RunReport, Subscriptions, Throughput, latency_summary
from .scenario import Scenario

__all__ = ["merge_results"]

_SATURATED_PCT = 90.0
"""a worker busier than this was the limit, not the server"""


def merge_results(
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

    def s(f: Callable[[WorkerResult], int]) -> int:
        return sum(f(r) for r in results)

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
        failure_samples=sub_samples[:MAX_SAMPLES],
        bad_frame_samples=bad_frames[:MAX_SAMPLES],
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
        publish_failures=PublishFailures(
            by_kind=dict(failures), samples=fail_samples[:MAX_SAMPLES], bad_replies=s(lambda r: r.bad_replies)
        ),
        subscriptions=subscriptions,
        cpu=cpu,
    )
