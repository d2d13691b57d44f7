"""The front door's request tasks: made on the loop it started on, waited for by ``stop``, and made by
the loop's task factory when one is set (instrumentation that wraps tasks keeps seeing requests)."""

from __future__ import annotations

import asyncio
from typing import Any

from upf_edge.frontdoor import FrontDoor
from upf_edge.ops import OpsRoutes
from upf_keyspace import Settings


async def _probe() -> bool:
    return True


def _door() -> FrontDoor:
    ops = OpsRoutes("upf-test", "0", _probe, lambda: b"", "text/plain")
    return FrontDoor(Settings(bind_host="127.0.0.1", bind_port=0), ops, role="test")


async def _get_health(port: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    reply = await reader.read()
    writer.close()
    return reply


async def test_a_request_task_is_named_on_the_start_loop_and_stop_waits_for_it() -> None:
    door = _door()
    await door.start()
    try:
        assert (await _get_health(door.port)).startswith(b"HTTP/1.1 200 ")
        finished: list[bool] = []

        async def slow() -> None:
            await asyncio.sleep(0.05)
            finished.append(True)

        task = door.spawn(slow())
        assert task.get_name() == "upf-request"
        assert task.get_loop() is asyncio.get_running_loop()
    finally:
        await door.stop(timeout=2.0)
    assert finished == [True]  # stop let it finish within the grace
    assert task.done() and not task.cancelled()


async def test_a_loop_task_factory_makes_the_request_tasks() -> None:
    loop = asyncio.get_running_loop()
    made: list[asyncio.Task[Any]] = []

    def factory(lp: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        task = asyncio.Task(coro, loop=lp, **kwargs)
        made.append(task)
        return task

    loop.set_task_factory(factory)
    door = _door()
    try:
        await door.start()
        before = len(made)
        assert (await _get_health(door.port)).startswith(b"HTTP/1.1 200 ")
        assert len(made) > before  # the health request's task came from the factory
    finally:
        await door.stop(timeout=2.0)
        loop.set_task_factory(None)
