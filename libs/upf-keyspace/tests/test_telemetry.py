"""upf_keyspace.telemetry: cells, Prometheus rendering, the OTEL_* switch, traceparent helpers; the
envelope's version-2 field; the drivers' store metrics."""

from __future__ import annotations

import logging

import msgspec
import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricExporter, MetricExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from upf_keyspace import ENVELOPE_VERSION, Envelope, Settings, decode_envelope, encode_envelope, open_store
from upf_keyspace import telemetry as tm


def samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text.decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_cells_render_as_prometheus_text() -> None:
    reg = tm.Registry()
    c = reg.counter("upf.test.things", "things", attributes=("kind",))
    c.cell("a").add()
    c.cell("a").add(2)
    c.cell("b").add()
    g = reg.gauge("upf.test.open", "open").cell()
    g.add(3)
    g.add(-1)
    h = reg.histogram("upf.test.wait", "wait", unit="s", bounds=(0.1, 1.0)).cell()
    for v in (0.05, 0.1, 0.5, 7.0):
        h.record(v)
    got = samples(tm.render_metrics(reg))
    assert got[("upf_test_things_total", (("kind", "a"),))] == 3
    assert got[("upf_test_things_total", (("kind", "b"),))] == 1
    assert got[("upf_test_open", ())] == 2
    # le semantics: 0.1 falls in the 0.1 bucket; buckets are cumulative.
    assert got[("upf_test_wait_seconds_bucket", (("le", "0.1"),))] == 2
    assert got[("upf_test_wait_seconds_bucket", (("le", "1.0"),))] == 3
    assert got[("upf_test_wait_seconds_bucket", (("le", "+Inf"),))] == 4
    assert got[("upf_test_wait_seconds_count", ())] == 4
    assert got[("upf_test_wait_seconds_sum", ())] == pytest.approx(7.65)
    assert any(name.startswith("process_") for name, _ in got)  # the process collectors come along


def test_a_family_is_defined_once() -> None:
    reg = tm.Registry()
    assert reg.counter("upf.x", "x", attributes=("a",)) is reg.counter("upf.x", "x", attributes=("a",))
    with pytest.raises(ValueError):
        reg.counter("upf.x", "x", attributes=("b",))
    with pytest.raises(ValueError):
        reg.counter("upf.x", "x", attributes=("a",)).cell("1", "2")


def test_traceparent_round_trip_and_rejects() -> None:
    tp = tm.format_traceparent(0xABC, 0x123, 1)
    assert tp == "00-00000000000000000000000000000abc-0000000000000123-01"
    assert tm.parse_traceparent(tp) == (0xABC, 0x123, 1)
    for bad in (
        "",
        "garbage",
        tp.replace("00-", "ff-", 1),
        "00-" + "0" * 32 + "-0000000000000123-01",
        tp + "-x",
        tp.upper(),
    ):
        assert tm.parse_traceparent(bad) is None, bad
    link = tm.link_from_traceparent(tp)
    assert link.context.trace_id == 0xABC and link.context.span_id == 0x123 and link.context.is_remote
    assert tm.link_from_traceparent("") is None
    ctx = tm.context_from_headers({"traceparent": tp})
    assert ctx is not None
    assert tm.context_from_headers({"traceparent": "nonsense"}) is None
    assert tm.context_from_headers({}) is None


def test_a_clients_tracestate_is_not_taken_nor_logged(caplog: pytest.LogCaptureFixture) -> None:
    """The SDK logs a malformed tracestate whole at WARNING: any publisher could write kilobytes of its
    choosing (a token, here) into the logs. UPF carries no vendor state: a client's is ignored."""
    import opentelemetry.trace as t

    tp = tm.format_traceparent(0xABC, 0x123, 1)
    junk = "LEAK Bearer tk_" + "x" * 29 + " " + "A" * 3000
    for state in (junk, "vendor=value"):
        ctx = tm.context_from_headers({"traceparent": tp, "tracestate": state})
        span_context = t.get_current_span(ctx).get_span_context()
        assert span_context.trace_id == 0xABC and not span_context.trace_state
    assert "tk_" not in caplog.text and "LEAK" not in caplog.text


@pytest.mark.parametrize(
    ("env", "tracing"),
    [
        ({}, False),
        ({"OTEL_SERVICE_NAME": "x"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:9/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_SDK_DISABLED": "true"}, False),
    ],
)
def test_tracing_is_on_only_with_an_exporter(env: dict[str, str], tracing: bool) -> None:
    t = tm.setup_telemetry("upf-test", "0", env=env, registry=tm.Registry(), make_current=False)
    try:
        assert t.tracing is tracing
        assert (t.tracer is not None) is tracing
        assert t.meter_provider is None  # OTLP metric push needs OTEL_METRICS_EXPORTER=otlp
    finally:
        t.shutdown()


def test_shutdown_does_not_wait_past_its_bound_on_an_exporter_that_hangs(caplog: pytest.LogCaptureFixture) -> None:
    """The SDK's own shutdown waits up to 30 s on an exporter (a collector that never answers); a stop
    has its grace, and an exit watchdog after it. Past the bound, what is unsent is dropped with one
    warning. (An exporter that blocks until released stands for the collector: a real one left
    retrying in this process would run on into the tests after this one.)"""
    import threading
    import time

    release = threading.Event()

    class Hanging(InMemorySpanExporter):
        def shutdown(self) -> None:
            release.wait(30)

    t = tm.setup_telemetry("upf-test", "0", env={}, span_exporter=Hanging(), registry=tm.Registry(), make_current=False)
    try:
        began = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="upf.telemetry"):
            t.shutdown(0.3)
        assert time.monotonic() - began < 2.0
        assert "telemetry flush cut at shutdown" in caplog.text
    finally:
        release.set()


def test_in_memory_sinks_see_spans_and_cells() -> None:
    reg = tm.Registry()
    exporter = InMemorySpanExporter()
    reader = tm.InMemoryCellReader()
    t = tm.setup_telemetry(
        "upf-test", "9", env={}, span_exporter=exporter, metric_readers=[reader], registry=reg, make_current=False
    )
    try:
        counter = reg.counter("upf.test.hits", "hits", attributes=("kind",)).cell("a")
        hist = reg.histogram("upf.test.size", "size", unit="By", bounds=tm.BYTES_BUCKETS).cell()
        counter.add(5)
        hist.record(100)
        span = t.tracer.start_span("publish")
        span.end()
        (done,) = exporter.get_finished_spans()
        assert done.name == "publish" and done.resource.attributes["service.name"] == "upf-test"
        data = reader.get_metrics_data()
        points = {
            m.name: m.data.data_points for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
        }
        assert [(p.value, dict(p.attributes)) for p in points["upf.test.hits"]] == [(5, {"kind": "a"})]
        (h,) = points["upf.test.size"]
        assert (h.count, h.sum) == (1, 100)
    finally:
        t.shutdown()
    hist.record(1)  # detached from the shut-down provider: still counts locally
    assert hist.count == 2


class CapturingExporter(MetricExporter):
    """A MetricExporter that keeps what it is given (what an OTLP exporter would send)."""

    def __init__(self) -> None:
        super().__init__()
        self.exported: list[object] = []

    def export(self, metrics_data, timeout_millis: float = 10_000, **kwargs) -> MetricExportResult:  # type: ignore[no-untyped-def]
        self.exported.append(metrics_data)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:  # type: ignore[no-untyped-def]
        pass


def metric_names(data) -> dict[str, object]:  # type: ignore[no-untyped-def]
    return {m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}


def test_pushed_metrics_carry_the_histogram_cells_through_the_public_reader_interface() -> None:
    """The OTLP push path: a PeriodicExportingMetricReader subclass hands the exporter the counters and
    the histograms, with no SDK internals touched (the reader's collect callback is the SDK's own)."""
    reg = tm.Registry()
    exporter = CapturingExporter()
    reader = tm.PeriodicCellReader(exporter, export_interval_millis=float("inf"))
    t = tm.setup_telemetry("upf-test", "9", env={}, metric_readers=[reader], registry=reg, make_current=False)
    try:
        assert reader._collect is not None and reader._collect.__self__ is t.meter_provider._measurement_consumer
        reg.counter("upf.test.pushed", "pushed").cell().add(2)
        wait = reg.histogram("upf.test.wait", "wait", unit="s", bounds=(0.1, 1.0), attributes=("kind",))
        wait.cell("a").record(0.5)
        wait.cell("a").record(5.0)
        wait.cell("b")  # never recorded: no data point
        assert t.meter_provider.force_flush()
        (data,) = exporter.exported
        metrics = metric_names(data)
        assert metrics["upf.test.pushed"].data.data_points[0].value == 2
        (point,) = metrics["upf.test.wait"].data.data_points
        assert dict(point.attributes) == {"kind": "a"}
        assert (point.count, point.sum, list(point.bucket_counts)) == (2, 5.5, [0, 1, 1])
        assert (point.min, point.max, list(point.explicit_bounds)) == (0.5, 5.0, [0.1, 1.0])
        assert data.resource_metrics[0].resource.attributes["service.name"] == "upf-test"
    finally:
        t.shutdown()


def test_a_weighted_observation_is_that_many_observations() -> None:
    """``record_many(v, n)`` (one message delivered to n connections) leaves the cell as n ``record(v)``."""
    reg = tm.Registry()
    one = reg.histogram("upf.test.a", "a", unit="s", bounds=tm.LATENCY_BUCKETS).cell()
    many = reg.histogram("upf.test.b", "b", unit="s", bounds=tm.LATENCY_BUCKETS).cell()
    for v, n in ((0.003, 5), (0.2, 1), (0.0001, 3)):
        for _ in range(n):
            one.record(v)
        many.record_many(v, n)
    assert (many.counts, many.min, many.max, many.count) == (one.counts, one.min, one.max, 9)
    assert abs(many.sum - one.sum) < 1e-12


def test_a_plain_sdk_reader_gets_the_counters_not_the_histograms() -> None:
    """Histograms reach only the cell readers. They ride on a collection of the SDK's own metrics: with no
    counter or gauge in the registry at all the SDK hands a reader nothing (every role has counters)."""
    reg = tm.Registry()
    cells, plain = tm.InMemoryCellReader(), InMemoryMetricReader()
    t = tm.setup_telemetry("upf-test", "9", env={}, metric_readers=[cells, plain], registry=reg, make_current=False)
    try:
        reg.histogram("upf.test.size", "size", unit="By", bounds=tm.BYTES_BUCKETS).cell().record(10)
        assert cells.get_metrics_data() is None
        reg.counter("upf.test.hits", "hits").cell().add()
        assert set(metric_names(cells.get_metrics_data())) == {"upf.test.hits", "upf.test.size"}
        assert set(metric_names(plain.get_metrics_data())) == {"upf.test.hits"}
    finally:
        t.shutdown()


def test_key_value_log_format() -> None:
    record = logging.LogRecord("upf.x", logging.INFO, __file__, 1, "static message", None, None)
    record.code = 1020
    line = tm.KeyValueFormatter("%(levelname)s %(message)s").format(record)
    assert line == "INFO static message code=1020"


class EnvelopeV1(msgspec.Struct, frozen=True, array_like=True, omit_defaults=False):
    """Envelope as version 1 had it (a reader of the previous release)."""

    time: int
    expires: int
    message: str
    encoding: str = ""
    title: str = ""
    priority: int = 0
    tags: tuple[str, ...] = ()
    click: str = ""
    icon: str = ""
    content_type: str = ""
    traceparent: str = ""
    idem: str = ""


def test_envelope_v2_is_readable_both_ways() -> None:
    assert ENVELOPE_VERSION >= 2
    v2 = Envelope(
        time=1, expires=2, message="m", traceparent="00-" + "1" * 32 + "-" + "2" * 16 + "-01", published_ms=1234
    )
    old = msgspec.msgpack.decode(encode_envelope(v2), type=EnvelopeV1)
    assert (old.message, old.traceparent) == ("m", v2.traceparent)
    back = decode_envelope(msgspec.msgpack.encode(EnvelopeV1(time=1, expires=2, message="m")))
    assert back.published_ms == 0 and back.message == "m"
    assert decode_envelope(encode_envelope(v2)) == v2


def test_envelope_v3_fields_survive_a_v2_reader_and_default_for_v2_rows() -> None:
    """A v2 role reading a v3 row ignores the new trailing fields; a v3 role reading a v2 row gets defaults."""
    assert ENVELOPE_VERSION == 3
    v3 = Envelope(
        time=1,
        expires=2,
        message="m",
        published_ms=7,
        event="message_delete",
        sequence_id="s1",
        nocache=True,
        urgency="high",
        poll_id="p",
    )
    v2_fields = msgspec.msgpack.decode(encode_envelope(v3))[:13]
    assert v2_fields[-1] == 7
    back = decode_envelope(msgspec.msgpack.encode(v2_fields))
    assert (back.event, back.sequence_id, back.nocache, back.actions) == ("", "", False, "")
    assert decode_envelope(encode_envelope(v3)) == v3


async def test_store_counts_transactions_and_conflict_retries(tmp_path) -> None:
    """Transactions are counted per driver; a conflict (1020) is counted as a retry by its code."""
    from upf_keyspace import errors

    store = await open_store(Settings(store_path=str(tmp_path / "s.db")))
    try:
        reg = tm.REGISTRY
        before = reg.value("upf.store.transactions", driver="embedded")
        retries = reg.value("upf.store.retries", driver="embedded", code="1020")
        batches = reg.value("upf.store.commit.batch_size", driver="embedded")
        attempts = 0

        async def body(tr):  # type: ignore[no-untyped-def]
            nonlocal attempts
            attempts += 1
            tr.set(b"\x02k", b"v")
            if attempts == 1:
                raise errors.StoreError(errors.NOT_COMMITTED)

        await store.db.transact(body)
        assert reg.value("upf.store.transactions", driver="embedded") == before + 1
        assert reg.value("upf.store.retries", driver="embedded", code="1020") == retries + 1
        assert reg.value("upf.store.commit.batch_size", driver="embedded") == batches + 1
        failures = reg.value("upf.store.failures", driver="embedded", code="2000")

        async def bad(tr):  # type: ignore[no-untyped-def]
            raise errors.StoreError(errors.CLIENT_INVALID_OPERATION)

        with pytest.raises(errors.StoreError):
            await store.db.transact(bad)
        assert reg.value("upf.store.failures", driver="embedded", code="2000") == failures + 1
    finally:
        await store.close()


def test_merged_rendering_sums_other_processes_snapshots_and_skips_what_it_cannot_read() -> None:
    """The all-in-one's workers answer /metrics for each other: counters, gauges and histogram buckets
    add up; a torn snapshot, or a family another release defined differently, is left out."""

    def worker(published: int, connections: int, latency: float) -> tm.Registry:
        reg = tm.Registry()
        reg.counter("upf.writer.publishes", "p", attributes=("result",)).cell("stored").add(published)
        reg.gauge("upf.pusher.connections", "c").cell().add(connections)
        reg.histogram("upf.delivery.latency", "l", unit="s", bounds=tm.LATENCY_BUCKETS).cell().record(latency)
        return reg

    mine, other = worker(3, 2, 0.002), worker(5, 7, 0.2)
    other.counter("upf.janitor.passes", "j", attributes=("result",)).cell("ok").add(4)  # only the other has it
    odd = tm.Registry()
    odd.gauge("upf.writer.publishes", "defined differently")  # an older release's worker, say
    text = tm.render_merged([tm.snapshot(mine), tm.snapshot(other), b"\x93torn", tm.snapshot(odd)])
    got = samples(text)
    assert got[("upf_writer_publishes_total", (("result", "stored"),))] == 8
    assert got[("upf_pusher_connections", ())] == 9
    assert got[("upf_janitor_passes_total", (("result", "ok"),))] == 4
    assert got[("upf_delivery_latency_seconds_count", ())] == 2
    assert got[("upf_delivery_latency_seconds_bucket", (("le", "0.0025"),))] == 1
    assert got[("upf_delivery_latency_seconds_sum", ())] == pytest.approx(0.202)
    assert any(name.startswith("process_") or name.startswith("python_") for name, _ in got)
    assert samples(tm.render_metrics(mine))[("upf_writer_publishes_total", (("result", "stored"),))] == 3
