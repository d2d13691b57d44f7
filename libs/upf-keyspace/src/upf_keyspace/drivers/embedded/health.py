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


_NEARLY_FULL_BYTES = 16 << 20
"""Free space under which a commit's I/O error is taken for a full disk (see ``_is_full``)."""


def _is_full(exc: BaseException, path: str) -> bool:
    """Over the quota, LMDB's MDB_MAP_FULL (its map, sized from the quota) or the OS's ENOSPC,
    however it surfaced; or an I/O error on a disk with almost no space left. LMDB reports a write
    that stopped short, as one does when the disk fills in the middle of it, as EIO, not ENOSPC."""
    if isinstance(exc, (_OverQuota, lmdb.MapFullError)):
        return True
    if isinstance(exc, lmdb.Error):
        text = str(exc)
        if "No space left on device" in text:
            return True
        return "Input/output error" in text and _free_bytes(path) < _NEARLY_FULL_BYTES
    return isinstance(exc, OSError) and exc.errno == errno.ENOSPC


def _free_bytes(path: str) -> int:
    """What this process may still write on ``path``'s filesystem (root may use the reserved blocks)."""
    try:
        st = os.statvfs(os.path.dirname(os.path.abspath(path)))
    except OSError:
        return _NEARLY_FULL_BYTES  # unknown: not taken for full
    return (st.f_bfree if os.geteuid() == 0 else st.f_bavail) * st.f_frsize


_RESERVE_MAX = 1 << 20
_RESERVE_FILE_RATIO = 4
_RESERVE_CHECK_SECS = 1.0
"""How often, at most, a committing process looks whether the reserve is still there."""


def reserve_path(path: str) -> str:
    return path + "-reserve"


def _reserve_size(path: str) -> int:
    """A sixteenth of the filesystem, at most 1 MB (a janitor's deletions of hundreds of messages)."""
    try:
        st = os.statvfs(os.path.dirname(os.path.abspath(path)))
    except OSError:
        return 0
    return min(_RESERVE_MAX, st.f_blocks * st.f_frsize // 16)


def has_room(path: str) -> bool:
    """Room for the reserve twice over: the disk is not full any more."""
    size = _reserve_size(path)
    return size > 0 and _free_bytes(path) >= 2 * size


def make_reserve(path: str) -> bool:
    """Create ``<store>-reserve``, the disk space the store gives back when the disk fills (see
    ``_File.check_reserve``), allocated (not sparse), once the store's file is four times its size
    (a quarter of a small filesystem, 4 MB on a large one: the tests' small stores make none) and the
    disk has room. Whole or not at all (written aside, then renamed)."""
    size = _reserve_size(path)
    try:
        data = os.stat(path).st_size
    except OSError:
        return False
    if size <= 0 or data < _RESERVE_FILE_RATIO * size or _free_bytes(path) < 2 * size:
        return False
    tmp = f"{reserve_path(path)}.{os.getpid()}"
    try:
        fd = os.open(tmp, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
        try:
            os.posix_fallocate(fd, 0, size)
        finally:
            os.close(fd)
        os.replace(tmp, reserve_path(path))
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return False
    return True


def disk_full(exc: BaseException, path: str) -> bool:
    """``_is_full`` for the disk itself (not the quota, not LMDB's map): what the reserve is for."""
    return not isinstance(exc, (_OverQuota, lmdb.MapFullError)) and _is_full(exc, path)


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
