"""Writer test fixtures: a real embedded store in a temporary directory, the app driven in-process
(Litestar's AsyncTestClient), and a real ``upf-writer`` process for black-box checks."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from litestar.types import ASGIApp

from upf_keyspace import Settings, Store, open_store
from upf_writer.app import create_app

PUBLIC_URL = "https://push.example"
TIMEOUT_FACTOR = float(os.environ.get("UPF_TESTS_TIMEOUT_FACTOR", "1"))


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(store_path=str(tmp_path / "upf.db"), public_url=PUBLIC_URL, default_ttl_secs=86400)


@pytest.fixture
async def store(settings: Settings) -> AsyncIterator[Store]:
    opened = await open_store(settings)
    yield opened
    await opened.close()


@contextlib.asynccontextmanager
async def lifespan(app: ASGIApp) -> AsyncIterator[None]:
    """Run the app's ASGI lifespan in this event loop (Litestar's AsyncTestClient runs the app in a
    thread with another loop, where a store opened by the test cannot be used)."""
    to_app: asyncio.Queue[dict] = asyncio.Queue()
    from_app: asyncio.Queue[dict] = asyncio.Queue()
    task = asyncio.create_task(
        app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, to_app.get, from_app.put)
    )
    await to_app.put({"type": "lifespan.startup"})
    started = await from_app.get()
    if started["type"] != "lifespan.startup.complete":
        raise RuntimeError(f"lifespan startup failed: {started}")
    try:
        yield
    finally:
        await to_app.put({"type": "lifespan.shutdown"})
        await from_app.get()
        await task


@contextlib.asynccontextmanager
async def in_process(app: ASGIApp) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client driving ``app`` in this event loop, lifespan included."""
    async with lifespan(app):
        transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://writer.test") as c:
            yield c


@pytest.fixture
async def client(settings: Settings, store: Store) -> AsyncIterator[httpx.AsyncClient]:
    """The app with a store it does not own (the all-in-one way)."""
    async with in_process(create_app(settings, store)) as c:
        yield c


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WriterProcess:
    """A real ``upf-writer`` on 127.0.0.1, stopped with SIGTERM; ``server``: UPF_WRITER_SERVER (UPF's
    own front door, the default, or granian with one worker)."""

    def __init__(self, tmp_path: Path, server: str = "upf", **env: str) -> None:
        self.server = server
        self.port = free_port()
        self.store_path = str(tmp_path / "upf.db")
        self.log_path = tmp_path / "writer.log"
        self.base_url = f"http://127.0.0.1:{self.port}"
        full_env = {
            **os.environ,
            "UPF_BIND": f"127.0.0.1:{self.port}",
            "UPF_STORE_PATH": self.store_path,
            "UPF_PUBLIC_URL": PUBLIC_URL,
            "UPF_WRITER_SERVER": server,
            **env,
        }
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "upf_writer"], env=full_env, stdout=self._log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 20 * TIMEOUT_FACTOR
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"upf-writer exited early:\n{self.log()}")
            try:
                if httpx.get(self.base_url + "/__heartbeat__", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"upf-writer did not become healthy:\n{self.log()}")
            time.sleep(0.1)

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        """SIGTERM, then wait; idempotent. Returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15 * TIMEOUT_FACTOR)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


@pytest.fixture(params=["upf", "granian"])
def writer_process(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[WriterProcess]:
    """Each black-box test runs against both servers the writer may run on."""
    w = WriterProcess(tmp_path, request.param)
    yield w
    w.stop()
