"""``UPF_WORKERS``: the all-in-one with the pusher role as N worker processes on one port.

One Python process uses one core. The supervisor (this module, in the parent) starts N copies of
``python -m upf``; each binds the port with SO_REUSEPORT, so the kernel spreads new connections over
them, and each is its own pusher node (``<UPF_NODE_ID>-w<i>``) on the shared store: they coordinate
only through it, exactly as separate pusher hosts do. The janitor runs in worker 0 only. The parent
restarts a worker that dies (with backoff), forwards SIGTERM/SIGINT (each worker then stops gracefully:
``Pusher.stop``), and exits once the workers have stopped, killing any that outlive
UPF_SHUTDOWN_GRACE_SECS plus a slack; it exits 70, as one process would, when a worker's stop failed.

A worker that hangs (stopped, deadlocked, its event loop stuck) is killed and restarted: each worker's
loop writes a byte to a pipe of its own every quarter of UPF_WORKER_WATCHDOG_SECS (a timer, nothing
else), and one silent for that long is killed. Why: the workers share one store file, whose writes
take turns; a hung worker holding the write turn stopped every publish on the host while health still
answered, and it kept receiving half of the new connections.

The parent holds the port (bound with SO_REUSEPORT, never listening) for its whole life, so a worker
restart always finds it and a second server cannot take it; it first checks that no one else has it,
so a busy port fails at start as it does for one process.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from upf_edge.lifecycle import EXIT_OVERDUE
from upf_edge.serve import base_url, bind_error, bound_socket
from upf_keyspace import Settings
from upf_keyspace import telemetry as tm

__all__ = [
    "METRICS_ENV",
    "WORKER_ENV",
    "start_beat",
    "SharedMetrics",
    "Supervisor",
    "become_worker",
    "shared_metrics",
    "worker_env_index",
]

log = logging.getLogger("upf.workers")

WORKER_ENV = "UPF_WORKER_INDEX"
"""Set by the supervisor in each worker's environment (``<index>:<supervisor pid>``); not a user setting."""
METRICS_ENV = "UPF_WORKER_METRICS_DIR"
"""Set by the supervisor: the private directory where workers leave their metrics (``SharedMetrics``)."""

STOP_SLACK_SECS = 6.0
"""Past UPF_SHUTDOWN_GRACE_SECS, how long a stopping worker has left (its own watchdog ends it at grace + 5 s)
before the supervisor kills it."""
BACKOFF_FIRST_SECS = 0.2
BACKOFF_MAX_SECS = 10.0
STABLE_SECS = 10.0
"""A worker that ran this long before dying is restarted after the first backoff again."""
BEAT_ENV = "UPF_WORKER_BEAT_FD"
"""Set by the supervisor: the pipe a worker writes its liveness beat to (``start_beat``)."""
BEATS_PER_WATCH = 4
"""A worker beats this many times per UPF_WORKER_WATCHDOG_SECS."""

_PR_SET_PDEATHSIG = 1


def worker_env_index(env: dict[str, str] | os._Environ[str] | None = None) -> tuple[int, int] | None:
    """(index, supervisor pid) when this process is a worker started by the supervisor."""
    raw = (os.environ if env is None else env).get(WORKER_ENV, "")
    index, _, parent = raw.partition(":")
    if not index.isdigit() or not parent.isdigit():
        return None
    return int(index), int(parent)


class SharedMetrics:
    """``GET /metrics`` of a worker: its own cells plus every other worker's, so a scrape through the
    shared port sees the whole server whichever worker answers it (without this, successive scrapes
    showed one worker's counters, then another's: to Prometheus, counters going backwards).

    Each worker leaves a snapshot of its cells in the supervisor's directory at each heartbeat (a
    wake-up its node takes anyway) and at each scrape it answers, which adds the others' latest: a
    scraper that keeps its connection, and so one worker, still sees the others' counters at most a
    heartbeat old. Each worker's counters only grow, so the sum never goes back."""

    __slots__ = ("directory", "index", "registry")

    def __init__(self, directory: str, index: int, registry: tm.Registry) -> None:
        self.directory = directory
        self.index = index
        self.registry = registry
        self.leave()  # so a worker that has not beaten yet still counts in the others' answers

    def leave(self) -> bytes:
        """Write this worker's snapshot (whole, by rename) and return it."""
        own = tm.snapshot(self.registry)
        path = os.path.join(self.directory, f"worker-{self.index}.metrics")
        with contextlib.suppress(OSError):  # a full disk: the others go on with this one's last
            with open(path + ".tmp", "wb") as f:
                f.write(own)
            os.replace(path + ".tmp", path)
        return own

    def render(self) -> bytes:
        snapshots = [self.leave()]  # rendered from the bytes written: what the others add is what was served
        mine = f"worker-{self.index}.metrics"
        with contextlib.suppress(OSError):
            for name in os.listdir(self.directory):
                if name != mine and _SNAPSHOT.fullmatch(name):
                    with contextlib.suppress(OSError), open(os.path.join(self.directory, name), "rb") as f:
                        snapshots.append(f.read())
        return tm.render_merged(snapshots)


_SNAPSHOT = re.compile(r"worker-\d+\.metrics")
"""A worker's snapshot; its ``.tmp`` while it is written is not one."""


def shared_metrics(registry: tm.Registry) -> SharedMetrics | None:
    """The worker's ``SharedMetrics`` when the supervisor gave it a directory, else None."""
    directory = os.environ.get(METRICS_ENV, "")
    worker = worker_env_index()
    if not directory or worker is None or not os.path.isdir(directory):
        return None
    return SharedMetrics(directory, worker[0], registry)


def become_worker(parent: int) -> None:
    """Die with the supervisor: a killed parent must not leave workers serving on its port."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def start_beat(loop: asyncio.AbstractEventLoop, watchdog_secs: float) -> None:
    """Beat on the supervisor's pipe from this loop (a worker of a supervisor; else nothing): a timer,
    so the beat stops when the loop does."""
    raw = os.environ.get(BEAT_ENV, "")
    if not raw.isdigit() or watchdog_secs <= 0:
        return
    fd = int(raw)
    os.set_blocking(fd, False)
    every = watchdog_secs / BEATS_PER_WATCH

    def beat() -> None:
        try:
            os.write(fd, b".")
        except BlockingIOError:
            pass  # the supervisor has not read the last ones: they say the same
        except OSError:
            return  # the supervisor is gone (this worker follows it: become_worker)
        loop.call_later(every, beat)

    beat()


def _reserve(host: str, port: int) -> socket.socket:
    """Fail if the port is taken (as one process would), then hold it for the workers."""
    probe = bound_socket(host, port)  # EADDRINUSE if anyone, even another group, has it
    port = probe.getsockname()[1]
    probe.close()
    return bound_socket(host, port, reuse_port=True)


class _Worker:
    def __init__(self, index: int) -> None:
        self.index = index
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0
        self.backoff = BACKOFF_FIRST_SECS
        self.restart_at = 0.0
        self.beats = -1
        """The read end of the worker's beat pipe (-1: none)."""
        self.beat_at: float | None = None
        """When it last beat (None: not yet; a starting worker is not watched)."""


class Supervisor:
    """Starts, restarts and stops the worker processes; see the module docstring."""

    def __init__(self, settings: Settings, *, argv: list[str] | None = None) -> None:
        self.settings = settings
        self.argv = argv or [sys.executable, "-m", "upf"]
        self.workers = [_Worker(i) for i in range(settings.workers)]
        self.stopping = False
        self.exit_code = 0
        self.port = settings.bind_port
        self.metrics_dir = ""

    def _env(self, index: int) -> dict[str, str]:
        env = dict(os.environ)
        suffix = f"-w{index}"
        base = self.settings.node_id[: 64 - len(suffix)]
        roles = [r for r in self.settings.roles if r != "janitor" or index == 0]
        env.update(
            UPF_NODE_ID=base + suffix,
            UPF_ROLES=",".join(roles),
            UPF_BIND=f"{self.settings.bind_host}:{self.port}",
            UPF_WORKERS="1",
        )
        env[WORKER_ENV] = f"{index}:{os.getpid()}"
        env[METRICS_ENV] = self.metrics_dir
        return env

    def _start(self, w: _Worker) -> None:
        self._close_beats(w)
        rfd, wfd = os.pipe()
        os.set_blocking(rfd, False)
        env = self._env(w.index)
        env[BEAT_ENV] = str(wfd)
        try:
            w.proc = subprocess.Popen(self.argv, env=env, pass_fds=(wfd,))
        finally:
            os.close(wfd)
        w.beats, w.beat_at = rfd, None
        w.started = time.monotonic()
        log.info("worker started", extra={"worker": w.index, "pid": w.proc.pid})
        print(f"upf: worker {w.index} pid {w.proc.pid}", flush=True)

    def _reap(self) -> None:
        now = time.monotonic()
        for w in self.workers:
            if w.proc is None or w.proc.poll() is None:
                continue
            code = w.proc.returncode
            w.proc = None
            if self.stopping:
                if code not in (0, -signal.SIGTERM, -signal.SIGINT):
                    # Its stop did not finish (its watchdog's 70, a crash): the supervisor's did not either.
                    log.warning("worker's stop failed", extra={"worker": w.index, "code": code})
                    self._failed_stop()
                continue
            if code == 2:  # a configuration error: restarting cannot fix it
                log.error("worker exited with a configuration error", extra={"worker": w.index})
                self.exit_code = 2
                self._stop()
                continue
            if now - w.started >= STABLE_SECS:
                w.backoff = BACKOFF_FIRST_SECS
            w.restart_at = now + w.backoff
            log.warning("worker died; restarting", extra={"worker": w.index, "code": code, "delay": w.backoff})
            w.backoff = min(w.backoff * 2, BACKOFF_MAX_SECS)

    @staticmethod
    def _close_beats(w: _Worker) -> None:
        if w.beats >= 0:
            os.close(w.beats)
            w.beats, w.beat_at = -1, None

    def _read_beats(self, ready: list[int]) -> None:
        now = time.monotonic()
        for w in self.workers:
            if w.beats in ready:
                with contextlib.suppress(BlockingIOError):
                    if os.read(w.beats, 512):
                        w.beat_at = now
                    else:  # the worker closed it (it exited): its reap follows
                        self._close_beats(w)

    def _watch(self) -> float | None:
        """Kill a running worker that stopped beating; the seconds until the next one could be due."""
        limit = self.settings.worker_watchdog_secs
        if self.stopping or limit <= 0:
            return None
        now = time.monotonic()
        due: float | None = None
        for w in self.workers:
            if w.proc is None or w.beat_at is None:
                continue
            left = w.beat_at + limit - now
            if left <= 0:
                log.warning(
                    "worker unresponsive; killing", extra={"worker": w.index, "silent_secs": round(now - w.beat_at, 1)}
                )
                print(
                    f"upf: worker {w.index} pid {w.proc.pid} unresponsive for {now - w.beat_at:.0f} s; killing it",
                    flush=True,
                )
                with contextlib.suppress(ProcessLookupError):
                    w.proc.kill()  # SIGKILL ends a stopped process too; its reap restarts it
                w.beat_at = None
                continue
            due = left if due is None else min(due, left)
        return due

    def _failed_stop(self) -> None:
        """Exit 70 (EX_SOFTWARE, as a process whose own watchdog ended it) unless a worse status is set."""
        if self.exit_code == 0:
            self.exit_code = EXIT_OVERDUE

    def _stop(self, signum: int = signal.SIGTERM) -> None:
        self.stopping = True
        for w in self.workers:
            if w.proc is not None and w.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    w.proc.send_signal(signum)

    def run(self) -> int:
        """Serve until SIGTERM/SIGINT; return the exit code (2 when a worker reports a bad setting, 70 when a
        worker's stop did not finish: it exited 70 or was killed at the deadline)."""
        try:
            hold = _reserve(self.settings.bind_host, self.settings.bind_port)
        except OSError as exc:
            print(f"upf: {bind_error(self.settings.bind_host, self.settings.bind_port, exc)}", file=sys.stderr)
            return 1
        self.port = hold.getsockname()[1]
        self.metrics_dir = tempfile.mkdtemp(prefix="upf-metrics-")  # 0700: counters of this server only
        rfd, wfd = os.pipe()
        os.set_blocking(rfd, False)
        os.set_blocking(wfd, False)
        old_wakeup = signal.set_wakeup_fd(wfd)
        received: list[int] = []
        handler = lambda signum, _frame: received.append(signum)  # noqa: E731 - the work happens in the loop
        previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD)}
        print(f"upf: {self.settings.workers} workers on {base_url(self.settings.bind_host, self.port)}", flush=True)
        try:
            for w in self.workers:
                self._start(w)
            deadline = None
            while True:
                self._reap()
                while received:
                    signum = received.pop()
                    if signum in (signal.SIGTERM, signal.SIGINT) and not self.stopping:
                        log.info("stopping workers", extra={"signal": signum})
                        self._stop(signum)
                if self.stopping:
                    if all(w.proc is None for w in self.workers):
                        return self.exit_code
                    deadline = deadline or time.monotonic() + self.settings.shutdown_grace_secs + STOP_SLACK_SECS
                    if time.monotonic() >= deadline:
                        for w in self.workers:
                            if w.proc is not None:
                                log.warning("worker outlived the stop grace; killing", extra={"worker": w.index})
                                w.proc.kill()
                                w.proc.wait()
                                w.proc = None
                                self._failed_stop()
                        continue
                    timeout: float | None = max(0.0, min(0.1, deadline - time.monotonic()))
                else:
                    now = time.monotonic()
                    due = [w for w in self.workers if w.proc is None]
                    for w in due:
                        if w.restart_at <= now:
                            self._start(w)
                    waiting = [w.restart_at - now for w in self.workers if w.proc is None]
                    watch = self._watch()
                    if watch is not None:
                        waiting.append(watch)
                    timeout = max(0.0, min(waiting)) if waiting else None
                beats = [w.beats for w in self.workers if w.beats >= 0]
                ready: list[int] = []
                with contextlib.suppress(InterruptedError):
                    ready = select.select([rfd, *beats], [], [], timeout)[0]
                self._read_beats(ready)
                with contextlib.suppress(BlockingIOError):
                    while os.read(rfd, 512):
                        pass
        finally:
            self.stopping = True
            for w in self.workers:
                if w.proc is not None and w.proc.poll() is None:
                    w.proc.kill()
                    w.proc.wait()
                self._close_beats(w)
            signal.set_wakeup_fd(old_wakeup)
            for s, h in previous.items():
                signal.signal(s, h)
            os.close(rfd)
            os.close(wfd)
            hold.close()
            shutil.rmtree(self.metrics_dir, ignore_errors=True)
