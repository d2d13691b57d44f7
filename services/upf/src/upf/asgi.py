"""The ASGI app granian's worker imports when ``upf`` runs the writer without the pusher
(``UPF_ROLES=writer`` or ``writer,janitor``): the writer's app, with the janitor started and stopped by
its lifespan when that role is on too, so both run in the one worker process and its ``GET /metrics``
covers both."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from upf_edge.asgi import lazy_app
from upf_edge.gcpolicy import settle_gc
from upf_keyspace import load_settings, open_store
from upf_keyspace.telemetry import setup_telemetry

from . import __version__

__all__ = ["app", "build_app"]  # noqa: F822 - `app` is built on first access by the module __getattr__


def build_app() -> Any:
    from upf_writer.app import create_app

    settings = load_settings()
    telemetry = setup_telemetry("upf", __version__)
    app = create_app(settings, telemetry=telemetry)
    if "janitor" in settings.roles:
        from upf_janitor import Janitor

        stop = asyncio.Event()
        running: dict[str, Any] = {}

        async def start_janitor() -> None:
            store = await open_store(settings)
            running["store"] = store
            running["task"] = asyncio.get_running_loop().create_task(Janitor(store, settings, telemetry).run(stop))

        async def stop_janitor() -> None:
            stop.set()
            task = running.get("task")
            if task is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(task, 10)
            store = running.get("store")
            if store is not None:
                await store.close()

        app.on_startup.append(start_janitor)
        app.on_shutdown.append(stop_janitor)
    app.on_startup.append(settle_gc)  # after the lifespan and the janitor's start: what startup left is frozen
    app.on_shutdown.append(telemetry.shutdown)
    return app


__getattr__ = lazy_app(build_app)
