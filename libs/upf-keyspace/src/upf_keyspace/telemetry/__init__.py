"""Telemetry shared by every role: metrics (always on, cheap), traces and OTLP export (only when the
standard ``OTEL_*`` environment asks for them), W3C trace-context helpers and the log format.

Modules: ``cells`` (metric families and cells, the process ``REGISTRY``), ``exposition`` (Prometheus
text), ``otel`` (the OpenTelemetry metric bridge, imported only when a reader is configured),
``tracecontext`` (W3C traceparent), ``setup`` (``setup_telemetry``, ``current``), ``logs``. Importers use
this package's names; the OpenTelemetry SDK is imported only when something turns it on.

Metrics
    Every metric is a family of *cells*, one per combination of attribute values, created once (at
    start, or the first time a bounded value such as an error code is seen) and kept by the code that
    updates it: a hot path does ``cell.add()`` (a slot increment, ~0.1 us) or ``cell.record(v)`` (a
    bisect into fixed buckets, ~0.3 us); nothing allocates per message. Cells are read only when
    someone collects: ``GET /metrics`` renders them in Prometheus text format through
    ``prometheus_client`` (always on, every role), and when an OpenTelemetry metric reader is
    configured (OTLP push, or an in-memory reader in tests) the same cells feed it: counters and
    gauges through observable instruments (read at collection), histograms as data points built from
    the cells at collection by the reader classes of ``otel`` (``PeriodicCellReader``,
    ``InMemoryCellReader``). Either way, nothing is added to the hot path.

    Why not the OpenTelemetry SDK's instruments with ``opentelemetry-exporter-prometheus``: on this
    project's machines one SDK ``Counter.add`` with an attribute costs ~6-9 us and a
    ``Histogram.record`` ~10 us (about 0.1 us and 0.3 us for a cell here), and a publish updates
    several; that is a double-digit share of a publish's CPU, and the scrape endpoint is always on.

    Names: OpenTelemetry style (``upf.writer.publishes``, unit ``s`` or ``By``); the Prometheus name
    is what the OpenTelemetry Prometheus conversion makes of it (dots to underscores, a ``_seconds``
    or ``_bytes`` suffix, ``_total`` on counters), so a collector that scrapes and one that receives
    OTLP show the same series. Attributes are low-cardinality by construction: transport, driver,
    result, an ntfy or store error code; never a topic, node id or message id.

Traces
    On only when an exporter is configured: ``OTEL_TRACES_EXPORTER`` (``otlp`` or ``console``), or an
    OTLP endpoint (``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``); never
    with ``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none``. Hot paths test
    ``telemetry.tracing`` (a plain bool) before creating any span object. The provider is this
    object's own, not the process-global one. OTLP goes over HTTP/protobuf (the only exporter
    shipped); sampling follows ``OTEL_TRACES_SAMPLER`` as the SDK reads it.

OTLP metric push
    Off unless asked for explicitly with ``OTEL_METRICS_EXPORTER=otlp`` or
    ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT``: the collector scrapes ``/metrics`` (deploy/otel), and
    pushing as well would store every series twice.
"""

from typing import Any

from .cells import (
    BYTES_BUCKETS,
    COUNT_BUCKETS,
    LATENCY_BUCKETS,
    REGISTRY,
    Counter,
    Family,
    Gauge,
    Histogram,
    Registry,
)
from .exposition import METRICS_CONTENT_TYPE, render_merged, render_metrics, snapshot
from .logs import KeyValueFormatter, configure_logging
from .setup import Telemetry, current, setup_telemetry
from .tracecontext import (
    context_from_headers,
    format_traceparent,
    link_from_traceparent,
    parse_traceparent,
    traceparent_of,
)

__all__ = [
    "Counter",
    "Gauge",
    "Histogram",
    "Family",
    "Registry",
    "REGISTRY",
    "Telemetry",
    "setup_telemetry",
    "current",
    "render_metrics",
    "render_merged",
    "snapshot",
    "METRICS_CONTENT_TYPE",
    "LATENCY_BUCKETS",
    "BYTES_BUCKETS",
    "COUNT_BUCKETS",
    "parse_traceparent",
    "format_traceparent",
    "traceparent_of",
    "context_from_headers",
    "link_from_traceparent",
    "KeyValueFormatter",
    "configure_logging",
    "InMemoryCellReader",
    "PeriodicCellReader",
]

_OTEL_NAMES = frozenset({"InMemoryCellReader", "PeriodicCellReader"})


def __getattr__(name: str) -> Any:
    """The OpenTelemetry readers, imported on first use (they import the SDK)."""
    if name in _OTEL_NAMES:
        from . import otel

        return getattr(otel, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
