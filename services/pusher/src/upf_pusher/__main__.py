"""``upf-pusher``: run the pusher role alone, on settings.bind_host:bind_port, until SIGTERM/SIGINT,
then stop gracefully within UPF_SHUTDOWN_GRACE_SECS (``Pusher.stop``)."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import sys

from upf_edge.gcpolicy import settle_gc
from upf_edge.lifecycle import stop_event, unless_stopped
from upf_edge.limits_os import raise_open_files_limit
from upf_edge.loop import install_loop_policy
from upf_edge.provision import load_provisioning
from upf_edge.serve import bind_error
from upf_keyspace import SettingsError, StoreOpenError, load_settings, open_store
from upf_keyspace.telemetry import configure_logging, setup_telemetry

from .server import _package_version, serve

log = logging.getLogger("upf.pusher")


class BindError(Exception):
    """The port could not be bound: one line for the operator, not a traceback."""


async def _run() -> None:
    settings = load_settings()
    load_provisioning()  # a malformed UPF_AUTH_* entry stops the start here, naming the variable
    telemetry = setup_telemetry("upf-pusher", _package_version())
    store = await open_store(settings)
    # From here a stop arms the exit watchdog and gives up a start that hangs (as ``upf`` does).
    stop = stop_event(settings.shutdown_grace_secs)
    try:
        try:
            pusher = await unless_stopped(
                serve(settings, store, telemetry=telemetry), stop, settings.shutdown_grace_secs
            )
        except OSError as exc:
            if exc.errno not in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES):
                raise
            raise BindError(bind_error(settings.bind_host, settings.bind_port, exc)) from None
        if pusher is None:
            log.warning("start given up at a stop signal")
            return
        settle_gc()
        await stop.wait()
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
    except (SettingsError, StoreOpenError) as e:
        print(f"upf-pusher: {e}", file=sys.stderr)
        sys.exit(2)
    except BindError as e:  # Pusher.start binds before starting anything: nothing to undo
        print(f"upf-pusher: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
