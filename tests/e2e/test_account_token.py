"""ntfy's token API (``POST``/``PATCH``/``DELETE /v1/account/token``) for a logged-in user, black box,
on the all-in-one (its front door falls back to the writer's cold routes) and on the standalone writer:
ntfy's request and reply JSON, its defaults (72 hours; a bare PATCH extends), its errors, and a token
made through it working on the running server, then not once deleted."""

from __future__ import annotations

import base64
import time

import httpx
import pytest

from tests.clients.ntfy import error_body
from tests.e2e.test_auth import cli

TOKEN_LIFE = 72 * 3600


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(params=["upf", "upf_writer"])
def server(request, fleet):  # type: ignore[no-untyped-def]
    cli(fleet, "user", "add", "phil", password="phil-pass")
    cli(fleet, "access", "phil", "up*", "rw")
    return fleet.start(request.param, node="tok", UPF_AUTH_DEFAULT_ACCESS="deny-all", UPF_WORKERS="2")


def test_a_token_made_through_the_api_works_changes_and_dies(server) -> None:
    with httpx.Client(base_url=server.base, timeout=10) as c:
        before = int(time.time())
        r = c.post("/v1/account/token", json={"label": "phone"}, headers=basic("phil", "phil-pass"))
        assert r.status_code == 200, r.text
        body = r.json()
        assert list(body) == ["token", "label", "last_access", "last_origin", "expires"]  # ntfy's order
        token = body["token"]
        assert token.startswith("tk_") and len(token) == 32 and body["label"] == "phone"
        assert body["last_origin"] == "127.0.0.1" and before <= body["last_access"] <= int(time.time())
        assert before + TOKEN_LIFE <= body["expires"] <= int(time.time()) + TOKEN_LIFE
        # the process that answered already holds it (a kept-alive connection stays with one worker)
        assert c.post("/upTokenApi01", content="x", headers=bearer(token)).status_code == 200

        # no body at all: allowed, no label (omitted), 72 hours; expires 0: never
        r = c.post("/v1/account/token", headers=basic("phil", "phil-pass"))
        assert r.status_code == 200 and "label" not in r.json() and r.json()["expires"] >= before + TOKEN_LIFE
        r = c.post("/v1/account/token", json={"expires": 0}, headers=basic("phil", "phil-pass"))
        assert r.status_code == 200 and "expires" not in r.json()

        # PATCH: the token logged in with, label only (expiry kept); then a bare PATCH extends it
        r = c.patch("/v1/account/token", json={"label": "laptop"}, headers=bearer(token))
        assert r.status_code == 200, r.text
        assert r.json()["token"] == token and r.json()["label"] == "laptop" and r.json()["expires"] == body["expires"]
        r = c.patch(
            "/v1/account/token", json={"token": token, "expires": before + 60}, headers=basic("phil", "phil-pass")
        )
        assert r.status_code == 200 and r.json()["expires"] == before + 60
        r = c.patch("/v1/account/token", headers=bearer(token))
        assert r.status_code == 200 and r.json()["expires"] >= before + TOKEN_LIFE

        # DELETE the one logged in with: it stops working on the running server, from the reply on
        r = c.delete("/v1/account/token", headers=bearer(token))
        assert r.status_code == 200 and r.json() == {"success": True}
        assert c.post("/upTokenApi01", content="x", headers=bearer(token)).status_code == 401

        # DELETE by X-Token, logged in with a password; an unknown one is a success too (as in ntfy)
        other = c.post("/v1/account/token", headers=basic("phil", "phil-pass")).json()["token"]
        r = c.delete("/v1/account/token", headers={**basic("phil", "phil-pass"), "X-Token": other})
        assert r.status_code == 200 and r.json() == {"success": True}
        assert c.post("/upTokenApi01", content="x", headers=bearer(other)).status_code == 401
        r = c.delete("/v1/account/token", headers={**basic("phil", "phil-pass"), "X-Token": "tk_" + "z" * 29})
        assert r.status_code == 200

        # revoked, then used at once, several times: the answer to the DELETE came after the process
        # had stopped accepting it (before, it did in about half of such tries, until its watch woke)
        for _ in range(6):
            once = c.post("/v1/account/token", headers=basic("phil", "phil-pass")).json()["token"]
            assert c.delete("/v1/account/token", headers=bearer(once)).status_code == 200
            assert c.get("/upTokenApi01/auth", headers=bearer(once)).status_code == 401


def test_a_tokens_last_use_is_recorded_from_each_role(fleet) -> None:
    """ntfy's last_access and last_origin: a token's use (a publish on the writer, a subscribe on the
    pusher) is written in a batch, at once after a quiet spell, with the client a trusted proxy named;
    the token API's PATCH and ``upf token list`` then show it. A use changes nobody's access: tokens
    keep working throughout."""
    cli(fleet, "user", "add", "phil", password="phil-pass")
    cli(fleet, "access", "phil", "up*", "rw")
    upf = fleet.start(
        "upf", node="use", UPF_AUTH_DEFAULT_ACCESS="deny-all", UPF_WORKERS="1", UPF_PROXY_TRUSTED="127.0.0.1"
    )
    with httpx.Client(base_url=upf.base, timeout=10) as c:
        made = [
            c.post("/v1/account/token", json={"label": f"t{i}"}, headers=basic("phil", "phil-pass")) for i in (0, 1)
        ]
        publisher, subscriber = (r.json() for r in made)
        assert "not used yet" in cli(fleet, "token", "list", "phil")
        time.sleep(1.1)  # a use's second differs from the creation's
        used = int(time.time())
        r = c.post("/upLastUse", content="x", headers={**bearer(publisher["token"]), "X-Forwarded-For": "203.0.113.7"})
        assert r.status_code == 200, r.text
        r = c.get(
            "/upLastUse/json",
            params={"poll": "1"},
            headers={**bearer(subscriber["token"]), "X-Forwarded-For": "198.51.100.9, 127.0.0.1"},
        )
        assert r.status_code == 200 and r.json()["message"] == "x"
        deadline = time.monotonic() + 15  # the second use waits for the next batch (WRITE_SECS)
        while True:
            listing = cli(fleet, "token", "list", "phil")
            if listing.count("last used") == 2 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert "from 203.0.113.7" in listing and "from 198.51.100.9" in listing, listing
        for token, origin in ((publisher, "203.0.113.7"), (subscriber, "198.51.100.9")):
            r = c.patch(
                "/v1/account/token", json={"token": token["token"], "label": "x"}, headers=basic("phil", "phil-pass")
            )
            assert r.status_code == 200, r.text
            assert r.json()["last_origin"] == origin and used <= r.json()["last_access"] <= int(time.time())
            assert r.json()["last_access"] > token["last_access"] and r.json()["expires"] == token["expires"]
        assert c.post("/upLastUse", content="y", headers=bearer(publisher["token"])).status_code == 200


@pytest.mark.parametrize(
    ("method", "body", "headers", "status", "code"),
    [
        ("POST", None, {}, 401, 40101),  # anonymous
        ("POST", None, basic("phil", "wrong"), 401, 40101),
        ("POST", b"{not json", "phil", 400, 40024),
        ("POST", b'{"label": 5}', "phil", 400, 40024),
        ("POST", b'{"expires": "soon"}', "phil", 400, 40024),
        ("POST", b'{"expires": 1e400}', "phil", 400, 40024),
        ("POST", b"[1,2]", "phil", 400, 40024),
        ("POST", b'{"label": "' + b"x" * 40_000 + b'"}', "phil", 413, 41303),
        ("PATCH", b'{"label": "x"}', "phil", 400, 40023),  # a password login names no token
        ("PATCH", b'{"token": "tk_' + b"q" * 29 + b'", "label": "x"}', "phil", 404, 40491),
        ("PATCH", b'{"token": "not-a-token"}', "phil", 404, 40491),
        ("DELETE", None, "phil", 400, 40023),
    ],
)
def test_bad_requests_get_ntfys_errors(server, method, body, headers, status, code) -> None:  # type: ignore[no-untyped-def]
    if headers == "phil":
        headers = basic("phil", "phil-pass")
    r = httpx.request(method, server.base + "/v1/account/token", content=body, headers=headers, timeout=10)
    assert r.status_code == status, r.text
    assert error_body(r)["code"] == code


def test_without_users_there_is_no_account_api(fleet) -> None:
    """ntfy without an auth database: 404 (ensureUserManager)."""
    upf = fleet.start("upf", node="open", UPF_WORKERS="1")
    r = httpx.post(upf.base + "/v1/account/token", headers=basic("phil", "x"), timeout=10)
    assert r.status_code == 404 and error_body(r)["code"] == 40401
