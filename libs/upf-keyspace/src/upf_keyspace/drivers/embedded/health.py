"""A full disk: how it is recognised, logged (once a minute, not per commit) and shared with the other
processes on the file for the health endpoints; and ``UPF_EMBEDDED_MAX_BYTES``, the size quota that
fails writes the same way (how the tests fill a "disk" without root)."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import time

import lmdb

from .._private import create_private_file

log = logging.getLogger("upf.store.embedded")

_FULL_LOG_SECS = 60.0  # a full disk is logged once a minute (with the count refused since), not per commit


class _OverQuota(Exception):
    """A commit that would grow the store's data past ``UPF_EMBEDDED_MAX_BYTES``."""


def _is_full(exc: BaseException) -> bool:
    """Over the quota, LMDB's MDB_MAP_FULL (its map, sized from the quota) or the OS's ENOSPC,
    however it surfaced."""
    if isinstance(exc, (_OverQuota, lmdb.MapFullError)):
        return True
    if isinstance(exc, lmdb.Error):
        return "No space left on device" in str(exc)
    return isinstance(exc, OSError) and exc.errno == errno.ENOSPC


def _health_marker(path: str) -> str:
    """``<store>-full``: its mtime is the last refused write of any process on the file (see
    ``errors.StorageHealth``); created with an mtime long past, so a new one says healthy."""
    marker = path + "-full"
    if not os.path.exists(marker):
        with contextlib.suppress(OSError):  # a disk too full for it: this process still reports its own
            create_private_file(marker)
            os.utime(marker, (0, 0))
    return marker


class _FullLog:
    """Transactions refused for a full disk, counted and logged once every ``_FULL_LOG_SECS``."""

    __slots__ = ("logged", "refused")

    def __init__(self) -> None:
        self.logged = -_FULL_LOG_SECS
        self.refused = 0

    def add(self, refused: int) -> None:
        self.refused += refused
        now = time.monotonic()
        if now - self.logged >= _FULL_LOG_SECS:
            log.error("embedded store full: writes refused", extra={"refused_transactions": self.refused})
            self.logged = now
            self.refused = 0
