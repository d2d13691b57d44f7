"""The roles' log format: a static message, then the record's ``extra=`` attributes as ``key=value``."""

from __future__ import annotations

import logging
import os

from ..settings import LOG_LEVELS

_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime", "taskName"}


class KeyValueFormatter(logging.Formatter):
    """Static message, then the record's ``extra=`` attributes as ``key=value`` pairs."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = [f"{k}={v!r}" for k, v in record.__dict__.items() if k not in _STANDARD and not k.startswith("_")]
        if not extras:
            return line
        head, sep, tail = line.partition("\n")
        return f"{head} {' '.join(extras)}{sep}{tail}"


def configure_logging(level: str | None = None) -> None:
    """The roles' log format on stderr: ``time [LEVEL] logger: static message key=value ...``."""
    import sys

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter("%(asctime)s [%(levelname)s] %(name)s: %(message)s"))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    name = (level or os.environ.get("UPF_LOG_LEVEL") or "INFO").strip().upper()
    root.setLevel(name if name in LOG_LEVELS else "INFO")  # a bad value: load_settings says so, then exits
