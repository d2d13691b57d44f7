"""Cross-process commit notification for the embedded store, costing nothing while idle.

Every process that opens a store file binds a Unix datagram socket in ``<store>.wake/`` and its event
loop waits on it (``loop.add_reader``). After each physical commit, the committer sends one tiny
datagram to every peer socket in that directory, so other processes' watches are checked at once
instead of by polling. A datagram carries no meaning beyond "something committed": lost ones cost
latency (the driver keeps a slow poll as the backstop), duplicate ones cost one cheap version read.

Sockets of processes killed with -9 stay behind as files nobody listens on: a send to one is refused,
and the sender removes it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
import time

from ._private import make_private_dirs

__all__ = ["Doorbell", "Inbox", "wake_dir"]

log = logging.getLogger("upf.store.wake")

_SUN_PATH_MAX = 107  # sockaddr_un.sun_path is 108 bytes with the terminating NUL
_RELIST_SECS = 1.0  # directory mtimes are coarse (a tick): re-list this often even when it looks unchanged


def wake_dir(store_path: str) -> str:
    return os.path.abspath(store_path) + ".wake"


class _Dir:
    """The wake directory, addressed through ``/proc/self/fd`` when its path is too long for
    ``sun_path`` (deep temporary directories are), so any store path works on Linux."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        if len(os.fsencode(path)) + 1 + 40 > _SUN_PATH_MAX:
            self._fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))

    def address(self, name: str) -> str:
        if self._fd is not None:
            return f"/proc/self/fd/{self._fd}/{name}"
        return os.path.join(self.path, name)

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


class Inbox:
    """This process's (this database handle's) receiving socket; the event loop reads it."""

    def __init__(self, store_path: str) -> None:
        directory = wake_dir(store_path)
        make_private_dirs(directory)  # 0700: only this user's processes may send wakes
        self.dir = _Dir(directory)
        self.name = f"{os.getpid()}-{secrets.token_hex(6)}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            self.sock.setblocking(False)
            self.sock.bind(self.dir.address(self.name))
        except BaseException:
            self.sock.close()
            self.dir.close()
            raise

    def fileno(self) -> int:
        return self.sock.fileno()

    def drain(self) -> int:
        """Read every queued datagram (one check covers them all); the count is for tests."""
        n = 0
        while True:
            try:
                self.sock.recv(16)
            except (BlockingIOError, InterruptedError):
                return n
            except OSError:
                return n
            n += 1

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.dir.address(self.name))
        self.sock.close()
        self.dir.close()


class Doorbell:
    """The committer's sender: one datagram to every live peer after each commit. The peer listing is
    cached and re-read when the directory's mtime moves (a peer bound or left) or a second passed."""

    def __init__(self, store_path: str, own: str) -> None:
        self.dir = _Dir(wake_dir(store_path))
        self.own = own
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setblocking(False)
        self._mtime = -1
        self._listed = 0.0
        self.peers: list[str] = []

    def _relist(self) -> None:
        now = time.monotonic()
        try:
            mtime = os.stat(self.dir.path).st_mtime_ns
        except OSError:
            self.peers = []
            return
        if mtime == self._mtime and now - self._listed < _RELIST_SECS:
            return
        self._mtime, self._listed = mtime, now
        try:
            names = os.listdir(self.dir.path)
        except OSError:
            names = []
        self.peers = [n for n in names if n != self.own]

    def ring(self) -> None:
        self._relist()
        gone: list[str] = []
        for name in self.peers:
            try:
                self.sock.sendto(b"!", self.dir.address(name))
            except (BlockingIOError, InterruptedError):
                pass  # its queue is full, so it already has wakes to read
            except ConnectionRefusedError:  # nobody bound: a process killed before it could clean up
                gone.append(name)
                with contextlib.suppress(OSError):
                    os.unlink(self.dir.address(name))
            except OSError:  # removed under us, or not a socket: skip it until the next listing
                gone.append(name)
        if gone:
            self.peers = [n for n in self.peers if n not in gone]

    def close(self) -> None:
        self.sock.close()
        self.dir.close()
