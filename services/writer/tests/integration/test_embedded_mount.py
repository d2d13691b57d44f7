"""How the all-in-one program can serve the writer: ``create_app(settings, store)`` with a store it
already opened, served by granian's embedded server in the program's own event loop."""

from __future__ import annotations

import asyncio

import httpx
from granian.constants import Interfaces
from granian.server.embed import Server

from upf_keyspace import Settings, Store, decode_id
from upf_writer.app import create_app

from ..conftest import TIMEOUT_FACTOR, free_port


async def test_serve_with_a_shared_store_in_this_loop(settings: Settings, store: Store) -> None:
    """The app uses the caller's store (same loop), and leaves it open when the server stops."""
    port = free_port()
    server = Server(
        create_app(settings, store), address="127.0.0.1", port=port, interface=Interfaces.ASGI, log_enabled=False
    )
    serving = asyncio.create_task(server.serve())
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as c:
            for _ in range(int(100 * TIMEOUT_FACTOR)):
                try:
                    r = await c.post("/shared", content=b"hello")
                    break
                except httpx.TransportError:
                    await asyncio.sleep(0.05)
            assert r.status_code == 200
    finally:
        server.stop()
        await asyncio.wait_for(serving, 10 * TIMEOUT_FACTOR)
    rows = await store.read_after("shared", None, 10)
    assert [row.stamp for row in rows] == [decode_id(r.json()["id"])]
