"""What the writer's handlers share: settings, limits, the store and the clock.

One ``WriterContext`` per app, built by ``create_app`` and closed over by the handlers (no global
state). ``store`` is ``None`` until the app's lifespan has opened it (or was given one).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from upf_keyspace import Settings, Store

from .ingest import STORE_UNAVAILABLE, Limits, PublishError

__all__ = ["WriterContext"]


def _unix_now() -> int:
    return int(time.time())


class WriterContext:
    __slots__ = ("settings", "limits", "store", "clock")

    def __init__(self, settings: Settings, store: Store | None = None, clock: Callable[[], int] = _unix_now) -> None:
        self.settings = settings
        self.limits = Limits.from_settings(settings)
        self.store = store
        self.clock = clock

    def require_store(self) -> Store:
        store = self.store
        if store is None:
            raise PublishError(STORE_UNAVAILABLE)
        return store
