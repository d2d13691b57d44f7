"""What every phase shares: the UPF shapes it starts, the helper processes it spawns and stops, the
publish-only driver (bench/pubdrive.py), and loadgen runs priced by the servers' CPU over their
publishing seconds."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import procs
from procs import PY, REPO, tree_cpu, tree_rss_kb
from schema import DiskStalls, Drive, Price, RunSummary

BENCH = REPO / "bench"
LOADGEN = str(Path(PY).parent / "upf-loadgen")
IDLE_MEMORY = REPO / "services" / "pusher" / "bench" / "idle_memory.py"
SERVER_CPUS = {0}
DRIVER_CPUS = {1}
R = TypeVar("R", bound=RunSummary)
BODY = 100  # bytes of every published body (loadgen --message-size, pubdrive --body-size)


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


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
    the split writer + pusher on one store file, or the writer alone (``writer``: on its default server,
    UPF's front door; ``writer_granian``: on granian)."""

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
        elif kind in ("writer", "writer_granian"):
            server = "granian" if kind == "writer_granian" else "upf"
            w, wport = procs.start_upf_writer(self.dir, store, cpus, UPF_WRITER_SERVER=server, **extra)
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


def disk_stalls(work: Path, secs: float, when: str, every: float = 0.01) -> DiskStalls:
    """A one-page write and ``fdatasync`` every ``every`` seconds for ``secs`` in ``work``: how long the
    disk under the stores holds a flush, at the median and at its worst."""
    path = work / "stall.test"
    page = 4096
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    lat: list[float] = []
    try:
        os.pwrite(fd, b"\0" * (256 * page), 0)
        os.fsync(fd)
        end = time.monotonic() + secs
        while time.monotonic() < end:
            os.pwrite(fd, os.urandom(page), random.randrange(256) * page)
            t0 = time.perf_counter()
            os.fdatasync(fd)
            lat.append((time.perf_counter() - t0) * 1e3)
            time.sleep(every)
    finally:
        os.close(fd)
        path.unlink()
    lat.sort()

    def at(q: float) -> float:
        return round(lat[min(len(lat) - 1, int(q * len(lat)))], 2)

    return DiskStalls(
        when=when,
        secs=secs,
        flushes=len(lat),
        median_ms=at(0.5),
        p99_ms=at(0.99),
        p999_ms=at(0.999),
        max_ms=round(lat[-1], 2),
        over_50=sum(x > 50 for x in lat),
        over_100=sum(x > 100 for x in lat),
    )


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
def pubdrive(
    url: str,
    roots: list[int],
    *,
    secs: float,
    conns: int,
    topics: int,
    prefix: str = "upBENCH",
    authorization: str | None = None,
    rate: float = 0.0,
) -> Drive:
    """Run bench/pubdrive.py pinned to the driver CPU; snapshot the server trees' CPU on its start and
    stop lines, so only the measured window counts. ``authorization``: a header value sent on every
    publish (a server with auth configured). ``rate``: paced publishes/s (0: closed loop)."""
    argv = [
        PY,
        str(BENCH / "pubdrive.py"),
        "--url",
        url,
        "--duration",
        str(secs),
        "--connections",
        str(conns),
        "--topics",
        str(topics),
        "--topic-prefix",
        prefix,
        "--body-size",
        str(BODY),
    ]
    if authorization:
        argv += ["--authorization", authorization]
    if rate:
        argv += ["--rate", str(rate)]
    p = spawn_pinned(argv, DRIVER_CPUS, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert p.stdout is not None
        cpu0 = cpu1 = 0.0
        busy0 = busy1 = 0
        result: Drive | None = None
        for line in p.stdout:
            line = line.strip()
            if line == "start":
                cpu0, busy0 = tree_cpu(roots), machine_busy()[0]
            elif line == "stop":
                cpu1, busy1 = tree_cpu(roots), machine_busy()[0]
            elif line.startswith("{"):
                result = msgspec.json.decode(line, type=Drive)
        p.wait(30)
        if result is None:
            raise RuntimeError(f"pubdrive failed: {p.stderr.read() if p.stderr else ''}")
    finally:
        stop_popen(p)
    cpu = cpu1 - cpu0
    others = (busy1 - busy0) / procs.TICK - cpu - result.driver_cpu_pct / 100 * result.secs
    result.others_cpu_pct_of_machine = round(max(0.0, 100 * others / (result.secs * (os.cpu_count() or 1))), 1)
    result.server_cpu_secs = round(cpu, 3)
    result.server_cpu_pct = round(100 * cpu / result.secs, 1)
    result.cpu_us_per_publish = round(1e6 * cpu / result.ok, 1) if result.ok else None
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
        self._threads = [
            threading.Thread(target=self._read_err, daemon=True),
            threading.Thread(target=self._read_out, daemon=True),
        ]
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
                ev = {
                    "kind": "live",
                    "lt": float(m.group(1)),
                    "phase": m.group(2),
                    "accepted": int(m.group(4)),
                    "delivered": int(m.group(5)),
                }
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
    for prev, cur in itertools.pairwise(load):
        span = cur["lt"] - prev["lt"]
        acc += cur["accepted"] * span
        dlv += cur["delivered"] * span
    cpu = {k: load[-1]["cpu"][k] - load[0]["cpu"][k] for k in load[0]["cpu"]}
    return {
        "secs": round(load[-1]["lt"] - load[0]["lt"], 2),
        "accepted": round(acc),
        "delivered": round(dlv),
        "cpu": cpu,
    }


def lg_common(shape: Shape, topics: int, secs: float) -> list[str]:
    return lg_args(shape.writer, shape.pusher, topics, secs)


def lg_args(writer: str, pusher: str, topics: int, secs: float, size: int = BODY) -> list[str]:
    """``upf-loadgen run``'s options every bench load shares: one ws subscriber per topic, ``size``-byte
    bodies, a minute to drain."""
    return [
        "--writer",
        writer,
        "--pusher",
        pusher,
        "--topics",
        str(topics),
        "--duration",
        str(secs),
        "--message-size",
        str(size),
        "--transport",
        "ws",
        "--drain-timeout",
        "60",
    ]


def summarize_run(r: dict[str, Any], cls: type[R], **extra: Any) -> R:
    """The figures the bench keeps from one loadgen JSON report (loadgen's own schema, read as JSON),
    as ``cls`` (RunSummary or a subclass, whose extra fields come in ``extra``), type-checked here."""
    th, lat, v = r["throughput"], r["latency"], r["violations"]
    return msgspec.convert(
        dict(
            rate=r["scenario"]["rate"],
            verdict=r["verdict"],
            offered=th["offered"],
            accepted=th["accepted"],
            delivered=th["delivered"],
            expected=th["expected_deliveries"],
            offered_per_s=th["offered_per_s"],
            accepted_per_s=th["accepted_per_s"],
            delivered_per_s=th["delivered_per_s"],
            rejected=th["rejected"],
            errors=th["errors"],
            p50_ms=lat["p50_ms"],
            p99_ms=lat["p99_ms"],
            max_ms=lat["max_ms"],
            publish_p99_ms=r["publish_latency"]["p99_ms"],
            drain_secs=r["drain"]["secs"],
            drain_complete=r["drain"]["complete"],
            violations=v,
            violations_total=sum(v.values()),
            disconnects=r["subscriptions"]["disconnects"],
            loadgen_cpu_pct=r["cpu"]["pct_of_wall"],
            loadgen_saturated=r["cpu"]["saturated"],
            **extra,
        ),
        cls,
    )


def price(acc: int, dlv: int, cpu: dict[str, float]) -> Price:
    """CPU per accepted publish / per delivered message, by role and in total."""
    out = Price(accepted=acc, delivered=dlv, server_cpu_secs={k: round(v, 3) for k, v in cpu.items()})
    total = sum(cpu.values())
    out.cpu_us_per_publish_total = round(1e6 * total / acc, 1) if acc else None
    if "writer" in cpu and acc:
        out.writer_cpu_us_per_publish = round(1e6 * cpu["writer"] / acc, 1)
    if "pusher" in cpu and dlv:
        out.pusher_cpu_us_per_delivery = round(1e6 * cpu["pusher"] / dlv, 1)
        out.pusher_frames_per_cpu_sec = round(dlv / cpu["pusher"], 1) if cpu["pusher"] > 0 else None
    if "upf" in cpu and dlv:
        out.allinone_frames_per_cpu_sec = round(dlv / cpu["upf"], 1) if cpu["upf"] > 0 else None
    return out


def price_run(s: RunSummary, events: list[dict[str, Any]], cpu_whole: dict[str, float]) -> None:
    """Attach ``whole`` (the whole loadgen run: connects, publishing, drain) and ``steady`` (the
    publishing seconds only; an empty Price when no window could be priced) to a run summary."""
    s.whole = price(s.accepted, s.delivered, cpu_whole)
    st = steady(events)
    s.steady = price(st["accepted"], st["delivered"], st["cpu"]) if st else Price()
    if st:
        s.steady.secs = st["secs"]
