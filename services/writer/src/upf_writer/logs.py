"""Logging for the writer process: static messages, variables as attributes (``extra=``), printed as
``key=value`` pairs after the message. Granian applies this dict config in its main and worker
processes."""

from __future__ import annotations

import copy
from typing import Any

from granian.log import LOGGING_CONFIG

from upf_keyspace.telemetry import KeyValueFormatter

__all__ = ["KeyValueFormatter", "log_dictconfig"]


def log_dictconfig(level: str = "INFO") -> dict[str, Any]:
    config: dict[str, Any] = copy.deepcopy(LOGGING_CONFIG)
    config["formatters"]["upf"] = {
        "()": KeyValueFormatter,
        "fmt": "%(asctime)s [%(levelname)s] %(name)s: %(message)s",
    }
    config["handlers"]["upf"] = {"formatter": "upf", "class": "logging.StreamHandler", "stream": "ext://sys.stderr"}
    for name in ("upf_writer", "upf", "upf_keyspace", "upf_edge"):
        config["loggers"][name] = {"handlers": ["upf"], "level": level, "propagate": False}
    return config
