"""The rest of ntfy's visitor limits against real processes on real sockets, each held fleet-wide:
failed logins (429 42909 after ntfy's 29), the daily message quota (42908), open subscriptions (42903,
and a killed pusher's subscriptions swept by the janitor), and the RateLimit headers on admitted
publishes. Loopback is exempt by default, so these servers exempt nothing (``UPF_LIMIT_EXEMPT=""``)."""

from __future__ import annotations

import base64
import json
import time
from contextlib import ExitStack, closing

import httpx
import pytest
import websockets.sync.client

from tests.clients.ntfy import error_body
from tests.e2e.test_auth import cli

LIMITED = {"UPF_LIMIT_EXEMPT": "", "UPF_WORKERS": "1", "UPF_LIMIT_REQUEST_BURST": "1000"}


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def stored(base: str, topic: str) -> list[str]:
    r = httpx.get(f"{base}/{topic}/json", params={"poll": "1", "since": "all"}, timeout=10)
    assert r.status_code == 200, r.text
    return [json.loads(line)["message"] for line in r.text.splitlines() if json.loads(line)["event"] == "message"]


def test_a_brute_force_run_reaches_42909_and_the_block_holds_across_processes(fleet) -> None:
    cli(fleet, "user", "add", "phil", password="right-pass")
    upf = fleet.start("upf", node="bf", UPF_AUTH_DEFAULT_ACCESS="deny-all", **LIMITED)
    writer = fleet.start("upf_writer", node="bfw", UPF_AUTH_DEFAULT_ACCESS="deny-all", **LIMITED)
    cli(fleet, "access", "phil", "up*", "rw")
    with httpx.Client(base_url=upf.base, timeout=10) as c:
        assert c.post("/upBrute0001", content="x", headers=basic("phil", "right-pass")).status_code == 200
        failures = 0
        while True:  # ntfy: burst 30, one back per minute, a login allowed while more than one token is left
            r = c.post("/upBrute0001", content="x", headers=basic("phil", f"guess{failures}"))
            if r.status_code != 401:
                break
            assert error_body(r)["code"] == 40101
            failures += 1
            assert failures <= 30, "no 42909"
        # 29 failures leave one token; the seconds they took refilled a sliver of one more, which
        # (ntfy's arithmetic too) may allow a 30th attempt
        assert 29 <= failures <= 30 and r.status_code == 429, r.text
        for headers in (
            basic("phil", "guess-more"),
            basic("phil", "right-pass"),
            {"Authorization": "Bearer tk_" + "a" * 29},
        ):
            r = c.post("/upBrute0001", content="x", headers=headers)  # even the right password now
            assert r.status_code == 429, r.text
            assert error_body(r) == {
                "code": 42909,
                "http": 429,
                "error": "limit reached: too many auth failures",
                "link": "https://ntfy.sh/docs/publish/#limitations",
            }
            assert 1 <= int(r.headers["retry-after"]) <= 60
        r = c.get("/upBrute0001/json", params={"poll": "1"}, headers=basic("phil", "right-pass"))
        assert r.status_code == 429 and error_body(r)["code"] == 42909  # the subscribe path too
        r = c.get(
            "/upBrute0001/auth", params={"auth": base64.urlsafe_b64encode(b"Basic cGhpbDp4").decode().rstrip("=")}
        )
        assert r.status_code == 429 and error_body(r)["code"] == 42909  # and ?auth=
        # a request without credentials is no login attempt: anonymous rules apply (deny-all: 403)
        assert c.post("/upBrute0001", content="x").status_code == 403
    with httpx.Client(base_url=writer.base, timeout=10) as c:
        # the other process has not seen a failure of this visitor yet: its first one learns the block
        r = c.post("/upBrute0001", content="x", headers=basic("phil", "guess-elsewhere"))
        assert r.status_code == 429 and error_body(r)["code"] == 42909
        assert c.post("/upBrute0001", content="x", headers=basic("phil", "right-pass")).status_code == 429


def test_the_daily_quota_is_shared_by_two_processes_and_stores_nothing_past_it(fleet) -> None:
    env = {**LIMITED, "UPF_LIMIT_MESSAGES_DAILY": "5"}
    roles = [fleet.start("upf", node="daily", **env), fleet.start("upf_writer", node="dailyw", **env)]
    codes = []
    with ExitStack() as stack:
        clients = [stack.enter_context(httpx.Client(base_url=r.base, timeout=10)) for r in roles]
        for i in range(8):
            r = clients[i % 2].post("/upDaily00001", content=f"m{i}")
            codes.append(r.status_code)
            if r.status_code == 429:
                assert error_body(r) == {
                    "code": 42908,
                    "http": 429,
                    "error": "limit reached: daily message quota reached",
                    "link": "https://ntfy.sh/docs/publish/#limitations",
                }
                left = 86_400 - int(time.time()) % 86_400
                assert left - 5 <= int(r.headers["retry-after"]) <= left + 1  # until the next UTC midnight
        r = clients[0].get("/upDaily00001/json", params={"poll": "1"})
        assert r.status_code == 200  # requests other than publishes are not messages
    assert codes.count(200) == 5 and codes[5:] == [429, 429, 429]
    assert sorted(stored(roles[0].base, "upDaily00001")) == ["m0", "m1", "m2", "m3", "m4"]


def test_an_admitted_publish_carries_the_drafts_ratelimit_headers_and_an_exempt_one_none(fleet) -> None:
    limited = fleet.start(
        "upf", node="hdr", **{**LIMITED, "UPF_LIMIT_REQUEST_BURST": "20", "UPF_LIMIT_REQUEST_REFILL_SECS": "5"}
    )
    open_ = fleet.start("upf", node="hdr-open", UPF_WORKERS="1")
    with httpx.Client(base_url=limited.base, timeout=10) as c:
        seen = []
        for _ in range(3):
            r = c.post("/upHeaders001", content="x")
            assert r.status_code == 200
            assert r.headers["ratelimit-policy"] == "20;w=100"
            fields = dict(part.strip().split("=") for part in r.headers["ratelimit"].split(","))
            assert fields["limit"] == "20"
            seen.append(int(fields["remaining"]))
            assert int(fields["reset"]) == (20 - int(fields["remaining"])) * 5
        assert seen == [19, 18, 17]  # the burst, minus what this visitor spent
    r = httpx.post(open_.base + "/upHeaders001", content="x", timeout=10)
    assert r.status_code == 200 and "ratelimit" not in r.headers and "ratelimit-policy" not in r.headers


def _subscribe(stack: ExitStack, base: str, topic: str) -> httpx.Response:
    """A streaming /json subscribe held open (its first line, the open event, read) or its refusal."""
    c = stack.enter_context(httpx.Client(base_url=base, timeout=10))
    r = stack.enter_context(c.stream("GET", f"/{topic}/json"))
    if r.status_code == 200:
        lines = stack.enter_context(closing(r.iter_lines()))  # held: a dropped iterator closes the stream
        assert json.loads(next(lines))["event"] == "open"
    else:
        r.read()
    return r


def _until(check, timeout: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_open_subscriptions_are_limited_across_pushers_and_a_killed_pushers_are_swept(fleet) -> None:
    env = {**LIMITED, "UPF_LIMIT_SUBSCRIPTIONS": "3"}
    a = fleet.start("upf", node="suba", **env)
    b = fleet.start("upf", node="subb", **env)
    with ExitStack() as held, ExitStack() as on_b:
        assert _subscribe(held, a.base, "upSubs000001").status_code == 200
        assert _subscribe(held, a.base, "upSubs000002").status_code == 200
        assert _subscribe(on_b, b.base, "upSubs000003").status_code == 200
        for base in (a.base, b.base):
            with ExitStack() as refused:
                r = _subscribe(refused, base, "upSubs000004")
                assert r.status_code == 429
                assert error_body(r) == {
                    "code": 42903,
                    "http": 429,
                    "error": "limit reached: too many active subscriptions",
                    "link": "https://ntfy.sh/docs/publish/#limitations",
                }
        with pytest.raises(websockets.sync.client.InvalidStatus) as err:  # the ntfy app's /ws: at the handshake
            with websockets.sync.client.connect(a.base.replace("http://", "ws://") + "/upSubs000004/ws"):
                pass
        assert err.value.response.status_code == 429 and b"42903" in err.value.response.body
        r = httpx.get(a.base + "/upSubs000004/json", params={"poll": "1"}, timeout=10)
        assert r.status_code == 200  # a poll holds no subscription
        b.kill9()  # its subscription cannot be uncounted by it: the janitor (in a) sweeps a dead node's

        def admitted() -> bool:
            with ExitStack() as trial:
                ok = _subscribe(trial, a.base, "upSubs000005").status_code == 200
            return ok

        assert _until(admitted), a.log()
    # every subscription closed: all three slots come back (the uncount runs once each stream ends)
    with ExitStack() as again:
        assert _until(lambda: _subscribe(again, a.base, "upSubs000006").status_code == 200)
        assert _subscribe(again, a.base, "upSubs000007").status_code == 200
        assert _subscribe(again, a.base, "upSubs000008").status_code == 200


def test_subscriber_based_limiting_charges_a_unifiedpush_topics_subscriber_and_507s_without_one(fleet) -> None:
    """ntfy's visitor-subscriber-rate-limiting: app servers share one IP; a UnifiedPush topic's
    publishes (a JSON publish's too) are charged to the phone that subscribed to it, and a UnifiedPush publish to a topic no
    one subscribed to is 507 50701 (a 5xx, so Mastodon keeps the subscription)."""
    upf = fleet.start(
        "upf",
        node="uprate",
        UPF_LIMIT_SUBSCRIBER_RATE="true",
        **{**LIMITED, "UPF_LIMIT_REQUEST_BURST": "3", "UPF_LIMIT_REQUEST_REFILL_SECS": "600"},
    )

    def from_(source: str) -> httpx.Client:
        return httpx.Client(base_url=upf.base, timeout=10, transport=httpx.HTTPTransport(local_address=source))

    with from_("127.0.0.2") as phone, from_("127.0.0.3") as app_server, from_("127.0.0.4") as other_server:
        r = app_server.post("/upRate00000001", content="early", params={"up": "1"})
        assert r.status_code == 507, r.text
        assert error_body(r) == {
            "code": 50701,
            "http": 507,
            "error": "cannot publish to UnifiedPush topic without previously active subscriber",
        }
        assert app_server.post("/upRate00000001", content="plain").status_code == 200  # no up=1: no 507
        assert phone.get("/upRate00000001/json", params={"poll": "1"}).status_code == 200  # the phone: 2 left
        assert app_server.post("/upRate00000001", content="a", params={"up": "1"}).status_code == 200
        # a JSON publish names its topic in the body: charged to the same subscriber once it is read
        r = other_server.post("/", content=b'{"topic":"upRate00000001","message":"b"}', params={"up": "1"})
        assert r.status_code == 200, r.text
        r = app_server.post("/upRate00000001", content="c", params={"up": "1"})
        assert r.status_code == 429 and error_body(r)["code"] == 42901  # the phone's budget is spent
        r = phone.get("/upRate00000001/json", params={"poll": "1"})
        assert r.status_code == 429  # the phone's own requests draw on the same bucket
        # another topic, not UnifiedPush-shaped: each app server's own budget (app_server spent 1 above)
        assert app_server.post("/not-up-shaped", content="x").status_code == 200
        assert app_server.post("/not-up-shaped", content="x").status_code == 429
    assert stored(upf.base, "upRate00000001") == ["plain", "a", "b"]


def test_matrix_and_web_push_publishes_meet_subscriber_based_limiting_as_in_ntfy(fleet) -> None:
    """ntfy publishes a Matrix push to its pushkey's URL: the request is charged to the topic's
    subscriber (a homeserver serves many users from one address), a ``?up=1`` pushkey whose topic has
    no subscriber gets 507 50701 (retried; never a rejection, which would make the homeserver delete the
    pusher), and an ``aes128gcm`` body (Web Push, whose endpoint has no ``up=1``) is UnifiedPush mode:
    507 50701 without a subscriber."""
    public = "http://push.test"
    upf = fleet.start(
        "upf",
        node="mxrate",
        UPF_LIMIT_SUBSCRIBER_RATE="true",
        UPF_PUBLIC_URL=public,
        **{**LIMITED, "UPF_LIMIT_REQUEST_BURST": "3", "UPF_LIMIT_REQUEST_REFILL_SECS": "600"},
    )

    def from_(source: str) -> httpx.Client:
        return httpx.Client(base_url=upf.base, timeout=10, transport=httpx.HTTPTransport(local_address=source))

    def notify(topic: str) -> dict[str, list[str]]:
        return {"notification": {"devices": [{"pushkey": f"{public}/{topic}?up=1"}]}}

    with from_("127.0.0.2") as phone, from_("127.0.0.3") as homeserver, from_("127.0.0.4") as app_server:
        r = homeserver.post("/_matrix/push/v1/notify", json=notify("upMxNobody0001"))
        assert r.status_code == 507 and error_body(r)["code"] == 50701, r.text
        assert phone.get("/upMxRate000001/json", params={"poll": "1"}).status_code == 200  # the phone: 2 left
        for _ in range(2):
            r = homeserver.post("/_matrix/push/v1/notify", json=notify("upMxRate000001"))
            assert (r.status_code, r.json()) == (200, {"rejected": []}), r.text
        r = homeserver.post("/_matrix/push/v1/notify", json=notify("upMxRate000001"))
        assert r.status_code == 429 and error_body(r)["code"] == 42901  # the phone's budget is spent
        # the homeserver paid only for the push to a topic without a subscriber (no one else to charge)
        assert all(homeserver.post("/not-up-shaped", content="x").status_code == 200 for _ in range(2))
        assert homeserver.post("/not-up-shaped", content="x").status_code == 429
        r = app_server.post("/upWpNobody0001", content=b"\x00" * 40, headers={"Content-Encoding": "aes128gcm"})
        assert r.status_code == 507 and error_body(r)["code"] == 50701, r.text
    assert len(stored(upf.base, "upMxRate000001")) == 2
    assert stored(upf.base, "upMxNobody0001") == [] and stored(upf.base, "upWpNobody0001") == []


def test_the_fleets_total_topics_cap_refuses_a_new_topic_with_42904_and_keeps_the_known_ones(fleet) -> None:
    env = {**LIMITED, "UPF_LIMIT_TOTAL_TOPICS": "3"}
    upf = fleet.start("upf", node="topics", **env)
    writer = fleet.start("upf_writer", node="topicsw", **env)
    with httpx.Client(base_url=upf.base, timeout=10) as c, httpx.Client(base_url=writer.base, timeout=10) as w:
        assert c.post("/upTopicCap01", content="x").status_code == 200
        assert w.post("/upTopicCap02", content="x").status_code == 200
        assert c.get("/upTopicCap03/json", params={"poll": "1"}).status_code == 200  # a subscribe makes one too
        for _client, r in (
            (w, w.post("/upTopicCap04", content="x")),
            (c, c.get("/upTopicCap05/json", params={"poll": "1"})),
        ):
            assert r.status_code == 429, r.text
            assert error_body(r) == {
                "code": 42904,
                "http": 429,
                "error": "limit reached: the total number of topics on the server has been reached, please contact the admin",
                "link": "https://ntfy.sh/docs/publish/#limitations",
            }
        assert w.post("/upTopicCap01", content="y").status_code == 200  # a known topic, on the other process
        assert c.post("/upTopicCap03", content="z").status_code == 200
    local = fleet.start("upf", node="topics-local", UPF_WORKERS="1", UPF_LIMIT_TOTAL_TOPICS="3")  # loopback exempt
    assert stored(local.base, "upTopicCap04") == []  # the exempt are neither refused nor counted
    assert stored(local.base, "upTopicCap01") == ["x", "y"]
