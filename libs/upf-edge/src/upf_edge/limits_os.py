"""The process's open-files limit, raised at start by every role's entry point.

Why: each subscriber holds a socket, and the default soft RLIMIT_NOFILE (1024 on most Linux systems) would
cap a pusher near a thousand connections while the hard limit (often 524288 or more) allows far more; an
unprivileged process may raise its soft limit up to the hard one.
"""

from __future__ import annotations

import logging

__all__ = ["raise_open_files_limit"]

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
