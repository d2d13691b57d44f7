"""``upf-pusher``: run the pusher role alone, on settings.bind_host:bind_port, until SIGTERM/SIGINT,
then stop gracefully within UPF_SHUTDOWN_GRACE_SECS (``Pusher.stop``)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

from upf_edge.gcpolicy import settle_gc
from upf_edge.lifecycle import arm_exit_watchdog
from upf_edge.limits_os import raise_open_files_limit
from upf_edge.loop import install_loop_policy
from upf_edge.provision import load_provisioning
from upf_keyspace import SettingsError, load_settings, open_store
from upf_keyspace.telemetry import configure_logging, setup_telemetry

from .server import _package_version, serve

log = logging.getLogger("upf.pusher")


async def _run() -> None:
    settings = load_settings()
    load_provisioning()  # a malformed UPF_AUTH_* entry stops the start here, naming the variable
    telemetry = setup_telemetry("upf-pusher", _package_version())
    store = await open_store(settings)
    try:
        pusher = await serve(settings, store, telemetry=telemetry)
        settle_gc()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        arm_exit_watchdog(settings.shutdown_grace_secs)
        await pusher.stop()
    finally:
        await store.close()
        telemetry.shutdown()


def main() -> None:
    configure_logging(os.environ.get("UPF_LOG_LEVEL", "INFO"))
    raise_open_files_limit()
    install_loop_policy()
    try:
        asyncio.run(_run())
    except SettingsError as e:
        print(f"upf-pusher: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
