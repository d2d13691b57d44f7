"""The last resort of a graceful shutdown: a process that has not exited some time after SIGTERM exits.

Each role ends its own work within ``UPF_SHUTDOWN_GRACE_SECS``; this covers what cannot be bounded from
inside the event loop (a blocked loop, a hung driver call, a non-daemon thread): an orchestrator's
SIGKILL would come anyway, this makes the bound the setting's and logs it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["EXIT_OVERDUE", "WATCHDOG_SLACK_SECS", "arm_exit_watchdog", "stop_event", "unless_stopped"]

T = TypeVar("T")

log = logging.getLogger("upf.lifecycle")

EXIT_OVERDUE = 70
"""Exit status of a process the watchdog ended (EX_SOFTWARE): its graceful stop did not finish."""
WATCHDOG_SLACK_SECS = 5.0
"""Past the grace, time left for closing the store and flushing telemetry."""


def arm_exit_watchdog(grace_secs: float) -> threading.Timer:
    """Start a daemon timer that ends the process ``grace_secs + WATCHDOG_SLACK_SECS`` from now."""

    def overdue() -> None:
        log.error("shutdown outlived its grace; exiting", extra={"grace": grace_secs})
        os._exit(EXIT_OVERDUE)

    timer = threading.Timer(grace_secs + WATCHDOG_SLACK_SECS, overdue)
    timer.daemon = True
    timer.start()
    return timer


def stop_event(grace_secs: float) -> asyncio.Event:
    """An event SIGTERM/SIGINT set, on the running loop; the first signal also arms the exit watchdog,
    so a stop ends the process within the grace plus its slack even while a start still hangs."""
    stop = asyncio.Event()
    armed: list[threading.Timer] = []

    def on_stop() -> None:
        if not armed:
            armed.append(arm_exit_watchdog(grace_secs))
        stop.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_stop)
    return stop


async def unless_stopped(start: Awaitable[T], stop: asyncio.Event, grace: float) -> T | None:
    """``start``'s result, or None when ``stop`` is set first: the start is then cancelled (it stops what
    it had started) and given the grace to unwind. A store call at start that never returns (its write
    lock held by another process, a stalled disk) must not keep a stopped process up."""
    started = asyncio.ensure_future(start)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((started, stopped), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if not started.done():
        started.cancel()
        await asyncio.wait((started,), timeout=grace)
        if not started.done() or started.cancelled() or started.exception() is not None:
            return None  # an error while unwinding a start given up: the stop goes on
    return started.result()
