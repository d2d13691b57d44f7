"""The client behind a trusted proxy, as the request limits see it, over a real all-in-one: a proxy
that appends its own X-Forwarded-For line after the client's (HAProxy's ``option forwardfor``), and
RFC 7239's ``Forwarded``."""

from __future__ import annotations

import httpx

from tests.e2e.test_auth import basic, cli


def test_a_client_cannot_pick_its_address_in_a_line_of_its_own(fleet) -> None:
    """45 wrong passwords, each with a forged X-Forwarded-For line the proxy's line follows: they are
    the proxy-named client's, so the failed-login limit (30) applies (before the fix, every one was
    401: each forged address had a budget of its own)."""
    cli(fleet, "user", "add", "phil", password="right-pass")
    upf = fleet.start(
        "upf", node="xff", UPF_AUTH_DEFAULT_ACCESS="deny-all", UPF_PROXY_TRUSTED="127.0.0.1", UPF_LIMIT_EXEMPT=""
    )
    codes = []
    with httpx.Client(base_url=upf.base, timeout=10) as c:
        for i in range(45):
            headers = [
                ("Authorization", basic("phil", f"guess{i}")),
                ("X-Forwarded-For", f"10.66.0.{i}"),  # the client's own line
                ("X-Forwarded-For", "198.51.100.7"),  # the proxy's
            ]
            codes.append(c.post("/upXff00000001", content="x", headers=headers).status_code)
    assert codes.count(401) < 45 and codes[-1] == 429, codes


def test_a_tokens_origin_is_the_forwarded_client(fleet) -> None:
    """The account API records where a token was made: behind a trusted proxy, the client it names
    (as ntfy records it), not the proxy."""
    cli(fleet, "user", "add", "phil", password="phil-pass")
    upf = fleet.start("upf", node="xfftok", UPF_AUTH_DEFAULT_ACCESS="deny-all", UPF_PROXY_TRUSTED="127.0.0.1")
    with httpx.Client(base_url=upf.base, timeout=10) as c:
        headers = {"Authorization": basic("phil", "phil-pass"), "X-Forwarded-For": "198.51.100.77"}
        r = c.post("/v1/account/token", headers=headers)
        assert r.status_code == 200 and r.json()["last_origin"] == "198.51.100.77", r.text
        r = c.post("/v1/account/token", headers={"Authorization": basic("phil", "phil-pass")})
        assert r.json()["last_origin"] == "127.0.0.1"  # no forwarded line: the peer


def test_rfc_7239_forwarded_names_the_client(fleet) -> None:
    """With ``Forwarded`` as the proxy's header, each client has its own request budget; before, its
    ``for=`` was unreadable and every client was the (trusted, here not exempt) proxy itself."""
    upf = fleet.start(
        "upf",
        node="fwd",
        UPF_PROXY_TRUSTED="127.0.0.1",
        UPF_PROXY_FORWARDED_HEADER="Forwarded",
        UPF_LIMIT_EXEMPT="",
        UPF_LIMIT_REQUEST_BURST="3",
        UPF_LIMIT_REQUEST_REFILL_SECS="600",
    )
    with httpx.Client(base_url=upf.base, timeout=10) as c:

        def publish(client: str) -> int:
            headers = {"Forwarded": f'for="{client}";proto=https'}
            return c.post("/upFwd00000001", content="x", headers=headers).status_code

        assert [publish("203.0.113.5") for _ in range(4)] == [200, 200, 200, 429]
        assert publish("[2001:db8::7]:4711") == 200  # another client, its own budget
