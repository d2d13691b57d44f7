"""The OpenTelemetry metric bridge: a Registry's cells made visible to OpenTelemetry metric readers at
collection time only (nothing on the hot path), through the SDK's public interfaces.

Counters and gauges go through observable instruments whose callbacks read the cells. Histograms have no
observable form in OpenTelemetry, so they reach a reader as data points built from the cells when it
receives a collection: the readers here are ``MetricReader`` subclasses that override
``_receive_metrics``, the method the SDK documents as the one a reader subclass implements, and merge
the histogram families into the ``MetricsData`` before passing it on (to memory, or to an exporter).
A reader of another class still gets the counters and gauges, not the histograms.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    HistogramDataPoint,
    InMemoryMetricReader,
    Metric,
    MetricsData,
    PeriodicExportingMetricReader,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.metrics.export import Histogram as HistogramData
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from .cells import Family, Registry

__all__ = ["CellHistograms", "InMemoryCellReader", "PeriodicCellReader", "bridge_to_otel"]

log = logging.getLogger("upf.telemetry")


class CellHistograms:
    """The histogram families of a registry as OpenTelemetry metrics (cumulative since ``start_ns``)."""

    def __init__(self, registry: Registry, version: str, resource: Resource, start_ns: int | None = None) -> None:
        self.registry = registry
        self.scope = InstrumentationScope("upf", version)
        self.resource = resource
        self.start_ns = time.time_ns() if start_ns is None else start_ns

    def metrics(self, now_ns: int) -> list[Metric]:
        out = []
        for fam in self.registry.families():
            if fam.kind != "histogram":
                continue
            points = []
            for cell in list(fam.cells.values()):
                counts = list(cell.counts)
                n = sum(counts)
                if not n:
                    continue
                points.append(
                    HistogramDataPoint(
                        attributes=dict(cell.attributes),
                        start_time_unix_nano=self.start_ns,
                        time_unix_nano=now_ns,
                        count=n,
                        sum=cell.sum,
                        bucket_counts=counts,
                        explicit_bounds=list(fam.bounds),
                        min=cell.min,
                        max=cell.max,
                    )
                )
            if points:
                data = HistogramData(data_points=points, aggregation_temporality=AggregationTemporality.CUMULATIVE)
                out.append(Metric(name=fam.name, description=fam.description, unit=fam.unit, data=data))
        return out

    def merge(self, data: MetricsData) -> MetricsData:
        """``data`` with the histograms added as one more scope of its first resource."""
        extra = self.metrics(time.time_ns())
        if not extra:
            return data
        scope = ScopeMetrics(scope=self.scope, metrics=extra, schema_url="")
        if not data.resource_metrics:
            return MetricsData(
                resource_metrics=[ResourceMetrics(resource=self.resource, scope_metrics=[scope], schema_url="")]
            )
        first = data.resource_metrics[0]
        merged = ResourceMetrics(
            resource=first.resource, scope_metrics=[*first.scope_metrics, scope], schema_url=first.schema_url
        )
        return MetricsData(resource_metrics=[merged, *data.resource_metrics[1:]])


class _WithCellHistograms:
    """Mixin for a MetricReader: what it receives also carries ``histograms`` (set by setup_telemetry)."""

    histograms: CellHistograms | None = None

    def _receive_metrics(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> None:
        if self.histograms is not None:
            metrics_data = self.histograms.merge(metrics_data)
        super()._receive_metrics(metrics_data, timeout_millis=timeout_millis, **kwargs)  # type: ignore[misc]  # a mixin: the MetricReader it is mixed into has it


class InMemoryCellReader(_WithCellHistograms, InMemoryMetricReader):
    """An InMemoryMetricReader (tests, diagnostics) that also sees the histogram cells."""


class PeriodicCellReader(_WithCellHistograms, PeriodicExportingMetricReader):
    """A PeriodicExportingMetricReader (OTLP push) whose exports also carry the histogram cells."""


def bridge_to_otel(registry: Registry, meter: Any, readers: Sequence[Any], version: str, resource: Resource) -> Any:
    """Make every family, present and future, visible to ``readers``: counters and gauges through
    observable instruments that read the cells, histograms through the readers that accept them.
    Returns the registry listener to remove at shutdown. Instruments are never created inside a
    collection callback (the SDK holds its lock there)."""
    from opentelemetry.metrics import CallbackOptions, Observation

    bridged: set[str] = set()
    lock = threading.Lock()

    def observe(fam: Family) -> Any:
        def callback(_options: CallbackOptions) -> Iterable[Observation]:
            return [
                Observation(cell.value, dict(zip(fam.attributes, values, strict=True)))
                for values, cell in list(fam.cells.items())
            ]

        return callback

    def bridge(fam: Family) -> None:
        with lock:
            if fam.name in bridged or fam.kind == "histogram":
                return
            bridged.add(fam.name)
        if fam.kind == "counter":
            meter.create_observable_counter(fam.name, [observe(fam)], unit=fam.unit, description=fam.description)
        else:
            meter.create_observable_up_down_counter(
                fam.name, [observe(fam)], unit=fam.unit, description=fam.description
            )

    registry.listen(bridge)
    for fam in registry.families():
        bridge(fam)
    histograms = CellHistograms(registry, version, resource)
    for reader in readers:
        if isinstance(reader, _WithCellHistograms):
            reader.histograms = histograms
        else:
            log.warning("metric reader gets no histograms", extra={"reader": type(reader).__name__})
    return bridge
