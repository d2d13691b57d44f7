"""``upf-writer``: serve the writer alone, on UPF's own front door (``door``, the default) or on granian
(``UPF_WRITER_SERVER=granian``: one worker process). SIGTERM/SIGINT stop either gracefully: the port
stops accepting, in-flight requests finish, idle keep-alive connections close, the store closes, and
the process exits 0; on the front door a stop still running UPF_SHUTDOWN_GRACE_SECS (plus a slack)
later exits 70, under granian a worker still running then is killed."""

from __future__ import annotations

import asyncio
import logging
import logging.config
import math
import sys
from typing import TYPE_CHECKING

from granian import Granian
from granian.constants import HTTPModes, Interfaces, Loops
from granian.http import HTTP1Settings
from granian.log import LogLevels

from upf_edge.limits_os import raise_open_files_limit
from upf_edge.loop import install_loop_policy
from upf_edge.provision import load_provisioning
from upf_edge.serve import bind_error, bound_socket
from upf_keyspace import Settings, SettingsError, StoreOpenError, load_settings, open_store
from upf_keyspace.telemetry import configure_logging

from .logs import log_dictconfig

if TYPE_CHECKING:
    # `granian.Granian` is a variable (the multi-process or free-threaded server, chosen at import time).
    from granian.server import MPServer, MTServer

__all__ = ["main", "build_server"]

log = logging.getLogger("upf_writer")

# Bounds on what one request may make the server buffer before the app sees it (request line plus
# headers): granian's default is ~400 KB; a publish needs far less.
HTTP1_MAX_BUFFER = 64 * 1024
WORKER_KILL_TIMEOUT_SECS = 10
"""Default of the grace granian gives a worker to stop (``UPF_SHUTDOWN_GRACE_SECS``) before killing it."""


def build_server(
    host: str,
    port: int,
    *,
    workers: int = 1,
    log_level: str = "info",
    target: str = "upf_writer.asgi:app",
    grace_secs: float = WORKER_KILL_TIMEOUT_SECS,
) -> MPServer | MTServer:
    """The granian server of the writer; ``target`` is the ASGI app each worker imports (the all-in-one
    program passes its own, which adds the janitor to the worker)."""
    return Granian(
        target=target,
        interface=Interfaces.ASGI,
        address=host,
        port=port,
        workers=workers,
        http=HTTPModes.http1,
        websockets=False,
        loop=Loops.auto,
        http1_settings=HTTP1Settings(max_buffer_size=HTTP1_MAX_BUFFER),
        log_level=LogLevels(log_level),
        log_dictconfig=log_dictconfig(log_level.upper()),
        log_access=False,
        workers_kill_timeout=max(1, math.ceil(grace_secs)),  # granian takes whole seconds
    )


def check_store(settings: Settings) -> None:
    """Open and close the embedded store before anything starts, so a path that cannot be opened is
    ``StoreOpenError`` (one line, exit 2, before the port is tried) here, not a traceback from granian's
    worker or a log line before it. FoundationDB is left to the server: its client's network thread
    must not start before granian forks."""
    if not settings.fdb_cluster_file:

        async def probe() -> None:
            await (await open_store(settings)).close()

        asyncio.run(probe())


def main(argv: list[str] | None = None) -> int:
    try:
        settings = load_settings()
        load_provisioning()  # a malformed UPF_AUTH_* entry stops the start here, naming the variable
        check_store(settings)
    except (SettingsError, StoreOpenError) as exc:
        print(f"upf-writer: {exc}", file=sys.stderr)
        return 2
    try:
        sock = bound_socket(settings.bind_host, settings.bind_port)  # a busy port: one line, exit 1
    except OSError as exc:
        print(f"upf-writer: {bind_error(settings.bind_host, settings.bind_port, exc)}", file=sys.stderr)
        return 1
    level = settings.log_level.lower()
    raise_open_files_limit()  # granian's workers inherit it
    if settings.writer_server == "granian":
        sock.close()  # granian binds it again in its own process; the gap is a start's moment
        logging.config.dictConfig(log_dictconfig(level.upper()))
        log.info("writer starting", extra=_start_attrs(settings))
        build_server(
            settings.bind_host, settings.bind_port, log_level=level, grace_secs=settings.shutdown_grace_secs
        ).serve()
        return 0
    from . import __version__
    from .door import run_writer

    configure_logging(level)
    install_loop_policy()
    log.info("writer starting", extra=_start_attrs(settings))
    try:
        asyncio.run(run_writer(settings, sock, ("upf-writer", __version__)))
    except StoreOpenError as exc:  # checked above; another process may have changed it since
        print(f"upf-writer: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


def _start_attrs(settings: Settings) -> dict[str, object]:
    return {
        "bind_host": settings.bind_host,
        "bind_port": settings.bind_port,
        "public_url": settings.public_url,
        "server": settings.writer_server,
    }


if __name__ == "__main__":
    sys.exit(main())
