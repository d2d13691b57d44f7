"""scaling: the all-in-one's knee with UPF_WORKERS=1 and 2 and the split shape's, found with bench/kneegen
(a Go load generator), and each shape at half and at twice its knee.

Why a second generator: on two cores the Python ``upf-loadgen`` spends about as much CPU per publish
and delivery as the server, so every ``sweep`` up to 10,000/s ended with its offered rate behind, not
the server's, and the scaling figure stayed a lower bound. kneegen does the same load (one awaited
publisher and one ws subscriber per topic, loadgen's bodies, loss / duplicate / order checks) for 16-45 us
of CPU per publish and delivery near the knee, and 30-90 us at 2,000-6,000/s, where its timers and idle
wake-ups are spread over fewer publishes (each step records it: ``kneegen_cpu_us_per_publish``; it runs
on the same cores as the server). Each step is a fresh kneegen run on fresh topics against one server;
the sweep stops at the first step that fails loadgen's knee rule (``find_knee``: offered or delivered
more than ``tolerance`` behind the rate, p99 over the bound) or has a violation. Then one run at half
the knee (the issue's p99 goal) and one at twice it (no violation, however far behind): the ``rounds``
phase runs those rates from the Python loadgen's knees, which its own CPU caps below the server's."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from harness import BODY, Shape, log
from procs import tree_cpu
from schema import Config, KneegenStep, Scaling, ScalingSweep

KNEEGEN_SRC = Path(__file__).resolve().parent.parent / "kneegen"
_P99_BOUND_MS = 250.0
_TOLERANCE = 0.05


def build_kneegen(cache: Path | None = None) -> Path | None:
    """The kneegen binary, built once per source (cached by its hash); None without a Go toolchain."""
    go = shutil.which("go")
    if go is None:
        return None
    digest = hashlib.sha256()
    for f in sorted(KNEEGEN_SRC.glob("*")):
        digest.update(f.name.encode() + f.read_bytes())
    cache = cache or Path.home() / ".cache" / "upf-bench"
    binary = cache / f"kneegen-{digest.hexdigest()[:16]}"
    if not binary.exists():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = binary.with_suffix(".tmp")
        subprocess.run([go, "build", "-o", str(tmp), "."], cwd=KNEEGEN_SRC, check=True, timeout=300)
        tmp.replace(binary)
    return binary


def run_step(binary: Path, shape: Shape, rate: int, topics: int, secs: float, prefix: str) -> KneegenStep:
    """One kneegen run at ``rate``, priced by the server's CPU over the whole run (connects, publishing
    and drain; the publishing seconds dominate), and by each role's over the publishing and drain
    alone (between kneegen's "publishing" and "drained" lines): the split pusher's frames per
    CPU-second are that window's, as loadgen's steady windows give them."""
    roles = {name: p.pid for name, p in shape.roles.items()}
    argv = [
        str(binary),
        "-writer",
        shape.writer,
        "-pusher",
        shape.pusher,
        "-topics",
        str(topics),
        "-rate",
        str(rate),
        "-duration",
        str(secs),
        "-message-size",
        str(BODY),
        "-prefix",
        prefix,
    ]
    cpu0, t0 = tree_cpu(list(roles.values())), time.monotonic()
    marks: dict[str, tuple[float, dict[str, float]]] = {}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.read() if proc.stdout else ""), daemon=True)
    reader.start()
    killer = threading.Timer(secs + 180, proc.kill)
    killer.start()
    err: list[str] = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            mark = line.strip().removeprefix("kneegen: ")
            if mark in ("publishing", "drained"):
                marks[mark] = (time.monotonic(), {n: tree_cpu([pid]) for n, pid in roles.items()})
            else:
                err.append(line)
        code = proc.wait()
        reader.join()
    finally:
        killer.cancel()
    cpu1, wall = tree_cpu(list(roles.values())), time.monotonic() - t0
    if code != 0:
        raise RuntimeError(f"kneegen at {rate}/s exited {code}: {''.join(err).strip()[-500:]}")
    r = json.loads(out[0])
    served = r["accepted_per_s"] * r["secs"]
    step = KneegenStep(
        rate=rate,
        offered_per_s=round(r["offered_per_s"], 1),
        accepted_per_s=round(r["accepted_per_s"], 1),
        delivered_per_s=round(r["delivered_per_s"], 1),
        p50_ms=round(r["p50_ms"], 2),
        p99_ms=round(r["p99_ms"], 2),
        violations=sum(r["violations"].values()),
        undelivered=r["undelivered"],
        errors=sum(r["errors"].values()),
        server_cpu_pct=round(100 * (cpu1 - cpu0) / wall, 1),
        server_cpu_us_per_publish=round((cpu1 - cpu0) / served * 1e6, 1) if served else None,
        kneegen_cpu_us_per_publish=round(r["cpu_secs"] / served * 1e6, 1) if served else None,
        reasons=knee_reasons(rate, r),
    )
    if "publishing" in marks and "drained" in marks:
        (a, before), (b, after) = marks["publishing"], marks["drained"]
        step.window_secs = round(b - a, 2)
        step.role_cpu_secs = {n: round(after[n] - before[n], 3) for n in roles}
        delivered = r["delivered_per_s"] * r["secs"]
        pusher = step.role_cpu_secs.get("pusher")
        if pusher and delivered and shape.kind == "split":
            step.pusher_frames_per_cpu_sec = round(delivered / pusher)
    return step


def knee_reasons(rate: int, r: dict[str, Any]) -> list[str]:
    """Why a kneegen report at ``rate`` fails loadgen's knee rule (``find_knee``), or a violation: none
    if it held. Offered falls behind when the server's publish latency exceeds a topic's period."""
    reasons = []
    floor = rate * (1 - _TOLERANCE)
    if r["offered_per_s"] < floor:
        reasons.append(f"offered {r['offered_per_s']:.0f}/s (each topic awaits its publish: the server's latency)")
    if r["delivered_per_s"] < floor:
        reasons.append(f"delivered {r['delivered_per_s']:.0f}/s < {100 * (1 - _TOLERANCE):.0f}% of {rate}/s")
    if r["p99_ms"] > _P99_BOUND_MS:
        reasons.append(f"p99 {r['p99_ms']:.1f} ms > {_P99_BOUND_MS:g} ms")
    bad = {k: v for k, v in r["violations"].items() if v}
    if bad or r["undelivered"]:
        reasons.append(f"violations {bad}, undelivered {r['undelivered']}")
    return reasons


def _step(binary: Path, shape: Shape, rate: int, cfg: Config, prefix: str, label: str) -> KneegenStep:
    """``run_step``, logged; a run that could not finish (its subscribers refused, no report) fails
    the rate with the reason: the knee, said as it is, not the end of the bench."""
    try:
        s = run_step(binary, shape, rate, cfg.lg_topics, cfg.sweep_secs, prefix)
    except (RuntimeError, ValueError, KeyError, subprocess.TimeoutExpired) as exc:
        s = KneegenStep(
            rate=rate, offered_per_s=0, accepted_per_s=0, delivered_per_s=0, p50_ms=0, p99_ms=0,
            violations=0, undelivered=0, errors=0, server_cpu_pct=0, reasons=[f"kneegen failed: {exc}"],
        )  # fmt: skip
    shape.check_alive()
    log(
        f"  scaling {shape.kind} {label}{rate}/s: offered {s.offered_per_s:,.0f}, delivered {s.delivered_per_s:,.0f}, "
        f"p99 {s.p99_ms} ms, server {s.server_cpu_pct}% of a core, kneegen {s.kneegen_cpu_us_per_publish} us"
        + (f": {'; '.join(s.reasons)}" if s.reasons else "")
    )
    return s


def sweep(binary: Path, kind: str, cfg: Config, work: Path) -> ScalingSweep:
    shape = Shape(kind, work)
    steps: list[KneegenStep] = []
    half = twice = None
    try:
        for i, rate in enumerate(cfg.scaling_rates):
            s = _step(binary, shape, rate, cfg, f"kg{i}x", "")
            steps.append(s)
            if s.reasons:
                break
            time.sleep(1)
        if steps:
            # The knee as loadgen's sweeps take it (``report.knee_rate``): the first rate that failed,
            # else the last (a lower bound).
            knee = steps[-1].rate
            time.sleep(1)
            half = _step(binary, shape, knee // 2, cfg, "kgh", "half the knee: ")
            time.sleep(1)
            twice = _step(binary, shape, knee * 2, cfg, "kgt", "twice the knee: ")
    finally:
        shape.stop()
    failed = steps[-1] if steps and steps[-1].reasons else None
    good = [s.rate for s in steps if not s.reasons]
    return ScalingSweep(
        shape=kind,
        knee=failed.rate if failed else None,
        last_good_rate=good[-1] if good else None,
        steps=steps,
        half_knee=half,
        twice_knee=twice,
    )


def phase_scaling(cfg: Config, work: Path) -> Scaling | None:
    try:
        binary = build_kneegen()
    except (OSError, subprocess.SubprocessError) as exc:
        log(f"scaling: kneegen did not build ({exc}); the phase is skipped")
        return None
    if binary is None:
        log("scaling: no Go toolchain on PATH to build bench/kneegen; the phase is skipped")
        return None
    sweeps = {}
    for kind in ("allinone", "allinone_w2", "split"):
        log(f"scaling {kind}: kneegen at {cfg.scaling_rates}/s x {cfg.sweep_secs}s, {cfg.lg_topics} topics")
        sweeps[kind] = sweep(binary, kind, cfg, work)
    return Scaling(sweeps=sweeps, p99_bound_ms=_P99_BOUND_MS, tolerance=_TOLERANCE)
