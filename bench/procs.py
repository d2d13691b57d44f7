"""Processes the bench starts, and what it reads about them from /proc.

Every process is started in its own session and remembered; ``Proc.stop`` ends exactly that process
group (SIGTERM, then SIGKILL), and ``stop_all`` stops everything this bench started, nothing else.
CPU is utime+stime from /proc/<pid>/stat, summed over the process and its live descendants (granian
serves from a worker process it spawns); memory is VmRSS from /proc/<pid>/status, summed the same way.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

__all__ = [
    "REPO",
    "PY",
    "Proc",
    "free_port",
    "tree_cpu",
    "tree_rss_kb",
    "tree_thread_cpu",
    "children",
    "stop_all",
    "start_upf_allinone",
    "start_upf_writer",
    "start_upf_pusher",
    "start_upf_command",
    "start_bare_asgi",
]

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
TICK = os.sysconf("SC_CLK_TCK")
_STARTED: list[Proc] = []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                raw = f.read()
        except OSError:
            continue
        ppid = int(raw[raw.rindex(b")") + 2 :].split()[1])
        kids.setdefault(ppid, []).append(int(d))
    return kids


def tree(pid: int) -> list[int]:
    kids = _children()
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def _cpu_secs(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return 0.0
    fields = raw[raw.rindex(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (fields 14, 15 of stat)


def _rss_kb(pid: int, field: str = "VmRSS:") -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_cpu(pids: list[int]) -> float:
    """CPU seconds (user+sys) of these processes and all their live descendants."""
    return sum(_cpu_secs(p) for root in pids for p in tree(root))


def children(pid: int) -> list[int]:
    """The direct children of a process (the all-in-one's workers under its supervisor)."""
    return sorted(_children().get(pid, []))


def listens(pid: int, port: int) -> bool:
    """Whether this process holds a listening TCP socket on the port (from /proc/net/tcp*)."""
    inodes = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(name) as f:
            for line in list(f)[1:]:
                parts = line.split()
                if parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(f"socket:[{parts[9]}]")
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                    return True
    return False


def tree_thread_cpu(pids: list[int]) -> dict[str, float]:
    """CPU seconds by thread, summed over these processes and their descendants, keyed ``<comm> main``
    for each process's main thread (a Python server's event loop) and ``<comm> other`` for the rest
    (Python names its threads ``python``: the embedded store's committer and watch poller are there)."""
    out: dict[str, float] = {}
    for p in (p for root in pids for p in tree(root)):
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{p}/task/{tid}/comm") as f:
                    comm = f.read().strip()
                with open(f"/proc/{p}/task/{tid}/stat", "rb") as f:
                    raw = f.read()
            except OSError:
                continue
            fields = raw[raw.rindex(b")") + 2 :].split()
            name = f"{comm} {'main' if int(tid) == p else 'other'}"
            out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / TICK
    return out


def tree_rss_kb(pids: list[int], field: str = "VmRSS:") -> int:
    return sum(_rss_kb(p, field) for root in pids for p in tree(root))


class Proc:
    """One started process (in its own session, so its whole group can be stopped)."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str] | None,
        log: Path,
        cpus: set[int] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.log_path = log
        self._log = open(log, "ab")  # noqa: SIM115 - the process writes to it until stop() closes it

        def pre() -> None:
            if cpus:
                os.sched_setaffinity(0, cpus)

        self.popen = subprocess.Popen(
            argv, env=env, cwd=cwd, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=pre
        )
        self.pid = self.popen.pid
        _STARTED.append(self)

    def log_tail(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-2000:]

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGTERM)
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.pid, signal.SIGKILL)
                self.popen.wait(5)
        else:  # the leader is gone; its group may not be (a granian worker)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
        self._log.close()
        if self in _STARTED:
            _STARTED.remove(self)


def stop_all() -> None:
    for p in list(_STARTED):
        p.stop()


def _env(**upf: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UPF_", "OTEL_"))}
    env.update(PYTHONUNBUFFERED="1", UPF_LOG_LEVEL="WARNING")
    env.update(upf)
    return env


def wait_http(proc: Proc, port: int, path: str = "/__lbheartbeat__", timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited: {proc.log_tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=1) as r:
                if r.status < 500:
                    return
        except urllib.error.HTTPError as e:
            if e.code < 500:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{proc.name} not ready: {proc.log_tail()}")


def _start_role(
    module: str,
    label: str,
    node: str,
    workdir: Path,
    store: Path,
    cpus: set[int] | None,
    extra: dict[str, str],
    python: str = PY,
) -> tuple[Proc, int]:
    return start_upf_command(module, [python, "-m", module], label, node, workdir, store, cpus, **extra)


def start_upf_command(
    name: str,
    argv: list[str],
    label: str,
    node: str,
    workdir: Path,
    store: Path,
    cpus: set[int] | None = None,
    **extra: str,
) -> tuple[Proc, int]:
    """``argv`` as a UPF role is started: on a free port (``UPF_BIND``), on ``store``, as node ``node``,
    ready once it answers HTTP (bench/writer_layers.py starts its stub layers this way)."""
    port = free_port()
    env = _env(UPF_BIND=f"127.0.0.1:{port}", UPF_STORE_PATH=str(store), UPF_NODE_ID=node, **extra)
    p = Proc(name, argv, env, workdir / f"{label}-{port}.log", cpus)
    wait_http(p, port)
    return p, port


def start_upf_allinone(
    workdir: Path, store: Path, cpus: set[int] | None = None, *, python: str = PY, **extra: str
) -> tuple[Proc, int]:
    """One process unless ``UPF_WORKERS`` is passed: the figures measured before workers existed stay comparable.
    ``python``: another checkout's interpreter runs that checkout's program (bench/ab_allinone.py)."""
    extra.setdefault("UPF_WORKERS", "1")
    return _start_role("upf", "upf", "bench-allinone", workdir, store, cpus, extra, python)


def start_upf_writer(
    workdir: Path, store: Path, cpus: set[int] | None = None, *, python: str = PY, **extra: str
) -> tuple[Proc, int]:
    """``python``: another checkout's interpreter runs that checkout's writer (bench/ab_writer.py)."""
    return _start_role("upf_writer", "writer", "bench-writer", workdir, store, cpus, extra, python)


def start_upf_pusher(
    workdir: Path,
    store: Path,
    cpus: set[int] | None = None,
    *,
    python: str = PY,
    node: str = "bench-pusher",
    **extra: str,
) -> tuple[Proc, int]:
    """``python``: another checkout's interpreter runs that checkout's pusher (bench/ab_pushers.py)."""
    return _start_role("upf_pusher", "pusher", node, workdir, store, cpus, extra, python)


def start_bare_asgi(workdir: Path, cpus: set[int] | None = None) -> tuple[Proc, int]:
    """bench/bare_asgi.py:app on granian, configured as upf_writer configures granian."""
    port = free_port()
    granian = str(Path(PY).parent / "granian")
    argv = [
        granian,
        "--interface",
        "asgi",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
        "--http",
        "1",
        "--no-ws",
        "--log-level",
        "warning",
        "--working-dir",
        str(REPO / "bench"),
        "bare_asgi:app",
    ]
    p = Proc("bare-asgi", argv, _env(), workdir / f"bare-{port}.log", cpus)
    wait_http(p, port, path="/probe")
    return p, port


def ab_parser(doc: str | None, secs: float, warm: float | None) -> argparse.ArgumentParser:
    """The A/B tools' common arguments: ``--base`` (another checkout), ``--secs`` and, unless ``warm``
    is None (a driver that warms up on its own), ``--warm``."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", type=Path, required=True, help="a checkout of the base commit, with its .venv")
    ap.add_argument("--secs", type=float, default=secs, help="seconds measured per run")
    if warm is not None:
        ap.add_argument("--warm", type=float, default=warm, help="seconds before the window (connects, warm-up)")
    return ap


def checkout_python(ap: argparse.ArgumentParser, base: Path) -> str:
    """The interpreter of another checkout (``--base`` of the A/B tools), or the parser's error."""
    python = base.resolve() / ".venv" / "bin" / "python"
    if not python.exists():
        ap.error(f"{python} not found: run `python3 -m uv sync --locked` in {base}")
    return str(python)


def print_ratios(ratios: list[float]) -> None:
    """The A/B tools' last line: head/base over the rounds or pairs."""
    print(f"head/base: median {statistics.median(ratios):.3f}, range {min(ratios):.3f}-{max(ratios):.3f}")
