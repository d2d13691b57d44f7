"""Logging for the writer process: static messages, variables as attributes (``extra=``), printed as
``key=value`` pairs after the message. Granian applies this dict config in its main and worker
processes."""

from __future__ import annotations

import copy
import logging
from typing import Any

from granian.log import LOGGING_CONFIG

__all__ = ["KeyValueFormatter", "log_dictconfig"]

_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime", "taskName"}


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = [f"{k}={v!r}" for k, v in record.__dict__.items() if k not in _STANDARD and not k.startswith("_")]
        if not extras:
            return line
        head, sep, tail = line.partition("\n")
        return f"{head} {' '.join(extras)}{sep}{tail}"


def log_dictconfig(level: str = "INFO") -> dict[str, Any]:
    config = copy.deepcopy(LOGGING_CONFIG)
    config["formatters"]["upf"] = {
        "()": KeyValueFormatter,
        "fmt": "%(asctime)s [%(levelname)s] %(name)s: %(message)s",
    }
    config["handlers"]["upf"] = {"formatter": "upf", "class": "logging.StreamHandler", "stream": "ext://sys.stderr"}
    for name in ("upf_writer", "upf", "upf_keyspace"):
        config["loggers"][name] = {"handlers": ["upf"], "level": level, "propagate": False}
    return config
