"""Metric cells: every metric is a family of cells, one per combination of attribute values, updated on
the hot path with plain attribute arithmetic and read only when someone collects (exposition.py for
Prometheus, otel.py for OpenTelemetry readers)."""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Sequence
from typing import Any

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""Seconds: a fsync'd commit is ~1-10 ms, a delivery through a bell a few ms, through a safety poll up to a minute."""
BYTES_BUCKETS = (64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 65536.0)
COUNT_BUCKETS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0)

# --- cells ---------------------------------------------------------------------------------------------
# A cell is updated with plain attribute arithmetic. Under the GIL an ``x.value += n`` on an int is not
# interrupted between its read and its write (no eval-breaker check in between), so cells shared by
# the event loop and a driver thread lose no increments on CPython's default build.


class Counter:
    """A monotonic count (one attribute combination of a counter family)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def add(self, n: int = 1) -> None:
        self.value += n


class Gauge:
    """A value that goes up and down (open connections)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def add(self, n: int = 1) -> None:
        self.value += n


class Histogram:
    """Fixed buckets (Prometheus ``le`` semantics), a sum, and the extremes (OTLP histograms carry them)."""

    __slots__ = ("bounds", "counts", "sum", "min", "max", "attributes")

    def __init__(self, bounds: tuple[float, ...], attributes: dict[str, str]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.min = float("inf")
        self.max = float("-inf")
        self.attributes = attributes

    def record(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        if value < self.min:
            self.min = value
        if value > self.max:
            self.max = value

    def record_many(self, value: float, n: int) -> None:
        """``n`` observations of one value (a message delivered to ``n`` connections at once)."""
        self.counts[bisect_left(self.bounds, value)] += n
        self.sum += value * n
        if value < self.min:
            self.min = value
        if value > self.max:
            self.max = value

    @property
    def count(self) -> int:
        return sum(self.counts)


class Family:
    """One metric: a name, a kind, the attribute names, and its cells by attribute values."""

    __slots__ = ("name", "kind", "unit", "description", "attributes", "bounds", "cells", "_lock")

    def __init__(
        self, name: str, kind: str, unit: str, description: str, attributes: tuple[str, ...], bounds: tuple[float, ...]
    ) -> None:
        self.name = name
        self.kind = kind
        self.unit = unit
        self.description = description
        self.attributes = attributes
        self.bounds = bounds
        self.cells: dict[tuple[str, ...], Any] = {}
        self._lock = threading.Lock()

    def cell(self, *values: str) -> Any:
        """The cell for these attribute values (in ``attributes`` order), created on first use. Call
        it once and keep the cell; only bounded values (an error code, a transport) belong here."""
        cell = self.cells.get(values)
        if cell is not None:
            return cell
        if len(values) != len(self.attributes):
            raise ValueError("wrong number of attribute values")
        with self._lock:
            cell = self.cells.get(values)
            if cell is None:
                if self.kind == "histogram":
                    cell = Histogram(self.bounds, dict(zip(self.attributes, values, strict=True)))
                elif self.kind == "counter":
                    cell = Counter()
                else:
                    cell = Gauge()
                self.cells[values] = cell
        return cell

    @property
    def prometheus_name(self) -> str:
        base = self.name.replace(".", "_")
        suffix = {"s": "_seconds", "By": "_bytes"}.get(self.unit, "")
        return base + suffix if suffix and not base.endswith(suffix) else base


class Registry:
    """Every metric family of the process. ``REGISTRY`` is the one the roles and drivers use."""

    def __init__(self) -> None:
        self._families: dict[str, Family] = {}
        self._lock = threading.Lock()
        self._listeners: list[Any] = []

    def _family(
        self, name: str, kind: str, unit: str, description: str, attributes: Sequence[str], bounds: Sequence[float] = ()
    ) -> Family:
        with self._lock:
            fam = self._families.get(name)
            if fam is not None:
                if fam.kind != kind or fam.attributes != tuple(attributes):
                    raise ValueError(f"metric {name} already defined differently")
                return fam
            fam = Family(name, kind, unit, description, tuple(attributes), tuple(float(b) for b in bounds))
            self._families[name] = fam
            listeners = list(self._listeners)
        for listener in listeners:
            listener(fam)
        return fam

    def listen(self, listener: Any) -> None:
        """Call ``listener(family)`` for every family defined from now on (the OpenTelemetry bridge)."""
        with self._lock:
            self._listeners.append(listener)

    def unlisten(self, listener: Any) -> None:
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def counter(self, name: str, description: str, *, unit: str = "1", attributes: Sequence[str] = ()) -> Family:
        return self._family(name, "counter", unit, description, attributes)

    def gauge(self, name: str, description: str, *, unit: str = "1", attributes: Sequence[str] = ()) -> Family:
        return self._family(name, "gauge", unit, description, attributes)

    def histogram(
        self, name: str, description: str, *, unit: str, bounds: Sequence[float], attributes: Sequence[str] = ()
    ) -> Family:
        return self._family(name, "histogram", unit, description, attributes, bounds)

    def families(self) -> list[Family]:
        with self._lock:
            return list(self._families.values())

    def get(self, name: str) -> Family | None:
        return self._families.get(name)

    def value(self, name: str, **attributes: str) -> float:
        """A counter's or gauge's value, or a histogram's count, for one attribute combination (0 if
        never touched): for tests and diagnostics."""
        fam = self._families.get(name)
        if fam is None:
            return 0
        cell = fam.cells.get(tuple(attributes.get(a, "") for a in fam.attributes))
        if cell is None:
            return 0
        return cell.count if isinstance(cell, Histogram) else cell.value


REGISTRY = Registry()
