"""``upf-janitor``: the janitor role on its own (its own image), with ops endpoints on UPF_BIND; SIGTERM
ends it after its pass in progress (cut at UPF_SHUTDOWN_GRACE_SECS)."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from upf_edge.gcpolicy import settle_gc
from upf_edge.lifecycle import arm_exit_watchdog
from upf_edge.ops import MetricsAccess, OpsRoutes
from upf_edge.serve import bind_error, serve_handler
from upf_keyspace import SettingsError, StoreOpenError, load_settings, open_store
from upf_keyspace import telemetry as tm

from . import __version__
from .janitor import Janitor

log = logging.getLogger("upf.janitor")


async def amain(service_name: str = "upf-janitor") -> None:
    settings = load_settings()
    telemetry = tm.setup_telemetry(service_name, __version__)
    store = await open_store(settings)
    janitor = Janitor(store, settings, telemetry)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    registry = telemetry.registry
    # The same ops routes, store probe (a ping) and heartbeat timeout as the writer's.
    ops = OpsRoutes(
        "upf-janitor",
        __version__,
        store.ping,
        lambda: tm.render_metrics(registry),
        tm.METRICS_CONTENT_TYPE,
        scrapers=MetricsAccess.of(settings),
    )
    try:
        server = await serve_handler(ops, settings.bind_host, settings.bind_port)
    except OSError as exc:
        await store.close()
        telemetry.shutdown()
        raise BindError(bind_error(settings.bind_host, settings.bind_port, exc)) from None
    log.info("janitor started", extra={"bind": f"{settings.bind_host}:{settings.bind_port}", "store": store.db.name})
    run = asyncio.create_task(janitor.run(stop))
    settle_gc()
    stopped = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait([run, stopped], return_when=asyncio.FIRST_COMPLETED)
        if not run.done():
            # A pass in progress finishes within the grace, else it is cancelled: a pass is idempotent
            # (the next one redoes what this one left).
            arm_exit_watchdog(settings.shutdown_grace_secs)
            try:
                await asyncio.wait_for(run, settings.shutdown_grace_secs)
            except TimeoutError:
                log.warning("janitor pass cut at shutdown")
        else:
            run.result()
    finally:
        stopped.cancel()
        server.close()
        await server.wait_closed()
        await store.close()
        telemetry.shutdown()


class BindError(Exception):
    """UPF_BIND's port could not be bound: one line for the operator, not a traceback."""


def main() -> None:
    tm.configure_logging()
    try:
        asyncio.run(amain())
    except (SettingsError, StoreOpenError) as exc:
        print(f"upf-janitor: {exc}", file=sys.stderr)
        sys.exit(2)
    except BindError as exc:
        print(f"upf-janitor: {exc}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
