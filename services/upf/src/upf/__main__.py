"""``upf``: run the roles named in UPF_ROLES (default all three) in one process.

The roles still talk only through the store: in one process they merely share its connection. With
the pusher present, its lean HTTP/1.1 server is the single front door and hands every request that is
not a subscription to the writer's ASGI app, so a phone can use one base URL. Without the pusher the
writer runs on granian as in its own image.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading

from upf_keyspace import Settings, SettingsError, load_settings, open_store

log = logging.getLogger("upf")


async def run_with_pusher(settings: Settings) -> None:
    from upf_janitor import Janitor
    from upf_pusher.server import serve

    store = await open_store(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    fallback = None
    if "writer" in settings.roles:
        from upf_writer.app import create_app

        fallback = create_app(settings, store)
    try:
        pusher = await serve(settings, store, fallback=fallback)
        janitor_task = None
        if "janitor" in settings.roles:
            janitor_task = asyncio.create_task(Janitor(store, settings).run(stop))
        log.info(
            "upf started",
            extra={"roles": ",".join(settings.roles), "bind": f"{settings.bind_host}:{settings.bind_port}",
                   "store": store.db.name, "node": settings.node_id},
        )
        print(f"upf: {','.join(settings.roles)} on http://{settings.bind_host}:{settings.bind_port} "
              f"(store: {settings.fdb_cluster_file or settings.store_path})", flush=True)
        await stop.wait()
        await pusher.stop()
        if janitor_task is not None:
            await janitor_task
    finally:
        await store.close()


def run_janitor_thread(settings: Settings, stop: threading.Event) -> threading.Thread:
    """The janitor beside a granian-served writer: its own loop and store connection in a thread."""
    from upf_janitor import Janitor

    async def body() -> None:
        store = await open_store(settings)
        done = asyncio.Event()

        async def watch_stop() -> None:
            while not stop.is_set():
                await asyncio.sleep(0.2)
            done.set()

        watcher = asyncio.create_task(watch_stop())
        try:
            await Janitor(store, settings).run(done)
        finally:
            watcher.cancel()
            await store.close()

    t = threading.Thread(target=lambda: asyncio.run(body()), name="upf-janitor", daemon=True)
    t.start()
    return t


def main() -> None:
    logging.basicConfig(level=os.environ.get("UPF_LOG_LEVEL", "INFO"), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        settings = load_settings()
    except SettingsError as exc:
        print(f"upf: {exc}", file=sys.stderr)
        sys.exit(2)
    roles = set(settings.roles)
    try:
        if "pusher" in roles:
            asyncio.run(run_with_pusher(settings))
        elif "writer" in roles:
            from upf_writer.__main__ import build_server

            stop = threading.Event()
            janitor = run_janitor_thread(settings, stop) if "janitor" in roles else None
            try:
                build_server(settings.bind_host, settings.bind_port).serve()
            finally:
                stop.set()
                if janitor is not None:
                    janitor.join(timeout=5)
        else:
            from upf_janitor.__main__ import amain

            asyncio.run(amain())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
