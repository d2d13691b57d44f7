"""Observability, black box: traces for one publish and one delivery across real processes (the trace context travels through the store: the pusher's
``deliver`` span links to the writer's ``publish`` span with no RPC between them), and the Prometheus
scrape endpoint of every role after real traffic."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client.parser import text_string_to_metric_families

from tests.clients.ntfy import publish, subscribe
from tests.conftest import eventually
from upf_keyspace import Settings, open_store
from upf_keyspace import telemetry as tm

TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
PARENT_ID = 0x00F067AA0BA902B7
PARENT = tm.format_traceparent(TRACE_ID, PARENT_ID, 1)


# --- helpers -------------------------------------------------------------------------------------------
def scrape(base: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    r = httpx.get(base + "/metrics", timeout=5)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    out = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def sample(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


# --- across processes: OTLP to an in-test receiver ----------------------------------------------------
class _Receiver:
    """A minimal OTLP/HTTP trace receiver: decodes every ExportTraceServiceRequest it is sent."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, Any]] = []  # (service.name, span)
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.path == "/v1/traces":
                    req = ExportTraceServiceRequest()
                    req.ParseFromString(body)
                    with receiver.lock:
                        for rs in req.resource_spans:
                            service = next(
                                (a.value.string_value for a in rs.resource.attributes if a.key == "service.name"), ""
                            )
                            for ss in rs.scope_spans:
                                receiver.spans.extend((service, sp) for sp in ss.spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def named(self, service: str, name: str) -> list[Any]:
        with self.lock:
            return [sp for svc, sp in self.spans if svc == service and sp.name == name]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def otlp() -> Iterator[_Receiver]:
    r = _Receiver()
    try:
        yield r
    finally:
        r.close()


@pytest.mark.slow
async def test_delivery_span_links_to_publish_span_across_processes(fleet, otlp) -> None:
    """A real writer process and a real pusher process on one store file, each exporting OTLP to this
    test: the pusher's deliver span links to the writer's publish span, whose trace is the request's."""
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{otlp.port}",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "NO_PROXY": "127.0.0.1,localhost",
    }
    writer = fleet.start("upf_writer", node="tw1", **env)
    pusher = fleet.start("upf_pusher", node="tp1", UPF_SAFETY_POLL_SECS="600", **env)
    async with subscribe(pusher.base, "telX1", "json") as s:
        r = await publish(writer.base, "telX1", "across", params={"up": "1"}, headers={"traceparent": PARENT})
        assert r.status_code == 200
        msg_id = r.json()["id"]
        assert (await s.next_message()).id == msg_id

    def exported() -> tuple[Any, Any]:
        pubs = otlp.named("upf-writer", "publish")
        dels = otlp.named("upf-pusher", "deliver")
        assert len(pubs) == 1 and len(dels) == 1, (pubs, dels)
        return pubs[0], dels[0]

    pub, dlv = await eventually(exported, 15)
    assert int.from_bytes(pub.trace_id, "big") == TRACE_ID
    assert int.from_bytes(pub.parent_span_id, "big") == PARENT_ID
    (link,) = dlv.links
    assert (link.trace_id, link.span_id) == (pub.trace_id, pub.span_id)
    assert dlv.trace_id != pub.trace_id
    attrs = {a.key: a.value for a in dlv.attributes}
    assert attrs["upf.message.id"].string_value == msg_id
    assert attrs["upf.transport"].string_value == "json"


# --- the Prometheus endpoint of running roles ----------------------------------------------------------
@pytest.mark.slow
async def test_scrape_writer_and_pusher_after_traffic(fleet) -> None:
    """Real writer and pusher processes (telemetry export off): after 3 publishes, 1 rejected publish
    and 3 deliveries, each role's /metrics has exactly those counts."""
    writer = fleet.start("upf_writer", node="sw1")
    pusher = fleet.start("upf_pusher", node="sp1", UPF_SAFETY_POLL_SECS="600")
    async with subscribe(pusher.base, "telS1", "json") as s:
        ids = [(await publish(writer.base, "telS1", f"m{i}")).json()["id"] for i in range(3)]
        assert (await publish(writer.base, "bad topic!", "x")).status_code == 400
        assert [f.id for f in await s.messages(3)] == ids
        w = scrape(writer.base)
        assert sample(w, "upf_writer_publishes_total", result="stored") == 3
        assert sample(w, "upf_writer_rejections_total", code="40009") == 1
        assert sample(w, "upf_writer_publish_commit_duration_seconds_count") == 3
        assert sample(w, "upf_writer_publish_size_bytes_sum") == 6
        assert sample(w, "upf_store_transactions_total", driver="embedded") >= 3

        def delivered() -> dict[Any, float]:
            p = scrape(pusher.base)
            assert sample(p, "upf_pusher_deliveries_total", transport="json") == 3
            return p

        p = await eventually(delivered)
        assert sample(p, "upf_pusher_delivery_latency_seconds_count", transport="json") == 3
        assert sample(p, "upf_pusher_connections", transport="json") == 1
        assert sample(p, "upf_pusher_bells_total") >= 1
        assert sample(p, "upf_pusher_inbox_entries_total") >= 1
        assert sample(p, "upf_pusher_inbox_drains_total") >= 2  # the first, of every shard; one a bell began
        assert sample(p, "upf_pusher_safety_poll_deliveries_total") == 0
        assert sample(p, "upf_writer_publishes_total", result="stored") == 0  # roles apart: own process, own metrics
    await eventually(lambda: _equal(sample(scrape(pusher.base), "upf_pusher_connections", transport="json"), 0))


@pytest.mark.slow
async def test_safety_poll_delivery_is_counted(fleet) -> None:
    """A lost poke (affinity removed behind the pusher's back): the safety poll delivers, and says so."""
    writer = fleet.start("upf_writer", node="sw2")
    pusher = fleet.start("upf_pusher", node="sp2", UPF_SAFETY_POLL_SECS="1")
    async with subscribe(pusher.base, "telLost1", "json") as s:
        store = await open_store(Settings(store_path=fleet.store, shard_count=8))
        try:
            await store.release(["telLost1"], "sp2")
            r = await publish(writer.base, "telLost1", "late")
        finally:
            await store.close()
        assert (await s.next_message(10)).id == r.json()["id"]
    p = await eventually(lambda: _with(scrape(pusher.base), "upf_pusher_safety_poll_deliveries_total", 1))
    assert sample(p, "upf_pusher_deliveries_total", transport="json") == 1


def _equal(a: Any, b: Any) -> None:
    assert a == b, (a, b)


def _with(samples: dict[Any, float], name: str, value: float) -> dict[Any, float]:
    assert sample(samples, name) == value, sample(samples, name)
    return samples


@pytest.mark.slow
async def test_all_in_one_has_one_endpoint_for_every_role(fleet) -> None:
    """The all-in-one process: one /metrics with the writer's, the pusher's, the janitor's and the
    store's metrics together. One worker (UPF_WORKERS=1): the counts are one process's."""
    upf = fleet.start("upf", node="allinone", UPF_WORKERS="1")
    async with subscribe(upf.base, "telAll1", "ws") as s:
        for i in range(2):
            await publish(upf.base, "telAll1", f"m{i}")
        await s.messages(2)

    def ready() -> dict[Any, float]:
        m = scrape(upf.base)
        assert sample(m, "upf_writer_publishes_total", result="stored") == 2
        assert sample(m, "upf_pusher_deliveries_total", transport="ws") == 2
        assert sample(m, "upf_janitor_passes_total", result="ok") >= 1
        assert sample(m, "upf_store_transactions_total", driver="embedded") > 0
        return m

    await eventually(ready)


@pytest.mark.slow
async def test_janitor_metrics_endpoint(fleet) -> None:
    """The janitor process serves /metrics on its ops port, counting its passes and expirations."""
    writer = fleet.start("upf_writer", node="jw1")
    await publish(writer.base, "telTtl1", "short", headers={"TTL": "1"})
    janitor = fleet.start("upf_janitor", node="jj1")

    def expired() -> None:
        m = scrape(janitor.base)
        assert sample(m, "upf_janitor_expired_total") == 1
        assert sample(m, "upf_janitor_passes_total", result="ok") >= 1

    await eventually(expired, 15)
