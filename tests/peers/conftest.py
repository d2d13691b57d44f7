"""Peer fixtures: the real ntfy server and a real UPF all-in-one process, side by side, same settings.

The binary is found (or built) once per session; the two servers live as long as the test module using them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.conftest import Role, free_port
from tests.peers.ntfy import NtfyServer, Unavailable, ensure_ntfy

# Both servers get the same keepalive interval (ntfy's minimum is 5 s) and the same 4096-byte body limit.
KEEPALIVE_SECS = 5
MAX_MESSAGE_BYTES = 4096


@pytest.fixture(scope="session")
def ntfy_binary():
    try:
        return ensure_ntfy()
    except Unavailable as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def ntfy(ntfy_binary, tmp_path_factory) -> Iterator[NtfyServer]:
    server = NtfyServer(
        ntfy_binary,
        tmp_path_factory.mktemp("ntfy"),
        keepalive_secs=KEEPALIVE_SECS,
        message_size_limit=MAX_MESSAGE_BYTES,
    )
    try:
        yield server.wait_ready()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def upf_peer(tmp_path_factory) -> Iterator[Role]:
    tmp = tmp_path_factory.mktemp("upf-peer")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UPF_", "OTEL_"))}
    env.update(
        UPF_BIND=f"127.0.0.1:{port}",
        UPF_PUBLIC_URL=f"http://127.0.0.1:{port}",
        UPF_STORE_PATH=str(tmp / "upf.db"),
        UPF_SHARD_COUNT="8",
        UPF_KEEPALIVE_SECS=str(KEEPALIVE_SECS),
        UPF_MAX_MESSAGE_BYTES=str(MAX_MESSAGE_BYTES),
        UPF_NODE_ID="peer",
        PYTHONUNBUFFERED="1",
    )
    role = Role("upf", env, tmp / "upf.log")
    try:
        yield role.wait_ready()
    finally:
        role.stop()
