"""Cross-role fixtures: real role processes on loopback ports, sharing one embedded store file."""

from __future__ import annotations

import asyncio
import inspect
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Self

import httpx
import pytest

TIMEOUT_FACTOR = float(os.environ.get("UPF_TESTS_TIMEOUT_FACTOR", "1"))


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


_EPHEMERAL = _ephemeral_range()
_HANDED_OUT: set[int] = set()  # a port is handed out once per test run: two picks may both still be unbound


def free_port() -> int:
    """A port free now, from below the kernel's ephemeral range when there is room: a port the kernel
    hands out (port 0) can be taken by any outgoing connection before the process we give it to binds."""
    low = 20000 if _EPHEMERAL[0] > 21000 else 1024
    high = min(_EPHEMERAL[0], 65536) if _EPHEMERAL[0] > low + 1000 else 65536
    for _ in range(200):
        port = random.randrange(low, high)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            _HANDED_OUT.add(port)
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def eventually(check: Callable[[], Any], timeout: float = 10.0, interval: float = 0.1) -> Any:
    """``check()`` (awaited when it returns an awaitable) until it stops raising AssertionError; its
    value, or the last AssertionError once ``timeout`` (times UPF_TESTS_TIMEOUT_FACTOR) has passed."""
    deadline = time.monotonic() + timeout * TIMEOUT_FACTOR
    while True:
        try:
            result = check()
            return await result if inspect.isawaitable(result) else result
        except AssertionError:
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(interval)


class Process:
    """A real server process on a loopback port, its output in a log file; stopped on exit. Ready
    when ``health`` answers 200."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str] | None,
        log: Path,
        port: int,
        health: str,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.port = port
        self.base = f"http://127.0.0.1:{port}"
        self.health = health
        self.log_path = log
        self._log = open(log, "ab")  # noqa: SIM115 - the process writes to it until stop() closes it
        self.proc = subprocess.Popen(
            argv, env=env, cwd=cwd, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def wait_ready(self, timeout: float = 20.0) -> Self:
        deadline = time.monotonic() + timeout * TIMEOUT_FACTOR
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: {self.log()}")
            try:
                if httpx.get(self.base + self.health, timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"{self.name} not ready: {self.log()}")

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-3000:]

    def kill9(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)  # its own session: a launcher's child goes too
                self.proc.wait(10)
        self._log.close()


class Role(Process):
    """One UPF process (``python -m <module>``) with its own port (from ``UPF_BIND``)."""

    def __init__(self, module: str, env: dict[str, str], log: Path) -> None:
        port = int(env["UPF_BIND"].rsplit(":", 1)[1])
        super().__init__(module, [sys.executable, "-m", module], env, log, port, "/__lbheartbeat__")
        self.module = module
        self.env = env


class Fleet:
    """Starts roles on one shared store file; every role gets the same shard count."""

    def __init__(self, tmp: Path, **settings: str) -> None:
        self.tmp = tmp
        self.store = str(tmp / "upf.db")
        self.settings = settings
        self.roles: list[Role] = []

    def start(self, module: str, roles: str | None = None, node: str = "", **extra: str) -> Role:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("UPF_", "OTEL_"))}
        env.update(
            UPF_BIND=f"127.0.0.1:{free_port()}",
            UPF_STORE_PATH=self.store,
            UPF_SHARD_COUNT="8",
            UPF_KEEPALIVE_SECS="2",
            UPF_HEARTBEAT_SECS="0.5",
            UPF_JANITOR_INTERVAL_SECS="0.5",
            PYTHONUNBUFFERED="1",
        )
        env.update(self.settings)
        if roles:
            env["UPF_ROLES"] = roles
        if node:
            env["UPF_NODE_ID"] = node
        env.update(extra)
        role = Role(module, env, self.tmp / f"{module}-{node or len(self.roles)}.log")
        self.roles.append(role)
        return role.wait_ready()

    def stop(self) -> None:
        for r in self.roles:
            r.stop()


@pytest.fixture
def fleet(tmp_path) -> Iterator[Fleet]:
    f = Fleet(tmp_path)
    try:
        yield f
    finally:
        f.stop()


@pytest.fixture
def upf(fleet) -> Role:
    """The all-in-one program: writer, pusher and janitor on one port."""
    return fleet.start("upf", node="allinone")
