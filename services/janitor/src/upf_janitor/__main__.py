"""``upf-janitor``: the janitor role on its own (its own image), with ops endpoints on UPF_BIND."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from upf_keyspace import SettingsError, load_settings, open_store
from upf_keyspace import telemetry as tm

from . import __version__
from .janitor import Janitor
from .ops_http import json_body, serve_ops

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

    async def health():  # type: ignore[no-untyped-def]
        return 200, "application/json", json_body({"healthy": True})

    async def heartbeat():  # type: ignore[no-untyped-def]
        try:
            await store.ping()
        except Exception:  # noqa: BLE001 - any store failure means unhealthy
            return 503, "application/json", json_body({"status": "error", "store": "unreachable"})
        return 200, "application/json", json_body({"status": "ok", "store": store.db.name})

    async def version():  # type: ignore[no-untyped-def]
        return 200, "application/json", json_body({"name": "upf-janitor", "version": __version__})

    async def lb():  # type: ignore[no-untyped-def]
        return 200, "application/json", b"{}\n"

    async def metrics():  # type: ignore[no-untyped-def]
        return 200, tm.METRICS_CONTENT_TYPE, tm.render_metrics(telemetry.registry)

    server = await serve_ops(
        settings.bind_host,
        settings.bind_port,
        {
            "/v1/health": health,
            "/__heartbeat__": heartbeat,
            "/__version__": version,
            "/__lbheartbeat__": lb,
            "/metrics": metrics,
        },
    )
    log.info("janitor started", extra={"bind": f"{settings.bind_host}:{settings.bind_port}", "store": store.db.name})
    try:
        await janitor.run(stop)
    finally:
        server.close()
        await server.wait_closed()
        await store.close()
        telemetry.shutdown()


def main() -> None:
    tm.configure_logging()
    try:
        asyncio.run(amain())
    except SettingsError as exc:
        print(f"upf-janitor: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
