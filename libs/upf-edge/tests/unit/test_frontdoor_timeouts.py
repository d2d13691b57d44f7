"""The front door's head timeout on a keep-alive connection: the next request's head gets its own
``HEAD_TIMEOUT`` from its first bytes, not the rest of the idle wait (``IDLE_TIMEOUT``), as Go's server
times it; a head trickled in after a reply cannot hold the connection for the idle wait."""

from __future__ import annotations

import asyncio

import pytest

from upf_edge import frontdoor
from upf_edge.frontdoor import FrontDoor
from upf_edge.ops import OpsRoutes
from upf_keyspace import Settings


async def _probe() -> bool:
    return True


async def test_a_keep_alive_connections_next_head_has_its_own_head_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(frontdoor, "HEAD_TIMEOUT", 0.5)
    monkeypatch.setattr(frontdoor, "IDLE_TIMEOUT", 60.0)
    ops = OpsRoutes("upf-test", "0", _probe, lambda: b"", "text/plain")
    door = FrontDoor(Settings(bind_host="127.0.0.1", bind_port=0), ops, role="test")
    await door.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", door.port)
        writer.write(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ") and b"Connection: keep-alive" in head
        await reader.readuntil(b"\n")  # the body
        writer.write(b"GET /v1/health HTTP/1.1\r\n")  # and never the rest
        # Closed after the head timeout (plus a sweep), long before the 60 s idle wait.
        assert await asyncio.wait_for(reader.read(), 10) == b""
        writer.close()
    finally:
        await door.stop(timeout=2.0)
