"""The bench's typed results: one msgspec Struct per phase result, and results.json read and written
through them, so a renamed or mistyped figure fails at the producer or on load, not as a blank cell
in summary.md. Fields that older runs did not record are optional (None or omitted), so every
committed results.json still loads and renders."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec


class Rec(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Base of every record: fields at their default (None) are not written. msgspec applies kw_only per
    class, so each subclass states it again."""


# --------------------------------------------------------------------------------------------- config
class Config(Rec, kw_only=True):
    """The knobs of one run (FULL or QUICK below)."""

    rounds: int
    ingest_secs: float
    ingest_conns: int
    ingest_topics: int
    bcast_n: int
    bcast_secs: float
    lg_topics: int
    sweep_rates: list[int]
    sweep_secs: float
    sweep_rounds: int
    fixed_secs: float
    fanout_topics: int
    fanout_subs: int
    fanout_rate: int
    topics_small: int
    topics_large: int
    topics_secs: float
    topics_rounds: int
    idle_n: int
    idle_kinds: str
    idle_rounds: int
    idle_max_n: int
    sweep_shapes: list[str]
    idle_cpu_secs: float
    idle_cpu_n: int
    idle_cpu_workers: list[int]
    pd_rate: int
    pd_topics: int
    pd_secs: float
    pd_shapes: list[str]
    pp_channels: int
    pp_streams: int
    pp_rate: int
    al_pairs: int = 3
    al_secs: float = 5.0
    scaling_rates: list[int] = []
    stall_secs: float = 15.0
    """Seconds of the disk's flush probe (``harness.disk_stalls``) at the run's start and at its end."""


FULL = Config(
    rounds=3,
    ingest_secs=5.0,
    ingest_conns=64,
    ingest_topics=1000,
    bcast_n=1000,
    bcast_secs=4.0,
    lg_topics=1000,
    # Up to 10,000/s: issue 9's goal is a knee of at least 4,000/s, and its scaling figure (the knee with
    # 1 vs 2 workers) needs both knees found, not bounded by the top rate. Every full run up to the
    # thirty-first pass ended at 6,000/s without one; at 12,000/s (twice that) loadgen's publishes fell
    # behind on the server's latency (10,200-11,600/s accepted, p99 108-123 ms). Steps of 1,000 above
    # 6,000: the knee's step is the scaling ratio's precision.
    sweep_rates=[250, 500, 1000, 1500, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 10000],
    sweep_secs=6.0,
    sweep_rounds=2,
    fixed_secs=8.0,
    fanout_topics=10,
    fanout_subs=100,
    fanout_rate=100,
    topics_small=1000,
    topics_large=100_000,
    topics_secs=5.0,
    topics_rounds=3,
    idle_n=10_000,
    idle_kinds="baseline,ws,json,sse",
    idle_rounds=2,
    idle_max_n=19_000,
    sweep_shapes=["allinone", "split", "allinone_w2"],
    idle_cpu_secs=60.0,
    idle_cpu_n=10_000,
    idle_cpu_workers=[1, 2],
    pd_rate=2000,
    pd_topics=1000,
    pd_secs=10.0,
    pd_shapes=["allinone", "allinone_w2", "split"],
    pp_channels=10,
    pp_streams=100,
    pp_rate=500,
    # bench/kneegen's sweep (phases/scaling.py) stops at the first rate that fails: steps of 1,000 from
    # 3,000, where the knees of slower hosts fall too (6,000-9,000/s on the AMD EPYC of the
    # thirty-seventh pass, whose steps of 2,000 there gave the scaling figure as 1.0 at best), and
    # of 2,000 past 14,000.
    scaling_rates=[3000, 4000, 5000, 6000, 7000, 8000, 9000, 10000, 11000, 12000, 13000, 14000, 16000, 18000, 20000],
)
QUICK = msgspec.structs.replace(  # a smoke run: the same phases, shorter and coarser
    FULL,
    rounds=1,
    ingest_secs=3.0,
    bcast_secs=3.0,
    lg_topics=500,
    sweep_rates=[500, 1000, 2000, 4000],
    sweep_secs=3.0,
    sweep_rounds=1,
    fixed_secs=4.0,
    topics_large=20_000,
    topics_secs=3.0,
    topics_rounds=1,
    idle_kinds="baseline,ws",
    idle_rounds=1,
    idle_max_n=0,
    idle_cpu_secs=15.0,
    idle_cpu_n=2000,
    pd_secs=5.0,
    pp_channels=5,
    pp_streams=20,
    pp_rate=200,
    al_secs=3.0,
    scaling_rates=[2000, 4000, 8000, 12000, 16000],
    stall_secs=5.0,
)

GOALS = {
    "writer_vs_bare": 0.5,
    "store_vs_bare_sqlite": 0.5,
    "pusher_1sub_vs_broadcast": 0.3,
    "pusher_vs_broadcast": 0.5,
    "p99_half_knee_ms": 50.0,
    "idle_kb": 16.0,
    "topics_ratio": 1.2,
    "idle_cpu_pct_0": 0.2,
    "idle_cpu_pct_n": 1.0,
    "cpu_us_per_publish_and_delivery": 250.0,
    "knee_allinone_w2": 4000.0,
}


# --------------------------------------------------------------------------------------- loadgen runs
class Price(Rec, kw_only=True):
    """CPU per accepted publish / per delivered message over a window, by role and in total. An empty
    Price (no window could be priced) has ``accepted`` and ``delivered`` 0 and no CPU figures."""

    accepted: int = 0
    delivered: int = 0
    server_cpu_secs: dict[str, float] = {}
    cpu_us_per_publish_total: float | None = None
    writer_cpu_us_per_publish: float | None = None
    pusher_cpu_us_per_delivery: float | None = None
    pusher_frames_per_cpu_sec: float | None = None
    allinone_frames_per_cpu_sec: float | None = None
    secs: float | None = None  # the steady window's length (steady prices only)


class RunSummary(Rec, kw_only=True):
    """One ``upf-loadgen run`` (or one sweep step), with its whole-run and steady-window prices."""

    rate: float
    verdict: str
    offered: int
    accepted: int
    delivered: int
    expected: int
    offered_per_s: float | None = None
    accepted_per_s: float
    delivered_per_s: float
    rejected: int
    errors: int
    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    publish_p99_ms: float | None
    drain_secs: float
    drain_complete: bool
    violations: dict[str, int]
    violations_total: int
    disconnects: int
    loadgen_cpu_pct: float
    loadgen_saturated: bool
    whole: Price | None = None
    steady: Price | None = None
    rss_kb: dict[str, int] | None = None


class FanoutRun(RunSummary, kw_only=True):
    subs_per_topic: int
    topics: int


class PubDeliverRun(RunSummary, kw_only=True):
    cpu_us_per_publish_and_delivery: float | None = None
    thread_cpu_secs_whole_run: dict[str, float] = {}
    worker_cpu_secs_whole_run: list[float] | None = None


class Knee(Rec, kw_only=True):
    rate: float
    last_good_rate: float | None = None
    reasons: list[str] = []


class Sweep(Rec, kw_only=True):
    shape: str
    rates: list[int]
    knee: Knee | None = None
    p99_bound_ms: float | None = None
    tolerance: float | None = None
    exit_code: int | None = None
    plot: str
    idle_rss_kb: dict[str, int]
    end_rss_kb: dict[str, int]
    peak_rss_kb: dict[str, int]
    steps: list[RunSummary]


class FixedRound(Rec, kw_only=True):
    half_knee: RunSummary
    twice_knee: RunSummary
    peak_rss_kb: dict[str, int]


class FixedRates(Rec, kw_only=True):
    half_knee: float
    twice_knee: float


# ----------------------------------------------------------------------------------- other drivers
class Drive(Rec, kw_only=True):
    """One bench/pubdrive.py window (its JSON line) priced with the server's CPU over that window."""

    url: str
    connections: int
    rate: float = 0.0  # paced requests/s; 0: closed loop
    topics: int
    body_size: int
    secs: float
    ok: int
    ok_per_s: float
    non_200: dict[int, int] = {}  # HTTP status -> count, for answers other than 200
    errors: int
    p50_ms: float
    p99_ms: float
    driver_cpu_pct: float
    others_cpu_pct_of_machine: float | None = None
    server_cpu_secs: float | None = None
    server_cpu_pct: float | None = None
    cpu_us_per_publish: float | None = None
    rss_kb: int | None = None


class Broadcast(Rec, kw_only=True):
    """bench/broadcast.py: the bare websockets fan-out ceiling."""

    broadcasts: int
    frames_sent: int
    secs: float
    server_cpu_self: float
    connections: int
    payload_bytes: int
    frame_bytes: int
    frames_delivered: int
    server_cpu_secs: float
    frames_per_cpu_sec: float
    frames_per_sec: float


class Pushpin(Rec, kw_only=True):
    """bench/pushpin_peer.py; only ``skipped`` when Pushpin could not run here."""

    skipped: str | None = None
    channels: int | None = None
    streams: int | None = None
    rate: float | None = None
    published: int | None = None
    publish_secs: float | None = None
    expected: int | None = None
    delivered: int | None = None
    item_bytes: int | None = None
    cpu_secs: float | None = None
    cpu_secs_by_thread: dict[str, float] = {}
    cpu_us_per_item: float | None = None
    items_per_cpu_sec: float | None = None
    rss_kb: int | None = None
    window_secs: float | None = None
    version: str | None = None


class Round(Rec, kw_only=True):
    """One alternating round: the ceilings and UPF at fixed rates, on the same machine minutes."""

    loadavg: str
    ingest: dict[str, Drive] | None = None
    broadcast: Broadcast | None = None
    fanout: FanoutRun | None = None
    pushpin: Pushpin | None = None
    allinone: FixedRound | None = None
    split: FixedRound | None = None


class TopicsRound(Rec, kw_only=True):
    small: Drive
    large: Drive


class Topics(Rec, kw_only=True):
    small_topics: int
    large_topics: int
    prepopulated_topics: int
    prepopulate_secs: float
    store_mb_before: float
    subscribers_held: bool
    writer_rss_kb_end: int
    rounds: list[TopicsRound]
    small_cpu_us_per_publish: float | None
    large_cpu_us_per_publish: float | None
    small_ok_per_s: float | None
    large_ok_per_s: float | None
    ratio_large_over_small: float | None


class AuthLimitsPair(Rec, kw_only=True):
    """One off/on pair of publish-only windows (``order`` says which ran first)."""

    order: list[str]
    off: Drive
    on: Drive


class AuthLimits(Rec, kw_only=True):
    """The all-in-one's publish cost with auth and limits applied to the load vs the defaults, both
    servers running side by side and driven in alternating windows by the same driver."""

    secs: float
    conns: int
    topics: int
    scheme: str  # how the driver authenticated on the "on" server: basic or bearer
    on_env: dict[str, str]  # the settings of the "on" server (the password hash elided)
    checks: dict[str, str]  # what the "on" server answered before the windows (it does apply auth and limits)
    pairs: list[AuthLimitsPair]
    off_cpu_us_per_publish: float | None
    on_cpu_us_per_publish: float | None
    off_ok_per_s: float | None
    on_ok_per_s: float | None
    ratio_cpu_on_over_off: float | None
    ratio_ok_per_s_on_over_off: float | None


class IdleKind(Rec, kw_only=True):
    rss_before_mb: float
    rss_after_mb: float
    kb_per_conn: float


class Idle(Rec, kw_only=True):
    n: int
    rounds: list[dict[str, IdleKind]]
    kb_per_conn: dict[str, float]
    nofile_limit: list[int]
    max_n: int | None = None
    max_n_kb_per_conn: float | None = None


class IdleCpuWorkers(Rec, kw_only=True):
    idle_0_pct: float
    idle_n_pct: float
    rss_mb: float


class IdleCpu(Rec, kw_only=True):
    secs: float
    n: int
    by_workers: dict[str, IdleCpuWorkers]


class PubDeliver(Rec, kw_only=True):
    rate: int
    topics: int
    secs: float
    shapes: dict[str, PubDeliverRun]


# ------------------------------------------------------------------------------------------ the run
class Machine(Rec, kw_only=True):
    nproc: int | None
    cpu_model: str
    python: str
    granian: str
    websockets: str
    kernel: str
    mem_total_mb: int
    nofile: list[int]
    uvloop: bool
    loadavg_start: str
    git: str = ""


class DiskStalls(Rec, kw_only=True):
    """``harness.disk_stalls``: a one-page write and ``fdatasync`` every 10 ms on the filesystem of the
    run's stores, nothing else of the bench running. A commit whose flush the disk holds holds every
    publish it carries: a low-rate step's p99 can be one such stall (BENCHMARKS.md, forty-fourth pass)."""

    when: str  # "start" or "end" of the run
    secs: float
    flushes: int
    median_ms: float
    p99_ms: float
    p999_ms: float
    max_ms: float
    over_50: int
    over_100: int


class Noise(Rec, kw_only=True):
    wall_secs: float
    machine_busy_cpu_secs: float
    bench_cpu_secs: float
    others_cpu_pct_of_machine: float
    loadavg_end: str
    disk_stalls: list[DiskStalls] = []
    """Empty in runs before 2026-12-07 17:00 UTC."""


class StoreBench(Rec, kw_only=True):
    """libs/upf-keyspace/bench/publish_bench.py: the embedded store's publish transactions against
    bare SQLite writing the same rows 256 per durable commit, alternating, per round."""

    publishes: int
    concurrency: int
    baseline_per_s: list[float]
    store_per_s: list[float]
    cpu_us_per_publish: list[float]
    loop_us_per_publish: list[float]
    committer_us_per_publish: list[float]
    gc_thresholds: list[int] = []
    """The collector's thresholds the store ran under; empty: CPython's defaults (every run before 2026-12-02)."""
    loop: str = ""
    """The store's event loop: uvloop (UPF's) or asyncio; empty: asyncio's own (every run before 2026-12-02)."""


class KneegenStep(Rec, kw_only=True):
    """One bench/kneegen run at ``rate`` against one shape (phases/scaling.py)."""

    rate: int
    offered_per_s: float
    accepted_per_s: float
    delivered_per_s: float
    p50_ms: float
    p99_ms: float
    violations: int
    undelivered: int
    errors: int
    server_cpu_pct: float
    server_cpu_us_per_publish: float | None = None
    kneegen_cpu_us_per_publish: float | None = None
    reasons: list[str] = []
    window_secs: float | None = None  # publishing and drain, without the connects (runs from the thirty-sixth pass)
    role_cpu_secs: dict[str, float] = {}  # each role's CPU over that window
    pusher_frames_per_cpu_sec: float | None = None  # the split pusher's, over that window


class ScalingSweep(Rec, kw_only=True):
    shape: str
    knee: int | None = None  # the first rate that failed; None: every rate held
    last_good_rate: int | None = None
    steps: list[KneegenStep] = []
    half_knee: KneegenStep | None = None  # a run at half the knee (the last rate when none failed)
    twice_knee: KneegenStep | None = None  # and one at twice it (runs before the thirty-sixth pass had neither)


class Scaling(Rec, kw_only=True):
    sweeps: dict[str, ScalingSweep]
    p99_bound_ms: float
    tolerance: float


class Results(Rec, kw_only=True):
    """results.json. ``config`` is kept as written (older runs lack newer knobs); ``summary`` is derived
    from the rest by report.summarize and rewritten on every render."""

    mode: str
    config: dict[str, Any]
    goals: dict[str, float]
    machine: Machine
    started_at: str
    frame_payload_bytes: int | None = None
    sweeps: dict[str, list[Sweep]] = {}
    knees: dict[str, float] | None = None
    fixed_rates: dict[str, FixedRates] | None = None
    rounds: list[Round] = []
    idle_cpu: IdleCpu | None = None
    pubdeliver: PubDeliver | None = None
    topics: Topics | None = None
    store: StoreBench | None = None
    authlimits: AuthLimits | None = None
    idle: Idle | None = None
    scaling: Scaling | None = None
    interrupted: bool = False
    noise: Noise
    summary: dict[str, Any] = {}


_encoder = msgspec.json.Encoder()


def encode(res: Results) -> bytes:
    """results.json's bytes: indented like the files committed before the Structs."""
    return msgspec.json.format(_encoder.encode(res), indent=1)


def decode(raw: bytes | str) -> Results:
    return msgspec.json.decode(raw, type=Results)


def load(path: Path) -> Results:
    return decode(path.read_bytes())
