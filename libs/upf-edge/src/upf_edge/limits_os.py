"""The process's open-files limit, raised at start by every role's entry point; accepting that backs off
when it is reached; connections per peer address, capped.

Why: each subscriber holds a socket, and the default soft RLIMIT_NOFILE (1024 on most Linux systems) would
cap a pusher near a thousand connections while the hard limit (often 524288 or more) allows far more; an
unprivileged process may raise its soft limit up to the hard one.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import logging
import socket
import time
from collections.abc import Callable

__all__ = ["Acceptor", "PeerCounter", "raise_open_files_limit"]

log = logging.getLogger("upf.edge.limits")


def raise_open_files_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit, log the (soft, hard) now in force once, return it.

    Where the hard limit is unlimited or refused as a soft value (macOS caps it), the soft limit stays."""
    try:
        import resource
    except ImportError:  # not a Unix: nothing to raise
        return (-1, -1)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard and hard != resource.RLIM_INFINITY:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            log.warning("open files limit not raised", extra={"soft": soft, "hard": hard})
    log.info("open files limit", extra={"soft": soft, "hard": hard})
    return (soft, hard)


ACCEPT_BATCH = 64
"""Connections taken per readiness event: a burst is accepted quickly, other sockets still get turns."""
ACCEPT_BACKOFF_SECS = 0.5
"""How long accepting pauses when the process (or system) is out of descriptors."""
EXHAUSTED_LOG_SECS = 10.0
"""At most one log line per this interval while accepts keep failing (the count rides as an attribute)."""
_EXHAUSTED = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class Acceptor:
    """The accept loop of a listening socket, for any event loop (asyncio's or uvloop's).

    Why not ``loop.create_server``: out of descriptors, asyncio's accept loop goes on trying (and logging
    a traceback) up to ``backlog`` times per wake-up and re-arms itself that often (~4,000 log lines a
    second were seen), and uvloop's accepts and silently closes the waiting connections. Here accepting
    pauses for ``ACCEPT_BACKOFF_SECS`` (the waiting connections stay in the kernel's backlog, served once
    descriptors are free) and one line is logged per ``EXHAUSTED_LOG_SECS`` with the count of failures.
    """

    __slots__ = ("loop", "sock", "factory", "tasks", "closed", "failures", "logged_at", "_retry")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, sock: socket.socket, factory: Callable[[], asyncio.Protocol]
    ) -> None:
        self.loop = loop
        self.sock = sock
        self.factory = factory
        self.tasks: set[asyncio.Task[object]] = set()
        self.closed = False
        self.failures = 0
        """Accepts refused for want of descriptors since the last log line."""
        self.logged_at = -EXHAUSTED_LOG_SECS
        self._retry: asyncio.TimerHandle | None = None
        sock.setblocking(False)

    def start(self) -> None:
        self.loop.add_reader(self.sock.fileno(), self._ready)

    def close(self) -> None:
        """Stop accepting and close the listening socket (accepted connections are the caller's).

        Connections accepted already still get their transport (``wait_closed`` waits for that): the
        task making one is not cancelled, since uvloop reads a connection's first request before that
        task ends, and cancelling it then closed the socket under a request in flight (a publish
        stored, its reply lost). The caller's protocol sees a stopping server and closes it."""
        if self.closed:
            return
        self.closed = True
        if self._retry is not None:
            self._retry.cancel()
        self.loop.remove_reader(self.sock.fileno())
        self.sock.close()

    async def wait_closed(self) -> None:
        """Until every connection accepted before ``close`` has its transport (or failed to get one)."""
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)

    def _ready(self) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                conn, _addr = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:
                if exc.errno in _EXHAUSTED:
                    self._exhausted(exc.errno)
                    return
                log.warning("accept failed", extra={"errno": exc.errno})
                return
            conn.setblocking(False)
            if conn.family != socket.AF_UNIX:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # frames are small and latency-bound
            task = self.loop.create_task(self._connect(conn))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _connect(self, conn: socket.socket) -> None:
        try:
            await self.loop.connect_accepted_socket(self.factory, conn)
        except OSError:
            conn.close()  # the peer left before its transport existed
        except asyncio.CancelledError:
            conn.close()  # the loop is going away before its transport existed
            raise

    def _exhausted(self, err: int) -> None:
        self.failures += 1
        self.loop.remove_reader(self.sock.fileno())
        self._retry = self.loop.call_later(ACCEPT_BACKOFF_SECS, self._resume)
        now = time.monotonic()
        if now - self.logged_at >= EXHAUSTED_LOG_SECS:
            log.warning(
                "accept paused: out of descriptors",
                extra={
                    "errno": errno.errorcode.get(err, err),
                    "failures": self.failures,
                    "backoff_secs": ACCEPT_BACKOFF_SECS,
                },
            )
            self.logged_at = now
            self.failures = 0

    def _resume(self) -> None:
        self._retry = None
        if not self.closed:
            self.start()


class PeerCounter:
    """Open connections per peer address, capped (``max_connections_per_ip``); exempt peers are not
    counted. Why: under a descriptor limit one client holding a thousand streams shut everyone out."""

    __slots__ = ("cap", "exempt", "open", "_exempt_seen")

    def __init__(self, cap: int, exempt: tuple[str, ...]) -> None:
        self.cap = cap
        self.exempt = tuple(ipaddress.ip_network(n, strict=False) for n in exempt)
        self.open: dict[str, int] = {}
        self._exempt_seen: dict[str, bool] = {}

    def _is_exempt(self, peer: str) -> bool:
        known = self._exempt_seen.get(peer)
        if known is None:
            try:
                addr = ipaddress.ip_address(peer)
            except ValueError:
                known = True  # no IP (a Unix socket): local
            else:
                known = any(addr in net for net in self.exempt)
            if len(self._exempt_seen) >= 65536:
                self._exempt_seen.clear()
            self._exempt_seen[peer] = known
        return known

    def acquire(self, peer: str) -> bool:
        """Count a new connection from ``peer``; False (not counted) when it is over the cap."""
        if self.cap <= 0 or self._is_exempt(peer):
            return True
        n = self.open.get(peer, 0)
        if n >= self.cap:
            return False
        self.open[peer] = n + 1
        return True

    def release(self, peer: str) -> None:
        n = self.open.get(peer, 0)
        if n <= 1:
            self.open.pop(peer, None)
        else:
            self.open[peer] = n - 1
