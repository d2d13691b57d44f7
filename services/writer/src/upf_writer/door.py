"""The writer alone on UPF's own front door (``upf_edge.frontdoor``), ``upf-writer``'s default server
(``UPF_WRITER_SERVER=upf``).

Why: through granian's ASGI bridge a publish cost the writer ~90 us of CPU against a bare granian app's
~35; on the front door the all-in-one program already uses, the same front and store cost ~60
(BENCHMARKS.md). The publish is the same plain function (``WriterFront``) either way; the cold routes
are the same Litestar app, run by the front door's ASGI bridge.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Coroutine
from typing import Any

from upf_edge.frontdoor import FrontDoor
from upf_edge.gcpolicy import settle_gc
from upf_edge.lifecycle import stop_event, unless_stopped
from upf_edge.serve import base_url
from upf_keyspace import Settings, Store, open_store
from upf_keyspace.telemetry import Telemetry, setup_telemetry

from .app import create_app

__all__ = ["Beside", "run_writer"]

log = logging.getLogger("upf_writer")

Beside = Callable[[Store, Telemetry, asyncio.Event], Coroutine[Any, Any, None]]
"""A role run in the writer's process until the stop event is set (the all-in-one's janitor)."""


async def run_writer(
    settings: Settings, sock: socket.socket, program: tuple[str, str], beside: Beside | None = None
) -> None:
    """Serve the writer on ``sock`` (bound, not listening) until SIGTERM/SIGINT, then stop gracefully:
    no new connections, idle keep-alive connections closed, publishes already received answered
    within the grace. ``program`` names the telemetry's service; ``beside`` runs next to the writer on
    the same store (its failure is logged at once) and gets what is left of the grace at the stop. A
    store that cannot be opened raises ``StoreOpenError`` before the port listens; until the store is
    open, a signal's default action ends the process (opening may wait on another process's lock)."""
    telemetry = setup_telemetry(*program)
    grace = settings.shutdown_grace_secs
    try:
        store = await open_store(settings)
        log.info("writer store opened", extra={"driver": "foundationdb" if settings.fdb_cluster_file else "embedded"})
        try:
            stop = stop_event(grace)
            app = create_app(settings, store, telemetry=telemetry)  # the store stays ours: closed below
            door = FrontDoor(settings, app.ops, role="writer", handler=app.front, fallback=app)  # type: ignore[arg-type]  # litestar types its ASGI app with its own aliases

            async def start() -> FrontDoor:
                await door.start(sock=sock)
                return door

            if await unless_stopped(start(), stop, grace) is None:
                log.warning("start given up at a stop signal")
                return
            task = asyncio.create_task(beside(store, telemetry, stop)) if beside is not None else None
            if task is not None:
                task.add_done_callback(_log_failure)
            settle_gc()
            print(
                f"{program[0]}: writer on {base_url(settings.bind_host, settings.bind_port)} "
                f"(store: {settings.fdb_cluster_file or settings.store_path})",
                flush=True,
            )
            await stop.wait()
            deadline = asyncio.get_running_loop().time() + grace
            await door.stop()
            if task is not None:
                await asyncio.wait((task,), timeout=max(0.1, deadline - asyncio.get_running_loop().time()))
                if not task.done():
                    log.warning("role beside the writer cut at shutdown")
                    task.cancel()
                    await asyncio.wait((task,))
        finally:
            await store.close()
            log.info("writer store closed")
    finally:
        telemetry.shutdown()


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("role beside the writer failed", exc_info=task.exception())
