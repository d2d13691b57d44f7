"""UPF's benchmark: one command, figures and ratios measured in one run on this machine.

    cd /work/main && python3 -m uv run python bench/run.py            # ~12-15 min, writes bench/results/
    python3 -m uv run python bench/run.py --quick                     # ~3 min, writes bench/results/quick/

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
The sweep also runs against the all-in-one with UPF_WORKERS=2 (scaling: the knee of 1 vs 2 workers),
and each round runs Pushpin (bench/pushpin_peer.py) as a fan-out peer beside the bare broadcast.

Every process it starts is stopped at the end (by the PIDs it started). Loopback only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import broadcast  # noqa: E402
import procs  # noqa: E402
import pushpin_peer  # noqa: E402
from procs import PY, REPO, tree_cpu, tree_rss_kb  # noqa: E402

BENCH = REPO / "bench"
LOADGEN = str(Path(PY).parent / "upf-loadgen")
IDLE_MEMORY = REPO / "services" / "pusher" / "bench" / "idle_memory.py"
SERVER_CPUS = {0}
DRIVER_CPUS = {1}
BODY = 100  # bytes of every published body (loadgen --message-size, pubdrive --body-size)

FULL = dict(
    rounds=3,
    ingest_secs=5.0,
    ingest_conns=64,
    ingest_topics=1000,
    bcast_n=1000,
    bcast_secs=4.0,
    lg_topics=1000,
    sweep_rates=[250, 500, 750, 1000, 1500, 2000, 3000],
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
)
QUICK = {
    **FULL,  # a smoke run: the same phases, shorter and coarser
    "rounds": 1,
    "ingest_secs": 3.0,
    "bcast_secs": 3.0,
    "lg_topics": 500,
    "sweep_rates": [500, 1000, 2000, 4000],
    "sweep_secs": 3.0,
    "sweep_rounds": 1,
    "fixed_secs": 4.0,
    "topics_large": 20_000,
    "topics_secs": 3.0,
    "topics_rounds": 1,
    "idle_kinds": "baseline,ws",
    "idle_rounds": 1,
    "idle_max_n": 0,
    "idle_cpu_secs": 15.0,
    "idle_cpu_n": 2000,
    "pd_secs": 5.0,
    "pp_channels": 5,
    "pp_streams": 20,
    "pp_rate": 200,
}

GOALS = {
    "writer_vs_bare": 0.5,
    "pusher_vs_broadcast": 0.5,
    "p99_half_knee_ms": 50.0,
    "idle_kb": 16.0,
    "topics_ratio": 1.2,
    "idle_cpu_pct_0": 0.2,
    "idle_cpu_pct_n": 1.0,
    "cpu_us_per_publish_and_delivery": 250.0,
}


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def med(xs: list[float]) -> float:
    xs = [x for x in xs if x is not None]
    return round(statistics.median(xs), 3) if xs else float("nan")


def spread(xs: list[float]) -> list[float]:
    xs = [x for x in xs if x is not None]
    return [round(min(xs), 1), round(max(xs), 1)] if xs else []


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    with open("/proc/stat") as f:
        parts = [int(x) for x in f.readline().split()[1:]]
    idle = parts[3] + parts[4]
    return sum(parts) - idle, sum(parts)


def own_cpu() -> float:
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


# --------------------------------------------------------------------------------------------- servers
class Shape:
    """A running UPF: the all-in-one program (``allinone``: one process; ``allinone_wN``: UPF_WORKERS=N),
    or the split writer + pusher on one store file."""

    def __init__(self, kind: str, workdir: Path, cpus: set[int] | None = None, **extra: str) -> None:
        self.kind = kind
        self.dir = Path(tempfile.mkdtemp(prefix=f"{kind}-", dir=workdir))
        store = self.dir / "upf.db"
        self.roles: dict[str, procs.Proc] = {}
        if kind.startswith("allinone"):
            workers = kind.partition("_w")[2] or "1"
            p, port = procs.start_upf_allinone(self.dir, store, cpus, UPF_WORKERS=workers, **extra)
            if int(workers) > 1:
                wait_workers(p, port, int(workers))
            self.roles["upf"] = p
            self.writer = self.pusher = f"http://127.0.0.1:{port}"
        elif kind == "split":
            w, wport = procs.start_upf_writer(self.dir, store, cpus)
            p, pport = procs.start_upf_pusher(self.dir, store, cpus)
            self.roles.update(writer=w, pusher=p)
            self.writer, self.pusher = f"http://127.0.0.1:{wport}", f"http://127.0.0.1:{pport}"
        elif kind == "writer":
            w, wport = procs.start_upf_writer(self.dir, store, cpus)
            self.roles["writer"] = w
            self.writer = self.pusher = f"http://127.0.0.1:{wport}"
        else:
            raise ValueError(kind)

    def cpu(self) -> dict[str, float]:
        return {name: tree_cpu([p.pid]) for name, p in self.roles.items()}

    def worker_cpu(self) -> list[float]:
        """CPU seconds of each worker process of an all-in-one with UPF_WORKERS > 1 (empty otherwise)."""
        if "upf" not in self.roles:
            return []
        return [tree_cpu([pid]) for pid in procs.children(self.roles["upf"].pid)]

    def thread_cpu(self) -> dict[str, float]:
        return procs.tree_thread_cpu([p.pid for p in self.roles.values()])

    def rss_kb(self, field: str = "VmRSS:") -> dict[str, int]:
        return {name: tree_rss_kb([p.pid], field) for name, p in self.roles.items()}

    def check_alive(self) -> None:
        for name, p in self.roles.items():
            if not p.alive():
                raise RuntimeError(f"{self.kind}: {name} died: {p.log_tail()}")

    def stop(self) -> None:
        for p in self.roles.values():
            p.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def wait_workers(p: procs.Proc, port: int, n: int, timeout: float = 60.0) -> None:
    """Until every worker of a supervisor listens on the port (the first one answering is not enough)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        kids = procs.children(p.pid)
        if len(kids) == n and all(procs.listens(k, port) for k in kids):
            return
        if not p.alive():
            raise RuntimeError(f"upf exited: {p.log_tail()}")
        time.sleep(0.2)
    raise TimeoutError(f"{n} workers not listening: {p.log_tail()}")


_POPENS: list[subprocess.Popen[str]] = []
"""Every helper process this bench started (each in its own process group), for the final clean-up."""


def spawn_pinned(argv: list[str], cpus: set[int] | None, **kw: Any) -> subprocess.Popen[str]:
    def pre() -> None:
        if cpus:
            os.sched_setaffinity(0, cpus)

    p = subprocess.Popen(argv, preexec_fn=pre, text=True, start_new_session=True, **kw)
    _POPENS.append(p)
    return p


def run_to_end(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Like subprocess.run, but in its own process group, so an interrupt stops its children too."""
    p = spawn_pinned(argv, None, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = p.communicate(timeout=timeout)
    except BaseException:
        stop_popen(p)
        raise
    return subprocess.CompletedProcess(argv, p.returncode, out, err)


def stop_helpers() -> None:
    for p in _POPENS:
        stop_popen(p)
    _POPENS.clear()


def stop_popen(p: subprocess.Popen[str]) -> None:
    if p.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(5)


# --------------------------------------------------------------------------------------------- drivers
def pubdrive(url: str, roots: list[int], *, secs: float, conns: int, topics: int, prefix: str = "upBENCH") -> dict[str, Any]:
    """Run bench/pubdrive.py pinned to the driver CPU; snapshot the server trees' CPU on its start and
    stop lines, so only the measured window counts."""
    argv = [PY, str(BENCH / "pubdrive.py"), "--url", url, "--duration", str(secs), "--connections", str(conns),
            "--topics", str(topics), "--topic-prefix", prefix, "--body-size", str(BODY)]
    p = spawn_pinned(argv, DRIVER_CPUS, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert p.stdout is not None
        cpu0 = cpu1 = 0.0
        busy0 = busy1 = 0
        result: dict[str, Any] = {}
        for line in p.stdout:
            line = line.strip()
            if line == "start":
                cpu0, busy0 = tree_cpu(roots), machine_busy()[0]
            elif line == "stop":
                cpu1, busy1 = tree_cpu(roots), machine_busy()[0]
            elif line.startswith("{"):
                result = json.loads(line)
        p.wait(30)
        if not result:
            raise RuntimeError(f"pubdrive failed: {p.stderr.read() if p.stderr else ''}")
    finally:
        stop_popen(p)
    cpu = cpu1 - cpu0
    others = (busy1 - busy0) / procs.TICK - cpu - result["driver_cpu_pct"] / 100 * result["secs"]
    result["others_cpu_pct_of_machine"] = round(max(0.0, 100 * others / (result["secs"] * (os.cpu_count() or 1))), 1)
    result["server_cpu_secs"] = round(cpu, 3)
    result["server_cpu_pct"] = round(100 * cpu / result["secs"], 1)
    result["cpu_us_per_publish"] = round(1e6 * cpu / result["ok"], 1) if result["ok"] else None
    return result


_LIVE = re.compile(r"^\s*([\d.]+)s (load|drain)\s+offered\s+(\d+)/s\s+accepted\s+(\d+)/s\s+delivered\s+(\d+)/s")


class LoadgenRun:
    """``upf-loadgen run|sweep ... --json -`` as a subprocess. Its stderr (the live line, once a second,
    and a sweep's step lines) is read line by line and each line is stamped with the server roles' CPU
    and RSS at that moment, so a run can be priced over its publishing seconds only and a sweep step
    by step."""

    def __init__(self, argv: list[str], shape: Shape) -> None:
        self.shape = shape
        self.events: list[dict[str, Any]] = []
        self.stderr_tail: list[str] = []
        self.out: list[str] = []
        self.cpu0 = shape.cpu()
        self.t0 = time.monotonic()
        self.p = spawn_pinned([LOADGEN, *argv, "--json", "-"], None, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self._threads = [threading.Thread(target=self._read_err, daemon=True), threading.Thread(target=self._read_out, daemon=True)]
        for t in self._threads:
            t.start()

    def _read_out(self) -> None:
        assert self.p.stdout is not None
        self.out.append(self.p.stdout.read())

    def _read_err(self) -> None:
        assert self.p.stderr is not None
        for line in self.p.stderr:
            line = line.rstrip("\n")
            self.stderr_tail = (self.stderr_tail + [line])[-40:]
            ev: dict[str, Any] | None = None
            m = _LIVE.match(line)
            if m:
                ev = {"kind": "live", "lt": float(m.group(1)), "phase": m.group(2), "accepted": int(m.group(4)),
                      "delivered": int(m.group(5))}
            elif line.startswith("sweep step:"):
                ev = {"kind": "step"}
            elif line.startswith("sweep point:"):
                ev = {"kind": "point"}
            if ev is not None:
                ev.update(t=time.monotonic(), cpu=self.shape.cpu(), rss_kb=self.shape.rss_kb())
                self.events.append(ev)

    def wait(self, timeout: float) -> dict[str, Any]:
        try:
            self.p.wait(timeout)
        except subprocess.TimeoutExpired as exc:
            stop_popen(self.p)
            raise RuntimeError("loadgen did not finish in time: " + "\n".join(self.stderr_tail)) from exc
        for t in self._threads:
            t.join(5)
        self.cpu1 = self.shape.cpu()
        self.secs = time.monotonic() - self.t0
        try:
            return json.loads("".join(self.out))
        except json.JSONDecodeError as exc:
            raise RuntimeError(f"loadgen exit {self.p.returncode}: " + "\n".join(self.stderr_tail)) from exc


def steady(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Price the publishing seconds only: from the first to the last live line of the load phase
    (subscriber connects before, and the drain and closes after, are left out). Counts are the live
    line's per-second rates times the seconds between lines."""
    load = [e for e in events if e["kind"] == "live" and e["phase"] == "load"]
    if len(load) < 2:
        return None
    acc = dlv = 0.0
    for prev, cur in zip(load, load[1:]):
        span = cur["lt"] - prev["lt"]
        acc += cur["accepted"] * span
        dlv += cur["delivered"] * span
    cpu = {k: load[-1]["cpu"][k] - load[0]["cpu"][k] for k in load[0]["cpu"]}
    return {"secs": round(load[-1]["lt"] - load[0]["lt"], 2), "accepted": round(acc), "delivered": round(dlv), "cpu": cpu}


def lg_common(shape: Shape, topics: int, secs: float) -> list[str]:
    return ["--writer", shape.writer, "--pusher", shape.pusher, "--topics", str(topics), "--duration", str(secs),
            "--message-size", str(BODY), "--transport", "ws", "--drain-timeout", "60"]


def summarize_run(r: dict[str, Any]) -> dict[str, Any]:
    th, lat, v = r["throughput"], r["latency"], r["violations"]
    return {
        "rate": r["scenario"]["rate"],
        "verdict": r["verdict"],
        "offered": th["offered"],
        "accepted": th["accepted"],
        "delivered": th["delivered"],
        "expected": th["expected_deliveries"],
        "offered_per_s": th["offered_per_s"],
        "accepted_per_s": th["accepted_per_s"],
        "delivered_per_s": th["delivered_per_s"],
        "rejected": th["rejected"],
        "errors": th["errors"],
        "p50_ms": lat["p50_ms"],
        "p99_ms": lat["p99_ms"],
        "max_ms": lat["max_ms"],
        "publish_p99_ms": r["publish_latency"]["p99_ms"],
        "drain_secs": r["drain"]["secs"],
        "drain_complete": r["drain"]["complete"],
        "violations": v,
        "violations_total": sum(v.values()),
        "disconnects": r["subscriptions"]["disconnects"],
        "loadgen_cpu_pct": r["cpu"]["pct_of_wall"],
        "loadgen_saturated": r["cpu"]["saturated"],
    }


def price(acc: int, dlv: int, cpu: dict[str, float]) -> dict[str, Any]:
    """CPU per accepted publish / per delivered message, by role and in total."""
    out: dict[str, Any] = {"accepted": acc, "delivered": dlv, "server_cpu_secs": {k: round(v, 3) for k, v in cpu.items()}}
    total = sum(cpu.values())
    out["cpu_us_per_publish_total"] = round(1e6 * total / acc, 1) if acc else None
    if "writer" in cpu and acc:
        out["writer_cpu_us_per_publish"] = round(1e6 * cpu["writer"] / acc, 1)
    if "pusher" in cpu and dlv:
        out["pusher_cpu_us_per_delivery"] = round(1e6 * cpu["pusher"] / dlv, 1)
        out["pusher_frames_per_cpu_sec"] = round(dlv / cpu["pusher"], 1) if cpu["pusher"] > 0 else None
    if "upf" in cpu and dlv:
        out["allinone_frames_per_cpu_sec"] = round(dlv / cpu["upf"], 1) if cpu["upf"] > 0 else None
    return out


def price_run(s: dict[str, Any], events: list[dict[str, Any]], cpu_whole: dict[str, float]) -> None:
    """Attach ``whole`` (the whole loadgen run: connects, publishing, drain) and ``steady`` (the
    publishing seconds only) prices to a run summary."""
    s["whole"] = price(s["accepted"], s["delivered"], cpu_whole)
    st = steady(events)
    s["steady"] = price(st["accepted"], st["delivered"], st["cpu"]) if st else {}
    if st:
        s["steady"]["secs"] = st["secs"]


# --------------------------------------------------------------------------------------------- phases
def phase_probe(work: Path) -> int:
    """The length of the text frame UPF's pusher sends for one loadgen-sized publish (14-char topic)."""
    import asyncio

    import httpx
    from websockets.asyncio.client import connect

    shape = Shape("allinone", work)
    try:
        async def go() -> int:
            port = shape.writer.rsplit(":", 1)[1]
            async with connect(f"ws://127.0.0.1:{port}/upPROBEabc00001/ws", compression=None) as ws:
                await ws.recv()  # open
                body = ("lg:0:1764450000000000000:" + "abcdefghijklmnopqrstuvwxyz0123456789" * 3)[:BODY]
                async with httpx.AsyncClient() as c:
                    r = await c.post(f"{shape.writer}/upPROBEabc00001", content=body, headers={"content-type": "text/plain"})
                    r.raise_for_status()
                m = await asyncio.wait_for(ws.recv(), 10)
                return len(m.encode() if isinstance(m, str) else m)

        return asyncio.run(go())
    finally:
        shape.stop()


def phase_sweep(kind: str, cfg: dict[str, Any], work: Path, out: Path, n: int = 1) -> dict[str, Any]:
    shape = Shape(kind, work)
    try:
        idle_rss = shape.rss_kb()
        rates = ",".join(str(r) for r in cfg["sweep_rates"])
        png = out / f"sweep-{kind}-{n}.png"
        argv = ["sweep", *lg_common(shape, cfg["lg_topics"], cfg["sweep_secs"]), "--rates", rates, "--pause", "1",
                "--plot", str(png)]
        lg = LoadgenRun(argv, shape)
        rep = lg.wait(timeout=len(cfg["sweep_rates"]) * (cfg["sweep_secs"] + 90) + 60)
        shape.check_alive()
        if png.exists():
            shrink_png(png)
        marks = [i for i, e in enumerate(lg.events) if e["kind"] in ("step", "point")]
        windows = []  # (step event index, point event index) per completed step
        for i, j in zip(marks, marks[1:]):
            if lg.events[i]["kind"] == "step" and lg.events[j]["kind"] == "point":
                windows.append((i, j))
        rows = []
        for n, run in enumerate(rep.get("runs", [])):
            s = summarize_run(run)
            if n < len(windows):
                i, j = windows[n]
                cpu = {k: lg.events[j]["cpu"][k] - lg.events[i]["cpu"][k] for k in lg.events[i]["cpu"]}
                price_run(s, lg.events[i : j + 1], cpu)
                s["rss_kb"] = lg.events[j]["rss_kb"]
            rows.append(s)
        knee = rep.get("knee")
        return {
            "shape": kind,
            "rates": cfg["sweep_rates"],
            "knee": knee,
            "p99_bound_ms": rep.get("p99_bound_ms"),
            "tolerance": rep.get("tolerance"),
            "exit_code": rep.get("exit_code"),
            "plot": (str(png.relative_to(REPO)) if png.is_relative_to(REPO) else str(png)) if png.exists() else "",
            "idle_rss_kb": idle_rss,
            "end_rss_kb": shape.rss_kb(),
            "peak_rss_kb": shape.rss_kb("VmHWM:"),
            "steps": rows,
        }
    finally:
        shape.stop()


def shrink_png(path: Path) -> None:
    """loadgen's plot is an 800x800 RGBA PNG of ~100 KB; a 64-colour palette keeps it legible at ~25 KB,
    small enough to commit. Best effort: left as it is without Pillow."""
    try:
        from PIL import Image

        with Image.open(path) as im:
            q = im.convert("RGB").quantize(colors=64, method=Image.Quantize.MEDIANCUT)
        q.save(path, optimize=True)
    except Exception as exc:  # noqa: BLE001 - a cosmetic step
        log(f"could not shrink {path}: {exc}")


def knee_rate(sweep: dict[str, Any]) -> float:
    """The sweep's knee (loadgen: the first offered rate that failed the rule); the last rate if
    every step held up (then it is a lower bound)."""
    k = sweep.get("knee")
    if k:
        return float(k["rate"])
    return float(sweep["rates"][-1])


def knee_of(sweeps: list[dict[str, Any]]) -> float:
    """The lower knee of a shape's sweeps: on a shared machine one sweep can be lucky."""
    return min(knee_rate(s) for s in sweeps)


def ingest_round(cfg: dict[str, Any], work: Path) -> dict[str, Any]:
    res: dict[str, Any] = {}
    kw = dict(secs=cfg["ingest_secs"], conns=cfg["ingest_conns"], topics=cfg["ingest_topics"])
    p, port = procs.start_bare_asgi(work, SERVER_CPUS)
    try:
        res["bare_asgi"] = pubdrive(f"http://127.0.0.1:{port}", [p.pid], **kw)
        res["bare_asgi"]["rss_kb"] = tree_rss_kb([p.pid])
    finally:
        p.stop()
    for kind in ("writer", "allinone"):
        shape = Shape(kind, work, SERVER_CPUS)
        try:
            roots = [r.pid for r in shape.roles.values()]
            res[f"upf_{kind}"] = pubdrive(shape.writer, roots, **kw)
            res[f"upf_{kind}"]["rss_kb"] = sum(shape.rss_kb().values())
            shape.check_alive()
        finally:
            shape.stop()
    return res


def broadcast_round(cfg: dict[str, Any], payload: int) -> dict[str, Any]:
    return broadcast.run(cfg["bcast_n"], payload, cfg["bcast_secs"], SERVER_CPUS, DRIVER_CPUS,
                         cpu_reader=lambda pid: tree_cpu([pid]))


def fixed_round(kind: str, cfg: dict[str, Any], work: Path, half: float, double: float) -> dict[str, Any]:
    shape = Shape(kind, work)
    out: dict[str, Any] = {}
    try:
        for label, rate in (("half_knee", half), ("twice_knee", double)):
            argv = ["run", *lg_common(shape, cfg["lg_topics"], cfg["fixed_secs"]), "--rate", str(round(rate))]
            lg = LoadgenRun(argv, shape)
            rep = lg.wait(timeout=cfg["fixed_secs"] + 180)
            shape.check_alive()
            s = summarize_run(rep)
            price_run(s, lg.events, {k: lg.cpu1[k] - lg.cpu0[k] for k in lg.cpu0})
            s["rss_kb"] = shape.rss_kb()
            out[label] = s
            time.sleep(1)
        out["peak_rss_kb"] = shape.rss_kb("VmHWM:")
    finally:
        shape.stop()
    return out


def fanout_round(cfg: dict[str, Any], work: Path) -> dict[str, Any]:
    """The split shape with many subscribers per topic (the pusher's closest analogue of a broadcast):
    each publish is delivered to ``fanout_subs`` connections."""
    shape = Shape("split", work)
    try:
        argv = ["run", *lg_common(shape, cfg["fanout_topics"], cfg["fixed_secs"]), "--subs-per-topic", str(cfg["fanout_subs"]),
                "--rate", str(cfg["fanout_rate"])]
        lg = LoadgenRun(argv, shape)
        rep = lg.wait(timeout=cfg["fixed_secs"] + 180)
        shape.check_alive()
        s = summarize_run(rep)
        price_run(s, lg.events, {k: lg.cpu1[k] - lg.cpu0[k] for k in lg.cpu0})
        s["subs_per_topic"] = cfg["fanout_subs"]
        s["topics"] = cfg["fanout_topics"]
        s["rss_kb"] = shape.rss_kb()
        return s
    finally:
        shape.stop()


def phase_topics(cfg: dict[str, Any], work: Path) -> dict[str, Any]:
    d = Path(tempfile.mkdtemp(prefix="topics-", dir=work))
    store = d / "upf.db"
    t0 = time.monotonic()
    r = run_to_end([PY, str(BENCH / "prepopulate.py"), "--store", str(store), "--topics", str(cfg["topics_large"]),
                    "--prefix", "upTOPIC"], timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"prepopulate failed: {r.stderr[-2000:]}")
    prepop_secs = time.monotonic() - t0
    store_mb = sum(f.stat().st_size for f in d.glob("upf.db*")) / 1e6
    w, port = procs.start_upf_writer(d, store, SERVER_CPUS)
    rounds: list[dict[str, Any]] = []
    try:
        # one short warm-up window so the first measured window is not the one paying for imports
        pubdrive(f"http://127.0.0.1:{port}", [w.pid], secs=1.0, conns=cfg["ingest_conns"], topics=cfg["topics_small"], prefix="upTOPIC")
        for r in range(cfg["topics_rounds"]):
            order = ("small", "large") if r % 2 == 0 else ("large", "small")
            row: dict[str, Any] = {}
            for which in order:
                n = cfg[f"topics_{which}"]
                row[which] = pubdrive(f"http://127.0.0.1:{port}", [w.pid], secs=cfg["topics_secs"], conns=cfg["ingest_conns"],
                                      topics=n, prefix="upTOPIC")
            rounds.append(row)
            log(f"topics round {r + 1}: {cfg['topics_small']} topics {row['small']['cpu_us_per_publish']} us/publish, "
                f"{cfg['topics_large']} topics {row['large']['cpu_us_per_publish']} us/publish")
        rss = tree_rss_kb([w.pid])
    finally:
        w.stop()
        shutil.rmtree(d, ignore_errors=True)
    small = med([r["small"]["cpu_us_per_publish"] for r in rounds])
    large = med([r["large"]["cpu_us_per_publish"] for r in rounds])
    return {
        "small_topics": cfg["topics_small"],
        "large_topics": cfg["topics_large"],
        "prepopulated_topics": cfg["topics_large"],
        "prepopulate_secs": round(prepop_secs, 1),
        "store_mb_before": round(store_mb, 1),
        "subscribers_held": False,
        "writer_rss_kb_end": rss,
        "rounds": rounds,
        "small_cpu_us_per_publish": small,
        "large_cpu_us_per_publish": large,
        "small_ok_per_s": med([r["small"]["ok_per_s"] for r in rounds]),
        "large_ok_per_s": med([r["large"]["ok_per_s"] for r in rounds]),
        "ratio_large_over_small": round(large / small, 3) if small else None,
    }


_IDLE_LINE = re.compile(r"^(\w+)\s+([\d.]+) MB\s+([\d.]+) MB\s+([\d.]+) KB")


def idle_memory(n: int, kinds: str) -> dict[str, dict[str, float]]:
    r = run_to_end([PY, str(IDLE_MEMORY), "--n", str(n), "--kinds", kinds], timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"idle_memory.py failed: {r.stderr[-2000:]}")
    out = {}
    for line in r.stdout.splitlines():
        m = _IDLE_LINE.match(line.strip())
        if m:
            out[m.group(1)] = {"rss_before_mb": float(m.group(2)), "rss_after_mb": float(m.group(3)), "kb_per_conn": float(m.group(4))}
    return out


def cpu_pct_over(shape: Shape, secs: float) -> float:
    """CPU of all of a shape's processes over ``secs`` of wall time, in % of one core."""
    c0, t0 = sum(shape.cpu().values()), time.monotonic()
    time.sleep(secs)
    c1, t1 = sum(shape.cpu().values()), time.monotonic()
    return round(100 * (c1 - c0) / (t1 - t0), 3)


def hold_idle_ws(port: int, n: int) -> subprocess.Popen[str]:
    """``n`` idle ws subscribers (one topic each) from idle_memory.py's client, held until stopped."""
    p = spawn_pinned([PY, str(IDLE_MEMORY), "--client", "ws", "--port", str(port), "--n", str(n), "--start", "0"],
                     None, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None
    line = p.stdout.readline()
    if not line.startswith("ready"):
        stop_popen(p)
        raise RuntimeError(f"idle clients failed: {line!r} {p.stderr.read() if p.stderr else ''}")
    return p


def phase_idle_cpu(cfg: dict[str, Any], work: Path) -> dict[str, Any]:
    """The all-in-one at rest, default timers (keepalives, safety poll, heartbeat, janitor): CPU % of a
    core with no connection, then with ``idle_cpu_n`` idle ws subscribers; a fresh server per worker count."""
    secs, n = cfg["idle_cpu_secs"], cfg["idle_cpu_n"]
    out: dict[str, Any] = {"secs": secs, "n": n, "by_workers": {}}
    for workers in cfg["idle_cpu_workers"]:
        shape = Shape(f"allinone_w{workers}", work)
        try:
            time.sleep(3)  # start-up work (imports, first heartbeat, first janitor pass) out of the window
            zero = cpu_pct_over(shape, secs)
            clients = hold_idle_ws(int(shape.pusher.rsplit(":", 1)[1]), n)
            try:
                time.sleep(3)  # the subscribes' writes out of the window
                held = cpu_pct_over(shape, secs)
            finally:
                stop_popen(clients)
            shape.check_alive()
            out["by_workers"][str(workers)] = {"idle_0_pct": zero, "idle_n_pct": held,
                                               "rss_mb": round(sum(shape.rss_kb().values()) / 1024, 1)}
            log(f"  idle CPU, {workers} worker(s): {zero}% of a core with 0 connections, {held}% with {n}")
        finally:
            shape.stop()
    return out


def phase_pubdeliver(cfg: dict[str, Any], work: Path) -> dict[str, Any]:
    """CPU of all roles together per publish-and-delivery at ``pd_rate`` publishes/s over ``pd_topics``
    topics with one ws subscriber each, for each shape; per-thread and per-worker CPU show where it goes."""
    out: dict[str, Any] = {"rate": cfg["pd_rate"], "topics": cfg["pd_topics"], "secs": cfg["pd_secs"], "shapes": {}}
    for kind in cfg["pd_shapes"]:
        shape = Shape(kind, work)
        try:
            argv = ["run", *lg_common(shape, cfg["pd_topics"], cfg["pd_secs"]), "--rate", str(cfg["pd_rate"])]
            th0, wk0 = shape.thread_cpu(), shape.worker_cpu()
            lg = LoadgenRun(argv, shape)
            rep = lg.wait(timeout=cfg["pd_secs"] + 180)
            th1, wk1 = shape.thread_cpu(), shape.worker_cpu()
            shape.check_alive()
            s = summarize_run(rep)
            price_run(s, lg.events, {k: lg.cpu1[k] - lg.cpu0[k] for k in lg.cpu0})
            st = s["steady"]
            total = sum(st.get("server_cpu_secs", {}).values())
            s["cpu_us_per_publish_and_delivery"] = (round(1e6 * total / min(st["accepted"], st["delivered"]), 1)
                                                    if st and min(st["accepted"], st["delivered"]) else None)
            threads = {k: round(th1[k] - th0.get(k, 0.0), 3) for k in th1 if th1[k] - th0.get(k, 0.0) > 0.005}
            s["thread_cpu_secs_whole_run"] = dict(sorted(threads.items(), key=lambda kv: -kv[1]))
            if len(wk0) == len(wk1) and wk1:
                s["worker_cpu_secs_whole_run"] = [round(b - a, 3) for a, b in zip(wk0, wk1)]
            out["shapes"][kind] = s
            log(f"  {kind} at {cfg['pd_rate']}/s: {s['verdict']}, delivered {s['delivered']}/{s['expected']}, "
                f"{s['cpu_us_per_publish_and_delivery']} us per publish-and-delivery (steady)")
        finally:
            shape.stop()
    return out


def phase_pushpin(cfg: dict[str, Any], payload: int, work: Path) -> dict[str, Any]:
    """Pushpin (Debian's package) holding one HTTP stream per subscriber, fed through its publish API."""
    return pushpin_peer.run(cfg["pp_channels"], cfg["pp_streams"], cfg["pp_rate"], cfg["bcast_secs"], payload,
                            work, SERVER_CPUS, DRIVER_CPUS)


def phase_idle(cfg: dict[str, Any]) -> dict[str, Any]:
    rounds = []
    kinds = cfg["idle_kinds"].split(",")
    for r in range(cfg["idle_rounds"]):
        order = kinds if r % 2 == 0 else list(reversed(kinds))
        rounds.append(idle_memory(cfg["idle_n"], ",".join(order)))
        log(f"idle round {r + 1}: " + ", ".join(f"{k} {v['kb_per_conn']} KB" for k, v in rounds[-1].items()))
    res: dict[str, Any] = {"n": cfg["idle_n"], "rounds": rounds,
                           "kb_per_conn": {k: med([rd[k]["kb_per_conn"] for rd in rounds if k in rd]) for k in kinds}}
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    res["nofile_limit"] = [soft, hard]
    if cfg["idle_max_n"]:
        n = min(cfg["idle_max_n"], hard - 500)
        res["max_n"] = n
        res["max_n_kb_per_conn"] = idle_memory(n, "ws").get("ws", {}).get("kb_per_conn")
        log(f"idle ws at {n}: {res['max_n_kb_per_conn']} KB")
    return res


# ----------------------------------------------------------------------------------------------- main
def machine() -> dict[str, Any]:
    model = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    import granian
    import websockets

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "python": platform.python_version(),
        "granian": granian.__version__,
        "websockets": websockets.__version__,
        "kernel": platform.release(),
        "mem_total_mb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e6),
        "nofile": [soft, hard],
        "uvloop": _has("uvloop"),
        "loadavg_start": loadavg(),
        "git": _git(),
    }


def _git() -> str:
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "libs", "services", "loadgen"],
                               capture_output=True, text=True).stdout.strip()
        return head + (" (+ uncommitted changes in libs/services/loadgen)" if dirty else "")
    except OSError:
        return ""


def _has(mod: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(mod) is not None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a ~3 minute run: fewer rounds, shorter windows")
    ap.add_argument("--out", help="results directory (default bench/results, or bench/results/quick)")
    ap.add_argument("--rounds", type=int, help="override the number of alternating rounds")
    ap.add_argument("--skip", default="", help="comma-separated phases to skip: sweep,rounds,pushpin,idlecpu,pubdeliver,topics,idle")
    ap.add_argument("--render", metavar="RESULTS_JSON", help="only re-render summary.md from a results.json")
    a = ap.parse_args()
    if a.render:
        path = Path(a.render)
        res = json.loads(path.read_text())
        res["summary"] = summarize(res)
        path.write_text(json.dumps(res, indent=1, default=str))
        (path.parent / "summary.md").write_text(render(res))
        print(render(res))
        return 0
    cfg = dict(QUICK if a.quick else FULL)
    if a.rounds:
        cfg["rounds"] = a.rounds
    skip = set(filter(None, a.skip.split(",")))
    out = Path(a.out) if a.out else BENCH / "results" / ("quick" if a.quick else "")
    out.mkdir(parents=True, exist_ok=True)
    broadcast.raise_fd_limit()
    if os.cpu_count() and os.cpu_count() < 2:
        SERVER_CPUS.clear()
        DRIVER_CPUS.clear()

    started = time.monotonic()
    busy0, total0 = machine_busy()
    own0 = own_cpu()
    res: dict[str, Any] = {"mode": "quick" if a.quick else "full", "config": cfg, "goals": GOALS, "machine": machine(),
                           "started_at": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    work = Path(tempfile.mkdtemp(prefix="upf-bench-"))

    def on_signal(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    try:
        log(f"mode {res['mode']}, machine {res['machine']['nproc']} x {res['machine']['cpu_model']}, load {loadavg()}")
        res["frame_payload_bytes"] = payload = phase_probe(work)
        log(f"probe: UPF's ws frame for a {BODY}-byte body is {payload} bytes of payload")

        sweeps: dict[str, list[dict[str, Any]]] = {}
        if "sweep" not in skip:
            for n in range(1, cfg["sweep_rounds"] + 1):
                for kind in cfg["sweep_shapes"] if n % 2 else list(reversed(cfg["sweep_shapes"])):
                    log(f"sweep {kind} #{n}: rates {cfg['sweep_rates']} x {cfg['sweep_secs']}s, {cfg['lg_topics']} topics")
                    sw = phase_sweep(kind, cfg, work, out, n)
                    sweeps.setdefault(kind, []).append(sw)
                    k = sw["knee"]
                    log(f"sweep {kind} #{n}: knee {k['rate'] if k else 'not reached'} ({'; '.join(k['reasons']) if k else ''})")
        res["sweeps"] = sweeps

        rounds: list[dict[str, Any]] = []
        if "rounds" not in skip:
            knees = {k: knee_of(s) for k, s in sweeps.items()} or {"allinone": 1000.0, "split": 1000.0}
            res["knees"] = knees
            res["fixed_rates"] = {k: {"half_knee": v / 2, "twice_knee": v * 2} for k, v in knees.items()}
            for r in range(cfg["rounds"]):
                log(f"round {r + 1}/{cfg['rounds']} (load {loadavg()})")
                row: dict[str, Any] = {"loadavg": loadavg()}
                steps = ["ingest", "broadcast", "fanout", "pushpin", "allinone", "split"]
                if "pushpin" in skip:
                    steps.remove("pushpin")
                if r % 2:
                    steps.reverse()
                for step in steps:
                    if step == "ingest":
                        row["ingest"] = ingest_round(cfg, work)
                        i = row["ingest"]
                        log("  ingest: " + ", ".join(f"{k} {v['ok_per_s']:.0f}/s {v['cpu_us_per_publish']} us (others {v['others_cpu_pct_of_machine']}%)"
                                                     for k, v in i.items()))
                    elif step == "fanout":
                        row["fanout"] = f = fanout_round(cfg, work)
                        log(f"  fanout {f['topics']} topics x {f['subs_per_topic']} subs at {f['rate']:.0f}/s: {f['verdict']}, "
                            f"delivered {f['delivered']}/{f['expected']}, pusher {f['steady'].get('pusher_frames_per_cpu_sec')} frames/CPU-s")
                    elif step == "pushpin":
                        row["pushpin"] = pp = phase_pushpin(cfg, payload, work)
                        log(f"  pushpin: {pp.get('skipped') or str(pp['delivered']) + '/' + str(pp['expected']) + ' items, ' + str(pp['cpu_us_per_item']) + ' us CPU per item'}")
                    elif step == "broadcast":
                        row["broadcast"] = broadcast_round(cfg, payload)
                        log(f"  broadcast: {row['broadcast']['frames_per_cpu_sec']:.0f} frames/CPU-s")
                    else:
                        fr = res["fixed_rates"][step]
                        row[step] = fixed_round(step, cfg, work, fr["half_knee"], fr["twice_knee"])
                        for lbl in ("half_knee", "twice_knee"):
                            s = row[step][lbl]
                            log(f"  {step} {lbl} {s['rate']:.0f}/s: {s['verdict']}, p99 {s['p99_ms']} ms, "
                                f"delivered {s['delivered']}/{s['expected']}, {s['steady'].get('cpu_us_per_publish_total')} us/publish (steady)")
                rounds.append(row)
        res["rounds"] = rounds

        if "idlecpu" not in skip:
            log(f"idle CPU: 0 and {cfg['idle_cpu_n']} idle ws subscribers, {cfg['idle_cpu_secs']}s each, UPF_WORKERS {cfg['idle_cpu_workers']}")
            res["idle_cpu"] = phase_idle_cpu(cfg, work)
        if "pubdeliver" not in skip:
            log(f"publish-and-delivery: {cfg['pd_rate']}/s over {cfg['pd_topics']} topics x 1 ws subscriber, {cfg['pd_shapes']}")
            res["pubdeliver"] = phase_pubdeliver(cfg, work)
        if "topics" not in skip:
            log(f"topics: pre-populating {cfg['topics_large']} topics, then {cfg['topics_small']} vs {cfg['topics_large']}")
            res["topics"] = phase_topics(cfg, work)
        if "idle" not in skip:
            log(f"idle memory: {cfg['idle_n']} connections per kind ({cfg['idle_kinds']})")
            res["idle"] = phase_idle(cfg)
    except KeyboardInterrupt:
        log("interrupted: stopping everything this bench started")
        res["interrupted"] = True
    finally:
        stop_helpers()
        procs.stop_all()
        shutil.rmtree(work, ignore_errors=True)
        busy1, total1 = machine_busy()
        own = own_cpu() - own0
        wall = time.monotonic() - started
        ncpu = os.cpu_count() or 1
        machine_cpu = (busy1 - busy0) / procs.TICK
        res["noise"] = {
            "wall_secs": round(wall, 1),
            "machine_busy_cpu_secs": round(machine_cpu, 1),
            "bench_cpu_secs": round(own, 1),
            "others_cpu_pct_of_machine": round(100 * max(0.0, machine_cpu - own) / (wall * ncpu), 1),
            "loadavg_end": loadavg(),
        }
    res["summary"] = summarize(res)
    (out / "results.json").write_text(json.dumps(res, indent=1, default=str))
    md = render(res)
    (out / "summary.md").write_text(md)
    print(md)
    log(f"done in {res['noise']['wall_secs']:.0f}s; results in {out}")
    return 0


# ------------------------------------------------------------------------------------------- summary
def summarize(res: dict[str, Any]) -> dict[str, Any]:
    s: dict[str, Any] = {}
    rounds = res.get("rounds", [])
    if rounds and "ingest" in rounds[0]:
        ing = {k: {"ok_per_s": med([r["ingest"][k]["ok_per_s"] for r in rounds]),
                   "ok_per_s_range": spread([r["ingest"][k]["ok_per_s"] for r in rounds]),
                   "cpu_us_range": spread([r["ingest"][k]["cpu_us_per_publish"] for r in rounds]),
                   "cpu_us_per_publish": med([r["ingest"][k]["cpu_us_per_publish"] for r in rounds]),
                   "driver_cpu_pct": med([r["ingest"][k]["driver_cpu_pct"] for r in rounds]),
                   "others_cpu_pct": spread([r["ingest"][k].get("others_cpu_pct_of_machine") for r in rounds]),
                   "p99_ms": med([r["ingest"][k]["p99_ms"] for r in rounds]),
                   "rss_mb": round(med([r["ingest"][k]["rss_kb"] for r in rounds]) / 1024, 1)}
               for k in rounds[0]["ingest"]}
        s["ingest"] = ing
        bare = ing["bare_asgi"]
        for k in ("upf_writer", "upf_allinone"):
            ing[k]["ratio_rate_vs_bare_per_round"] = [round(r["ingest"][k]["ok_per_s"] / r["ingest"]["bare_asgi"]["ok_per_s"], 3)
                                                      for r in rounds]
            ing[k]["ratio_rate_vs_bare"] = round(ing[k]["ok_per_s"] / bare["ok_per_s"], 3)
            ing[k]["ratio_cpu_vs_bare"] = round(bare["cpu_us_per_publish"] / ing[k]["cpu_us_per_publish"], 3)
    if rounds and "broadcast" in rounds[0]:
        b = [r["broadcast"] for r in rounds]
        s["broadcast"] = {"frames_per_cpu_sec": med([x["frames_per_cpu_sec"] for x in b]),
                          "frames_per_cpu_sec_range": spread([x["frames_per_cpu_sec"] for x in b]),
                          "frames_per_sec": med([x["frames_per_sec"] for x in b]),
                          "connections": b[0]["connections"], "frame_bytes": b[0]["frame_bytes"]}
    if rounds and "fanout" in rounds[0]:
        xs = [r["fanout"] for r in rounds]
        s["fanout"] = {
            "topics": xs[0]["topics"], "subs_per_topic": xs[0]["subs_per_topic"], "rate": xs[0]["rate"],
            "delivered_per_s_total": med([x["delivered_per_s"] * x["subs_per_topic"] for x in xs]),
            "p50_ms": med([x["p50_ms"] for x in xs]), "p99_ms": med([x["p99_ms"] for x in xs]),
            "pusher_frames_per_cpu_sec": med([x["steady"].get("pusher_frames_per_cpu_sec") for x in xs]),
            "pusher_frames_per_cpu_sec_range": spread([x["steady"].get("pusher_frames_per_cpu_sec") for x in xs]),
            "pusher_cpu_us_per_delivery": med([x["steady"].get("pusher_cpu_us_per_delivery") for x in xs]),
            "writer_cpu_us_per_publish": med([x["steady"].get("writer_cpu_us_per_publish") for x in xs]),
            "violations_total": sum(x["violations_total"] for x in xs),
            "undelivered": sum(x["expected"] - x["delivered"] for x in xs),
            "loadgen_cpu_pct": med([x["loadgen_cpu_pct"] for x in xs]),
        }
    for kind in ("allinone", "split"):
        if rounds and kind in rounds[0]:
            agg: dict[str, Any] = {}
            for lbl in ("half_knee", "twice_knee"):
                xs = [r[kind][lbl] for r in rounds]
                a = {
                    "rate": xs[0]["rate"],
                    "p50_ms": med([x["p50_ms"] for x in xs]),
                    "p99_ms": med([x["p99_ms"] for x in xs]),
                    "p99_ms_range": spread([x["p99_ms"] for x in xs]),
                    "offered_per_s": med([x.get("offered_per_s") for x in xs]),
                    "accepted_per_s": med([x["accepted_per_s"] for x in xs]),
                    "delivered_per_s": med([x["delivered_per_s"] for x in xs]),
                    "violations_total": sum(x["violations_total"] for x in xs),
                    "undelivered": sum(x["expected"] - x["delivered"] for x in xs),
                    "verdicts": [x["verdict"] for x in xs],
                    "cpu_us_per_publish_total": med([x["steady"].get("cpu_us_per_publish_total") for x in xs]),
                    "whole_cpu_us_per_publish_total": med([x["whole"].get("cpu_us_per_publish_total") for x in xs]),
                    "rss_mb": round(med([sum(x["rss_kb"].values()) for x in xs]) / 1024, 1),
                    "loadgen_cpu_pct": med([x["loadgen_cpu_pct"] for x in xs]),
                }
                for key in ("writer_cpu_us_per_publish", "pusher_cpu_us_per_delivery", "pusher_frames_per_cpu_sec",
                            "allinone_frames_per_cpu_sec"):
                    if key in xs[0]["steady"]:
                        a[key] = med([x["steady"].get(key) for x in xs])
                    if key in xs[0]["whole"]:
                        a["whole_" + key] = med([x["whole"].get(key) for x in xs])
                agg[lbl] = a
            agg["peak_rss_mb"] = round(med([sum(r[kind]["peak_rss_kb"].values()) for r in rounds]) / 1024, 1)
            s[kind] = agg
    pps = [r["pushpin"] for r in rounds if "pushpin" in r and not r["pushpin"].get("skipped")]
    if pps:
        s["pushpin"] = {
            "channels": pps[0]["channels"], "streams": pps[0]["streams"], "rate": pps[0]["rate"],
            "item_bytes": pps[0]["item_bytes"], "version": pps[0].get("version", ""),
            "cpu_us_per_item": med([x["cpu_us_per_item"] for x in pps]),
            "cpu_us_per_item_range": spread([x["cpu_us_per_item"] for x in pps]),
            "items_per_cpu_sec": med([x["items_per_cpu_sec"] for x in pps]),
            "undelivered": sum(x["expected"] - x["delivered"] for x in pps),
            "cpu_secs_by_thread_round_1": pps[0].get("cpu_secs_by_thread", {}),
        }
        if "broadcast" in s and s["broadcast"]["frames_per_cpu_sec"]:
            s["pushpin"]["broadcast_cpu_us_per_frame"] = round(1e6 / s["broadcast"]["frames_per_cpu_sec"], 1)
        if "fanout" in s:
            s["pushpin"]["upf_pusher_cpu_us_per_delivery"] = s["fanout"]["pusher_cpu_us_per_delivery"]
    elif any("pushpin" in r for r in rounds):
        s["pushpin"] = {"skipped": next(r["pushpin"].get("skipped") for r in rounds if "pushpin" in r)}
    if "pubdeliver" in res:
        pd = res["pubdeliver"]
        s["pubdeliver"] = {"rate": pd["rate"], "topics": pd["topics"], "shapes": {
            k: {"verdict": v["verdict"], "accepted_per_s": v["accepted_per_s"], "delivered_per_s": v["delivered_per_s"],
                "p99_ms": v["p99_ms"], "cpu_us_per_publish_and_delivery": v.get("cpu_us_per_publish_and_delivery"),
                "writer_cpu_us_per_publish": v["steady"].get("writer_cpu_us_per_publish"),
                "pusher_cpu_us_per_delivery": v["steady"].get("pusher_cpu_us_per_delivery"),
                "workers_cpu_secs": v.get("worker_cpu_secs_whole_run"),
                "threads_cpu_secs": dict(list(v.get("thread_cpu_secs_whole_run", {}).items())[:6])}
            for k, v in pd["shapes"].items()}}
    sw_all = res.get("sweeps", {})
    if "allinone" in sw_all and "allinone_w2" in sw_all:
        k1, k2 = knee_of(sw_all["allinone"]), knee_of(sw_all["allinone_w2"])
        s["scaling"] = {"knee_workers_1": k1, "knee_workers_2": k2, "ratio": round(k2 / k1, 2) if k1 else None,
                        "knee_reached_1": all(sw.get("knee") for sw in sw_all["allinone"]),
                        "knee_reached_2": all(sw.get("knee") for sw in sw_all["allinone_w2"]),
                        "last_good_1": min((sw["knee"]["last_good_rate"] for sw in sw_all["allinone"] if (sw.get("knee") or {}).get("last_good_rate")), default=None),
                        "last_good_2": min((sw["knee"]["last_good_rate"] for sw in sw_all["allinone_w2"] if (sw.get("knee") or {}).get("last_good_rate")), default=None)}
    if "idle_cpu" in res:
        s["idle_cpu"] = res["idle_cpu"]
    sweeps = res.get("sweeps", {})
    all_runs = [st for sws in sweeps.values() for sw in sws for st in sw["steps"]]
    all_runs += [r[k][lbl] for r in rounds for k in ("allinone", "split") if k in r for lbl in ("half_knee", "twice_knee")]
    all_runs += [r["fanout"] for r in rounds if "fanout" in r]
    all_runs += list(res.get("pubdeliver", {}).get("shapes", {}).values())
    if all_runs:
        s["correctness"] = {
            "runs": len(all_runs),
            "violations": sum(x["violations_total"] for x in all_runs),
            "undelivered": sum(x["expected"] - x["delivered"] for x in all_runs),
            "rejected_or_failed": sum(x["rejected"] + x["errors"] for x in all_runs),
            "unclean": [f"{x['rate']}: {x['verdict']}" for x in all_runs if x["verdict"] != "clean"],
        }
    # goals
    g: dict[str, Any] = {}
    if "correctness" in s:
        c = s["correctness"]
        g["zero_loss_dup_reorder"] = {"met": c["violations"] == 0 and c["undelivered"] == 0,
                                      "value": f"{c['violations']} violations, {c['undelivered']} undelivered over {c['runs']} runs"}
    if "ingest" in s:
        per = s["ingest"]["upf_writer"]["ratio_rate_vs_bare_per_round"]
        r = med(per)
        g["writer_vs_bare"] = {"met": r >= GOALS["writer_vs_bare"],
                               "value": f"{r} (median of per-round ratios {per}; CPU-per-publish ratio {s['ingest']['upf_writer']['ratio_cpu_vs_bare']})"}
    if "broadcast" in s and "split" in s:
        cands = [s["split"][lbl].get("pusher_frames_per_cpu_sec") for lbl in ("half_knee", "twice_knee")]
        cands += [st["steady"].get("pusher_frames_per_cpu_sec") for sw in res.get("sweeps", {}).get("split", [])
                  for st in sw["steps"] if st.get("steady")]
        best = max(filter(None, cands), default=0)
        bc = s["broadcast"]["frames_per_cpu_sec"]
        g["pusher_vs_broadcast"] = {"met": best / bc >= GOALS["pusher_vs_broadcast"], "value": round(best / bc, 3)}
        if "fanout" in s and s["fanout"]["pusher_frames_per_cpu_sec"]:
            r = s["fanout"]["pusher_frames_per_cpu_sec"] / bc
            g["pusher_fanout_vs_broadcast"] = {"met": r >= GOALS["pusher_vs_broadcast"], "value": round(r, 3)}
    for kind in ("allinone", "split"):
        if kind in s:
            p = s[kind]["half_knee"]["p99_ms"]
            per = [r[kind]["half_knee"]["p99_ms"] for r in rounds]
            ok = sum(1 for x in per if x <= GOALS["p99_half_knee_ms"])
            g[f"p99_half_knee_{kind}"] = {"met": p <= GOALS["p99_half_knee_ms"],
                                          "value": f"{p} ms median at {s[kind]['half_knee']['rate']:g}/s; rounds {per}; met in {ok}/{len(per)}"}
    if "idle" in res:
        kb = {k: v for k, v in res["idle"]["kb_per_conn"].items() if k != "baseline"}
        g["idle_kb"] = {"met": all(v <= GOALS["idle_kb"] for v in kb.values()), "value": kb}
    if "topics" in res:
        r = res["topics"]["ratio_large_over_small"]
        g["topics_ratio"] = {"met": r is not None and r <= GOALS["topics_ratio"], "value": r}
    if "idle_cpu" in s:
        by = s["idle_cpu"]["by_workers"]
        g["idle_cpu_pct_0"] = {"met": all(v["idle_0_pct"] <= GOALS["idle_cpu_pct_0"] for v in by.values()),
                               "value": ", ".join(f"{v['idle_0_pct']}% ({w} worker{'s' if w != '1' else ''})" for w, v in by.items())}
        g["idle_cpu_pct_n"] = {"met": all(v["idle_n_pct"] <= GOALS["idle_cpu_pct_n"] for v in by.values()),
                               "value": ", ".join(f"{v['idle_n_pct']}% ({w} worker{'s' if w != '1' else ''})" for w, v in by.items())
                               + f" at {s['idle_cpu']['n']:,} subscribers"}
    if "pubdeliver" in s:
        vals = {k: v["cpu_us_per_publish_and_delivery"] for k, v in s["pubdeliver"]["shapes"].items()}
        g["cpu_us_per_publish_and_delivery"] = {
            "met": all(v is not None and v <= GOALS["cpu_us_per_publish_and_delivery"] for v in vals.values()),
            "value": ", ".join(f"{k} {v} us" for k, v in vals.items()) + f" at {s['pubdeliver']['rate']}/s"}
    s["goals"] = g
    return s


def _f(x: Any, nd: int = 0) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:,.{nd}f}"
    return str(x)


def render(res: dict[str, Any]) -> str:
    s = res["summary"]
    m = res["machine"]
    L = [f"# UPF bench results ({res['mode']}, {res['started_at']})", "",
         f"Machine: {m['nproc']} x {m['cpu_model']}, {m['mem_total_mb']} MB, Python {m['python']}, granian {m['granian']}, "
         f"websockets {m['websockets']}, uvloop {'yes' if m['uvloop'] else 'not installed'}, nofile {m['nofile']}, commit {m.get('git')}.",
         f"Noise: other processes used {res['noise']['others_cpu_pct_of_machine']}% of the machine during the run "
         f"(load average {m['loadavg_start']} at start, {res['noise']['loadavg_end']} at end); wall {res['noise']['wall_secs']}s.",
         ""]
    if res.get("knees"):
        L += ["Knees used (the lower of each shape's sweeps): " + ", ".join(f"{k} {v:g}/s" for k, v in res["knees"].items())
              + "; the fixed-rate runs are at half and twice these.", ""]
    if "ingest" in s:
        L += ["## Ingest: publish-only, server on CPU 0, driver (bench/pubdrive.py) on CPU 1", "",
              "| target | publishes/s (range) | server CPU us/publish (range) | p99 ms | RSS MB | rate vs bare (per round) | CPU vs bare | driver CPU % | others' CPU % of machine |",
              "|---|---|---|---|---|---|---|---|---|"]
        for k, v in s["ingest"].items():
            per = v.get("ratio_rate_vs_bare_per_round")
            L.append(f"| {k} | {_f(v['ok_per_s'])} ({'-'.join(_f(x) for x in v.get('ok_per_s_range', []))}) | "
                     f"{_f(v['cpu_us_per_publish'], 1)} ({'-'.join(_f(x, 1) for x in v.get('cpu_us_range', []))}) | "
                     f"{_f(v['p99_ms'], 1)} | {_f(v['rss_mb'], 1)} | "
                     f"{_f(v.get('ratio_rate_vs_bare'), 2)}{' (' + ', '.join(f'{x:.2f}' for x in per) + ')' if per else ''} | "
                     f"{_f(v.get('ratio_cpu_vs_bare'), 2)} | {_f(v.get('driver_cpu_pct'))} | {'-'.join(_f(x, 1) for x in v.get('others_cpu_pct', []))} |")
        L.append("")
    if "broadcast" in s:
        b = s["broadcast"]
        L += [f"## Fan-out ceiling: bare websockets broadcast, {b['connections']} clients, {b['frame_bytes']}-byte frames", "",
              f"{_f(b['frames_per_cpu_sec'])} frames per server CPU-second (rounds: {'-'.join(_f(x) for x in b.get('frames_per_cpu_sec_range', []))}; "
              f"{_f(b['frames_per_sec'])} frames/s).", ""]
    if "fanout" in s:
        f = s["fanout"]
        L += [f"## Fan-out through UPF (split shape): {f['topics']} topics x {f['subs_per_topic']} ws subscribers, {f['rate']} publishes/s", "",
              f"{_f(f['delivered_per_s_total'])} deliveries/s, p50 {f['p50_ms']} ms, p99 {f['p99_ms']} ms; pusher "
              f"{_f(f['pusher_frames_per_cpu_sec'])} frames per CPU-second (rounds: {'-'.join(_f(x) for x in f.get('pusher_frames_per_cpu_sec_range', []))}; "
              f"{f['pusher_cpu_us_per_delivery']} us per delivery); "
              f"writer {f['writer_cpu_us_per_publish']} us per publish; {f['violations_total']} violations, {f['undelivered']} undelivered; "
              f"loadgen at {f['loadgen_cpu_pct']}% of a core.", ""]
    for kind in ("allinone", "split"):
        if kind in s:
            L += [f"## {kind}: loadgen run, medians over rounds (CPU over the publishing seconds; whole run incl. connects and drain in results.json)", "",
                  "| load | target/s | offered/s | p50 ms | p99 ms (rounds) | accepted/s | delivered/s | CPU us/publish (all roles) | writer us/publish | pusher us/delivery | frames/CPU-s (pusher; allinone: whole process) | violations | undelivered | RSS MB |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
            for lbl in ("half_knee", "twice_knee"):
                a = s[kind][lbl]
                L.append(f"| {lbl} | {_f(a['rate'])} | {_f(a.get('offered_per_s'))} | {_f(a['p50_ms'], 1)} | {_f(a['p99_ms'], 1)} ({'-'.join(_f(x, 1) for x in a.get('p99_ms_range', []))}) | {_f(a['accepted_per_s'])} | "
                         f"{_f(a['delivered_per_s'])} | {_f(a['cpu_us_per_publish_total'], 0)} | {_f(a.get('writer_cpu_us_per_publish'), 0)} | "
                         f"{_f(a.get('pusher_cpu_us_per_delivery'), 0)} | {_f(a.get('pusher_frames_per_cpu_sec') or a.get('allinone_frames_per_cpu_sec'))} | "
                         f"{a['violations_total']} | {a['undelivered']} | {_f(a['rss_mb'], 1)} |")
            L.append(f"\nPeak RSS (VmHWM, all roles): {s[kind]['peak_rss_mb']} MB.\n")
    for kind, n, sw in ((k, i, w) for k, ws in res.get("sweeps", {}).items() for i, w in enumerate(ws, 1)):
        k = sw["knee"]
        L += [f"## Sweep {kind} #{n} (p99 bound {sw['p99_bound_ms']} ms, tolerance {sw['tolerance']})", "",
              f"Knee: {k['rate'] if k else 'not reached'}" + (f" (last good {k['last_good_rate']}): {'; '.join(k['reasons'])}" if k else "")
              + f". Plot: `{sw['plot']}`.", "",
              "| rate | accepted/s | delivered/s | p50 ms | p99 ms | CPU us/publish (all roles) | writer us/publish | pusher us/delivery | violations | RSS MB |",
              "|---|---|---|---|---|---|---|---|---|---|"]
        for st in sw["steps"]:
            L.append(f"| {_f(st['rate'])} | {_f(st['accepted_per_s'])} | {_f(st['delivered_per_s'])} | {_f(st['p50_ms'], 1)} | {_f(st['p99_ms'], 1)} | "
                     f"{_f(st.get('steady', {}).get('cpu_us_per_publish_total'))} | {_f(st.get('steady', {}).get('writer_cpu_us_per_publish'))} | "
                     f"{_f(st.get('steady', {}).get('pusher_cpu_us_per_delivery'))} | "
                     f"{st['violations_total']} | {_f(sum(st.get('rss_kb', {}).values()) / 1024, 1)} |")
        L.append("")
    if "topics" in res:
        t = res["topics"]
        L += [f"## Publish cost vs topics (store pre-populated with {t['prepopulated_topics']:,} topics, no subscribers held)", "",
              "| topics | writer CPU us/publish | publishes/s |", "|---|---|---|",
              f"| {t['small_topics']:,} | {_f(t['small_cpu_us_per_publish'], 1)} | {_f(t['small_ok_per_s'])} |",
              f"| {t['large_topics']:,} | {_f(t['large_cpu_us_per_publish'], 1)} | {_f(t['large_ok_per_s'])} |",
              f"\nRatio {t['large_topics']:,} / {t['small_topics']:,}: {t['ratio_large_over_small']}.", ""]
    if "idle" in res:
        i = res["idle"]
        L += [f"## Idle subscribers: RSS per connection at {i['n']:,}", "", "| kind | KB per connection |", "|---|---|"]
        L += [f"| {k} | {v} |" for k, v in i["kb_per_conn"].items()]
        if i.get("max_n"):
            L.append(f"\nws at {i['max_n']:,} connections: {i['max_n_kb_per_conn']} KB per connection.")
        L.append("")
    if "pushpin" in s:
        p = s["pushpin"]
        if p.get("skipped"):
            L += ["## Fan-out peer: Pushpin", "", f"Skipped: {p['skipped']}.", ""]
        else:
            L += [f"## Fan-out peer: {p['version']}, {p['streams']} held HTTP streams on {p['channels']} channels, "
                  f"{p['rate']:g} publishes/s of {p['item_bytes']}-byte items (CPU of all its processes, publishing and drain)", "",
                  "| server | CPU us per delivered item |", "|---|---|",
                  f"| Pushpin (incl. its HTTP publish intake) | {_f(p['cpu_us_per_item'], 1)} (rounds: {'-'.join(_f(x, 1) for x in p.get('cpu_us_per_item_range', []))}) |",
                  f"| UPF pusher (fan-out round, split shape) | {_f(p.get('upf_pusher_cpu_us_per_delivery'), 1)} |",
                  f"| bare websockets broadcast | {_f(p.get('broadcast_cpu_us_per_frame'), 1)} |",
                  f"\n{p['undelivered']} Pushpin items undelivered. Its CPU by process and thread (round 1, CPU s): "
                  + (", ".join(f"{k} {v:g}" for k, v in p.get("cpu_secs_by_thread_round_1", {}).items()) or "-") + ".", ""]
    if "idle_cpu" in s:
        ic = s["idle_cpu"]
        L += [f"## Idle CPU of the all-in-one (default timers, keepalives included), {ic['secs']:g} s windows", "",
              f"| UPF_WORKERS | CPU % of a core, 0 connections (goal <= {GOALS['idle_cpu_pct_0']}) | CPU % with {ic['n']:,} idle ws subscribers (goal <= {GOALS['idle_cpu_pct_n']}) | RSS MB |",
              "|---|---|---|---|"]
        L += [f"| {w} | {v['idle_0_pct']} | {v['idle_n_pct']} | {v['rss_mb']} |" for w, v in ic["by_workers"].items()]
        L.append("")
    if "pubdeliver" in s:
        pd = s["pubdeliver"]
        L += [f"## CPU per publish-and-delivery, all roles together: {pd['rate']}/s over {pd['topics']:,} topics x 1 ws subscriber "
              f"(goal <= {GOALS['cpu_us_per_publish_and_delivery']:g} us)", "",
              "| shape | verdict | accepted/s | delivered/s | p99 ms | CPU us per publish-and-delivery | writer us/publish | pusher us/delivery | per-worker CPU s | busiest threads (CPU s, whole run) |",
              "|---|---|---|---|---|---|---|---|---|---|"]
        for k, v in pd["shapes"].items():
            th = ", ".join(f"{n} {c:g}" for n, c in v["threads_cpu_secs"].items())
            L.append(f"| {k} | {v['verdict']} | {_f(v['accepted_per_s'])} | {_f(v['delivered_per_s'])} | {_f(v['p99_ms'], 1)} | "
                     f"{_f(v['cpu_us_per_publish_and_delivery'], 1)} | {_f(v['writer_cpu_us_per_publish'], 1)} | {_f(v['pusher_cpu_us_per_delivery'], 1)} | "
                     f"{v['workers_cpu_secs'] or '-'} | {th} |")
        L.append("")
    if "scaling" in s:
        sc = s["scaling"]
        L += ["## Scaling: the all-in-one's knee with UPF_WORKERS=1 vs 2", "",
              f"Knee (lower of the sweeps): {sc['knee_workers_1']:g}/s with 1 worker{'' if sc['knee_reached_1'] else ' (not reached: a lower bound)'}, "
              f"{sc['knee_workers_2']:g}/s with 2{'' if sc['knee_reached_2'] else ' (not reached: a lower bound)'}; ratio {sc['ratio']} "
              f"(last good rate: {_f(sc.get('last_good_1'))}/s and {_f(sc.get('last_good_2'))}/s; the sweep's rate steps bound the ratio's precision). "
              "The CPU split between roles is in the publish-and-delivery table (the split shape's writer and pusher, "
              "the all-in-one's threads and workers).", ""]
    if "correctness" in s:
        c = s["correctness"]
        L += ["## Correctness over every loadgen run", "",
              f"{c['runs']} runs: {c['violations']} violations, {c['undelivered']} accepted-but-undelivered, "
              f"{c['rejected_or_failed']} rejected/failed publishes; unclean: {c['unclean'] or 'none'}.", ""]
    L += ["## Goals", "", "| goal | target | measured | met |", "|---|---|---|---|"]
    targets = {"zero_loss_dup_reorder": "0", "writer_vs_bare": ">= 0.5 x bare ASGI", "pusher_vs_broadcast": ">= 0.5 x bare broadcast", "pusher_fanout_vs_broadcast": ">= 0.5 x bare broadcast",
               "p99_half_knee_allinone": "<= 50 ms", "p99_half_knee_split": "<= 50 ms", "idle_kb": "<= 16 KB", "topics_ratio": "<= 1.2",
               "idle_cpu_pct_0": "<= 0.2% of a core", "idle_cpu_pct_n": "<= 1% of a core", "cpu_us_per_publish_and_delivery": "<= 250 us"}
    for k, v in s["goals"].items():
        L.append(f"| {k} | {targets.get(k, '')} | {v['value']} | {'yes' if v['met'] else 'NO'} |")
    return "\n".join(L) + "\n"


if __name__ == "__main__":
    sys.exit(main())
