"""VAPID-restricted topics at every publish route of the writer app (in-process, real embedded store):
a topic bound to a key refuses the ntfy publish, the JSON publish, the Matrix gateway and a sequence's
clear, read and delete, which carry no VAPID key; with restriction off a binding is ignored."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import msgspec
import pytest

from upf_keyspace import Settings, Store
from upf_writer.app import create_app

from ..conftest import PUBLIC_URL, in_process


def matrix_body(pushkey: str) -> bytes:
    return json.dumps({"notification": {"devices": [{"app_id": "im.x", "pushkey": pushkey}]}}).encode()


@pytest.fixture
async def restricted(settings: Settings, store: Store) -> AsyncIterator[httpx.AsyncClient]:
    async with in_process(create_app(msgspec.structs.replace(settings, vapid_restrict=True), store)) as c:
        yield c


async def test_bound_topic_refuses_every_route_without_its_key(restricted: httpx.AsyncClient, store: Store) -> None:
    assert await store.vapid_admit("upBOUND", "BKey", bind=True)
    for r in (
        await restricted.post("/upBOUND", content=b"ntfy"),
        await restricted.post("/", json={"topic": "upBOUND", "message": "json"}),
        await restricted.post("/_matrix/push/v1/notify", content=matrix_body(PUBLIC_URL + "/upBOUND?up=1")),
        await restricted.post("/upBOUND", content=b"\x01", headers={"content-encoding": "aes128gcm", "ttl": "5"}),
        await restricted.put("/upBOUND/sid1", content=b"sequence"),
        await restricted.put("/upBOUND/sid1/clear"),
        await restricted.get("/upBOUND/sid1/read"),
        await restricted.delete("/upBOUND/sid1"),
    ):
        assert (r.status_code, r.json()["code"]) == (401, 40192)
    assert await store.read_after("upBOUND", None) == []
    # an unbound topic stays open to all of them, and nothing without a valid key binds it
    assert (await restricted.post("/upFREE", content=b"ntfy")).status_code == 200
    r = await restricted.post("/_matrix/push/v1/notify", content=matrix_body(PUBLIC_URL + "/upFREE?up=1"))
    assert r.status_code == 200 and r.json() == {"rejected": []}
    assert len(await store.read_after("upFREE", None)) == 2
    assert await store.vapid_bindings() == [("upBOUND", "BKey")]


async def test_bindings_are_ignored_when_restriction_is_off(client: httpx.AsyncClient, store: Store) -> None:
    assert await store.vapid_admit("upBOUND", "BKey", bind=True)
    assert (await client.post("/upBOUND", content=b"ntfy")).status_code == 200
    assert len(await store.read_after("upBOUND", None)) == 1


async def test_without_a_public_url_a_web_push_reply_names_its_message_by_a_relative_location(
    settings: Settings, store: Store
) -> None:
    """Unset, UPF_PUBLIC_URL gives no absolute URL to build on: RFC 8030's Location is relative (RFC
    9110 allows a URI reference), never a made-up host."""
    async with in_process(create_app(msgspec.structs.replace(settings, public_url=""), store)) as c:
        r = await c.post("/upNOURL", content=b"\x01", headers={"content-encoding": "aes128gcm", "ttl": "60"})
    assert r.status_code == 201, r.text
    assert r.headers["location"] == f"/upNOURL/m/{r.json()['id']}"
