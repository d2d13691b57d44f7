"""The last resort of a graceful shutdown: a process that has not exited some time after SIGTERM exits.

Each role ends its own work within ``UPF_SHUTDOWN_GRACE_SECS``; this covers what cannot be bounded from
inside the event loop (a blocked loop, a hung driver call, a non-daemon thread): an orchestrator's
SIGKILL would come anyway, this makes the bound the setting's and logs it.
"""

from __future__ import annotations

import logging
import os
import threading

__all__ = ["EXIT_OVERDUE", "WATCHDOG_SLACK_SECS", "arm_exit_watchdog"]

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
