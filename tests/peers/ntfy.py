"""The real ntfy server as a test peer: built once per machine from the pinned release, started on loopback.

The binary is cached outside the repository, at ``${XDG_CACHE_HOME:-~/.cache}/upf-peers/ntfy-<version>/ntfy``,
and built under a file lock so parallel test processes build it once. The source comes from the Go module
proxy (``go mod download heckel.io/ntfy/v2@<version>``) and from nowhere else. Nothing of ntfy is kept in
this repository.

Where Go or the module cannot be had, ``ensure_ntfy`` raises ``Unavailable`` with the reason (the tests skip
with it); a build that fails once the source is there is an error, not a skip.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from tests.conftest import Process, free_port

NTFY_MODULE = "heckel.io/ntfy/v2"
NTFY_VERSION = "v2.13.0"
DOWNLOAD_TIMEOUT = 300.0
BUILD_TIMEOUT = 900.0


class Unavailable(Exception):
    """Go, or ntfy's module, cannot be had on this machine; the message says which and why."""


def cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "upf-peers" / f"ntfy-{NTFY_VERSION}"


def _go_env() -> dict[str, str]:
    env = dict(os.environ)
    env["CGO_ENABLED"] = "1"  # ntfy's message cache is cgo SQLite
    env.setdefault("GOFLAGS", "-buildvcs=false")
    env["GOTOOLCHAIN"] = "local"  # never download a toolchain
    return env


def _run(cmd: list[str], cwd: Path | None, timeout: float, what: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, cwd=cwd, env=_go_env(), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        message = f"{what} timed out after {timeout:.0f} s: {' '.join(cmd)}"
        if "download" in what:  # the proxy does not answer: it cannot be had, like a refusal
            raise Unavailable(message) from e
        raise RuntimeError(message) from e


def _module_source() -> Path:
    """A directory holding ntfy's source at the pinned version (read-only is fine)."""
    r = _run(
        ["go", "mod", "download", "-json", f"{NTFY_MODULE}@{NTFY_VERSION}"], None, DOWNLOAD_TIMEOUT, "go mod download"
    )
    try:
        info = json.loads(r.stdout)
    except json.JSONDecodeError:
        info = {}
    if info.get("Dir") and not info.get("Error"):
        return Path(info["Dir"])
    reason = (info.get("Error") or r.stderr or r.stdout).strip().splitlines()
    raise Unavailable(
        f"the Go module proxy does not serve {NTFY_MODULE}@{NTFY_VERSION}: "
        f"{reason[-1] if reason else 'no reason given'}"
    )


def _build(target: Path, log: Path) -> float:
    """Build ntfy (server only) into ``target``; returns the build time in seconds."""
    if shutil.which("go") is None:
        raise Unavailable("Go is not installed (no `go` on PATH), so the ntfy peer cannot be built")
    src = _module_source()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="upf-ntfy-build-") as tmp:
        work = Path(tmp) / "ntfy"
        shutil.copytree(src, work, ignore=shutil.ignore_patterns(".git"))
        for d in (work, *[Path(p) for p, _, _ in os.walk(work)]):
            d.chmod(0o755)  # the module cache is read-only
        # ntfy embeds its web app and docs; a server-only build needs placeholders (its Makefile does the same)
        for placeholder in ("server/site/app.html", "server/docs/index.html"):
            (work / placeholder).parent.mkdir(parents=True, exist_ok=True)
            (work / placeholder).touch()
        # dependencies first, so that a proxy refusing them is told apart from a broken build
        r = _run(["go", "mod", "download"], work, DOWNLOAD_TIMEOUT, "go mod download (dependencies)")
        if r.returncode != 0:
            raise Unavailable(f"the Go module proxy does not serve ntfy's dependencies: {r.stderr.strip()[-500:]}")
        out = target.with_suffix(".tmp")
        r = _run(["go", "build", "-o", str(out), "."], work, BUILD_TIMEOUT, "go build of ntfy")
        log.write_text(r.stdout + r.stderr)
        if r.returncode != 0 and re.search(r"requires go >= |go: downloading go1", r.stderr):
            raise Unavailable(f"the installed Go is too old for ntfy {NTFY_VERSION}: {r.stderr.strip()[-300:]}")
        if r.returncode != 0:
            raise RuntimeError(f"go build of ntfy {NTFY_VERSION} failed (log {log}):\n{r.stderr[-3000:]}")
        out.replace(target)
    return time.monotonic() - started


def ensure_ntfy() -> Path:
    """The cached ntfy binary, built first when missing (once per machine, under a file lock)."""
    d = cache_dir()
    binary = d / "ntfy"
    if binary.is_file() and os.access(binary, os.X_OK):
        return binary
    d.mkdir(parents=True, exist_ok=True)
    with open(d / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a parallel process builds it; wait, then find it done
        if not binary.is_file():
            seconds = _build(binary, d / "build.log")
            (d / "build-seconds").write_text(f"{seconds:.1f}\n")
    return binary


class NtfyServer(Process):
    """One ntfy process on a free loopback port with a throw-away config; ``stop()`` ends it."""

    def __init__(
        self,
        binary: Path,
        workdir: Path,
        *,
        keepalive_secs: int = 45,
        cache_secs: int = 2419200,
        message_size_limit: int = 4096,
        cache_file: bool = True,
        **extra: object,
    ) -> None:
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        workdir.mkdir(parents=True, exist_ok=True)
        config = {
            "base-url": base,
            "listen-http": f"127.0.0.1:{port}",
            "cache-file": str(workdir / "cache.db"),
            "cache-duration": f"{cache_secs}s",
            "behind-proxy": False,
            "keepalive-interval": f"{keepalive_secs}s",
            "message-size-limit": str(message_size_limit),
            "visitor-request-limit-exempt-hosts": "127.0.0.1",
            "visitor-request-limit-burst": 100000,
            "visitor-message-daily-limit": 1000000,
            "visitor-subscription-limit": 100000,
            "global-topic-limit": 1000000,
            "log-level": "warn",
            **extra,
        }
        if not cache_file:
            del config["cache-file"]  # ntfy keeps its message cache in memory
        self.config_path = workdir / "server.yml"
        # JSON is YAML; ntfy reads the file with its YAML loader
        self.config_path.write_text(json.dumps(config, indent=1))
        super().__init__(
            "ntfy",
            [str(binary), "serve", "--config", str(self.config_path)],
            None,
            workdir / "ntfy.log",
            port,
            "/v1/health",
        )
