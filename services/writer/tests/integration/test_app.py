"""The writer app in-process over a real embedded store: what a publisher sees, and what lands in
the store (read back through ``Store.read_after``)."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator

import msgspec
import pytest
from httpx import AsyncClient as AsyncTestClient

from upf_keyspace import Settings, Store, StoreError, decode_id, open_store
from upf_keyspace.auth import AuthState, Permission
from upf_writer.app import create_app

from ..conftest import PUBLIC_URL, in_process


async def stored(store: Store, topic: str):
    return await store.read_after(topic, None, 100)


def assert_ntfy_error(response, http: int, code: int) -> None:
    assert response.status_code == http
    assert response.headers["content-type"].startswith("application/json")
    assert response.content.endswith(b"\n")
    body = response.json()
    assert body["code"] == code and body["http"] == http and isinstance(body["error"], str)


# --- publish -----------------------------------------------------------------------------------------
async def test_publish_answers_ntfy_message_and_stores_it(client: AsyncTestClient, store: Store) -> None:
    """POST /{topic}: 200, the ntfy message JSON with integer time/expires, and the message in Q."""
    r = await client.post("/mytopic", content=b"  Disk full  ")
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    assert r.content.endswith(b"}\n")
    msg = r.json()
    assert list(msg) == ["id", "time", "expires", "event", "topic", "message"]
    assert isinstance(msg["time"], int) and isinstance(msg["expires"], int)
    assert msg["expires"] - msg["time"] == 86400
    assert (msg["event"], msg["topic"], msg["message"]) == ("message", "mytopic", "Disk full")
    rows = await stored(store, "mytopic")
    assert len(rows) == 1
    assert rows[0].stamp == decode_id(msg["id"])
    assert rows[0].envelope.message == "Disk full"
    assert rows[0].envelope.time == msg["time"]


async def test_put_with_app_query_parameters(client: AsyncTestClient, store: Store) -> None:
    """The ntfy app's PUT /t?priority=3&tags=a,b&title=x."""
    r = await client.put("/t1?priority=3&tags=a,b&title=x&markdown=true", content="**hi**")
    assert r.status_code == 200
    msg = r.json()
    assert (msg["priority"], msg["tags"], msg["title"], msg["content_type"]) == (3, ["a", "b"], "x", "text/markdown")
    env = (await stored(store, "t1"))[0].envelope
    assert (env.priority, env.tags, env.title, env.message) == (3, ("a", "b"), "x", "**hi**")


async def test_unifiedpush_binary_round_trips(client: AsyncTestClient, store: Store) -> None:
    """An aes128gcm WebPush body (with VAPID auth and TTL, as pywebpush sends) is stored as base64;
    a Web Push request is answered RFC 8030's 201 with TTL (its Urgency high shown as priority 5)."""
    body = bytes(range(256)) * 4
    headers = {
        "content-encoding": "aes128gcm",
        "ttl": "60",
        "authorization": "vapid t=eyJ0.eyJ1.c2ln,k=BDd3",
        "urgency": "high",
    }
    r = await client.post("/upAbCdEfGhIjKl", content=body, headers=headers)
    assert r.status_code == 201 and r.headers["ttl"] == "60"
    msg = r.json()
    assert r.headers["location"].endswith(f"/upAbCdEfGhIjKl/m/{msg['id']}") and msg["priority"] == 5
    assert msg["encoding"] == "base64" and base64.b64decode(msg["message"]) == body
    assert msg["expires"] == msg["time"] + 60
    env = (await stored(store, "upAbCdEfGhIjKl"))[0].envelope
    assert base64.b64decode(env.message) == body and env.encoding == "base64"


async def test_a_web_push_replys_ttl_is_the_retention_kept(client: AsyncTestClient, store: Store) -> None:
    """RFC 8030 5.2: a replay's ``TTL`` is the original's (the retry asked for another); ``X-Cache: no``
    keeps the message for no one offline: 0."""
    headers = {"content-encoding": "aes128gcm", "ttl": "60", "idempotency-key": "wp-1"}
    first = await client.post("/upTtlReply", content=b"\x00\x01", headers=headers)
    again = await client.post("/upTtlReply", content=b"\x00\x01", headers={**headers, "ttl": "3600"})
    assert (first.status_code, first.headers["ttl"]) == (201, "60")
    assert (again.status_code, again.headers["ttl"], again.headers["idempotent-replayed"]) == (201, "60", "true")
    assert again.json()["expires"] == again.json()["time"] + 60 and again.json()["id"] == first.json()["id"]
    r = await client.post(
        "/upTtlReply", content=b"\x00", headers={**headers, "idempotency-key": "wp-2", "x-cache": "no"}
    )
    assert (r.status_code, r.headers["ttl"]) == (201, "0") and "expires" not in r.json()


async def test_unifiedpush_text_is_verbatim(client: AsyncTestClient, store: Store) -> None:
    r = await client.post("/upX?up=1", content=b'  {"a": 1}\n')
    assert r.json()["message"] == '  {"a": 1}\n'
    r = await client.post("/upX", content=b"", headers={"x-unifiedpush": "1"})
    assert r.json()["message"] == "triggered"


async def test_oversized_body_is_413_and_nothing_stored(client: AsyncTestClient, store: Store) -> None:
    """4097 bytes: 413 41301, with a Content-Length and streamed without one, plain and UP mode."""
    assert_ntfy_error(await client.post("/big", content=b"a" * 4097), 413, 41301)
    assert_ntfy_error(await client.post("/big?up=1", content=b"\xff" * 100_000), 413, 41301)

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(50):
            yield b"x" * 1000

    assert_ntfy_error(await client.post("/big", content=chunks()), 413, 41301)
    assert await stored(store, "big") == []
    assert (await client.post("/big", content=b"a" * 4096)).status_code == 200


@pytest.mark.parametrize("path", ["/bad.topic", "/" + "x" * 65, "/a%20b", "/%C3%A4"])
async def test_invalid_topic_is_400_40009(client: AsyncTestClient, path: str) -> None:
    assert_ntfy_error(await client.post(path, content=b"x"), 400, 40009)


async def test_disallowed_topic_is_400_40010(client: AsyncTestClient) -> None:
    assert_ntfy_error(await client.post("/docs", content=b"x"), 400, 40010)
    assert_ntfy_error(await client.put("/v1", content=b"x"), 400, 40010)


async def test_bad_parameters(client: AsyncTestClient) -> None:
    assert_ntfy_error(await client.post("/t", content=b"x", headers={"x-priority": "7"}), 400, 40007)
    assert_ntfy_error(await client.post("/t", content=b"x", headers={"ttl": "-5"}), 400, 40092)
    assert_ntfy_error(await client.post("/t", content=b"x", headers={"idempotency-key": "k" * 201}), 400, 40091)
    assert_ntfy_error(await client.post("/t", content=b"x", headers={"icon": "file:///etc"}), 400, 40021)
    assert (await client.post("/t", content=b"x", headers={"priority": "u=3, i"})).status_code == 200


async def test_idempotent_retry_returns_the_original(client: AsyncTestClient, store: Store) -> None:
    """A retried publish with the same Idempotency-Key returns the original message, stored once."""
    first = await client.post("/t", content=b"one", headers={"idempotency-key": "abc"})
    again = await client.post("/t", content=b"two", headers={"x-idempotency-key": "abc"})
    other = await client.post("/t", content=b"three", headers={"idempotency-key": "def"})
    assert first.status_code == again.status_code == 200
    assert again.json() == first.json()
    assert again.headers.get("idempotent-replayed") == "true"
    assert "idempotent-replayed" not in first.headers
    assert other.json()["id"] != first.json()["id"]
    assert [r.envelope.message for r in await stored(store, "t")] == ["one", "three"]


async def test_ttl_zero_expires_at_publish_time(client: AsyncTestClient, store: Store) -> None:
    """TTL: 0 stores the message with expires == time: the janitor's first pass after that second
    removes it (one within it does not: a poked pusher may still be reading it for a subscriber)."""
    msg = (await client.post("/t", content=b"x", headers={"ttl": "0"})).json()
    assert msg["expires"] == msg["time"]
    assert len(await stored(store, "t")) == 1
    assert await store.expire(msg["time"]) == 0
    assert await store.expire(msg["time"] + 1) == 1
    assert await stored(store, "t") == []


# --- JSON publish ------------------------------------------------------------------------------------
async def test_json_publish(client: AsyncTestClient, store: Store) -> None:
    doc = {"topic": "jt", "message": " hello ", "title": "T", "priority": 5, "tags": ["x"], "click": "https://c"}
    r = await client.post("/", content=json.dumps(doc))
    assert r.status_code == 200
    msg = r.json()
    assert (msg["topic"], msg["message"], msg["priority"], msg["title"]) == ("jt", "hello", 5, "T")
    assert (await stored(store, "jt"))[0].envelope.message == "hello"
    assert (await client.put("/", content=json.dumps({"topic": "jt"}))).json()["message"] == "triggered"


async def test_json_publish_errors(client: AsyncTestClient, store: Store) -> None:
    assert_ntfy_error(await client.post("/", content=b"{not json"), 400, 40024)
    assert_ntfy_error(await client.post("/", content=json.dumps({"message": "x"})), 400, 40009)
    assert_ntfy_error(await client.post("/", content=json.dumps({"topic": "docs"})), 400, 40010)
    assert_ntfy_error(await client.post("/", content=b" " * 9000), 413, 41303)
    assert_ntfy_error(await client.post("/", content=json.dumps({"topic": "jt", "message": "a" * 5000})), 413, 41301)
    assert await stored(store, "jt") == []


# --- Matrix ------------------------------------------------------------------------------------------
def matrix_body(pushkey: str) -> bytes:
    return json.dumps({"notification": {"event_id": "$e", "counts": {"unread": 2},
                                         "devices": [{"app_id": "im.x", "pushkey": pushkey}]}}).encode()  # fmt: skip


async def test_matrix_gateway(client: AsyncTestClient, store: Store) -> None:
    """Discovery, a delivered push (the whole body stored as text), a rejected foreign pushkey."""
    r = await client.get("/_matrix/push/v1/notify")
    assert r.json() == {"unifiedpush": {"gateway": "matrix"}}
    body = matrix_body(PUBLIC_URL + "/upMatrixTopic1?up=1")
    r = await client.post("/_matrix/push/v1/notify", content=body)
    assert (r.status_code, r.json()) == (200, {"rejected": []})
    assert (await stored(store, "upMatrixTopic1"))[0].envelope.message == body.decode()
    foreign = "https://other.example/upX?up=1"
    r = await client.post("/_matrix/push/v1/notify", content=matrix_body(foreign))
    assert (r.status_code, r.json()) == (200, {"rejected": [foreign]})


async def test_matrix_errors(client: AsyncTestClient) -> None:
    assert_ntfy_error(await client.post("/_matrix/push/v1/notify", content=b"{}"), 400, 40019)
    assert_ntfy_error(await client.post("/_matrix/push/v1/notify", content=b"nope"), 400, 40019)
    big = matrix_body(PUBLIC_URL + "/t") + b" " * 4096
    assert_ntfy_error(await client.post("/_matrix/push/v1/notify", content=big), 413, 41302)


async def test_matrix_gateway_without_a_public_url_is_ntfys_50003(settings: Settings, store: Store) -> None:
    """Unset, UPF_PUBLIC_URL matches no pushkey: ntfy without base-url answers 500 50003 to discovery and
    to every push, so a homeserver uses another gateway; a 200 {"rejected":[...]} made it delete the
    pusher (UPF's old default, http://localhost:8080, matched no phone's pushkey)."""
    async with in_process(create_app(msgspec.structs.replace(settings, public_url=""), store)) as c:
        assert_ntfy_error(await c.get("/_matrix/push/v1/notify"), 500, 50003)
        body = matrix_body("http://localhost:8080/upMatrixTopic1?up=1")
        assert_ntfy_error(await c.post("/_matrix/push/v1/notify", content=body), 500, 50003)
    assert await stored(store, "upMatrixTopic1") == []
    assert Settings().public_url == ""  # the default


# --- other routes ------------------------------------------------------------------------------------
async def test_discovery_and_small_routes(client: AsyncTestClient) -> None:
    assert (await client.get("/upX?up=1")).json() == {"unifiedpush": {"version": 1}}
    assert (await client.get("/upX", headers={"x-unifiedpush": "1"})).json() == {"unifiedpush": {"version": 1}}
    assert_ntfy_error(await client.get("/upX"), 404, 40401)
    assert (await client.get("/a,b/auth")).json() == {"success": True}
    assert_ntfy_error(await client.get("/a,b.c/auth"), 400, 40009)
    assert (await client.get("/v1/health")).json() == {"healthy": True}
    assert (await client.head("/")).status_code == 200
    assert (await client.get("/__lbheartbeat__")).json() == {}
    assert (await client.get("/__heartbeat__")).status_code == 200
    version = (await client.get("/__version__")).json()
    assert version["name"] == "upf-writer" and version["version"]


async def test_litestar_errors_are_ntfy_json(client: AsyncTestClient) -> None:
    assert_ntfy_error(await client.get("/no/such/route"), 404, 40401)
    assert_ntfy_error(await client.delete("/v1/health"), 405, 40501)
    assert_ntfy_error(await client.patch("/sometopic"), 405, 40501)
    assert_ntfy_error(await client.get("/_matrix/push/v1/notify/x"), 404, 40401)


class BrokenStore:
    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    async def publish(self, *args: object, **kwargs: object) -> None:
        raise self.exc

    async def read_after(self, *args: object) -> None:
        raise self.exc

    async def close(self) -> None:
        pass

    async def auth_state(self) -> AuthState:
        return AuthState()  # nothing configured: the failures under test are the publish's

    async def watch_auth(self) -> tuple[int, asyncio.Future[None]]:
        return 0, asyncio.get_running_loop().create_future()  # a watch that never fires


@pytest.mark.parametrize(
    "exc,http,code",
    [(StoreError(1031), 503, 50301), (StoreError(9507), 507, 50702), (RuntimeError("boom"), 500, 50001)],
)
async def test_store_failures(settings: Settings, exc: Exception, http: int, code: int) -> None:
    """A store error is 503 (publishers retry), a full store 507, a bug is 500; all as ntfy JSON;
    heartbeat is 503."""
    app = create_app(settings, BrokenStore(exc))  # type: ignore[arg-type]
    async with in_process(app) as c:
        assert_ntfy_error(await c.post("/t", content=b"x"), http, code)
        assert_ntfy_error(await c.post("/", content=b'{"topic":"t"}'), http, code)
        assert_ntfy_error(await c.get("/__heartbeat__"), 503, 50301)
        assert (await c.get("/__lbheartbeat__")).status_code == 200


async def test_lifespan_opens_and_closes_its_own_store(settings: Settings) -> None:
    """Without a store, the app opens one from settings at startup and closes it at shutdown."""
    app = create_app(settings)
    async with in_process(app) as c:
        msg = (await c.post("/owned", content=b"x")).json()
    assert app.state.writer.store is None
    reopened = await open_store(settings)
    try:
        rows = await reopened.read_after("owned", None, 10)
        assert [r.stamp for r in rows] == [decode_id(msg["id"])]
    finally:
        await reopened.close()


# --- ntfy's GET publish and CORS -------------------------------------------------------------------------
@pytest.mark.parametrize("verb", ["publish", "send", "trigger"])
async def test_get_publish_from_query_parameters(client: AsyncTestClient, store: Store, verb: str) -> None:
    """ntfy's webhook form: GET /{topic}/publish|send|trigger publishes from the query parameters."""
    r = await client.get(f"/hook/{verb}?message=from+a+webhook&title=T&priority=high")
    assert r.status_code == 200
    msg = r.json()
    assert (msg["topic"], msg["message"], msg["title"], msg["priority"]) == ("hook", "from a webhook", "T", 4)
    assert (await stored(store, "hook"))[-1].envelope.message == "from a webhook"
    assert (await client.get("/hook2/trigger")).json()["message"] == "triggered"
    # a body sent with the GET is the message, as ntfy reads it (it was ignored)
    r = await client.request("GET", f"/hook4/{verb}", content=b"from the body", params={"t": "T"})
    assert (r.status_code, r.json()["message"], r.json()["title"]) == (200, "from the body", "T")
    r = await client.request("GET", f"/hook4/{verb}", content=b"x" * 5000)
    assert_ntfy_error(r, 413, 41301)


async def test_get_publish_bad_input_stores_nothing(client: AsyncTestClient, store: Store) -> None:
    assert_ntfy_error(await client.get("/settings/publish?message=x"), 400, 40010)
    assert_ntfy_error(await client.get("/bad.topic!/send"), 400, 40009)
    assert_ntfy_error(await client.get("/hook3/publish?priority=9"), 400, 40007)
    assert_ntfy_error(await client.get("/hook3/publish?email=a@b.c"), 400, 40001)
    assert_ntfy_error(await client.get("/hook3/publish?actions=junk"), 400, 40018)
    assert_ntfy_error(await client.get("/hook3/publish?attach=ftp://x"), 400, 40013)
    assert_ntfy_error(await client.get("/hook3/publish/x"), 404, 40401)
    assert await stored(store, "hook3") == []


async def test_post_to_a_publish_path_is_a_sequence_id(client: AsyncTestClient) -> None:
    """Only GET makes ``/{topic}/publish`` ntfy's webhook publish; POST/PUT ``/{topic}/{sid}`` is v2.16's
    publish with a sequence id, and ``publish`` is a valid one."""
    r = await client.post("/hook4/publish", content=b"x")
    assert r.status_code == 200 and r.json()["sequence_id"] == "publish" and r.json()["message"] == "x"


async def test_actions_and_attachment_round_trip(client: AsyncTestClient, store: Store) -> None:
    r = await client.post(
        "/rt", content=b"", headers={"x-actions": "view, Open, https://o", "x-attach": "https://e/f.pdf"}
    )
    msg = r.json()
    assert list(msg)[-3:] == ["message", "actions", "attachment"]
    assert msg["message"] == "You received a file: f.pdf" and msg["attachment"] == {
        "name": "f.pdf",
        "url": "https://e/f.pdf",
    }
    env = (await stored(store, "rt"))[0].envelope
    assert json.loads(env.actions) == msg["actions"] and (env.attach_url, env.attach_name) == (
        "https://e/f.pdf",
        "f.pdf",
    )


async def test_every_answer_allows_any_origin(client: AsyncTestClient) -> None:
    """ntfy's Access-Control-Allow-Origin: * on publish replies, errors, cold routes and framework errors."""
    for r in (await client.post("/cors", content=b"x"), await client.post("/cors", headers={"x-priority": "9"}),
              await client.get("/a,b/auth"), await client.get("/v1/health"), await client.get("/no/such/route"),
              await client.get("/upX?up=1"), await client.patch("/cors")):  # fmt: skip
        assert r.headers["access-control-allow-origin"] == "*", r.request.url
        assert len(r.headers.get_list("access-control-allow-origin")) == 1


@pytest.mark.parametrize("path", ["/cors", "/", "/cors/json", "/v1/health", "/_matrix/push/v1/notify"])
async def test_preflight_on_every_path(client: AsyncTestClient, path: str) -> None:
    r = await client.options(path, headers={"origin": "https://app.example", "access-control-request-method": "POST"})
    assert r.status_code == 200 and r.content == b""
    assert r.headers["access-control-allow-origin"] == "*"
    assert r.headers["access-control-allow-methods"] == "GET, PUT, POST, PATCH, DELETE"
    assert r.headers["access-control-allow-headers"] == "*"


async def test_get_publish_needs_write_access(settings: Settings, store: Store) -> None:
    """GET /{topic}/publish is a publish: on a read-only server it is 403 40301 and stores nothing."""
    ro = msgspec.structs.replace(settings, auth_default_access="read-only")
    async with in_process(create_app(ro, store)) as c:
        assert_ntfy_error(await c.get("/ro/publish?message=x"), 403, 40301)
    assert await stored(store, "ro") == []


async def test_write_access_is_checked_before_any_parameter(settings: Settings, store: Store) -> None:
    """ntfy's authorizeTopicWrite runs before handlePublish reads a parameter or the body: a topic the
    caller may not write is 403 40301 whatever else is wrong, and an oversized body there too (ntfy's
    413 comes from the body, after the ACL). A JSON publish's body is read first (transformBodyJSON
    wraps the ACL): invalid JSON or field types (40024), a bad topic or a body over the limit (41303)
    come before the 403; its other fields after."""
    await store.set_access("*", "priv*", Permission.READ_ONLY)
    async with in_process(create_app(settings, store)) as c:
        for r in (await c.post("/priv1", content=b"x", headers={"priority": "9"}),
                  await c.post("/priv1?delay=banana&icon=ftp://x", content=b"x"),
                  await c.post("/priv1", content=b"a" * 4097),
                  await c.put("/priv1/bad!sid", content=b"x"),
                  await c.delete("/priv1/bad!sid"),
                  await c.put("/priv1/bad!sid/clear"),
                  await c.get("/priv1/publish?priority=9"),
                  await c.post("/", content=b'{"topic":"priv1","priority":9}'),
                  await c.post("/", content=b'{"topic":"priv1","priority":-1,"delay":"banana"}'),
                  await c.post("/", content=b'{"topic":"priv1","actions":[{"action":"junk"}]}')):  # fmt: skip
            assert_ntfy_error(r, 403, 40301)
        assert_ntfy_error(await c.post("/", content=b'{"topic":"priv1","priority":"9"}'), 400, 40024)
        assert_ntfy_error(await c.post("/", content=b'{"topic":"priv1","actions":"junk"}'), 400, 40024)
        assert_ntfy_error(await c.post("/", content=b'{"topic":"priv1!"}'), 400, 40009)
        assert_ntfy_error(await c.post("/", content=b'{"topic":"priv1"}' + b" " * 8192), 413, 41303)
        assert_ntfy_error(await c.post("/open1", content=b"x", headers={"priority": "9"}), 400, 40007)
        assert_ntfy_error(await c.post("/", content=b'{"topic":"open1","priority":9}'), 400, 40007)
    assert await stored(store, "priv1") == []
