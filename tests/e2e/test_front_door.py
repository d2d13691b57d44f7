"""The all-in-one's front door against hostile heads, black box: raw sockets to a real process.

Every refusal is ntfy's JSON error and a closed connection, and nothing a refused connection carried
is ever stored (in particular a request smuggled behind an ambiguous body)."""

from __future__ import annotations

import json
import resource
import socket

import httpx
import pytest

from tests.clients.ntfy import error_body, poll
from tests.clients.raw import exchange


def _status_and_error(resp: bytes) -> tuple[int, dict]:
    head, _, body = resp.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body.split(b"\n", 1)[0])


SMUGGLED = b"POST /smugB HTTP/1.1\r\nHost: x\r\nContent-Length: 7\r\n\r\nsmuggle"


@pytest.mark.parametrize(
    "first",
    [
        b"POST /smugA HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"POST /smugA HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 80\r\n\r\n0\r\n\r\n",
        b"POST /smugA HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: 80\r\n\r\n",
        b"POST /smugA HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n0\r\n\r\n",
        b"POST /smugA HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    ],
)
async def test_smuggled_publish_is_never_stored(upf, first):
    """An ambiguous body framing is one 400 and a closed connection: the publish behind it never runs."""
    resp, closed = exchange(upf.port, first + SMUGGLED)
    status, err = _status_and_error(resp)
    assert (status, err["code"], err["http"]) == (400, 40000, 400) and closed
    assert resp.count(b"HTTP/1.1 ") == 1
    assert await poll(upf.base, "smugA,smugB") == []


@pytest.mark.parametrize(
    "raw",
    [
        b"GET /fd1/json?poll=1 HTTP/1.1\r\nConnection: close\r\n\r\n",  # no Host
        b"GET /fd1/json?poll=1 HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n",
        b"GET /fd1/json?poll=1&x=a\x01b HTTP/1.1\r\nHost: x\r\n\r\n",  # control byte in the query
        b"GET /fd1/json?poll=1 HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n",
        b"POST /fd1 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
        b"POST /fd1 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n",
        b"POST /fd1 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5 \r\nhello\r\n0\r\n\r\n",
        b"POST /fd1 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n",
    ],
)
async def test_malformed_heads_are_400_and_close(upf, raw):
    """Each is ntfy's 400 error JSON, the connection closes, and nothing is stored."""
    resp, closed = exchange(upf.port, raw)
    status, err = _status_and_error(resp)
    assert (status, err["code"]) == (400, 40000) and closed
    assert await poll(upf.base, "fd1") == []


def test_bare_lf_head_is_refused_without_waiting(upf):
    """Bare-LF line ends never form a head: 400 and close at once, not a silent head timeout."""
    resp, closed = exchange(upf.port, b"GET /fd2/json?poll=1 HTTP/1.1\nHost: x\n\n")
    assert _status_and_error(resp)[0] == 400 and closed


async def test_declared_length_over_the_limit_is_413_before_100_continue(upf):
    """A publish declaring more than the message limit gets 413 instead of the go-ahead to send it."""
    resp, closed = exchange(
        upf.port, b"POST /fd3 HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\nExpect: 100-continue\r\n\r\n"
    )
    assert not resp.startswith(b"HTTP/1.1 100")
    status, err = _status_and_error(resp)
    assert (status, err["code"]) == (413, 41301) and closed
    assert await poll(upf.base, "fd3") == []


async def test_declared_length_past_the_body_cap_is_the_writers_413(upf):
    """A publish declaring more than the front door would ever read (64 KiB) gets the writer's own 413,
    as one within it does, and the connection closes with the body unread."""
    resp, closed = exchange(
        upf.port, b"POST /fd5 HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000\r\n\r\n" + b"a" * 1000
    )
    status, err = _status_and_error(resp)
    assert (status, err["code"]) == (413, 41301) and closed
    assert await poll(upf.base, "fd5") == []


def test_within_the_limit_100_continue_still_comes(upf):
    """A publish within the limit still gets ``100 Continue`` and then its 200."""
    with socket.create_connection(("127.0.0.1", upf.port), timeout=5) as s:
        s.sendall(
            b"POST /fd4 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n"
        )
        assert s.recv(1024) == b"HTTP/1.1 100 Continue\r\n\r\n"
        s.sendall(b"hello")
        resp = b""
        while chunk := s.recv(65536):
            resp += chunk
    assert resp.startswith(b"HTTP/1.1 200 ")


async def test_a_publish_sent_whole_then_half_closed_is_answered_once(upf):
    """A client that sends its publish and shuts its sending side (HTTP/1.1, 1.0, and two pipelined)
    gets every reply before the close, as from Go's server: the publish is stored, and a client left
    without its answer would publish it again."""
    resp, closed = exchange(
        upf.port, b"POST /fdH1 HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc", half_close=True
    )
    assert resp.startswith(b"HTTP/1.1 200 ") and closed
    resp, closed = exchange(upf.port, b"POST /fdH1 HTTP/1.0\r\nContent-Length: 3\r\n\r\ndef", half_close=True)
    assert resp.startswith(b"HTTP/1.1 200 ") and closed
    two = b"".join(b"POST /fdH1 HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n" + c for c in (b"g", b"h"))
    resp, closed = exchange(upf.port, two, half_close=True)
    assert resp.count(b"HTTP/1.1 200 ") == 2 and closed
    assert [m.message for m in await poll(upf.base, "fdH1")] == ["abc", "def", "g", "h"]


async def test_a_template_publish_takes_a_json_body_past_the_message_limit(upf):
    """ntfy's template mode (X-Template or ?tpl=): the body is JSON data of up to 32 KB, the message and
    title are rendered over it; without it a body over 4096 bytes is still 413 41301."""
    body = json.dumps({"alert": {"name": "disk"}, "pad": "x" * 10_000})
    async with httpx.AsyncClient(base_url=upf.base, timeout=10) as c:
        r = await c.post("/fdTpl1", content=body, headers={"X-Template": "yes", "X-Message": "{{.alert.name}} full"})
        assert r.status_code == 200 and r.json()["message"] == "disk full", r.text
        r = await c.post("/fdTpl1", content=body, params={"tpl": "1", "t": "[{{.alert.name}}]"})
        assert r.status_code == 200 and r.json()["title"] == "[disk]", r.text
        r = await c.post("/fdTpl1", content=b"x" * 40_000, headers={"X-Template": "yes"})
        assert (r.status_code, r.json()["code"]) == (413, 41303)
        r = await c.post("/fdTpl1", content=body)
        assert (r.status_code, r.json()["code"]) == (413, 41301)
        r = await c.post("/fdTpl1", content=b"{}", headers={"X-Template": "yes", "X-Message": "{{nope}}"})
        assert (r.status_code, r.json()["code"]) == (400, 40043)
    assert [(m.message, m.title) for m in await poll(upf.base, "fdTpl1")] == [
        ("disk full", ""),
        ("triggered", "[disk]"),
    ]


async def test_an_absolute_form_target_is_routed_by_its_path(upf):
    """A request line naming the whole URL (RFC 9112 3.2.2, as sent to a proxy) publishes and polls as
    its path and query do; Go's server, and so ntfy, takes it."""
    port = upf.port
    pub = f"POST http://127.0.0.1:{port}/fdAbs1?title=T HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi"
    resp, _ = exchange(port, pub.encode(), half_close=True)
    assert resp.startswith(b"HTTP/1.1 200 "), resp
    got = await poll(upf.base, "fdAbs1")
    assert [(m.message, m.title) for m in got] == [("hi", "T")]
    resp, _ = exchange(port, b"GET HTTP://h/fdAbs1/json?poll=1 HTTP/1.1\r\nHost: x\r\n\r\n", half_close=True)
    assert resp.startswith(b"HTTP/1.1 200 ") and b'"message":"hi"' in resp


async def test_a_body_cut_short_by_a_half_close_is_never_stored(upf):
    resp, closed = exchange(
        upf.port, b"POST /fdH2 HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc", half_close=True
    )
    assert resp == b"" and closed
    assert await poll(upf.base, "fdH2") == []


@pytest.mark.parametrize("connection", [b"", b"Connection: close\r\n"])
async def test_a_poll_then_half_closed_gets_its_whole_reply(upf, connection):
    """The poll's messages and the chunked reply's last chunk, then the close (a keep-alive poll's
    connection is not handed back to wait for a next request that cannot come)."""
    async with httpx.AsyncClient(timeout=10) as c:
        assert (await c.post(f"{upf.base}/fdH3", content=b"kept")).status_code == 200
    resp, closed = exchange(
        upf.port,
        b"GET /fdH3/json?poll=1 HTTP/1.1\r\nHost: x\r\n" + connection + b"\r\n",
        half_close=True,
    )
    assert resp.startswith(b"HTTP/1.1 200 ") and closed
    assert b'"message":"kept"' in resp and resp.endswith(b"0\r\n\r\n")


async def test_an_expectation_other_than_100_continue_is_417_and_nothing_runs(upf):
    resp, closed = exchange(upf.port, b"POST /fdE1 HTTP/1.1\r\nHost: x\r\nExpect: foo\r\nContent-Length: 3\r\n\r\nabc")
    status, err = _status_and_error(resp)
    assert (status, err["code"], err["http"]) == (417, 41700, 417) and closed
    assert await poll(upf.base, "fdE1") == []


async def test_100_continue_from_an_http10_client_is_ignored(upf):
    """RFC 9110 10.1.1: an HTTP/1.0 client may take a 100 for the final reply; it gets the 200 only."""
    resp, closed = exchange(upf.port, b"POST /fdE2 HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc")
    assert resp.startswith(b"HTTP/1.1 200 ") and b" 100 " not in resp and closed
    assert [m.message for m in await poll(upf.base, "fdE2")] == ["abc"]


async def test_an_empty_line_after_a_body_is_ignored_and_the_next_request_served(upf):
    """RFC 9112 2.2 (old clients end a POST body with a CRLF; Go's server skips it too)."""
    resp, closed = exchange(
        upf.port,
        b"POST /fdE3 HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc\r\n"
        b"GET /v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    assert resp.count(b"HTTP/1.1 200 ") == 2 and closed
    assert [m.message for m in await poll(upf.base, "fdE3")] == ["abc"]


def test_connection_close_on_a_second_line_closes(upf):
    resp, closed = exchange(
        upf.port, b"GET /v1/health HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\nConnection: close\r\n\r\n"
    )
    assert resp.startswith(b"HTTP/1.1 200 ") and b"Connection: close" in resp and closed


async def test_subscribe_and_publish_inputs_are_bounded(fleet):
    """Over UPF_MAX_TOPICS_PER_SUBSCRIBE topics is 400 40093; a title, tags, click or icon over
    UPF_MAX_FIELD_BYTES is 413 41301 and stores nothing; at the bounds both are served."""
    upf = fleet.start("upf", node="bounds", UPF_MAX_TOPICS_PER_SUBSCRIBE="3", UPF_MAX_FIELD_BYTES="16")
    async with httpx.AsyncClient(base_url=upf.base, timeout=10) as c:
        r = await c.get("/bA,bB,bC,bD/json", params={"poll": "1"})
        assert r.status_code == 400 and error_body(r) == {
            "code": 40093,
            "http": 400,
            "error": "invalid request: too many topics",
        }
        assert (await c.get("/bA,bB,bC/json", params={"poll": "1"})).status_code == 200
        for headers, params in (
            ({"X-Title": "t" * 17}, {}),
            ({}, {"tags": "a" * 17}),
            ({"X-Click": "https://x.example/" + "a" * 20}, {}),
            ({"X-Icon": "https://x.example/a.png"}, {}),
        ):
            r = await c.post("/bA", content=b"body", headers=headers, params=params)
            assert r.status_code == 413 and error_body(r)["code"] == 41301
        assert await poll(upf.base, "bA") == []
        r = await c.post("/bA", content=b"body", headers={"X-Title": "t" * 16})
        assert r.status_code == 200
    assert [f.title for f in await poll(upf.base, "bA")] == ["t" * 16]


@pytest.mark.parametrize("module", ["upf", "upf_pusher", "upf_writer"])
def test_every_entry_point_raises_the_open_files_limit(fleet, module):
    """Started with a soft limit of 256, each role runs with its soft limit at the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 256), hard))  # what the child inherits
    try:
        role = fleet.start(module, node=f"nofile-{module.replace('_', '-')}")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    with open(f"/proc/{role.proc.pid}/limits") as f:
        line = next(line for line in f if line.startswith("Max open files"))
    limit_soft, limit_hard = line.split()[3:5]
    assert limit_soft == limit_hard and int(limit_soft) > 256
