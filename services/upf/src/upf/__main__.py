"""``upf``: run the roles named in UPF_ROLES (default all three) on one port; ``upf user|access|token``
manage who may use them.

The roles still talk only through the store: in one process they merely share its connection. With
the pusher present, its lean HTTP/1.1 server is the single front door, so a phone can use one base
URL: it serves subscriptions, calls the writer's publish function directly, and hands the writer's
cold routes to its ASGI app. With UPF_WORKERS > 1 (default: the cores) a supervisor runs that many
such processes on the port (SO_REUSEPORT), each its own pusher node (``workers.py``). Without the
pusher the writer runs as in its own image: on the same front door (``upf_writer.door``), or on granian
with UPF_WRITER_SERVER=granian (``upf.asgi``), with the janitor (when on) in the same process, so its
``GET /metrics`` covers both.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
import sys

from upf_edge.gcpolicy import settle_gc
from upf_edge.lifecycle import stop_event, unless_stopped
from upf_edge.limits_os import raise_open_files_limit
from upf_edge.loop import install_loop_policy
from upf_edge.provision import load_provisioning
from upf_edge.serve import base_url
from upf_keyspace import Settings, SettingsError, Store, StoreOpenError, load_settings, open_store
from upf_keyspace.telemetry import Telemetry, configure_logging, setup_telemetry

from . import __version__

log = logging.getLogger("upf")


async def run_with_pusher(settings: Settings, sock: socket.socket | None = None) -> None:
    """The pusher's front door serves everything: subscriptions and ops itself, the writer's hot routes
    through its plain function (``handler``: parsed once, no ASGI), the writer's cold routes through its
    ASGI app (``fallback``). The pusher never imports the writer: both arrive here as callables.
    ``sock`` is the port, bound by ``main`` before anything starts (a worker's SO_REUSEPORT socket when a
    supervisor runs several: UPF_WORKERS); it listens once the pusher serves."""
    from upf_janitor import Janitor
    from upf_pusher.server import serve

    # One telemetry for every role of the process: one /metrics (the pusher's front door) covers them all.
    telemetry = setup_telemetry("upf", __version__)
    # Opening the embedded store may block the loop (its write lock): until then SIGTERM's default
    # action ends the process. From here the handler arms the exit watchdog itself, so a stop ends the
    # process within the grace plus its slack even while the start below still hangs.
    store = await open_store(settings)
    stop = stop_event(settings.shutdown_grace_secs)
    loop = asyncio.get_running_loop()
    fallback = handler = None
    if "writer" in settings.roles:
        from upf_writer.app import create_app

        # The writer's hot routes (publish, JSON publish, the UnifiedPush check) as a plain function the
        # pusher's front door calls directly; its ASGI app only for the cold routes.
        fallback = create_app(settings, store, telemetry=telemetry)
        handler = fallback.front
    from .workers import shared_metrics, start_beat

    metrics = shared_metrics(telemetry.registry)  # a worker of several: /metrics answers for them all
    try:
        pusher = await unless_stopped(
            serve(
                settings,
                store,
                fallback=fallback,  # type: ignore[arg-type]  # litestar types its ASGI app with its own aliases, not the bridge's Callable
                handler=handler,
                telemetry=telemetry,
                sock=sock,
                metrics=metrics.render if metrics is not None else None,
                program=("upf", __version__),
            ),
            stop,
            settings.shutdown_grace_secs,
        )
        if pusher is None:
            log.warning("start given up at a stop signal")
            return
        if metrics is not None:
            pusher.hub.on_heartbeat = metrics.leave
        start_beat(loop, settings.worker_watchdog_secs)  # a supervisor's worker: its liveness, watched
        janitor_task = None
        if "janitor" in settings.roles:
            janitor_task = asyncio.create_task(Janitor(store, settings, telemetry).run(stop))
        settle_gc()
        port = pusher.port  # the port bound (UPF_BIND's, or the kernel's pick for port 0)
        log.info(
            "upf started",
            extra={
                "roles": ",".join(settings.roles),
                "bind": f"{settings.bind_host}:{port}",
                "store": store.db.name,
                "node": settings.node_id,
            },
        )
        print(
            f"upf: {','.join(settings.roles)} on {base_url(settings.bind_host, port)} "
            f"(store: {settings.fdb_cluster_file or settings.store_path})",
            flush=True,
        )
        await stop.wait()
        # Graceful: in-flight publishes answered, streams ended (ws 1001), affinity released, all
        # within the grace; the janitor finishes its pass in what is left of it, else is cancelled.
        deadline = loop.time() + settings.shutdown_grace_secs
        await pusher.stop()
        if janitor_task is not None:
            try:
                await asyncio.wait_for(janitor_task, max(0.1, deadline - loop.time()))
            except TimeoutError:
                log.warning("janitor pass cut at shutdown")
    finally:
        await store.close()
        telemetry.shutdown()


def _bound_or_exit(settings: Settings) -> socket.socket:
    """The port, bound before anything starts (as the supervisor binds it): a busy one is one line, exit 1."""
    from upf_edge.serve import bind_error, bound_socket

    try:
        return bound_socket(settings.bind_host, settings.bind_port)
    except OSError as exc:
        print(f"upf: {bind_error(settings.bind_host, settings.bind_port, exc)}", file=sys.stderr)
        sys.exit(1)


async def _janitor(settings: Settings, store: Store, telemetry: Telemetry, stop: asyncio.Event) -> None:
    """The janitor beside a writer without a pusher (``upf_writer.door.run_writer``), on its store."""
    from upf_janitor import Janitor

    await Janitor(store, settings, telemetry).run(stop)


def main() -> None:
    configure_logging(os.environ.get("UPF_LOG_LEVEL", "INFO"))
    if len(sys.argv) > 1:
        from .admin import COMMANDS, run

        if sys.argv[1] in ("-h", "--help"):
            sys.exit(run(["--help"]))
        if sys.argv[1] not in COMMANDS:
            print(
                f"upf: unknown command {sys.argv[1]!r}; commands: {', '.join(COMMANDS)} (none: run the server)",
                file=sys.stderr,
            )
            sys.exit(2)
        sys.exit(run(sys.argv[1:]))
    try:
        settings = load_settings()
        load_provisioning()  # a malformed UPF_AUTH_* entry stops the start here, naming the variable
    except SettingsError as exc:
        print(f"upf: {exc}", file=sys.stderr)
        sys.exit(2)
    roles = set(settings.roles)
    raise_open_files_limit()
    install_loop_policy()
    try:
        if "pusher" in roles:
            from upf_edge.serve import bound_socket

            from .workers import Supervisor, become_worker, worker_env_index

            worker = worker_env_index()
            if worker is not None:  # one of the supervisor's workers: the port is shared (SO_REUSEPORT)
                become_worker(worker[1])
                asyncio.run(
                    run_with_pusher(
                        settings, sock=bound_socket(settings.bind_host, settings.bind_port, reuse_port=True)
                    )
                )
            elif settings.workers > 1:
                sys.exit(Supervisor(settings).run())
            else:
                asyncio.run(run_with_pusher(settings, sock=_bound_or_exit(settings)))
        elif "writer" in roles:
            from upf_writer.__main__ import build_server, check_store

            check_store(settings)  # one line, exit 2, before the port is tried (and granian's worker starts)
            sock = _bound_or_exit(settings)
            if settings.writer_server == "upf":
                from upf_writer.door import run_writer

                beside = functools.partial(_janitor, settings) if "janitor" in roles else None
                asyncio.run(run_writer(settings, sock, ("upf", __version__), beside))
            else:
                sock.close()  # granian binds it again in its own process; the gap is a start's moment
                # The janitor, when on, runs inside the writer's worker process (upf.asgi), beside it.
                build_server(
                    settings.bind_host,
                    settings.bind_port,
                    log_level=settings.log_level.lower(),
                    target="upf.asgi:app",
                    grace_secs=settings.shutdown_grace_secs,
                ).serve()
        else:
            from upf_janitor.__main__ import BindError, amain

            try:
                asyncio.run(amain("upf"))
            except BindError as exc:
                print(f"upf: {exc}", file=sys.stderr)
                sys.exit(1)
    except (StoreOpenError, SettingsError) as exc:  # exit 2: a supervisor restarts no worker for it
        print(f"upf: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
