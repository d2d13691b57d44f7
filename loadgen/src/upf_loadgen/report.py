"""Report structures, their text rendering, and the sweep's knee rule: pure functions of the
numbers a run produced, so they are testable without a server.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

import msgspec
from hdrh.histogram import HdrHistogram

from .checker import TopicVerdict, Violations
from .scenario import Scenario

__all__ = [
    "Bucket",
    "LatencySummary",
    "Throughput",
    "Drain",
    "Cpu",
    "Subscriptions",
    "PublishFailures",
    "RunReport",
    "SweepPoint",
    "Knee",
    "SweepReport",
    "latency_summary",
    "find_knee",
    "format_run",
    "format_sweep",
    "BUCKET_BOUNDS_MS",
]

BUCKET_BOUNDS_MS = (0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 30000, 60000)


class Bucket(msgspec.Struct):
    le_ms: float | None
    """upper bound (inclusive); null for the overflow bucket"""
    count: int


class LatencySummary(msgspec.Struct, kw_only=True):
    count: int = 0
    min_ms: float = 0.0
    mean_ms: float = 0.0
    p50_ms: float = 0.0
    p90_ms: float = 0.0
    p95_ms: float = 0.0
    p99_ms: float = 0.0
    p999_ms: float = 0.0
    max_ms: float = 0.0
    buckets: list[Bucket] = []


class Throughput(msgspec.Struct, kw_only=True):
    target_rate: float
    publish_secs: float
    offered: int
    accepted: int
    rejected: int
    errors: int
    expected_deliveries: int
    """accepted x subscribers per topic"""
    delivered: int
    """first receipts of each seq, summed over subscribers"""
    delivered_during_load: int
    offered_per_s: float
    accepted_per_s: float
    delivered_per_s: float
    """deliveries while publishing ran, per second of publishing, per subscriber"""
    pool_waits: int = 0
    """publishes that queued for a free keep-alive connection; many means --pool-size, not the
    server, capped the offered rate (the queueing time is part of the measured latency)"""
    pool_connections: int = 0
    """publish connections opened over the run (reconnects after errors or idle drops included)"""


class Drain(msgspec.Struct, kw_only=True):
    secs: float
    complete: bool
    backlog_at_stop: int
    """expected - delivered when publishing stopped"""
    backlog_left: int
    """expected - delivered when the drain ended (non-zero only if it timed out)"""


class Cpu(msgspec.Struct, kw_only=True):
    cores: int
    wall_secs: float
    user_secs: float
    sys_secs: float
    pct_of_wall: float
    """user+sys of loadgen and its worker processes over the run's wall time; 100 = one core busy"""
    pct_of_machine: float
    worker_load_pct: list[float]
    """each worker's own CPU during publish+drain, as % of one core"""
    saturated: bool
    """a worker used >= 90% of a core: loadgen may be the bottleneck, not the server"""


class Subscriptions(msgspec.Struct, kw_only=True):
    transport: str
    wanted: int
    connected: int
    failed: int
    connect_secs: float
    disconnects: int
    reconnects: int
    failure_samples: list[str] = []
    bad_frame_samples: list[str] = []
    """frames that did not decode or carried a body loadgen did not send (counted as corrupt)"""


class PublishFailures(msgspec.Struct, kw_only=True):
    by_kind: dict[str, int] = {}
    """HTTP status ("429", "500", ...) or "connection" / "timeout" -> count"""
    samples: list[str] = []
    bad_replies: int = 0
    """200 replies whose body was not an ntfy message object"""


class RunReport(msgspec.Struct, kw_only=True):
    ok: bool
    verdict: str
    """"clean", "violations", "degraded" (only with --strict) or "setup_failed" """
    exit_code: int
    reason: str = ""
    started_at: str
    scenario: Scenario
    throughput: Throughput
    latency: LatencySummary
    publish_latency: LatencySummary
    drain: Drain
    violations: Violations
    topics_total: int
    topics_clean: int
    topics: list[TopicVerdict]
    publish_failures: PublishFailures
    subscriptions: Subscriptions
    cpu: Cpu


class SweepPoint(msgspec.Struct, kw_only=True):
    rate: float
    offered_per_s: float
    accepted_per_s: float
    delivered_per_s: float
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float
    drain_secs: float
    violations: int
    rejected: int = 0
    errors: int = 0
    loadgen_cpu_pct: float = 0.0
    loadgen_saturated: bool = False
    verdict: str = "clean"


class Knee(msgspec.Struct, kw_only=True):
    rate: float
    """first offered rate that failed the rule"""
    last_good_rate: float | None
    reasons: list[str]


class SweepReport(msgspec.Struct, kw_only=True):
    ok: bool
    exit_code: int
    tolerance: float
    p99_bound_ms: float
    points: list[SweepPoint]
    knee: Knee | None
    plot: str = ""
    runs: list[RunReport] = []


def _ms(us: float) -> float:
    return round(us / 1000.0, 3)


def latency_summary(hist: HdrHistogram) -> LatencySummary:
    n = hist.get_total_count()
    if n == 0:
        return LatencySummary()
    counts = [0] * (len(BUCKET_BOUNDS_MS) + 1)
    bounds_us = [b * 1000 for b in BUCKET_BOUNDS_MS]
    # a direct scan of the counts array: hdrh's own iterators are far slower in pure Python
    raw = hist.counts
    for index in range(hist.counts_len):
        c = raw[index]
        if not c:
            continue
        value = hist.get_value_from_index(index)  # lowest equivalent: exact bounds stay in their bucket
        i = bisect.bisect_left(bounds_us, value)
        counts[i] += c
    buckets = [Bucket(float(b), c) for b, c in zip(BUCKET_BOUNDS_MS, counts[:-1], strict=True)] + [
        Bucket(None, counts[-1])
    ]
    pct = hist.get_percentile_to_value_dict([50, 90, 95, 99, 99.9])
    return LatencySummary(
        count=n,
        min_ms=_ms(hist.get_min_value()),
        mean_ms=_ms(hist.get_mean_value()),
        p50_ms=_ms(pct[50]),
        p90_ms=_ms(pct[90]),
        p95_ms=_ms(pct[95]),
        p99_ms=_ms(pct[99]),
        p999_ms=_ms(pct[99.9]),
        max_ms=_ms(hist.get_max_value()),
        buckets=buckets,
    )


def find_knee(points: Iterable[SweepPoint], tolerance: float = 0.05, p99_bound_ms: float = 250.0) -> Knee | None:
    """The first rate where delivery falls more than ``tolerance`` behind the offered rate, or p99
    passes the bound; None if every point held up."""
    prev: SweepPoint | None = None
    for p in sorted(points, key=lambda q: q.rate):
        reasons: list[str] = []
        floor = p.rate * (1.0 - tolerance)
        if p.offered_per_s < floor:
            reasons.append(
                f"loadgen offered only {p.offered_per_s:.0f}/s of {p.rate:.0f}/s"
                + (
                    " (loadgen CPU-bound)"
                    if p.loadgen_saturated
                    else " (publishes too slow: each topic awaits its previous publish, and at most"
                    " --pool-size per worker are in flight)"
                )
            )
        if p.delivered_per_s < floor:
            reasons.append(f"delivered {p.delivered_per_s:.0f}/s < {100 * (1 - tolerance):.0f}% of {p.rate:.0f}/s")
        if p.p99_ms > p99_bound_ms:
            reasons.append(f"p99 {p.p99_ms:.1f} ms > {p99_bound_ms:g} ms")
        if reasons:
            return Knee(rate=p.rate, last_good_rate=prev.rate if prev else None, reasons=reasons)
        prev = p
    return None


def _fmt_ms(v: float) -> str:
    return f"{v:.2f}" if v < 100 else f"{v:.0f}"


def _latency_lines(title: str, lat: LatencySummary) -> list[str]:
    if lat.count == 0:
        return [f"{title}: no samples"]
    lines = [
        f"{title} (n={lat.count}): p50 {_fmt_ms(lat.p50_ms)}  p90 {_fmt_ms(lat.p90_ms)}  "
        f"p95 {_fmt_ms(lat.p95_ms)}  p99 {_fmt_ms(lat.p99_ms)}  p99.9 {_fmt_ms(lat.p999_ms)}  "
        f"max {_fmt_ms(lat.max_ms)}  mean {_fmt_ms(lat.mean_ms)} ms",
    ]
    return lines


def _histogram_lines(lat: LatencySummary, width: int = 40) -> list[str]:
    if lat.count == 0:
        return []
    top = max(b.count for b in lat.buckets) or 1
    lines = []
    lo = 0.0
    # skip empty buckets at both ends so the picture is about the data
    nonempty = [i for i, b in enumerate(lat.buckets) if b.count]
    first, last = nonempty[0], nonempty[-1]
    for i, b in enumerate(lat.buckets):
        if first <= i <= last:
            label = f"> {lo:g} ms" if b.le_ms is None else f"<= {b.le_ms:g} ms"
            bar = "#" * max(1 if b.count else 0, round(width * b.count / top))
            lines.append(f"  {label:>13} {b.count:>10} {100 * b.count / lat.count:6.2f}% {bar}")
        if b.le_ms is not None:
            lo = b.le_ms
    return lines


def format_run(r: RunReport) -> str:
    t = r.throughput
    v = r.violations
    s = r.subscriptions
    out = [
        "== upf-loadgen run ==",
        f"scenario: {r.scenario.topics} topics x {r.scenario.subs_per_topic} subs over {r.scenario.transport}, "
        f"target {r.scenario.rate:g}/s for {r.scenario.duration:g}s, body {r.scenario.message_size} B"
        f"{' binary (up=1)' if r.scenario.binary else ''}, {r.scenario.procs} proc(s)",
        f"subscriptions: {s.connected}/{s.wanted} connected in {s.connect_secs:.2f}s, "
        f"{s.disconnects} disconnects, {s.reconnects} reconnects, {s.failed} failed",
    ]
    if r.verdict == "setup_failed" and not t.offered:
        out.append(f"SETUP FAILED: {r.reason}")
        out.extend(f"  {x}" for x in s.failure_samples)
        return "\n".join(out)
    out += [
        f"throughput: offered {t.offered} ({t.offered_per_s:.0f}/s), accepted {t.accepted} ({t.accepted_per_s:.0f}/s), "
        f"rejected {t.rejected}, errors {t.errors}",
        f"            publish pool: {t.pool_connections} connections opened, {t.pool_waits} publishes queued for one",
        f"            delivered {t.delivered}/{t.expected_deliveries} "
        f"({t.delivered_per_s:.0f}/s per subscriber during {t.publish_secs:.1f}s of publishing)",
        f"drain: {r.drain.secs:.2f}s, {'complete' if r.drain.complete else 'TIMED OUT'}, "
        f"backlog at stop {r.drain.backlog_at_stop}, left {r.drain.backlog_left}",
    ]
    out += _latency_lines("latency send->receive", r.latency)
    out += _histogram_lines(r.latency)
    out += _latency_lines("publish round trip", r.publish_latency)
    if r.publish_failures.by_kind:
        kinds = ", ".join(f"{k}: {n}" for k, n in sorted(r.publish_failures.by_kind.items()))
        out.append(f"publish failures (not loss): {kinds}")
        out.extend(f"  {x}" for x in r.publish_failures.samples)
    if r.publish_failures.bad_replies:
        out.append(f"publish replies that were not a message object: {r.publish_failures.bad_replies}")
    c = r.cpu
    out.append(
        f"loadgen cpu: {c.user_secs:.1f}s user + {c.sys_secs:.1f}s sys over {c.wall_secs:.1f}s = "
        f"{c.pct_of_wall:.0f}% of one core ({c.pct_of_machine:.0f}% of {c.cores} cores); per worker under load: "
        + ", ".join(f"{x:.0f}%" for x in c.worker_load_pct)
        + ("  -> LOADGEN SATURATED, numbers may understate the server" if c.saturated else "")
    )
    out.append(
        f"correctness: loss {v.loss}, out-of-order {v.out_of_order}, duplicates {v.duplicates}, gaps {v.gaps}, "
        f"id mismatch {v.id_mismatch}, corrupt {v.corrupt}, unexpected {v.unexpected}"
    )
    if s.bad_frame_samples:
        out.append("unusable frames:")
        out.extend(f"  {x}" for x in s.bad_frame_samples)
    bad = [tv for tv in r.topics if not tv.clean]
    for tv in bad[:20]:
        tv_v = tv.violations
        detail = (
            f"  {tv.topic}: accepted {tv.accepted}, delivered {tv.delivered}/{tv.accepted * tv.subscribers}; "
            f"loss {tv_v.loss} ooo {tv_v.out_of_order} dup {tv_v.duplicates} gaps {tv_v.gaps} "
            f"idmis {tv_v.id_mismatch} corrupt {tv_v.corrupt} unexp {tv_v.unexpected}"
        )
        if tv.gap_ranges:
            detail += " holes " + " ".join(f"s{s}:{a}-{b}" for s, a, b in tv.gap_ranges[:3])
        if tv.tail_loss_from:
            detail += " stalled-from " + " ".join(f"s{s}:{a}" for s, a in tv.tail_loss_from[:3])
        out.append(detail)
    if len(bad) > 20:
        out.append(f"  ... and {len(bad) - 20} more topics with violations")
    out.append(f"topics clean: {r.topics_clean}/{r.topics_total}")
    out.append(f"VERDICT: {r.verdict.upper()}" + (f" ({r.reason})" if r.reason else ""))
    return "\n".join(out)


def format_sweep(s: SweepReport) -> str:
    head = (
        f"{'rate':>8} {'offered/s':>10} {'accepted/s':>10} {'deliv/s':>9} {'p50':>8} {'p90':>8} {'p95':>8} "
        f"{'p99':>8} {'max':>8} {'drain s':>8} {'viol':>5} {'cpu%':>5}"
    )
    lines = ["== upf-loadgen sweep ==", head]
    for p in s.points:
        lines.append(
            f"{p.rate:>8.0f} {p.offered_per_s:>10.0f} {p.accepted_per_s:>10.0f} {p.delivered_per_s:>9.0f} "
            f"{_fmt_ms(p.p50_ms):>8} {_fmt_ms(p.p90_ms):>8} {_fmt_ms(p.p95_ms):>8} {_fmt_ms(p.p99_ms):>8} "
            f"{_fmt_ms(p.max_ms):>8} {p.drain_secs:>8.2f} {p.violations:>5} {p.loadgen_cpu_pct:>5.0f}"
            + ("  loadgen-saturated" if p.loadgen_saturated else "")
        )
    if not s.points:
        lines.append("knee: no completed steps")
    elif s.knee is None:
        lines.append(
            f"knee: not reached (delivered within {100 * s.tolerance:.0f}% of offered and p99 <= {s.p99_bound_ms:g} ms "
            "at every rate)"
        )
    else:
        good = "none" if s.knee.last_good_rate is None else f"{s.knee.last_good_rate:.0f}/s"
        lines.append(f"knee: at {s.knee.rate:.0f}/s (last good {good}): " + "; ".join(s.knee.reasons))
    if s.plot:
        lines.append(f"plot: {s.plot}")
    lines.append("VERDICT: " + {0: "CLEAN", 1: "VIOLATIONS"}.get(s.exit_code, "SETUP FAILED"))
    return "\n".join(lines)


def rates_from(start: float, factor: float, steps: int) -> Sequence[float]:
    return [start * factor**i for i in range(steps)]
