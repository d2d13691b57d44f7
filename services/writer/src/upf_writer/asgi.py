"""The ASGI entry point granian imports in its worker process: ``upf_writer.asgi:app``.

``app`` is built lazily, on first attribute access, from ``load_settings()`` (the UPF_* environment),
so importing this module has no side effects; ``build_app`` is the same as a factory
(``granian --factory upf_writer.asgi:build_app``). The store is opened by the app's lifespan, in the
worker process.
"""

from __future__ import annotations

from upf_edge.asgi import lazy_app
from upf_edge.gcpolicy import settle_gc
from upf_keyspace import load_settings
from upf_keyspace.telemetry import setup_telemetry

from .app import WriterApp, create_app

__all__ = ["app", "build_app"]  # noqa: F822 - `app` is built on first access by the module __getattr__


def build_app() -> WriterApp:
    """The writer of the ``upf-writer`` program: telemetry for this (worker) process from the
    ``OTEL_*`` environment, flushed at the app's shutdown."""
    from . import __version__

    telemetry = setup_telemetry("upf-writer", __version__)
    app = create_app(load_settings(), telemetry=telemetry)
    app.on_startup.append(settle_gc)  # after the lifespan opened the store: what startup left is frozen
    app.on_shutdown.append(telemetry.shutdown)
    return app


__getattr__ = lazy_app(build_app)
