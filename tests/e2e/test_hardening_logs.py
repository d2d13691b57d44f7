"""No topic and no message body in the log at any level (issue 14 #11), black box: the all-in-one at
UPF_LOG_LEVEL=DEBUG serves every transport, and its whole log is searched afterwards.

A UnifiedPush topic is a capability. Before: the WebSocket core's DEBUG lines printed every frame
("> TEXT '{"id":...,"topic":"up..."}'"), pings and pongs included."""

from __future__ import annotations

import asyncio

import httpx
import websockets

from tests.clients.ntfy import poll, publish, subscribe

TOPIC = "upSECRETtopic7Q"
BODY = "body-never-logged-9f3"
TITLE = "title-never-logged-4c1"


async def _exercise(base: str) -> None:
    kinds = ("ws", "json", "sse")
    async with (
        subscribe(base, TOPIC + "ws", "ws") as ws,
        subscribe(base, TOPIC + "json", "json") as js,
        subscribe(base, TOPIC + "sse", "sse") as sse,
    ):
        for kind in kinds:
            assert (await publish(base, TOPIC + kind, BODY, headers={"Title": TITLE})).status_code == 200
        for s in (ws, js, sse):
            m = await s.next()
            while m.event != "message":
                m = await s.next()
            assert m.message == BODY
    async with websockets.connect(base.replace("http", "ws") + f"/{TOPIC}/ws") as raw:
        await raw.recv()  # open
        await (await raw.ping(b"ping-" + BODY.encode()))
        await raw.send(TOPIC + BODY)  # a text frame a client should never send
    assert [m.message for m in await poll(base, ",".join(TOPIC + k for k in kinds))] == [BODY] * 3
    async with httpx.AsyncClient() as c:
        assert (await c.get(f"{base}/{TOPIC}/json", params={"poll": "1", "since": "x" + BODY})).status_code == 400


def test_debug_log_names_no_topic_and_no_body(fleet):
    upf = fleet.start("upf", node="logs", UPF_WORKERS="1", UPF_LOG_LEVEL="DEBUG")
    asyncio.run(_exercise(upf.base))
    upf.stop()
    log = upf.log_path.read_text(errors="replace")
    assert "[DEBUG]" in log  # the level was in force
    for secret in (TOPIC, BODY, TITLE):
        assert secret not in log, [line for line in log.splitlines() if secret in line][:3]
