"""Fixtures for the deployment tests: the repository, real tools (nginx, podman-compose), and an ingress
started from the SHIPPED nginx config with its upstreams pointed at local ports.

No container engine can run on the project's machines, so these tests check everything about deploy/
that can run here: compose files through a real compose implementation, the Containerfiles' labels and
entrypoints, the entrypoint and health-check scripts, the FoundationDB init script against a fake
fdbcli, the Pants config, and the ingress with the real nginx.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import free_port

REPO = Path(__file__).resolve().parents[2]
INGRESS_DIR = REPO / "deploy" / "ingress"


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(name="free_port", scope="session")
def free_port_fixture() -> Callable[[], int]:
    return free_port


@pytest.fixture(scope="session")
def uv() -> list[str]:
    """How to run uv, as `python3 -m uv` does from a shell. Under `uv run pytest`, python3 is the project
    venv's (which has no uv module), but uv names itself in $UV; otherwise use the base interpreter's."""
    if os.environ.get("UV"):
        return [os.environ["UV"]]
    return [getattr(sys, "_base_executable", sys.executable), "-m", "uv"]


@pytest.fixture(scope="session")
def nginx_bin() -> str:
    path = shutil.which("nginx") or ("/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None)
    if path is None:
        pytest.fail(
            "nginx is not installed: run the tests with `./dev test` (it installs Debian's nginx) "
            "or `apt-get install nginx`; the ingress tests need the real proxy",
            pytrace=False,
        )
    return path


def render_ingress_config(
    workdir: Path,
    writer_ports: Sequence[int],
    pusher_ports: Sequence[int],
    listen_port: int,
    *,
    listen_options: str = "",
    http_extra: Sequence[str] = (),
    server_extra: Sequence[str] = (),
) -> Path:
    """Write an nginx.conf that is deploy/ingress/nginx.conf with only the host-specific lines changed.

    The upstream servers move from compose service names to local ports, the includes point at the
    repository's rule files (the same files the ingress image copies), and the pid, log and temp paths
    move into ``workdir`` so nginx runs unprivileged. Every replacement must match exactly, so an edit
    to the shipped file fails here instead of silently testing something else.

    ``listen_options`` are added to the listen directive (``proxy_protocol``); ``http_extra`` and
    ``server_extra`` are directives added to the http and server blocks, for tests that
    stand in for the deployment around the ingress (its own address on compose's network, a PROXY
    protocol balancer in front).
    """
    text = (INGRESS_DIR / "nginx.conf").read_text()
    workdir.mkdir(parents=True, exist_ok=True)

    def replace(old: str, new: str, count: int = 1) -> None:
        nonlocal text
        found = text.count(old)
        if found != count:
            raise AssertionError(f"deploy/ingress/nginx.conf: expected {count} of {old!r}, found {found}")
        text = text.replace(old, new)

    replace("worker_processes auto;", "worker_processes 1;")
    replace("pid /var/lib/nginx/nginx.pid;", f"pid {workdir}/nginx.pid;")
    replace("error_log stderr crit;", f"error_log {workdir}/error.log notice;")
    replace(
        "access_log /dev/stdout upf_private;",
        f"access_log {workdir}/access.log upf_private;\n"
        + "".join(
            f"    {kind}_temp_path {workdir}/{kind}_temp;\n"
            for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
        )
        + "".join(f"    {line}\n" for line in http_extra),
    )
    replace("include /etc/nginx/upf/", f"include {INGRESS_DIR}/", count=2)
    replace("        server writer:8080;\n", "".join(f"        server 127.0.0.1:{p};\n" for p in writer_ports))
    replace("        server pusher:8080;\n", "".join(f"        server 127.0.0.1:{p};\n" for p in pusher_ports))
    replace(
        "        listen 8080;\n",
        f"        listen {' '.join(filter(None, (f'127.0.0.1:{listen_port}', listen_options)))};\n"
        + "".join(f"        {line}\n" for line in server_extra),
    )
    conf = workdir / "nginx.conf"
    conf.write_text(text)
    return conf


@pytest.fixture(name="render_ingress_config")
def render_ingress_config_fixture() -> Callable[[Path, Sequence[int], Sequence[int], int], Path]:
    return render_ingress_config


@pytest.fixture(name="nginx_test")
def nginx_test_fixture(nginx_bin: str) -> Callable[[Path], subprocess.CompletedProcess[str]]:
    return lambda conf: nginx_test(nginx_bin, conf)


def nginx_test(nginx: str, conf: Path) -> subprocess.CompletedProcess[str]:
    """`nginx -t` on a config; -e keeps nginx off the system error log before the config is read."""
    return subprocess.run(
        [nginx, "-t", "-p", str(conf.parent), "-c", str(conf), "-e", str(conf.parent / "error.log")],
        capture_output=True,
        text=True,
        timeout=30,
    )


@dataclass
class Ingress:
    url: str
    port: int
    conf: Path
    workdir: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def ws_url(self) -> str:
        return "ws" + self.url.removeprefix("http")

    def error_log(self) -> str:
        path = self.workdir / "error.log"
        return path.read_text() if path.exists() else ""


def wait_for_port(port: int, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process exited with {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nothing listening on 127.0.0.1:{port} after {timeout}s")


@pytest.fixture
def start_ingress(nginx_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Ingress]]:
    """Start real nginx with the shipped config in front of the given writer and pusher ports (keyword
    arguments go to render_ingress_config)."""
    started: list[tuple[subprocess.Popen[bytes], Ingress]] = []

    def start(writer_ports: Sequence[int], pusher_ports: Sequence[int], **render: Any) -> Ingress:
        workdir = tmp_path_factory.mktemp("ingress")
        port = free_port()
        conf = render_ingress_config(workdir, writer_ports, pusher_ports, port, **render)
        checked = nginx_test(nginx_bin, conf)
        assert checked.returncode == 0, checked.stderr
        proc = subprocess.Popen(
            [nginx_bin, "-p", str(workdir), "-c", str(conf), "-e", str(workdir / "error.log"), "-g", "daemon off;"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        ingress = Ingress(url=f"http://127.0.0.1:{port}", port=port, conf=conf, workdir=workdir, proc=proc)
        started.append((proc, ingress))
        try:
            wait_for_port(port, 10, proc)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{ingress.error_log()}") from None
        return ingress

    yield start
    for proc, _ in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # fast shutdown: idle streams would hold a graceful one open
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
