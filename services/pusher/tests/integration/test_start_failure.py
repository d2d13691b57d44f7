"""A pusher start that fails or is given up: nothing it started keeps running on the store its caller
then closes (``upf-pusher`` and ``upf`` close the store right after a failed start)."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
from upf_pusher_testkit import MS, eventually, settings_for

from upf_edge import gate
from upf_keyspace import Store
from upf_pusher.server import Pusher


async def test_a_busy_port_fails_the_start_before_the_hub_runs(tmp_path: Any, store: Store) -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        pusher = Pusher(settings_for(tmp_path), store)
        started: list[bool] = []

        async def start() -> None:
            started.append(True)

        pusher.hub.start = start  # type: ignore[method-assign]
        with pytest.raises(OSError):
            await pusher.start(host="127.0.0.1", port=other.getsockname()[1])
    assert started == [] and pusher.sockets == ()
    assert gate._SHARED.get(store) is None  # the gate's watch stopped with its last user


@pytest.mark.parametrize("how", ["cancelled", "failed"])
async def test_a_start_given_up_after_the_hub_started_stops_it(tmp_path: Any, store: Store, how: str) -> None:
    """The hub's loops (heartbeat, bells, releases) and the auth gate's watch stop with the start."""
    pusher = Pusher(settings_for(tmp_path), store)
    original = pusher.hub.start
    hub_started = asyncio.Event()
    loops: list[asyncio.Task[Any]] = []

    async def start_then_hang() -> None:
        await original()
        loops.extend(pusher.hub._loops)
        assert loops and not any(t.done() for t in loops)
        hub_started.set()
        if how == "failed":
            raise RuntimeError("a later start step failed")
        await asyncio.Event().wait()

    pusher.hub.start = start_then_hang  # type: ignore[method-assign]
    task = asyncio.create_task(pusher.start(host="127.0.0.1", port=0))
    await asyncio.wait_for(hub_started.wait(), 5000 * MS)
    if how == "cancelled":
        task.cancel()
    with pytest.raises(asyncio.CancelledError if how == "cancelled" else RuntimeError):
        await task
    await eventually(lambda: all(t.done() for t in loops))
    assert pusher.sockets == ()
    assert gate._SHARED.get(store) is None  # the gate's watch stopped with its last user
