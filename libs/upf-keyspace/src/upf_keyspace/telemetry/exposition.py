"""Prometheus exposition: ``GET /metrics`` renders a Registry's cells at scrape time through
``prometheus_client``, with the process collectors beside them."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

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
