"""Users, tokens and ACL against a running all-in-one, black box: the ntfy app's flows (Basic auth on
/json and /ws, ``?auth=`` on ws), tokens and their expiry, a denied topic inside a multi-topic
subscribe, and changes made with ``upf user|access|token`` seen by the running server without restart."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import subprocess
import sys
import time

import httpx
import pytest
import websockets

from tests.clients.ntfy import error_body
from tests.clients.raw import exchange


def cli(fleet, *args: str, password: str | None = None) -> str:  # type: ignore[no-untyped-def]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UPF_", "FDB_"))}
    env.update(UPF_STORE_PATH=fleet.store, UPF_LOG_LEVEL="WARNING")
    if password is not None:
        env["UPF_PASSWORD"] = password
    r = subprocess.run([sys.executable, "-m", "upf", *args], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def auth_param(header: str) -> str:
    return base64.urlsafe_b64encode(header.encode()).decode().rstrip("=")


async def until(check, timeout: float = 5.0):  # type: ignore[no-untyped-def]
    """The server sees store changes through a watch: give it a moment, then insist."""
    deadline = time.monotonic() + timeout
    while True:
        result = await check()
        if result or time.monotonic() > deadline:
            return result
        await asyncio.sleep(0.05)


@pytest.fixture
def secured(fleet):  # type: ignore[no-untyped-def]
    """An all-in-one whose default access is deny-all, with a user phil (rw on up*, ro on news),
    an admin, and anonymous read on 'public'."""
    cli(fleet, "user", "add", "phil", password="phil-pass")
    cli(fleet, "user", "add", "--role=admin", "root", password="root-pass")
    cli(fleet, "access", "phil", "up*", "rw")
    cli(fleet, "access", "phil", "news", "ro")
    cli(fleet, "access", "*", "public", "read-only")
    return fleet.start(
        "upf", node="secured", UPF_AUTH_DEFAULT_ACCESS="deny-all", UPF_WORKERS="1", UPF_PUBLIC_URL="http://push.test"
    )


async def post(
    base: str, topic: str, body: str, headers: dict | None = None, params: dict | None = None
) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as c:
        return await c.post(f"{base}/{topic}", content=body, headers=headers or {}, params=params or {})


async def get(base: str, path: str, headers: dict | None = None) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as c:
        return await c.get(base + path, headers=headers or {})


async def json_stream_first(base: str, path: str, headers: dict) -> tuple[int, dict]:
    async with httpx.AsyncClient(timeout=10) as c, c.stream("GET", base + path, headers=headers) as r:
        if r.status_code != 200:
            await r.aread()
            return r.status_code, r.json()
        async for line in r.aiter_lines():
            return 200, json.loads(line)
    raise AssertionError("stream ended before its first frame")


async def test_the_ntfy_apps_flows_basic_on_json_and_ws_and_auth_param_on_ws(secured):
    phil = {"Authorization": basic("phil", "phil-pass")}
    assert (await get(secured.base, "/upPHIL0001/auth", phil)).json() == {"success": True}
    status, frame = await json_stream_first(secured.base, "/upPHIL0001/json", phil)
    assert status == 200 and frame["event"] == "open"
    ws_base = "ws" + secured.base.removeprefix("http")
    async with websockets.connect(f"{ws_base}/upPHIL0001/ws", additional_headers=phil) as ws:
        assert json.loads(await ws.recv())["event"] == "open"
        sent = (await post(secured.base, "upPHIL0001", "hi", phil)).json()
        msg = json.loads(await asyncio.wait_for(ws.recv(), 5))
        assert (msg["event"], msg["id"], msg["message"]) == ("message", sent["id"], "hi")
    query = auth_param(basic("phil", "phil-pass"))
    async with websockets.connect(f"{ws_base}/upPHIL0001/ws?auth={query}") as ws:
        assert json.loads(await ws.recv())["event"] == "open"


async def test_wrong_credentials_are_401_and_missing_access_403_on_every_route(secured):
    bad = {"Authorization": basic("phil", "wrong")}
    for r in (
        await post(secured.base, "upPHIL0001", "x", bad),
        await get(secured.base, "/upPHIL0001/auth", bad),
        await get(secured.base, "/upPHIL0001/json?poll=1", bad),
    ):
        assert (r.status_code, error_body(r)["code"]) == (401, 40101)
    phil = {"Authorization": basic("phil", "phil-pass")}
    r = await post(secured.base, "news", "x", phil)  # read-only for phil
    assert (r.status_code, error_body(r)["code"]) == (403, 40301)
    r = await post(secured.base, "upANON00001", "x")  # anonymous, default deny-all
    assert (r.status_code, error_body(r)["code"]) == (403, 40301)
    r = await post(secured.base, "", json.dumps({"topic": "news", "message": "x"}), phil)  # JSON publish: topic in body
    assert (r.status_code, error_body(r)["code"]) == (403, 40301)
    ws_base = "ws" + secured.base.removeprefix("http")
    with pytest.raises(websockets.InvalidStatus) as err:
        async with websockets.connect(f"{ws_base}/upPHIL0001/ws", additional_headers=bad):
            pass
    assert err.value.response.status_code == 401
    # Nothing refused was stored: phil's topic holds nothing.
    assert (await get(secured.base, "/upPHIL0001/json?poll=1", phil)).text == ""


async def test_a_refused_publish_waiting_on_100_continue_gets_its_refusal_instead(secured):
    """``Expect: 100-continue``: bad credentials (401) and a denied topic (403) are answered before the
    body is asked for, as Go's server answers ntfy's, and the connection closes with the body unsent;
    a JSON publish's 401 too (its topic is in the body). Allowed, the 100 comes and the body is stored."""
    head = "POST /{path} HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n{auth}\r\n"
    phil, bad = f"Authorization: {basic('phil', 'phil-pass')}\r\n", f"Authorization: {basic('phil', 'no')}\r\n"
    for path, auth, status, code in (
        ("upCONT0001", bad, 401, 40101),
        ("news", phil, 403, 40301),
        ("upCONT0001", "", 403, 40301),
        ("", bad, 401, 40101),
    ):
        resp, closed = exchange(secured.port, head.format(path=path, auth=auth).encode(), quiet_secs=3)
        assert not resp.startswith(b"HTTP/1.1 100") and closed, resp
        head_part, _, body = resp.partition(b"\r\n\r\n")
        assert int(head_part.split(b" ", 2)[1]) == status and json.loads(body)["code"] == code
    with socket.create_connection(("127.0.0.1", secured.port), timeout=5) as s:
        s.sendall(head.format(path="upCONT0001", auth=phil).encode())
        assert s.recv(1024) == b"HTTP/1.1 100 Continue\r\n\r\n"
        s.sendall(b"hello")
        assert s.recv(65536).startswith(b"HTTP/1.1 200 ")
    # a client that sends its body (and a next request) without waiting: read once the 100 is out
    pipelined = head.format(path="upCONT0001", auth=phil).encode() + b"world"
    resp, closed = exchange(
        secured.port, pipelined + b"GET /v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    assert resp.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 ") and resp.count(b" 200 OK") == 2 and closed
    resp, closed = exchange(secured.port, head.format(path="news", auth=phil).encode() + b"never")
    assert resp.startswith(b"HTTP/1.1 403 ") and closed
    r = await get(secured.base, "/upCONT0001/json?poll=1", {"Authorization": basic("phil", "phil-pass")})
    assert [json.loads(line)["message"] for line in r.text.splitlines()] == ["hello", "world"]
    r = await get(secured.base, "/news/json?poll=1", {"Authorization": basic("phil", "phil-pass")})
    assert r.status_code == 200 and r.text == ""


async def test_a_denied_topic_inside_a_multi_topic_subscribe_fails_it_whole(secured):
    phil = {"Authorization": basic("phil", "phil-pass")}
    assert (await get(secured.base, "/upPHIL0001,news/json?poll=1", phil)).status_code == 200
    for path in ("/upPHIL0001,secret/json?poll=1", "/upPHIL0001,news,secret/sse?poll=1", "/upPHIL0001,secret/auth"):
        r = await get(secured.base, path, phil)
        assert (r.status_code, error_body(r)["code"]) == (403, 40301), path
    assert (await get(secured.base, "/public/json?poll=1")).status_code == 200  # anonymous read on public


async def test_admin_may_do_everything_and_vapid_is_anonymous(secured):
    root = {"Authorization": basic("root", "root-pass")}
    assert (await post(secured.base, "anything", "x", root)).status_code == 200
    vapid = {
        "Authorization": "vapid t=eyJ0eXAiOiJKV1QifQ.eyJhdWQiOiJ4In0.c2ln,k=BNcRdreALRFXTkOOUHK1EtK2wtaz5Ry4YfYCA_0QTpQtUbVlUls0VJXg7A8u-Ts1XbjhazAkj7I99e8QcYP7DkM"
    }
    r = await post(secured.base, "upANON00001", "x", vapid)
    assert (r.status_code, error_body(r)["code"]) == (403, 40301)  # anonymous: denied by ACL, never 401


async def test_the_matrix_gateway_reads_auth_from_the_query_as_every_route(secured):
    """ntfy reads ``?auth=`` on every route; the Matrix gateway took only the header (403 for phil)."""
    body = json.dumps({"notification": {"devices": [{"pushkey": "http://push.test/upPHIL0001?up=1"}]}})
    path = "/_matrix/push/v1/notify"
    phil = auth_param(basic("phil", "phil-pass"))
    async with httpx.AsyncClient(base_url=secured.base, timeout=10) as c:
        r = await c.post(path, content=body, params={"auth": phil})
        assert (r.status_code, r.json()) == (200, {"rejected": []})
        r = await c.post(path, content=body, params={"auth": "!!"})
        assert (r.status_code, r.json()["code"]) == (400, 40094)
        r = await c.post(path, content=body)
        assert (r.status_code, r.json()["code"]) == (403, 40301)


async def test_a_long_vapid_authorization_is_anonymous_not_a_failed_login(secured):
    """Only Basic and Bearer are logins: a VAPID header of any length is anonymous (the ACL's 403)."""
    vapid = {"Authorization": "vapid t=" + "e" * 5000 + ",k=BNcRdreALRFXTkOOUHK1EtK2wtaz5Ry4YfYCA"}
    r = await post(secured.base, "upANON00001", "x", vapid)
    assert (r.status_code, error_body(r)["code"]) == (403, 40301)


async def test_tokens_work_until_they_expire(secured, fleet):
    token = cli(fleet, "token", "add", "--expires", "2s", "phil")
    bearer = {"Authorization": f"Bearer {token}"}
    empty_user = {"Authorization": basic("", token)}  # ntfy: Basic with an empty user carries a token

    async def accepted() -> bool:
        return (await post(secured.base, "upPHIL0001", "t", bearer)).status_code == 200

    assert await until(accepted)
    assert (await post(secured.base, "upPHIL0001", "t", empty_user)).status_code == 200
    ws_base = "ws" + secured.base.removeprefix("http")
    frames: list[dict] = []
    stream = asyncio.create_task(_ws_frames(f"{ws_base}/upPHIL0001/ws", bearer, frames))
    await asyncio.sleep(2.2)
    r = await post(secured.base, "upPHIL0001", "t", bearer)
    assert (r.status_code, error_body(r)["code"]) == (401, 40101)
    # The stream the token opened ends with it (1008), having had the open frame and nothing refused.
    assert await asyncio.wait_for(stream, 5) == 1008
    assert frames and frames[0]["event"] == "open"


async def test_acl_change_reaches_the_running_server_without_restart(secured, fleet):
    phil = {"Authorization": basic("phil", "phil-pass")}
    r = await post(secured.base, "later", "x", phil)
    assert r.status_code == 403
    cli(fleet, "access", "phil", "later", "write-only")

    async def allowed() -> bool:
        return (await post(secured.base, "later", "x", phil)).status_code == 200

    assert await until(allowed)
    cli(fleet, "user", "del", "phil")

    async def gone() -> bool:
        return (await post(secured.base, "later", "x", phil)).status_code == 401

    assert await until(gone)


async def test_malformed_credentials_are_clear_errors_never_500(secured):
    cases = {
        "Basic !!!": 401,
        "Basic " + base64.b64encode(b"no-colon").decode(): 401,
        "Bearer tk_tooshort": 401,
        "Bearer " + "x" * 10_000: 401,
    }
    for header, status in cases.items():
        r = await post(secured.base, "upPHIL0001", "x", {"Authorization": header})
        assert r.status_code == status and error_body(r)["code"] == 40101, header[:30]
    r = await post(secured.base, "upPHIL0001", "x", params={"auth": "@@not-base64@@"})
    assert (r.status_code, error_body(r)["code"]) == (400, 40094)
    log = secured.log()
    assert "phil-pass" not in log and "tk_" not in log


async def test_declared_users_access_and_tokens_apply_at_start(fleet):
    """UPF_AUTH_USERS/ACCESS/TOKENS (ntfy's auth-users, auth-access, auth-tokens) need no CLI run."""
    import bcrypt

    hashed = bcrypt.hashpw(b"decl-pass", bcrypt.gensalt(4)).decode()
    token = "tk_" + "d" * 29
    role = fleet.start(
        "upf",
        node="declared",
        UPF_WORKERS="1",
        UPF_AUTH_DEFAULT_ACCESS="deny-all",
        UPF_AUTH_USERS=f"decl:{hashed}:user",
        UPF_AUTH_ACCESS="decl:upDECL*:rw,*:open:rw",
        UPF_AUTH_TOKENS=f"decl:{token}:ci",
    )
    assert (await post(role.base, "upDECL0001", "x", {"Authorization": basic("decl", "decl-pass")})).status_code == 200
    assert (await post(role.base, "upDECL0001", "x", {"Authorization": f"Bearer {token}"})).status_code == 200
    assert (await post(role.base, "open", "x")).status_code == 200
    assert (await post(role.base, "upDECL0001", "x")).status_code == 403
    assert "decl (user)" in cli(fleet, "user", "list")


@pytest.mark.parametrize(
    ("name", "value"),
    [("UPF_AUTH_USERS", "decl:plaintext:user"), ("UPF_AUTH_ACCESS", "*:bad.pattern:rw"), ("UPF_AUTH_TOKENS", "x:tk_1")],
)
def test_malformed_declarations_stop_the_start_naming_the_variable(fleet, name: str, value: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UPF_", "FDB_"))}
    env.update(UPF_STORE_PATH=fleet.store, UPF_BIND="127.0.0.1:0", UPF_WORKERS="1", **{name: value})
    r = subprocess.run([sys.executable, "-m", "upf"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and name in r.stderr and "Traceback" not in r.stderr, r.stderr


async def _stream_lines(base: str, path: str, headers: dict, lines: list[dict]) -> None:
    """Read a /json stream into ``lines`` until the server ends it."""
    async with httpx.AsyncClient(timeout=None) as c, c.stream("GET", base + path, headers=headers) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            lines.append(json.loads(line))


async def _ws_frames(url: str, headers: dict, frames: list[dict]) -> int | None:
    """Read a WebSocket into ``frames`` until the server closes it; its close code."""
    async with websockets.connect(url, additional_headers=headers) as ws:
        try:
            async for data in ws:
                frames.append(json.loads(data))
        except websockets.ConnectionClosed:
            pass
    return ws.close_code


async def test_a_stream_opened_while_auth_was_off_keeps_its_login_once_auth_is_on(fleet):
    """With no users (auth off) credentials are not checked, but a stream keeps the ones it presented:
    once auth is on, each auth change re-checks the stream as a new subscribe with them would be. The
    right password's stream goes on and receives; a wrong password's and an anonymous one end."""
    role = fleet.start("upf", node="opened", UPF_WORKERS="1")
    alice = {"Authorization": basic("alice", "alice-pass")}
    ws_base = "ws" + role.base.removeprefix("http")
    frames: dict[str, list[dict]] = {"alice": [], "wrong": [], "anon": []}
    heads = {"alice": alice, "wrong": {"Authorization": basic("alice", "nope")}, "anon": {}}
    tasks = {k: asyncio.create_task(_ws_frames(f"{ws_base}/secret/ws", heads[k], frames[k])) for k in frames}

    async def opened() -> bool:
        return all(f and f[0]["event"] == "open" for f in frames.values())

    assert await until(opened)
    cli(fleet, "user", "add", "alice", password="alice-pass")
    cli(fleet, "access", "alice", "secret", "rw")
    cli(fleet, "access", "*", "secret", "deny")
    assert await asyncio.wait_for(tasks["wrong"], 10) == 1008
    assert await asyncio.wait_for(tasks["anon"], 10) == 1008
    sent = (await post(role.base, "secret", "for alice", alice)).json()

    async def delivered() -> bool:
        return any(m.get("id") == sent["id"] for m in frames["alice"])

    assert await until(delivered)
    assert not tasks["alice"].done()
    tasks["alice"].cancel()


async def test_an_auth_change_ends_the_open_streams_it_revokes_and_no_other(secured, fleet):
    """ntfy ends a user's subscriptions when its access is reset; UPF does so for every change that
    takes a stream's access away: an ACL entry, a token, a password, a user. Streams the change does
    not touch go on, and a revoked client that reconnects gets what a new request gets."""
    token = cli(fleet, "token", "add", "phil")
    phil = {"Authorization": basic("phil", "phil-pass")}
    bearer = {"Authorization": f"Bearer {token}"}
    ws_base = "ws" + secured.base.removeprefix("http")
    news: list[dict] = []
    public: list[dict] = []
    by_token: list[dict] = []
    by_password: list[dict] = []
    tasks = {
        "news": asyncio.create_task(_stream_lines(secured.base, "/news/json", phil, news)),
        "public": asyncio.create_task(_stream_lines(secured.base, "/public/json", {}, public)),
        "token": asyncio.create_task(_ws_frames(f"{ws_base}/upPHIL0002/ws", bearer, by_token)),
        "password": asyncio.create_task(_ws_frames(f"{ws_base}/upPHIL0001/ws", phil, by_password)),
    }

    async def opened() -> bool:
        return all(frames and frames[0]["event"] == "open" for frames in (news, public, by_token, by_password))

    assert await until(opened)
    root = {"Authorization": basic("root", "root-pass")}

    # An ACL entry reset: phil's stream on news ends; the others go on.
    cli(fleet, "access", "--reset", "phil", "news")
    await asyncio.wait_for(tasks["news"], 10)
    r = await get(secured.base, "/news/json?poll=1", phil)
    assert (r.status_code, error_body(r)["code"]) == (403, 40301)
    assert not any(t.done() for name, t in tasks.items() if name != "news")

    # A token removed: the ws it opened is closed with 1008 (policy violation); Basic auth goes on.
    cli(fleet, "token", "remove", "phil", token)
    assert await asyncio.wait_for(tasks["token"], 10) == 1008
    sent = (await post(secured.base, "upPHIL0001", "still here", phil)).json()
    sent2 = (await post(secured.base, "public", "still public", root)).json()

    async def delivered() -> bool:
        return any(m.get("id") == sent["id"] for m in by_password) and any(m.get("id") == sent2["id"] for m in public)

    assert await until(delivered)

    # A password changed: the ws opened with the old one closes; the old password is now a 401.
    cli(fleet, "user", "change-pass", "phil", password="new-pass")
    assert await asyncio.wait_for(tasks["password"], 10) == 1008
    with pytest.raises(websockets.InvalidStatus) as err:
        async with websockets.connect(f"{ws_base}/upPHIL0001/ws", additional_headers=phil):
            pass
    assert err.value.response.status_code == 401
    assert not tasks["public"].done()

    # Everyone's read on public reset: the anonymous stream ends too.
    cli(fleet, "access", "--reset", "*", "public")
    await asyncio.wait_for(tasks["public"], 10)
    assert [m["id"] for m in public if m["event"] == "message"] == [sent2["id"]]
    assert [m["id"] for m in by_password if m["event"] == "message"] == [sent["id"]]
