"""UPF's benchmark: one command, figures and ratios measured in one run on this machine.

    cd /work/main && python3 -m uv run python bench/run.py            # ~27 min, writes bench/results/
    python3 -m uv run python bench/run.py --quick                     # ~6 min, writes bench/results/quick/

What it does (see BENCHMARKS.md for how to read it):

1. probe     the size of the WebSocket frame UPF delivers for loadgen's 100-byte bodies.
2. sweep     `upf-loadgen sweep` against the all-in-one program and against the split shape (one
             writer process + one pusher process on one embedded store file): the knee, a PNG each,
             and the servers' CPU per accepted publish / per delivered message at every step.
3. rounds    R alternating rounds of: the ingest ceiling (a bare granian ASGI app) and UPF's writer
             and all-in-one program driven by the same publish-only driver (bench/pubdrive.py), server
             pinned to CPU 0 and driver to CPU 1; the fan-out ceiling (bench/broadcast.py, a bare
             `websockets` broadcast of frames of UPF's size), pinned the same way; and `upf-loadgen
             run` against both UPF shapes at half the knee (latency) and at twice the knee
             (correctness under overload). Medians over the rounds are reported.
4. topics    publish CPU per publish at 1,000 vs 100,000 distinct topics: one store pre-populated with
             one message on each of 100,000 topics, no subscribers held (no pusher runs), the writer
             driven by bench/pubdrive.py, the two topic counts alternating on the same writer.
5. idle      resident memory per idle subscriber (services/pusher/bench/idle_memory.py), 10,000
             connections per transport, a fresh server each.
6. idlecpu   the all-in-one at rest (UPF_WORKERS=1 and 2): CPU % of a core over 60 s with no
             connection and with 10,000 idle ws subscribers, keepalives included (goals 0.2% / 1%).
7. pubdeliver CPU of all roles per publish-and-delivery at 2,000/s, 1,000 topics x 1 ws subscriber,
             for the all-in-one with 1 and 2 workers and the split shape (goal 250 us), with the
             CPU per worker, per thread and per role.
8. authlimits the all-in-one's CPU per publish and publishes/s with auth and limits applied to the
             load (nobody exempt, a user, deny-all, an ACL grant, Basic credentials) vs the defaults,
             two servers driven by bench/pubdrive.py in alternating windows (phases/authlimits.py).
9. store     the embedded store alone (no HTTP): publish transactions/s against bare SQLite writing
             the same rows 256 per durable commit, alternating (libs/upf-keyspace/bench/publish_bench.py;
             goal 0.5).
The sweep also runs against the all-in-one with UPF_WORKERS=2, and each round runs Pushpin
(bench/pushpin_peer.py) as a fan-out peer beside the bare broadcast.
10. scaling  the knees of the all-in-one with UPF_WORKERS=1 and 2 (issue 9's scaling figure) and of
             the split shape, found with bench/kneegen, a Go load generator doing loadgen's run for a
             fifth of its CPU (on two cores the Python loadgen's offered rate falls behind before the
             server's knee), then each shape at half its knee (the p99 goal) and twice it (no
             violation); built with the Go toolchain on first use (phases/scaling.py), skipped with
             the reason without one.

Every process it starts is stopped at the end (by the PIDs it started). Loopback only.

Layout: schema.py (the typed results, results.json), harness.py (shapes, helper processes, drivers,
pricing), phases/ (one module per phase or group), report.py (summary and summary.md); this file
runs the phases in order.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))

import broadcast
import harness
import procs
import report
import schema
from harness import BENCH, BODY, loadavg, log, machine_busy, own_cpu
from phases.authlimits import phase_authlimits
from phases.idle import phase_idle, phase_idle_cpu
from phases.probe import phase_probe
from phases.pubdeliver import phase_pubdeliver
from phases.rounds import phase_rounds
from phases.scaling import phase_scaling
from phases.store import phase_store
from phases.sweep import phase_sweep
from phases.topics import phase_topics
from procs import REPO
from schema import FULL, GOALS, QUICK, DiskStalls, FixedRates, Machine, Noise, Results, Sweep

PHASES = ("sweep", "scaling", "rounds", "pushpin", "idlecpu", "pubdeliver", "topics", "store", "authlimits", "idle")


def machine() -> Machine:
    model = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    import granian
    import websockets

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return Machine(
        nproc=os.cpu_count(),
        cpu_model=model,
        python=platform.python_version(),
        granian=granian.__version__,
        websockets=websockets.__version__,
        kernel=platform.release(),
        mem_total_mb=round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e6),
        nofile=[soft, hard],
        uvloop=_has("uvloop"),
        loadavg_start=loadavg(),
        git=_git(),
    )


def _git() -> str:
    try:
        head = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--", "libs", "services", "loadgen"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        return head + (" (+ uncommitted changes in libs/services/loadgen)" if dirty else "")
    except OSError:
        return ""


def _has(mod: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(mod) is not None


def render_file(path: Path) -> str:
    """Re-render summary.md beside a results.json (the summary is recomputed; results.json is left as is)."""
    res = schema.load(path)
    res.summary = report.summarize(res)
    md = report.render(res)
    (path.parent / "summary.md").write_text(md)
    return md


def _stall_probe(work: Path, secs: float, when: str) -> DiskStalls:
    """The disk's flushes, timed with nothing else of the bench running: beside a low-rate p99, the
    stall that may be all of it."""
    st = harness.disk_stalls(work, secs, when)
    log(
        f"disk at the {when}: a one-page flush every 10 ms for {secs:g}s: median {st.median_ms} ms, "
        f"max {st.max_ms} ms, {st.over_50} over 50 ms, {st.over_100} over 100 ms"
    )
    return st


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a ~3 minute run: fewer rounds, shorter windows")
    ap.add_argument("--out", help="results directory (default bench/results, or bench/results/quick)")
    ap.add_argument("--rounds", type=int, help="override the number of alternating rounds")
    ap.add_argument("--skip", default="", help="comma-separated phases to skip: " + ",".join(PHASES))
    ap.add_argument("--render", metavar="RESULTS_JSON", help="only re-render summary.md from a results.json")
    a = ap.parse_args()
    if a.render:
        try:
            print(render_file(Path(a.render)))
        except (OSError, msgspec.DecodeError) as exc:  # ValidationError is a DecodeError: it names the bad field
            ap.error(f"--render {a.render}: {exc}")
        return 0
    cfg = QUICK if a.quick else FULL
    if a.rounds:
        cfg = msgspec.structs.replace(cfg, rounds=a.rounds)
    skip = set(filter(None, a.skip.split(",")))
    if skip - set(PHASES):
        ap.error(f"--skip: unknown phase(s) {','.join(sorted(skip - set(PHASES)))}; known: {','.join(PHASES)}")
    out = Path(a.out) if a.out else BENCH / "results" / ("quick" if a.quick else "")
    out.mkdir(parents=True, exist_ok=True)
    broadcast.raise_fd_limit()
    if os.cpu_count() and os.cpu_count() < 2:
        harness.SERVER_CPUS.clear()
        harness.DRIVER_CPUS.clear()

    started = time.monotonic()
    busy0, _ = machine_busy()
    own0 = own_cpu()
    mode = "quick" if a.quick else "full"
    m = machine()
    started_at = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    parts: dict[str, Any] = {}
    work = Path(tempfile.mkdtemp(prefix="upf-bench-"))

    def on_signal(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    stalls: list[DiskStalls] = []
    try:
        log(f"mode {mode}, machine {m.nproc} x {m.cpu_model}, load {loadavg()}")
        stalls.append(_stall_probe(work, cfg.stall_secs, "start"))
        parts["frame_payload_bytes"] = payload = phase_probe(work)
        log(f"probe: UPF's ws frame for a {BODY}-byte body is {payload} bytes of payload")

        sweeps: dict[str, list[Sweep]] = {}
        if "sweep" not in skip:
            for n in range(1, cfg.sweep_rounds + 1):
                for kind in cfg.sweep_shapes if n % 2 else list(reversed(cfg.sweep_shapes)):
                    log(f"sweep {kind} #{n}: rates {cfg.sweep_rates} x {cfg.sweep_secs}s, {cfg.lg_topics} topics")
                    sw = phase_sweep(kind, cfg, work, out, n)
                    sweeps.setdefault(kind, []).append(sw)
                    k = sw.knee
                    log(
                        f"sweep {kind} #{n}: knee {k.rate if k else 'not reached'} ({'; '.join(k.reasons) if k else ''})"
                    )
        parts["sweeps"] = sweeps
        if "scaling" not in skip:
            parts["scaling"] = phase_scaling(cfg, work)

        if "rounds" not in skip:
            knees = {k: report.knee_of(s) for k, s in sweeps.items()} or {"allinone": 1000.0, "split": 1000.0}
            parts["knees"] = knees
            parts["fixed_rates"] = fixed = {k: FixedRates(half_knee=v / 2, twice_knee=v * 2) for k, v in knees.items()}
            parts["rounds"] = phase_rounds(cfg, work, payload, fixed, pushpin="pushpin" not in skip)

        if "idlecpu" not in skip:
            log(
                f"idle CPU: 0 and {cfg.idle_cpu_n} idle ws subscribers, {cfg.idle_cpu_secs}s each, UPF_WORKERS {cfg.idle_cpu_workers}"
            )
            parts["idle_cpu"] = phase_idle_cpu(cfg, work)
        if "pubdeliver" not in skip:
            log(f"publish-and-delivery: {cfg.pd_rate}/s over {cfg.pd_topics} topics x 1 ws subscriber, {cfg.pd_shapes}")
            parts["pubdeliver"] = phase_pubdeliver(cfg, work)
        if "topics" not in skip:
            log(f"topics: pre-populating {cfg.topics_large} topics, then {cfg.topics_small} vs {cfg.topics_large}")
            parts["topics"] = phase_topics(cfg, work)
        if "store" not in skip:
            log("store: the embedded store's publish transactions vs bare SQLite, alternating")
            parts["store"] = st = phase_store(cfg, work)
            log(
                "  store: "
                + ", ".join(f"{s / b:.2f}" for s, b in zip(st.store_per_s, st.baseline_per_s, strict=True))
                + " x bare SQLite per round"
            )
        if "authlimits" not in skip:
            log(
                f"auth and limits on vs off: all-in-one, {cfg.al_pairs} pairs of {cfg.al_secs:g}s publish-only windows, "
                f"{cfg.ingest_conns} connections, {cfg.ingest_topics} topics"
            )
            parts["authlimits"] = phase_authlimits(cfg, work)
        if "idle" not in skip:
            log(f"idle memory: {cfg.idle_n} connections per kind ({cfg.idle_kinds})")
            parts["idle"] = phase_idle(cfg)
    except KeyboardInterrupt:
        log("interrupted: stopping everything this bench started")
        parts["interrupted"] = True
    finally:
        harness.stop_helpers()
        procs.stop_all()
        if stalls and not parts.get("interrupted"):
            with contextlib.suppress(OSError):
                stalls.append(_stall_probe(work, cfg.stall_secs, "end"))
        shutil.rmtree(work, ignore_errors=True)
        busy1, _ = machine_busy()
        own = own_cpu() - own0
        wall = time.monotonic() - started
        ncpu = os.cpu_count() or 1
        machine_cpu = (busy1 - busy0) / procs.TICK
        noise = Noise(
            wall_secs=round(wall, 1),
            machine_busy_cpu_secs=round(machine_cpu, 1),
            bench_cpu_secs=round(own, 1),
            others_cpu_pct_of_machine=round(100 * max(0.0, machine_cpu - own) / (wall * ncpu), 1),
            loadavg_end=loadavg(),
            disk_stalls=stalls,
        )
    res = Results(
        mode=mode, config=msgspec.to_builtins(cfg), goals=GOALS, machine=m, started_at=started_at, noise=noise, **parts
    )
    res.summary = report.summarize(res)
    (out / "results.json").write_bytes(schema.encode(res))
    md = report.render(res)
    (out / "summary.md").write_text(md)
    print(md)
    log(f"done in {noise.wall_secs:.0f}s; results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
