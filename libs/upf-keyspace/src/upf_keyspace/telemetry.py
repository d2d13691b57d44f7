"""Telemetry shared by every role: metrics (always on, cheap), traces and OTLP export (only when the
standard ``OTEL_*`` environment asks for them), W3C trace-context helpers and the log format.

Metrics
    Every metric is a family of *cells*, one per combination of attribute values, created once (at
    start, or the first time a bounded value such as an error code is seen) and kept by the code that
    updates it: a hot path does ``cell.add()`` (a slot increment, ~0.1 us) or ``cell.record(v)`` (a
    bisect into fixed buckets, ~0.3 us); nothing allocates per message. Cells are read only when
    someone collects: ``GET /metrics`` renders them in Prometheus text format through
    ``prometheus_client`` (always on, every role), and when an OpenTelemetry metric reader is
    configured (OTLP push, or an in-memory reader in tests) the same cells feed it: counters and
    gauges through observable instruments (read at collection), histograms as data points built from
    the cells at collection. Either way, nothing is added to the hot path.

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

from __future__ import annotations

import logging
import os
import threading
import time
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

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
]

log = logging.getLogger("upf.telemetry")

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


# --- Prometheus exposition -----------------------------------------------------------------------------
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
            prom.register(_PrometheusBridge(registry))  # type: ignore[arg-type]
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


# --- W3C trace context -------------------------------------------------------------------------------
_HEX = frozenset("0123456789abcdef")


def parse_traceparent(value: str) -> tuple[int, int, int] | None:
    """``(trace_id, span_id, flags)`` of a version-00 W3C traceparent, or None if it is not one."""
    if len(value) < 55 or value[2] != "-" or value[35] != "-" or value[52] != "-":
        return None
    version, trace, span, flags = value[:2], value[3:35], value[36:52], value[53:55]
    if version == "ff" or not _HEX.issuperset(version + trace + span + flags):
        return None
    if len(value) > 55 and (version == "00" or value[55] != "-"):
        return None
    trace_id, span_id = int(trace, 16), int(span, 16)
    if not trace_id or not span_id:
        return None
    return trace_id, span_id, int(flags, 16)


def format_traceparent(trace_id: int, span_id: int, flags: int) -> str:
    return f"00-{trace_id:032x}-{span_id:016x}-{flags & 0xFF:02x}"


def traceparent_of(span: Any) -> str:
    """The W3C traceparent naming ``span`` (what the writer stores in ``Envelope.traceparent``)."""
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return ""
    return format_traceparent(ctx.trace_id, ctx.span_id, int(ctx.trace_flags))


def _span_context(value: str, *, remote: bool = True) -> Any:
    parsed = parse_traceparent(value)
    if parsed is None:
        return None
    from opentelemetry.trace import SpanContext, TraceFlags

    trace_id, span_id, flags = parsed
    return SpanContext(trace_id, span_id, is_remote=remote, trace_flags=TraceFlags(flags & 0x01))


def context_from_headers(headers: Mapping[str, str]) -> Any:
    """The parent context of an incoming request (``traceparent``/``tracestate``), or None. Parsed
    here rather than by the SDK's propagator (a regex per request, ~6x the cost)."""
    traceparent = headers.get("traceparent")
    if not traceparent:
        return None
    parsed = parse_traceparent(traceparent)
    if parsed is None:
        return None
    t = _trace_api()
    trace_id, span_id, flags = parsed
    state = headers.get("tracestate")
    ctx = t.SpanContext(
        trace_id, span_id, is_remote=True, trace_flags=t.TraceFlags(flags & 0x01),
        trace_state=t.TraceState.from_header([state]) if state else None,
    )
    return t.set_span_in_context(t.NonRecordingSpan(ctx))


_trace_module: Any = None


def _trace_api() -> Any:
    """``opentelemetry.trace``, imported on first use (a role with tracing off never needs it)."""
    global _trace_module
    if _trace_module is None:
        import opentelemetry.trace

        _trace_module = opentelemetry.trace
    return _trace_module


def link_from_traceparent(value: str, attributes: Mapping[str, Any] | None = None) -> Any:
    """A span Link to the span a stored traceparent names, or None if there is none."""
    if not value:
        return None
    ctx = _span_context(value)
    if ctx is None:
        return None
    from opentelemetry.trace import Link

    return Link(ctx, attributes)


# --- setup ---------------------------------------------------------------------------------------------
def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() == "true"


def _names(value: str | None) -> list[str]:
    return [v.strip().lower() for v in (value or "").split(",") if v.strip()]


class Telemetry:
    """What a role holds: whether tracing is on (a plain bool, tested before any span is made), the
    tracer, the registry its metrics live in, and the providers to shut down."""

    def __init__(
        self,
        *,
        registry: Registry = REGISTRY,
        tracer: Any = None,
        tracer_provider: Any = None,
        meter_provider: Any = None,
        service_name: str = "",
    ) -> None:
        self.registry = registry
        self.tracer = tracer
        self.tracing = tracer is not None
        self.tracer_provider = tracer_provider
        self.meter_provider = meter_provider
        self.service_name = service_name
        self._closed = False
        self._bridge: Any = None

    def force_flush(self, timeout_millis: int = 5000) -> None:
        if self.tracer_provider is not None:
            self.tracer_provider.force_flush(timeout_millis)
        if self.meter_provider is not None:
            self.meter_provider.force_flush(timeout_millis)

    def shutdown(self) -> None:
        """Flush and stop the exporters (idempotent); metrics cells and /metrics keep working."""
        if self._closed:
            return
        self._closed = True
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()
        if self.meter_provider is not None:
            if self._bridge is not None:
                self.registry.unlisten(self._bridge)
            self.meter_provider.shutdown()


_DISABLED = Telemetry()
_current: Telemetry = _DISABLED


def current() -> Telemetry:
    """The process's telemetry: what ``setup_telemetry`` last returned, else a disabled one."""
    return _current


def _traces_wanted(env: Mapping[str, str]) -> list[str]:
    exporters = _names(env.get("OTEL_TRACES_EXPORTER"))
    if "none" in exporters:
        return []
    if exporters:
        return exporters
    if env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return ["otlp"]
    return []


def _metrics_push_wanted(env: Mapping[str, str]) -> bool:
    exporters = _names(env.get("OTEL_METRICS_EXPORTER"))
    if "none" in exporters:
        return False
    return "otlp" in exporters or bool(env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"))


def _warn_protocol(env: Mapping[str, str], signal: str) -> None:
    protocol = env.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or ""
    if protocol and protocol != "http/protobuf":
        log.warning("only OTLP over http/protobuf is supported; exporting with it", extra={"signal": signal.lower()})


def setup_telemetry(
    service_name: str,
    service_version: str,
    *,
    env: Mapping[str, str] | None = None,
    span_exporter: Any = None,
    metric_readers: Sequence[Any] = (),
    registry: Registry = REGISTRY,
    make_current: bool = True,
) -> Telemetry:
    """Configure this process's telemetry from the ``OTEL_*`` environment (see the module docstring).

    ``span_exporter`` and ``metric_readers`` are extra sinks (tests: an InMemorySpanExporter, exported
    synchronously, and an InMemoryMetricReader); they turn tracing or the OpenTelemetry metric
    pipeline on regardless of the environment, unless ``OTEL_SDK_DISABLED=true``."""
    global _current
    env = os.environ if env is None else env
    if _truthy(env.get("OTEL_SDK_DISABLED")):
        telemetry = Telemetry(registry=registry, service_name=service_name)
        if make_current:
            _current = telemetry
        return telemetry
    traces = _traces_wanted(env)
    push_metrics = _metrics_push_wanted(env)
    readers = list(metric_readers)
    tracer_provider = tracer = meter_provider = bridge = None
    if traces or span_exporter is not None or push_metrics or readers:
        from opentelemetry.sdk.resources import Resource

        attributes = {"service.version": service_version}
        if not env.get("OTEL_SERVICE_NAME"):
            attributes["service.name"] = service_name
        resource = Resource.create(attributes)
        if traces or span_exporter is not None:
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

            tracer_provider = TracerProvider(resource=resource)
            for name in traces:
                if name == "otlp":
                    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

                    _warn_protocol(env, "TRACES")
                    tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
                elif name == "console":
                    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

                    tracer_provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
                else:
                    log.warning("unsupported OTEL_TRACES_EXPORTER ignored", extra={"exporter": name})
            if span_exporter is not None:
                tracer_provider.add_span_processor(SimpleSpanProcessor(span_exporter))
            tracer = tracer_provider.get_tracer("upf", service_version)
        if push_metrics:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
            from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

            _warn_protocol(env, "METRICS")
            readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
        if readers:
            from opentelemetry.sdk.metrics import MeterProvider

            meter_provider = MeterProvider(metric_readers=readers, resource=resource)
            bridge = _bridge_to_otel(registry, meter_provider.get_meter("upf", service_version), readers, service_version)
    telemetry = Telemetry(
        registry=registry,
        tracer=tracer,
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
        service_name=service_name,
    )
    if meter_provider is not None:
        telemetry._bridge = bridge
    if make_current:
        _current = telemetry
    log.info(
        "telemetry configured",
        extra={"service": service_name, "tracing": tracer is not None, "otel_metrics": meter_provider is not None},
    )
    return telemetry


def _bridge_to_otel(registry: Registry, meter: Any, readers: Sequence[Any], version: str) -> Any:
    """Make every family, present and future, visible to OpenTelemetry metric readers, at collection
    time only (nothing on the hot path): counters and gauges through observable instruments that read
    the cells; histograms, which have no observable form, as data points built from the cells and
    added to each reader's collection (cumulative temporality). Returns the registry listener to
    remove at shutdown. Instruments are never created inside a collection callback (the SDK holds its
    lock there)."""
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
            meter.create_observable_up_down_counter(fam.name, [observe(fam)], unit=fam.unit, description=fam.description)

    registry.listen(bridge)
    for fam in registry.families():
        bridge(fam)
    start_ns = time.time_ns()
    for reader in readers:
        _add_histograms_to(reader, registry, version, start_ns)
    return bridge


def _add_histograms_to(reader: Any, registry: Registry, version: str, start_ns: int) -> None:
    """Wrap the collect callback the MeterProvider gave ``reader`` (SDK internals, checked by the tests
    against the pinned SDK) so its MetricsData also carries the histogram families."""
    from opentelemetry.sdk.metrics.export import (
        AggregationTemporality,
        HistogramDataPoint,
        Metric,
        MetricsData,
        ResourceMetrics,
        ScopeMetrics,
    )
    from opentelemetry.sdk.metrics.export import Histogram as HistogramData
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    collect = reader._collect
    scope = InstrumentationScope("upf", version)

    def histograms(now: int) -> list[Any]:
        out = []
        for fam in registry.families():
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
                        attributes=dict(cell.attributes), start_time_unix_nano=start_ns, time_unix_nano=now,
                        count=n, sum=cell.sum, bucket_counts=counts, explicit_bounds=list(fam.bounds),
                        min=cell.min, max=cell.max,
                    )
                )
            if points:
                data = HistogramData(data_points=points, aggregation_temporality=AggregationTemporality.CUMULATIVE)
                out.append(Metric(name=fam.name, description=fam.description, unit=fam.unit, data=data))
        return out

    def collect_with_histograms(r: Any, timeout_millis: float = 10_000) -> Any:
        data = collect(r, timeout_millis=timeout_millis)
        extra = histograms(time.time_ns())
        if not extra:
            return data
        if data is None or not data.resource_metrics:
            return None if data is None else data
        first = data.resource_metrics[0]
        merged = ResourceMetrics(
            resource=first.resource,
            scope_metrics=[*first.scope_metrics, ScopeMetrics(scope=scope, metrics=extra, schema_url="")],
            schema_url=first.schema_url,
        )
        return MetricsData(resource_metrics=[merged, *data.resource_metrics[1:]])

    reader._collect = collect_with_histograms


# --- logs ----------------------------------------------------------------------------------------------
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
    root.setLevel((level or os.environ.get("UPF_LOG_LEVEL") or "INFO").upper())
