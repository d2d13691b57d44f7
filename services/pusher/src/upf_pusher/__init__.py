"""UPF pusher role: holds ntfy subscriber connections (/ws, /json, /sse, /raw) and streams each one
its topics' durable queues from a cursor, woken by per-shard bells in the store.

Public entry: ``serve(settings, store, *, fallback=None, ready=None) -> Pusher`` (and ``Pusher``).
"""

__version__ = "0.1.0"

__all__ = ["Pusher", "serve", "__version__"]


def __getattr__(name: str):  # lazy, so `import upf_pusher.query` stays light
    if name in ("Pusher", "serve"):
        from . import server

        return getattr(server, name)
    raise AttributeError(name)
