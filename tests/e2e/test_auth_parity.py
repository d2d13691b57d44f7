"""ntfy's auth details against a real all-in-one: a bare ``Bearer``/``Basic`` is anonymous, failed logins
from an exempt address are limited (ntfy's exemption covers requests and messages only), on publish and
subscribe alike, and a role given no UPF_AUTH_* declaration leaves the declared records alone."""

from __future__ import annotations

import bcrypt
import httpx

from tests.clients.ntfy import error_body
from tests.e2e.test_auth import basic, cli


def test_a_bare_scheme_is_anonymous_as_in_ntfy(fleet) -> None:
    cli(fleet, "user", "add", "phil", password="right-pass")  # auth on, default read-write
    cli(fleet, "access", "*", "closed", "deny")
    upf = fleet.start("upf", node="bare", UPF_WORKERS="1")
    with httpx.Client(base_url=upf.base, timeout=10) as c:
        for header in ("Bearer", "Basic", "bearer"):  # `Authorization: Bearer $UNSET`: anonymous, as in ntfy
            assert c.post("/open1", content="x", headers={"Authorization": header}).status_code == 200, header
            r = c.post("/closed", content="x", headers={"Authorization": header})
            assert (r.status_code, error_body(r)["code"]) == (403, 40301), header
        r = c.get("/open1/json", params={"poll": "1"}, headers={"Authorization": "Bearer"})
        assert r.status_code == 200 and r.text.count('"message":"x"') == 3


def test_failed_logins_from_an_exempt_address_are_limited_as_in_ntfy(fleet) -> None:
    """Loopback is exempt by default (UPF_LIMIT_EXEMPT) and these requests come from it: ntfy's
    exemption covers requests and messages, never password guessing."""
    cli(fleet, "user", "add", "phil", password="right-pass")
    upf = fleet.start("upf", node="exempt", UPF_WORKERS="1", UPF_LIMIT_AUTH_FAILURE_BURST="3")
    with httpx.Client(base_url=upf.base, timeout=10) as c:
        failures = 0
        while True:  # burst 3: 2 failures leave one token; the time they took may allow one more
            r = c.post("/open1", content="x", headers={"Authorization": basic("phil", f"guess{failures}")})
            if r.status_code != 401:
                break
            failures += 1
            assert failures <= 3, "no 42909 for an exempt address"
        assert 2 <= failures <= 3 and (r.status_code, error_body(r)["code"]) == (429, 42909)
        r = c.post("/open1", content="x", headers={"Authorization": basic("phil", "right-pass")})
        assert r.status_code == 429 and error_body(r)["code"] == 42909 and int(r.headers["retry-after"]) >= 1
        for _ in range(3):  # no credentials (a bare scheme included) is no login: admitted, still unlimited
            assert c.post("/open1", content="x", headers={"Authorization": "Bearer"}).status_code == 200
        r = c.get("/open1/json", params={"poll": "1"}, headers={"Authorization": basic("phil", "right-pass")})
        assert (r.status_code, error_body(r)["code"]) == (429, 42909)  # the pusher's front door too


def test_failed_subscribe_logins_from_an_exempt_address_are_limited(fleet) -> None:
    """The same through the pusher's front door, which lets exempt subscribes past the limiter."""
    cli(fleet, "user", "add", "phil", password="right-pass")
    upf = fleet.start("upf", node="exemptsub", UPF_WORKERS="1", UPF_LIMIT_AUTH_FAILURE_BURST="3")
    with httpx.Client(base_url=upf.base, timeout=10) as c:
        codes = [
            c.get("/open1/json", params={"poll": "1"}, headers={"Authorization": basic("phil", f"g{i}")}).status_code
            for i in range(5)
        ]
        assert codes[0] == 401 and codes[-1] == 429, codes
        assert c.get("/open1/json", params={"poll": "1"}).status_code == 200  # no credentials: no login


def test_a_role_started_without_the_declaration_leaves_it(fleet) -> None:
    """A role given no UPF_AUTH_* variables (in a split deployment, say) changes nothing: the records
    never depend on which role started last."""
    hashed = bcrypt.hashpw(b"decl-pass", bcrypt.gensalt(4)).decode()
    declared = fleet.start(
        "upf",
        node="declared",
        UPF_WORKERS="1",
        UPF_AUTH_USERS=f"decl:{hashed}:user",
        UPF_AUTH_ACCESS="decl:upDECL*:rw",
        UPF_AUTH_TOKENS=f"decl:tk_{'e' * 29}",
    )
    declared.stop()
    fleet.start("upf", node="undeclared", UPF_WORKERS="1")
    assert "decl (user)" in cli(fleet, "user", "list")
    assert "upDECL*" in cli(fleet, "access")
    assert "tk_eeee" in cli(fleet, "token", "list")
