"""idle: resident memory per idle subscriber (services/pusher/bench/idle_memory.py), and idlecpu: the
all-in-one's CPU at rest, with no connection and with idle ws subscribers, keepalives included."""

from __future__ import annotations

import re
import resource
import subprocess
import time
from pathlib import Path

from harness import IDLE_MEMORY, Shape, log, run_to_end, spawn_pinned, stop_popen
from procs import PY
from report import med
from schema import Config, Idle, IdleCpu, IdleCpuWorkers, IdleKind

_IDLE_LINE = re.compile(r"^(\w+)\s+([\d.]+) MB\s+([\d.]+) MB\s+([\d.]+) KB")


def parse_idle_memory(stdout: str) -> dict[str, IdleKind]:
    """idle_memory.py's table: ``<kind> <rss before> MB <rss after> MB <per connection> KB`` per line."""
    out = {}
    for line in stdout.splitlines():
        m = _IDLE_LINE.match(line.strip())
        if m:
            out[m.group(1)] = IdleKind(
                rss_before_mb=float(m.group(2)), rss_after_mb=float(m.group(3)), kb_per_conn=float(m.group(4))
            )
    return out


def idle_memory(n: int, kinds: str) -> dict[str, IdleKind]:
    r = run_to_end([PY, str(IDLE_MEMORY), "--n", str(n), "--kinds", kinds], timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"idle_memory.py failed: {r.stderr[-2000:]}")
    return parse_idle_memory(r.stdout)


def phase_idle(cfg: Config) -> Idle:
    rounds = []
    kinds = cfg.idle_kinds.split(",")
    for r in range(cfg.idle_rounds):
        order = kinds if r % 2 == 0 else list(reversed(kinds))
        rounds.append(idle_memory(cfg.idle_n, ",".join(order)))
        log(f"idle round {r + 1}: " + ", ".join(f"{k} {v.kb_per_conn} KB" for k, v in rounds[-1].items()))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    res = Idle(
        n=cfg.idle_n,
        rounds=rounds,
        nofile_limit=[soft, hard],
        kb_per_conn={k: med([rd[k].kb_per_conn for rd in rounds if k in rd]) for k in kinds},
    )
    if cfg.idle_max_n:
        n = min(cfg.idle_max_n, hard - 500)
        res.max_n = n
        ws = idle_memory(n, "ws").get("ws")
        res.max_n_kb_per_conn = ws.kb_per_conn if ws else None
        log(f"idle ws at {n}: {res.max_n_kb_per_conn} KB")
    return res


def cpu_pct_over(shape: Shape, secs: float) -> float:
    """CPU of all of a shape's processes over ``secs`` of wall time, in % of one core."""
    c0, t0 = sum(shape.cpu().values()), time.monotonic()
    time.sleep(secs)
    c1, t1 = sum(shape.cpu().values()), time.monotonic()
    return round(100 * (c1 - c0) / (t1 - t0), 3)


def hold_idle_ws(port: int, n: int) -> subprocess.Popen[str]:
    """``n`` idle ws subscribers (one topic each) from idle_memory.py's client, held until stopped."""
    p = spawn_pinned(
        [PY, str(IDLE_MEMORY), "--client", "ws", "--port", str(port), "--n", str(n), "--start", "0"],
        None,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert p.stdout is not None
    line = p.stdout.readline()
    if not line.startswith("ready"):
        stop_popen(p)
        raise RuntimeError(f"idle clients failed: {line!r} {p.stderr.read() if p.stderr else ''}")
    return p


def phase_idle_cpu(cfg: Config, work: Path) -> IdleCpu:
    """The all-in-one at rest, default timers (keepalives, safety poll, heartbeat, janitor): CPU % of a
    core with no connection, then with ``idle_cpu_n`` idle ws subscribers; a fresh server per worker count."""
    secs, n = cfg.idle_cpu_secs, cfg.idle_cpu_n
    out = IdleCpu(secs=secs, n=n, by_workers={})
    for workers in cfg.idle_cpu_workers:
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
            out.by_workers[str(workers)] = IdleCpuWorkers(
                idle_0_pct=zero, idle_n_pct=held, rss_mb=round(sum(shape.rss_kb().values()) / 1024, 1)
            )
            log(f"  idle CPU, {workers} worker(s): {zero}% of a core with 0 connections, {held}% with {n}")
        finally:
            shape.stop()
    return out
