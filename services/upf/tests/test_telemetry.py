"""Telemetry in one process with in-memory exporters: the all-in-one shape (the pusher's front door with the
writer behind it, as ``upf`` runs them), one publish with a ``traceparent`` header and its delivery produce
exactly the expected spans, span link and metrics. (Here, not in tests/e2e: only this package may import
the roles.)"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import msgspec
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from upf_keyspace import Settings, decode_id, open_store
from upf_keyspace import telemetry as tm

TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
PARENT_ID = 0x00F067AA0BA902B7
PARENT = tm.format_traceparent(TRACE_ID, PARENT_ID, 1)


def metric_points(reader: tm.InMemoryCellReader) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    out: dict[str, list[Any]] = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out.setdefault(m.name, []).extend(m.data.data_points)
    return out


def point(points: dict[str, list[Any]], name: str, **attributes: str) -> Any:
    matches = [p for p in points.get(name, []) if dict(p.attributes) == attributes]
    assert len(matches) == 1, (name, attributes, points.get(name))
    return matches[0]


class _Stream:
    """A minimal /json or /ws-less subscriber: reads NDJSON lines of a chunked stream."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def next(self, timeout: float = 5.0) -> Any:
        async def one() -> Any:
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).strip(), 16)
                data = await self.reader.readexactly(size + 2)
                return msgspec.json.decode(data[:-2])

        return await asyncio.wait_for(one(), timeout)

    async def next_message(self, timeout: float = 5.0) -> Any:
        while True:
            frame = await self.next(timeout)
            if frame["event"] == "message":
                return frame


class subscribe:
    def __init__(self, base: str, topic: str, transport: str) -> None:
        assert transport == "json"
        self.port = int(base.rsplit(":", 1)[1])
        self.topic = topic

    async def __aenter__(self) -> _Stream:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        writer.write(f"GET /{self.topic}/json HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        await reader.readuntil(b"\r\n\r\n")
        self.stream = _Stream(reader, writer)
        assert (await self.stream.next())["event"] == "open"
        return self.stream

    async def __aexit__(self, *exc: Any) -> None:
        self.stream.writer.close()


async def publish(base: str, topic: str, body: str, *, params: Any = None, headers: Any = None) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as c:
        return await c.post(f"{base}/{topic}", content=body, params=params, headers=headers)


async def eventually(check: Any, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return check()
        except AssertionError:
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.1)


async def start_in_process(settings: Settings, telemetry: tm.Telemetry) -> tuple[Any, Any, str]:
    """The writer's app behind the pusher's front door in this process, as the all-in-one runs them."""
    from upf_pusher.server import serve
    from upf_writer.app import create_app

    store = await open_store(settings)
    pusher = await serve(
        settings,
        store,
        fallback=create_app(settings, store, telemetry=telemetry),
        telemetry=telemetry,
        host="127.0.0.1",
        port=0,
    )
    return store, pusher, f"http://127.0.0.1:{pusher.port}"


# --- in process, in-memory exporters ------------------------------------------------------------------
async def test_one_publish_one_delivery_in_memory(tmp_path) -> None:
    """The all-in-one shape in this process (pusher front door, writer behind it), with an
    InMemorySpanExporter and an InMemoryCellReader: one publish with a ``traceparent`` header and its
    delivery produce exactly the expected spans, link and metrics."""
    registry = tm.Registry()
    spans = InMemorySpanExporter()
    reader = tm.InMemoryCellReader()
    telemetry = tm.setup_telemetry(
        "upf", "test", env={}, span_exporter=spans, metric_readers=[reader], registry=registry, make_current=False
    )
    settings = Settings(store_path=str(tmp_path / "upf.db"), shard_count=4, node_id="mem1", safety_poll_secs=600)
    store, pusher, base = await start_in_process(settings, telemetry)
    try:
        async with subscribe(base, "telMem1", "json") as s:
            r = await publish(base, "telMem1", "hello", params={"up": "1"}, headers={"traceparent": PARENT})
            assert r.status_code == 200
            msg_id = r.json()["id"]
            assert (await s.next_message())["id"] == msg_id

            (publish_span,) = [x for x in spans.get_finished_spans() if x.name == "publish"]
            (deliver_span,) = await eventually(lambda: _named(spans, "deliver", 1))
            # publish: a child of the request's traceparent, and named in the stored envelope
            assert publish_span.context.trace_id == TRACE_ID
            assert publish_span.parent is not None and publish_span.parent.span_id == PARENT_ID
            assert publish_span.attributes["upf.message.id"] == msg_id
            assert publish_span.attributes["upf.message.size"] == 5
            (stored,) = await store.read_after("telMem1", None)
            assert stored.envelope.traceparent == tm.traceparent_of(publish_span)
            assert stored.envelope.published_ms > 0
            assert stored.stamp == decode_id(msg_id)
            # deliver: its own trace, linked to the publish span
            assert deliver_span.context.trace_id != TRACE_ID
            (link,) = deliver_span.links
            assert (link.context.trace_id, link.context.span_id) == (TRACE_ID, publish_span.context.span_id)
            assert deliver_span.attributes["upf.transport"] == "json"
            assert deliver_span.attributes["upf.trigger"] == "bell"
            assert deliver_span.attributes["upf.message.id"] == msg_id

            points = metric_points(reader)
            assert point(points, "upf.writer.publishes", result="stored").value == 1
            assert point(points, "upf.writer.publishes", result="replayed").value == 0
            commit = point(points, "upf.writer.publish.commit.duration")
            assert commit.count == 1 and 0 < commit.sum < 5
            assert point(points, "upf.writer.publish.size").sum == 5
            assert point(points, "upf.pusher.deliveries", transport="json").value == 1
            assert point(points, "upf.pusher.deliveries", transport="ws").value == 0
            latency = point(points, "upf.pusher.delivery.latency", transport="json")
            assert latency.count == 1 and 0 <= latency.sum < 5
            assert point(points, "upf.pusher.connections", transport="json").value == 1
            assert point(points, "upf.pusher.inbox.entries").value == 1
            assert point(points, "upf.pusher.safety_poll.deliveries").value == 0
            assert not [p for p in points.get("upf.writer.rejections", []) if p.value]
    finally:
        await pusher.stop()
        await store.close()
        telemetry.shutdown()
    names = sorted(x.name for x in spans.get_finished_spans())
    assert names == ["deliver", "publish"]


def _named(exporter: InMemorySpanExporter, name: str, n: int) -> list[Any]:
    found = [x for x in exporter.get_finished_spans() if x.name == name]
    assert len(found) == n, found
    return found


async def test_tracing_off_makes_no_spans_and_stores_no_traceparent(tmp_path) -> None:
    """Without an exporter nothing is traced (the envelope carries no traceparent), but metrics count."""
    registry = tm.Registry()
    telemetry = tm.setup_telemetry("upf", "test", env={}, registry=registry, make_current=False)
    assert not telemetry.tracing and telemetry.tracer is None
    settings = Settings(store_path=str(tmp_path / "upf.db"), shard_count=4, node_id="mem2")
    store, pusher, base = await start_in_process(settings, telemetry)
    try:
        async with subscribe(base, "telOff1", "json") as s:
            r = await publish(base, "telOff1", "x", headers={"traceparent": PARENT})
            assert (await s.next_message())["id"] == r.json()["id"]
        (stored,) = await store.read_after("telOff1", None)
        assert stored.envelope.traceparent == "" and stored.envelope.published_ms > 0
        assert registry.value("upf.writer.publishes", result="stored") == 1
        await eventually(lambda: _equal(registry.value("upf.pusher.deliveries", transport="json"), 1))
    finally:
        await pusher.stop()
        await store.close()


def _equal(a: Any, b: Any) -> None:
    assert a == b, (a, b)
