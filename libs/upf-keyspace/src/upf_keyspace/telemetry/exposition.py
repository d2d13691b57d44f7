"""Prometheus exposition: ``GET /metrics`` renders a Registry's cells at scrape time through
``prometheus_client``, with the process collectors beside them."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from typing import Any

import msgspec

from .cells import REGISTRY, Registry


class _PrometheusBridge:
    """A prometheus_client collector that renders a Registry's cells at scrape time."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        for fam in self.registry.families():
            labels = list(fam.attributes)
            name = fam.prometheus_name
            cells = list(fam.cells.items())
            if fam.kind == "counter":
                out: Any = CounterMetricFamily(name, fam.description, labels=labels)
                for values, cell in cells:
                    out.add_metric(list(values), cell.value)
            elif fam.kind == "gauge":
                out = GaugeMetricFamily(name, fam.description, labels=labels)
                for values, cell in cells:
                    out.add_metric(list(values), cell.value)
            else:
                out = HistogramMetricFamily(name, fam.description, labels=labels)
                for values, cell in cells:
                    counts = list(cell.counts)
                    running = 0
                    buckets = []
                    for bound, n in zip(fam.bounds, counts, strict=False):
                        running += n
                        buckets.append((_fmt_bound(bound), running))
                    running += counts[-1]
                    buckets.append(("+Inf", running))
                    out.add_metric(list(values), buckets, cell.sum)
            yield out


def _fmt_bound(bound: float) -> str:
    return repr(float(bound))


METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_exposition_lock = threading.Lock()
_exposition: dict[int, Any] = {}


def _prometheus_registry(registry: Registry) -> Any:
    with _exposition_lock:
        prom = _exposition.get(id(registry))
        if prom is None:
            from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector

            prom = CollectorRegistry(auto_describe=False)
            prom.register(_PrometheusBridge(registry))
            ProcessCollector(registry=prom)
            PlatformCollector(registry=prom)
            GCCollector(registry=prom)
            _exposition[id(registry)] = prom
        return prom


def render_metrics(registry: Registry | None = None) -> bytes:
    """``GET /metrics``: every family of ``registry`` (the process's by default), plus the process
    collectors, in Prometheus text format (``METRICS_CONTENT_TYPE``)."""
    from prometheus_client import generate_latest

    return generate_latest(_prometheus_registry(REGISTRY if registry is None else registry))


class _Family(msgspec.Struct, array_like=True):
    """One family in a ``snapshot``: its definition and each cell's value (a histogram's: its bucket
    counts and sum)."""

    name: str
    kind: str
    unit: str
    description: str
    attributes: tuple[str, ...]
    bounds: tuple[float, ...]
    cells: list[tuple[tuple[str, ...], int | tuple[list[int], float]]]


_encode_families = msgspec.msgpack.Encoder().encode
_decode_families = msgspec.msgpack.Decoder(list[_Family]).decode


def snapshot(registry: Registry) -> bytes:
    """``registry``'s cells as they are now, for another process to add to its own (``render_merged``)."""
    families = []
    for fam in registry.families():
        cells: list[tuple[tuple[str, ...], int | tuple[list[int], float]]] = [
            (values, (list(cell.counts), cell.sum) if fam.kind == "histogram" else cell.value)
            for values, cell in list(fam.cells.items())
        ]
        families.append(_Family(fam.name, fam.kind, fam.unit, fam.description, fam.attributes, fam.bounds, cells))
    return _encode_families(families)


def render_merged(snapshots: Iterable[bytes]) -> bytes:
    """``render_metrics`` of the cells of several processes' ``snapshot``s added up: the workers of one
    all-in-one answer ``/metrics`` on one port, so each answers for all. The process collectors (CPU,
    memory) are this process's. A snapshot that does not decode is skipped."""
    merged = Registry()
    parts = []
    for raw in snapshots:
        try:
            parts.append(_decode_families(raw))
        except msgspec.DecodeError:
            continue  # a worker's file caught mid-write or from an older release: this scrape goes without it
    for families in parts:
        for f in families:
            try:
                fam = merged._family(f.name, f.kind, f.unit, f.description, f.attributes, f.bounds)
            except ValueError:
                continue  # defined differently elsewhere (an older release's worker): not summable
            for values, value in f.cells:
                if len(values) != len(fam.attributes):
                    continue
                cell = fam.cell(*values)
                if isinstance(value, tuple):
                    counts, total = value
                    if len(counts) == len(cell.counts):
                        cell.counts = [a + b for a, b in zip(cell.counts, counts, strict=True)]
                        cell.sum += total
                else:
                    cell.value += value
    with _merged_lock:  # one exposition (``render_metrics``') for every merged render: it renders _MERGED
        _MERGED._families = merged._families
        return render_metrics(_MERGED)


_MERGED = Registry()
"""What ``render_merged`` renders, its families replaced at each call."""
_merged_lock = threading.Lock()
