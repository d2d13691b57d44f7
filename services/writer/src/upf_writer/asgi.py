"""The ASGI entry point granian imports in its worker process: ``upf_writer.asgi:app``.

``app`` is built lazily, on first attribute access, from ``load_settings()`` (the UPF_* environment),
so importing this module has no side effects; ``build_app`` is the same as a factory
(``granian --factory upf_writer.asgi:build_app``). The store is opened by the app's lifespan, in the
worker process.
"""

from __future__ import annotations

from typing import Any

from upf_keyspace import load_settings

from .app import WriterApp, create_app

__all__ = ["app", "build_app"]


def build_app() -> WriterApp:
    return create_app(load_settings())


_built: WriterApp | None = None


def __getattr__(name: str) -> Any:
    global _built
    if name == "app":
        if _built is None:
            _built = build_app()
        return _built
    raise AttributeError(name)
