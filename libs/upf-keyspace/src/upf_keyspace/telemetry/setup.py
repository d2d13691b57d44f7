"""Setting up a process's telemetry from the standard ``OTEL_*`` environment: whether tracing is on, the
tracer and meter providers, and the process's current ``Telemetry`` (see the package docstring)."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from ..settings import SettingsError
from .cells import REGISTRY, Registry

log = logging.getLogger("upf.telemetry")

SHUTDOWN_SECS = 2.0
"""How long ``Telemetry.shutdown`` waits for the exporters' last flush by default."""


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

    def shutdown(self, timeout_secs: float = SHUTDOWN_SECS) -> None:
        """Flush and stop the exporters (idempotent) for at most ``timeout_secs``; metrics cells and
        /metrics keep working. Why bounded: the SDK's own shutdown waits up to 30 s on a collector
        that does not answer, which would hold a stop past its grace (and its exit watchdog's 70).
        What is still unsent then is dropped, as the SDK drops it at exit."""
        if self._closed:
            return
        self._closed = True
        if self._bridge is not None:
            self.registry.unlisten(self._bridge)
        tracer_provider, meter_provider = self.tracer_provider, self.meter_provider
        if tracer_provider is None and meter_provider is None:
            return

        def stop() -> None:
            if tracer_provider is not None:
                tracer_provider.shutdown()
            if meter_provider is not None:
                meter_provider.shutdown(timeout_millis=timeout_secs * 1000)

        # A daemon thread: a flush cut short does not keep the process alive (the SDK's exit hooks
        # find the providers already shut down and return at once).
        thread = threading.Thread(target=stop, name="upf-telemetry-stop", daemon=True)
        thread.start()
        thread.join(max(0.0, timeout_secs))
        if thread.is_alive():
            log.warning("telemetry flush cut at shutdown", extra={"timeout_secs": timeout_secs})


_DISABLED = Telemetry()
_current: Telemetry = _DISABLED


def current() -> Telemetry:
    """The process's telemetry: what ``setup_telemetry`` last returned, else a disabled one."""
    return _current


_TRACE_EXPORTERS = ("otlp", "console")


def _traces_wanted(env: Mapping[str, str]) -> list[str]:
    """The trace exporters to run: the supported ones named (an unsupported name is warned of and
    dropped, so it turns no tracing on by itself), else OTLP when an endpoint is set."""
    exporters = _names(env.get("OTEL_TRACES_EXPORTER"))
    if "none" in exporters:
        return []
    if exporters:
        for name in exporters:
            if name not in _TRACE_EXPORTERS:
                log.warning("unsupported OTEL_TRACES_EXPORTER ignored", extra={"exporter": name})
        return [name for name in exporters if name in _TRACE_EXPORTERS]
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
    synchronously, and an ``InMemoryCellReader``, which also sees the histograms); they turn tracing or the OpenTelemetry metric
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
                    try:
                        processor = BatchSpanProcessor(OTLPSpanExporter())
                    except ValueError as exc:  # the SDK's check of OTEL_BSP_* (a negative delay, say)
                        raise SettingsError(f"an OTEL_BSP_* setting is invalid: {exc}") from None
                    tracer_provider.add_span_processor(processor)
                else:
                    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

                    tracer_provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
            if span_exporter is not None:
                tracer_provider.add_span_processor(SimpleSpanProcessor(span_exporter))
            tracer = tracer_provider.get_tracer("upf", service_version)
        if push_metrics:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

            from .otel import PeriodicCellReader

            _warn_protocol(env, "METRICS")
            readers.append(PeriodicCellReader(OTLPMetricExporter()))
        if readers:
            from opentelemetry.sdk.metrics import MeterProvider

            from .otel import bridge_to_otel

            meter_provider = MeterProvider(metric_readers=readers, resource=resource)
            meter = meter_provider.get_meter("upf", service_version)
            bridge = bridge_to_otel(registry, meter, readers, service_version, resource)
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
