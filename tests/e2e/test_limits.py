"""ntfy's request limit against real processes on real sockets: a visitor past its burst gets 429
42901 with an honest Retry-After and the draft's RateLimit headers; two processes on one store share
one budget; a trusted proxy's forwarded header separates clients, anyone else's is ignored; loopback
is exempt by default; subscribes, /auth and the Matrix gateway spend the same budget."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.clients.ntfy import error_body

LIMITED = {"UPF_LIMIT_EXEMPT": "", "UPF_WORKERS": "1"}


def client(base: str, source: str = "127.0.0.1") -> httpx.Client:
    """A client whose connections come from ``source`` (any 127/8 address reaches a loopback server)."""
    return httpx.Client(base_url=base, timeout=10, transport=httpx.HTTPTransport(local_address=source))


def assert_limited(r: httpx.Response, burst: int, window: int) -> int:
    """ntfy's 429 body plus the headers it lacks; returns Retry-After."""
    assert r.status_code == 429, r.text
    assert error_body(r) == {
        "code": 42901,
        "http": 429,
        "error": "limit reached: too many requests",
        "link": "https://ntfy.sh/docs/publish/#limitations",
    }
    wait = int(r.headers["retry-after"])
    assert wait >= 1
    assert r.headers["ratelimit-policy"] == f"{burst};w={window}"
    assert r.headers["ratelimit"] == f"limit={burst}, remaining=0, reset={wait}"
    return wait


def stored(c: httpx.Client, topic: str) -> list[str]:
    r = c.get(f"/{topic}/json", params={"poll": "1", "since": "all"})
    assert r.status_code == 200, r.text
    return [json.loads(line)["message"] for line in r.text.splitlines() if json.loads(line)["event"] == "message"]


def test_past_the_burst_a_publish_is_refused_until_retry_after_and_stores_nothing(fleet) -> None:
    import time

    upf = fleet.start("upf", node="lim", UPF_LIMIT_REQUEST_BURST="5", UPF_LIMIT_REQUEST_REFILL_SECS="2", **LIMITED)
    with client(upf.base) as c:
        for i in range(5):
            assert c.post("/upLimitA0001", content=f"m{i}").status_code == 200
        wait = assert_limited(c.post("/upLimitA0001", content="refused"), 5, 10)
        assert wait <= 2
        time.sleep(wait)  # honest: after Retry-After seconds a token is there
        assert c.post("/upLimitA0001", content="after").status_code == 200
        time.sleep(2)
        assert stored(c, "upLimitA0001") == ["m0", "m1", "m2", "m3", "m4", "after"]


def test_two_writer_processes_share_one_visitors_budget(fleet) -> None:
    """Alternating between two writers on one store admits the budget once (minus at most the
    tokens one writer holds leased and unspent: burst 20 leases 2 at a time), not twice."""
    env = {**LIMITED, "UPF_LIMIT_REQUEST_BURST": "20", "UPF_LIMIT_REQUEST_REFILL_SECS": "600"}
    writers = [fleet.start("upf_writer", node=f"w{i}", **env) for i in range(2)]
    clients = [client(w.base) for w in writers]
    try:
        codes = [clients[i % 2].post(f"/upShare{i:06d}", content="x").status_code for i in range(60)]
    finally:
        for c in clients:
            c.close()
    assert set(codes) == {200, 429}
    assert 20 - 2 <= codes.count(200) <= 20


def test_a_trusted_proxys_header_separates_clients_and_an_untrusted_peers_is_ignored(fleet) -> None:
    upf = fleet.start(
        "upf",
        node="proxied",
        UPF_LIMIT_REQUEST_BURST="2",
        UPF_LIMIT_REQUEST_REFILL_SECS="600",
        UPF_PROXY_TRUSTED="127.0.0.1",
        **LIMITED,
    )
    with client(upf.base) as proxy:
        for who in ("203.0.113.1", "203.0.113.2"):
            for _ in range(2):
                assert proxy.post("/upProxied001", content="x", headers={"X-Forwarded-For": who}).status_code == 200
        assert_limited(proxy.post("/upProxied001", content="x", headers={"X-Forwarded-For": "203.0.113.1"}), 2, 1200)
        # what the client claimed stands left of the hop the proxy appended: it does not count
        forged = {"X-Forwarded-For": "198.51.100.9, 203.0.113.2"}
        assert_limited(proxy.post("/upProxied001", content="x", headers=forged), 2, 1200)
    with client(upf.base, "127.0.0.2") as untrusted:  # not a trusted proxy: its header is ignored
        for i in range(2):
            r = untrusted.post("/upProxied001", content="x", headers={"X-Forwarded-For": f"192.0.2.{i}"})
            assert r.status_code == 200
        assert_limited(untrusted.post("/upProxied001", content="x", headers={"X-Forwarded-For": "192.0.2.9"}), 2, 1200)


def test_loopback_is_exempt_by_default(fleet) -> None:
    upf = fleet.start(
        "upf", node="local", UPF_LIMIT_REQUEST_BURST="2", UPF_LIMIT_REQUEST_REFILL_SECS="600", UPF_WORKERS="1"
    )
    with client(upf.base) as c:
        assert all(c.post("/upLocal00001", content=f"{i}").status_code == 200 for i in range(50))
        assert all(c.get("/upLocal00001/json", params={"poll": "1"}).status_code == 200 for _ in range(10))
    with client(upf.base, "127.9.9.9") as other:  # all of 127/8
        assert all(other.post("/upLocal00001", content="x").status_code == 200 for _ in range(10))


@pytest.mark.parametrize("transport", ["json", "sse", "raw"])
def test_subscribes_auth_checks_and_matrix_pushes_are_requests_endpoint_checks_not(fleet, transport: str) -> None:
    upf = fleet.start(
        "upf",
        node="subs",
        UPF_LIMIT_REQUEST_BURST="3",
        UPF_LIMIT_REQUEST_REFILL_SECS="600",
        UPF_PUBLIC_URL="http://push.test",
        **LIMITED,
    )
    with client(upf.base) as c:
        assert c.get(f"/upSubs000001/{transport}", params={"poll": "1"}).status_code == 200
        assert c.get("/upSubs000001/auth").status_code == 200
        matrix = {"notification": {"devices": [{"pushkey": "http://push.test/upSubs000001"}]}}
        assert c.post("/_matrix/push/v1/notify", json=matrix).status_code == 200
        assert_limited(c.get(f"/upSubs000001/{transport}", params={"poll": "1"}), 3, 1800)
        assert_limited(c.get("/upSubs000001/auth"), 3, 1800)
        assert_limited(c.post("/_matrix/push/v1/notify", json=matrix), 3, 1800)
        assert_limited(c.post("/upSubs000001", content="x"), 3, 1800)
        # the UnifiedPush endpoint check reads nothing and spends nothing, as in ntfy
        assert c.get("/upSubs000001", params={"up": "1"}).json() == {"unifiedpush": {"version": 1}}
        assert c.get("/v1/health").status_code == 200  # ops endpoints are not requests of a visitor


def test_ntfys_order_401_then_429_then_403_and_a_user_is_its_own_visitor(fleet) -> None:
    from tests.e2e.test_auth import basic, cli

    cli(fleet, "user", "add", "phil", password="phil-pass")
    cli(fleet, "access", "phil", "up*", "rw")
    upf = fleet.start(
        "upf",
        node="ordered",
        UPF_AUTH_DEFAULT_ACCESS="deny-all",
        UPF_LIMIT_REQUEST_BURST="1",
        UPF_LIMIT_REQUEST_REFILL_SECS="600",
        **LIMITED,
    )
    with client(upf.base) as c:
        assert c.post("/upOrder00001", content="x").status_code == 403  # admitted, then denied: spent
        assert_limited(c.post("/upOrder00001", content="x"), 1, 600)  # the limit before the ACL
        wrong = {"Authorization": basic("phil", "wrong")}
        assert c.post("/upOrder00001", content="x", headers=wrong).status_code == 401  # before the limit
        phil = {"Authorization": basic("phil", "phil-pass")}  # user:phil, not this address
        assert c.post("/upOrder00001", content="x", headers=phil).status_code == 200
        assert_limited(c.post("/upOrder00001", content="x", headers=phil), 1, 600)


async def test_a_websocket_subscribe_past_the_limit_is_refused_before_the_upgrade(fleet) -> None:
    """The ntfy app subscribes over /ws: past the limit the handshake gets the 429 and its headers."""
    import websockets

    upf = fleet.start("upf", node="ws", UPF_LIMIT_REQUEST_BURST="1", UPF_LIMIT_REQUEST_REFILL_SECS="600", **LIMITED)
    url = upf.base.replace("http://", "ws://") + "/upWsLimit001/ws"
    async with websockets.connect(url) as ws:
        assert json.loads(await ws.recv())["event"] == "open"
    with pytest.raises(websockets.InvalidStatus) as err:
        async with websockets.connect(url):
            pass
    response = err.value.response
    assert response.status_code == 429 and json.loads(response.body)["code"] == 42901
    assert 1 <= int(response.headers["Retry-After"]) <= 600
