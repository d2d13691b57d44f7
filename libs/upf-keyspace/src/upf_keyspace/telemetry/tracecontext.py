"""W3C trace context: traceparent parsing and formatting, and the OpenTelemetry contexts and links made
from it (the SDK's propagator is a regex per request, ~6x the cost)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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
    """The parent context of an incoming request (``traceparent``), or None. Parsed here rather than
    by the SDK's propagator (a regex per request, ~6x the cost). A client's ``tracestate`` is not
    taken: UPF has no vendor state to carry, and the SDK logs a malformed one whole at WARNING (any
    publisher could write kilobytes of its choosing into the logs, credentials included)."""
    traceparent = headers.get("traceparent")
    if not traceparent:
        return None
    parsed = parse_traceparent(traceparent)
    if parsed is None:
        return None
    t = _trace_api()
    trace_id, span_id, flags = parsed
    ctx = t.SpanContext(trace_id, span_id, is_remote=True, trace_flags=t.TraceFlags(flags & 0x01))
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
