"""The shipped ingress in front of the real services: one writer and two pushers (started as their console
scripts with `python3 -m uv run`, sharing one embedded store file), behind real nginx running
deploy/ingress/nginx.conf with its upstreams pointed at their ports.

Everything goes through the ingress's single base URL, as an ntfy client would use it: publish with
POST /{topic}, subscribe over /ws, /json, /sse and /raw. The idle-stream test holds a stream through
several keepalives before delivering a message on it; together with the assertion that the shipped
stream route's proxy_read_timeout is far above the 45 s default keepalive, that shows idle subscribers
outlive the proxy (nginx's own 60 s default is too close to 45 s to test by waiting).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets

from tests.conftest import Process

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
KEEPALIVE_SECS = 1
SHARDS = "8"
READY_SECS = 90.0  # times UPF_TESTS_TIMEOUT_FACTOR, in Process.wait_ready
STEP_TIMEOUT = 15.0 * float(os.environ.get("UPF_TESTS_TIMEOUT_FACTOR", "1"))


def start(uv: list[str], script: str, workdir: Path, port: int, store: Path, **extra: str) -> Process:
    """`python3 -m uv run <console script>` with the UPF settings of this test (no FoundationDB)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UPF_", "FDB_", "OTEL_"))}
    env.update(
        UPF_BIND=f"127.0.0.1:{port}",
        UPF_STORE_PATH=str(store),
        UPF_SHARD_COUNT=SHARDS,
        UPF_KEEPALIVE_SECS=str(KEEPALIVE_SECS),
        UPF_HEARTBEAT_SECS="1",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    # --no-sync: the test session already runs in the synced environment, and three processes syncing at
    # once would only contend for its lock.
    argv = [*uv, "run", "--no-sync", script]
    return Process(script, argv, env, workdir / f"{script}-{port}.log", port, "/__lbheartbeat__", cwd=REPO)


def wait_ready(services: list[Process]) -> None:
    """Until GET /__lbheartbeat__ answers 200 on each process."""
    for service in services:
        service.wait_ready(READY_SECS)


@dataclass
class Stack:
    writer: Process
    pushers: list[Process]

    def stop(self) -> None:
        for service in (self.writer, *self.pushers):
            service.stop()


def start_stack(uv: list[str], workdir: Path, free_port: Callable[[], int]) -> Stack:
    store = workdir / "upf.db"
    # The writer first: it creates the store file the pushers open.
    writer = start(uv, "upf-writer", workdir, free_port(), store)
    try:
        wait_ready([writer])
        pushers = [start(uv, "upf-pusher", workdir, free_port(), store, UPF_NODE_ID=f"pusher-{n}") for n in ("a", "b")]
        stack = Stack(writer, pushers)
        wait_ready(pushers)
    except BaseException:
        writer.stop()
        for service in locals().get("pushers", []):
            service.stop()
        raise
    return stack


@pytest.fixture(scope="module")
def stack(uv: list[str], tmp_path_factory: pytest.TempPathFactory, free_port: Callable[[], int]) -> Iterator[Stack]:
    running = start_stack(uv, tmp_path_factory.mktemp("stack"), free_port)
    yield running
    running.stop()


@pytest.fixture
def ingress(stack: Stack, start_ingress):
    return start_ingress([stack.writer.port], [p.port for p in stack.pushers])


def topic() -> str:
    return "up" + uuid.uuid4().hex[:12]


async def publish(client: httpx.AsyncClient, base: str, topic_: str, body: str) -> dict[str, Any]:
    response = await client.post(f"{base}/{topic_}", content=body.encode())
    assert response.status_code == 200, response.text
    message = response.json()
    assert message["id"] and message["topic"] == topic_ and message["message"] == body
    return message


async def json_events(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    async for line in response.aiter_lines():
        assert line.strip(), "blank line on /json (the ntfy app chokes on it)"
        yield json.loads(line)


async def sse_events(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """Parse text/event-stream; yield each event's JSON data with the SSE event name checked against it."""
    name, data = None, []
    async for line in response.aiter_lines():
        if line == "":
            if data:
                event = json.loads("\n".join(data))
                assert (name or "message") == event["event"], (name, event)
                yield event
            name, data = None, []
        elif line.startswith("event:"):
            name = line.partition(":")[2].strip()
        elif line.startswith("data:"):
            data.append(line.partition(":")[2].strip())


async def next_message(events: AsyncIterator[dict[str, Any]]) -> dict[str, Any]:
    async for event in events:
        if event["event"] == "message":
            return event
        assert event["event"] == "keepalive", event
    raise AssertionError("stream ended before a message")


def assert_delivered(event: dict[str, Any], published: dict[str, Any], topic_: str, body: str) -> None:
    assert event["event"] == "message"
    assert event["id"] == published["id"]
    assert event["topic"] == topic_
    assert event["message"] == body
    assert isinstance(event["time"], int)


async def test_everything_but_streams_reaches_the_writer(ingress) -> None:
    """Publish, the UnifiedPush endpoint check and /__version__ through the ingress land on the writer."""
    t = topic()
    async with httpx.AsyncClient(timeout=STEP_TIMEOUT) as client:
        await publish(client, ingress.url, t, "hello writer")
        check = await client.get(f"{ingress.url}/{t}", params={"up": "1"})
        assert check.status_code == 200 and check.json() == {"unifiedpush": {"version": 1}}
        version = await client.get(f"{ingress.url}/__version__")
        assert version.json()["name"] == "upf-writer"


async def test_websocket_through_the_ingress(ingress) -> None:
    t, body = topic(), "over websocket"
    async with httpx.AsyncClient(timeout=STEP_TIMEOUT) as client:
        async with asyncio.timeout(STEP_TIMEOUT):
            async with websockets.connect(f"{ingress.ws_url}/{t}/ws") as ws:
                opened = json.loads(await ws.recv())
                assert opened["event"] == "open" and opened["topic"] == t
                published = await publish(client, ingress.url, t, body)
                while (event := json.loads(await ws.recv()))["event"] != "message":
                    pass
    assert_delivered(event, published, t, body)


@pytest.mark.parametrize("transport", ["json", "sse"])
async def test_http_streams_through_the_ingress(ingress, transport: str) -> None:
    """/json and /sse: an open event first, then the published message, unbuffered."""
    t, body = topic(), f"over {transport}"
    parse = json_events if transport == "json" else sse_events
    async with httpx.AsyncClient(timeout=httpx.Timeout(STEP_TIMEOUT, read=None)) as client:
        async with asyncio.timeout(STEP_TIMEOUT):
            async with client.stream("GET", f"{ingress.url}/{t}/{transport}") as response:
                assert response.status_code == 200
                events = parse(response)
                opened = await anext(events)
                assert opened["event"] == "open" and opened["topic"] == t
                published = await publish(client, ingress.url, t, body)
                event = await next_message(events)
    assert_delivered(event, published, t, body)


async def test_sequence_ids_named_like_streams_through_the_ingress(ingress) -> None:
    """ntfy v2.16's sequence ids: ``PUT /{topic}/json`` publishes with the sequence id "json" and
    ``DELETE /{topic}/json`` deletes it (a writer's), while ``GET /{topic}/sse`` subscribes (a pusher's)
    and sees both, in order."""
    t = topic()
    async with httpx.AsyncClient(timeout=httpx.Timeout(STEP_TIMEOUT, read=None)) as client:
        async with asyncio.timeout(STEP_TIMEOUT):
            async with client.stream("GET", f"{ingress.url}/{t}/sse") as response:
                events = sse_events(response)
                assert (await anext(events))["event"] == "open"
                put = await client.put(f"{ingress.url}/{t}/json", content=b"v1")
                gone = await client.delete(f"{ingress.url}/{t}/json")
                assert (put.status_code, gone.status_code) == (200, 200), (put.text, gone.text)
                got = []
                async for event in events:
                    if event["event"] != "keepalive":
                        got.append(event)
                    if len(got) == 2:
                        break
    assert [(e["id"], e["event"], e["sequence_id"]) for e in got] == [
        (put.json()["id"], "message", "json"),
        (gone.json()["id"], "message_delete", "json"),
    ]


async def test_raw_stream_through_the_ingress(ingress) -> None:
    t, body = topic(), "over raw"
    async with httpx.AsyncClient(timeout=httpx.Timeout(STEP_TIMEOUT, read=None)) as client:
        async with asyncio.timeout(STEP_TIMEOUT):
            async with client.stream("GET", f"{ingress.url}/{t}/raw") as response:
                assert response.status_code == 200
                lines = response.aiter_lines()
                assert await anext(lines) == ""  # the open event is an empty line on /raw
                await publish(client, ingress.url, t, body)
                while (line := await anext(lines)) == "":  # keepalives are empty lines too
                    pass
    assert line == body


def test_shipped_idle_timeout_is_far_above_the_keepalive(repo: Path) -> None:
    routes = (repo / "deploy/ingress/upf-routes.conf").read_text()
    stream_block = routes.split("location / {")[0]
    (timeout,) = re.findall(r"proxy_read_timeout (\d+)s;", stream_block)
    assert int(timeout) >= 10 * 45  # the pushers' default UPF_KEEPALIVE_SECS


async def test_idle_stream_survives_keepalives_then_delivers(ingress) -> None:
    """A subscriber idle through several keepalive intervals keeps its stream, which still delivers."""
    t, body = topic(), "after a quiet while"
    idle = 5 * KEEPALIVE_SECS
    async with httpx.AsyncClient(timeout=httpx.Timeout(STEP_TIMEOUT, read=None)) as client:
        async with client.stream("GET", f"{ingress.url}/{t}/json") as response:
            events = json_events(response)
            assert (await anext(events))["event"] == "open"
            # Read (never cancel a read: that would close the stream's generator) until `idle` seconds
            # have passed; with nothing published, only keepalives may arrive meanwhile.
            keepalives = 0
            loop = asyncio.get_running_loop()
            until = loop.time() + idle
            async with asyncio.timeout(idle + STEP_TIMEOUT):
                while loop.time() < until:
                    event = await anext(events)
                    assert event["event"] == "keepalive", event
                    keepalives += 1
            assert keepalives >= idle // KEEPALIVE_SECS - 1, f"only {keepalives} keepalives in {idle}s"
            published = await publish(client, ingress.url, t, body)
            async with asyncio.timeout(STEP_TIMEOUT):
                event = await next_message(events)
    assert_delivered(event, published, t, body)


async def test_subscribers_spread_and_survive_a_pusher_exit(
    uv: list[str], tmp_path: Path, start_ingress, free_port
) -> None:
    """Two streams held at once land on both pushers (least_conn) and both deliver; after one pusher
    exits, a new subscribe through the same ingress lands on the survivor and delivers."""
    stack = start_stack(uv, tmp_path, free_port)
    try:
        ingress = start_ingress([stack.writer.port], [p.port for p in stack.pushers])
        topics = [topic(), topic()]
        async with httpx.AsyncClient(timeout=httpx.Timeout(STEP_TIMEOUT, read=None)) as client:
            async with asyncio.timeout(STEP_TIMEOUT):
                async with (
                    client.stream("GET", f"{ingress.url}/{topics[0]}/json") as first,
                    client.stream("GET", f"{ingress.url}/{topics[1]}/json") as second,
                ):
                    streams = [json_events(first), json_events(second)]
                    for events in streams:
                        assert (await anext(events))["event"] == "open"
                    for t, events in zip(topics, streams, strict=True):
                        published = await publish(client, ingress.url, t, f"to {t}")
                        assert_delivered(await next_message(events), published, t, f"to {t}")
            stack.pushers[0].stop()
            t = topic()
            async with asyncio.timeout(STEP_TIMEOUT):
                async with client.stream("GET", f"{ingress.url}/{t}/json") as response:
                    events = json_events(response)
                    assert (await anext(events))["event"] == "open"
                    published = await publish(client, ingress.url, t, "to the survivor")
                    assert_delivered(await next_message(events), published, t, "to the survivor")
    finally:
        stack.stop()


NGINX_DEFAULT_READ_TIMEOUT = 60


@pytest.mark.slow
async def test_silent_stream_outlives_the_proxys_default_read_timeout(
    uv: list[str], tmp_path: Path, start_ingress, free_port
) -> None:
    """With keepalives rarer than nginx's default 60 s proxy_read_timeout, a stream that stays
    completely silent for longer still stands behind the shipped config, and then delivers."""
    store = tmp_path / "upf.db"
    writer = start(uv, "upf-writer", tmp_path, free_port(), store)
    pusher = None
    try:
        wait_ready([writer])
        pusher = start(
            uv, "upf-pusher", tmp_path, free_port(), store, UPF_NODE_ID="pusher-silent", UPF_KEEPALIVE_SECS="600"
        )
        wait_ready([pusher])
        ingress = start_ingress([writer.port], [pusher.port])
        t, body = topic(), "after more than a minute of silence"
        silence = NGINX_DEFAULT_READ_TIMEOUT + 5
        async with httpx.AsyncClient(timeout=httpx.Timeout(STEP_TIMEOUT, read=None)) as client:
            async with client.stream("GET", f"{ingress.url}/{t}/json") as response:
                events = json_events(response)
                assert (await anext(events))["event"] == "open"
                await asyncio.sleep(silence)  # nothing is sent either way meanwhile
                published = await publish(client, ingress.url, t, body)
                async with asyncio.timeout(STEP_TIMEOUT):
                    event = await next_message(events)
        assert_delivered(event, published, t, body)
    finally:
        writer.stop()
        if pusher is not None:
            pusher.stop()
