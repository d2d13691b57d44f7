"""rounds: R alternating rounds of the ceilings (a bare granian ASGI app, a bare websockets broadcast,
Pushpin) and UPF (the writer and all-in-one under the same publish-only driver; loadgen runs at half
and twice the knee; the split shape's fan-out), so each ratio compares figures of the same minutes."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import broadcast
import msgspec
import procs
import pushpin_peer
from harness import (
    DRIVER_CPUS,
    SERVER_CPUS,
    LoadgenRun,
    Shape,
    lg_common,
    loadavg,
    log,
    price_run,
    pubdrive,
    summarize_run,
)
from procs import tree_cpu, tree_rss_kb
from schema import Broadcast, Config, Drive, FanoutRun, FixedRates, FixedRound, Pushpin, Round, RunSummary


def phase_rounds(
    cfg: Config, work: Path, payload: int, fixed_rates: dict[str, FixedRates], pushpin: bool
) -> list[Round]:
    rounds: list[Round] = []
    for r in range(cfg.rounds):
        log(f"round {r + 1}/{cfg.rounds} (load {loadavg()})")
        row = Round(loadavg=loadavg())
        steps = ["ingest", "broadcast", "fanout", "pushpin", "allinone", "split"]
        if not pushpin:
            steps.remove("pushpin")
        if r % 2:
            steps.reverse()
        for step in steps:
            if step == "ingest":
                row.ingest = i = ingest_round(cfg, work)
                log(
                    "  ingest: "
                    + ", ".join(
                        f"{k} {v.ok_per_s:.0f}/s {v.cpu_us_per_publish} us (others {v.others_cpu_pct_of_machine}%)"
                        for k, v in i.items()
                    )
                )
            elif step == "fanout":
                row.fanout = f = fanout_round(cfg, work)
                log(
                    f"  fanout {f.topics} topics x {f.subs_per_topic} subs at {f.rate:.0f}/s: {f.verdict}, "
                    f"delivered {f.delivered}/{f.expected}, pusher {f.steady.pusher_frames_per_cpu_sec if f.steady else None} frames/CPU-s"
                )
            elif step == "pushpin":
                row.pushpin = pp = phase_pushpin(cfg, payload, work)
                log(
                    f"  pushpin: {pp.skipped or f'{pp.delivered}/{pp.expected} items, {pp.cpu_us_per_item} us CPU per item'}"
                )
            elif step == "broadcast":
                row.broadcast = b = broadcast_round(cfg, payload)
                log(f"  broadcast: {b.frames_per_cpu_sec:.0f} frames/CPU-s")
            else:
                fr = fixed_rates[step]
                fixed = fixed_round(step, cfg, work, fr.half_knee, fr.twice_knee)
                setattr(row, step, fixed)
                for s in (fixed.half_knee, fixed.twice_knee):
                    log(
                        f"  {step} {s.rate:.0f}/s: {s.verdict}, p99 {s.p99_ms} ms, delivered {s.delivered}/{s.expected}, "
                        f"{s.steady.cpu_us_per_publish_total if s.steady else None} us/publish (steady)"
                    )
        rounds.append(row)
    return rounds


def ingest_round(cfg: Config, work: Path) -> dict[str, Drive]:
    res: dict[str, Drive] = {}
    kw = dict(secs=cfg.ingest_secs, conns=cfg.ingest_conns, topics=cfg.ingest_topics)
    p, port = procs.start_bare_asgi(work, SERVER_CPUS)
    try:
        res["bare_asgi"] = pubdrive(f"http://127.0.0.1:{port}", [p.pid], **kw)
        res["bare_asgi"].rss_kb = tree_rss_kb([p.pid])
    finally:
        p.stop()
    for kind in ("writer", "allinone", "writer_granian"):
        shape = Shape(kind, work, SERVER_CPUS)
        try:
            roots = [r.pid for r in shape.roles.values()]
            res[f"upf_{kind}"] = pubdrive(shape.writer, roots, **kw)
            res[f"upf_{kind}"].rss_kb = sum(shape.rss_kb().values())
            shape.check_alive()
        finally:
            shape.stop()
    return res


def broadcast_round(cfg: Config, payload: int) -> Broadcast:
    out = broadcast.run(
        cfg.bcast_n, payload, cfg.bcast_secs, SERVER_CPUS, DRIVER_CPUS, cpu_reader=lambda pid: tree_cpu([pid])
    )
    return msgspec.convert(out, Broadcast)


def fixed_round(kind: str, cfg: Config, work: Path, half: float, double: float) -> FixedRound:
    shape = Shape(kind, work)
    runs = {}
    try:
        for label, rate in (("half_knee", half), ("twice_knee", double)):
            argv = ["run", *lg_common(shape, cfg.lg_topics, cfg.fixed_secs), "--rate", str(round(rate))]
            lg = LoadgenRun(argv, shape)
            rep = lg.wait(timeout=cfg.fixed_secs + 180)
            shape.check_alive()
            s = summarize_run(rep, RunSummary)
            price_run(s, lg.events, {k: lg.cpu1[k] - lg.cpu0[k] for k in lg.cpu0})
            s.rss_kb = shape.rss_kb()
            runs[label] = s
            time.sleep(1)
        return FixedRound(
            half_knee=runs["half_knee"], twice_knee=runs["twice_knee"], peak_rss_kb=shape.rss_kb("VmHWM:")
        )
    finally:
        shape.stop()


def fanout_round(cfg: Config, work: Path) -> FanoutRun:
    """The split shape with many subscribers per topic (the pusher's closest analogue of a broadcast):
    each publish is delivered to ``fanout_subs`` connections."""
    shape = Shape("split", work)
    try:
        argv = [
            "run",
            *lg_common(shape, cfg.fanout_topics, cfg.fixed_secs),
            "--subs-per-topic",
            str(cfg.fanout_subs),
            "--rate",
            str(cfg.fanout_rate),
        ]
        lg = LoadgenRun(argv, shape)
        rep = lg.wait(timeout=cfg.fixed_secs + 180)
        shape.check_alive()
        s = summarize_run(rep, FanoutRun, subs_per_topic=cfg.fanout_subs, topics=cfg.fanout_topics)
        price_run(s, lg.events, {k: lg.cpu1[k] - lg.cpu0[k] for k in lg.cpu0})
        s.rss_kb = shape.rss_kb()
        return s
    finally:
        shape.stop()


def phase_pushpin(cfg: Config, payload: int, work: Path) -> Pushpin:
    """Pushpin (Debian's package) holding one HTTP stream per subscriber, fed through its publish API.
    A failed attempt is made once more (a full run once died when Pushpin left its first streams
    unanswered for the driver's 30 s); a second failure is this round's ``skipped``, with its reason,
    and the run goes on: the rounds Pushpin did run still give its figure."""
    reason = ""
    for attempt in (1, 2):
        try:
            out = pushpin_peer.run(
                cfg.pp_channels, cfg.pp_streams, cfg.pp_rate, cfg.bcast_secs, payload, work, SERVER_CPUS, DRIVER_CPUS
            )
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:  # TimeoutError is an OSError
            reason = pushpin_peer.failure_reason(exc)
            log(f"  pushpin: attempt {attempt} failed: {exc}")
            continue
        return msgspec.convert(out, Pushpin)
    return Pushpin(skipped=f"Pushpin failed twice in a round ({reason})")
