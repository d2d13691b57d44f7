"""The ops endpoints every role shares: bodies, the store probe, 405 on other methods."""

from __future__ import annotations

import asyncio
import json

import pytest

from upf_edge import NO_BODY
from upf_edge.ops import PATHS, OpsRoutes


def routes(probe_result: object = None, fail: bool = False) -> OpsRoutes:
    async def probe() -> object:
        if fail:
            raise RuntimeError("store down")
        return probe_result

    return OpsRoutes("upf-test", "1.2.3", probe, lambda: b"# metrics\n", "text/plain; version=0.0.4")


async def call(r: OpsRoutes, method: str, path: str):
    assert r.wants(method, path) and r.body_limit(method, path[1:], [], b"") == NO_BODY
    return await r(method, path[1:], [], b"", b"", "127.0.0.1")


async def test_bodies_of_each_path() -> None:
    """Health, lbheartbeat, version and metrics answer 200 with their documented bodies and types."""
    r = routes()
    assert (await call(r, "GET", "/v1/health"))[:2] == (200, b'{"healthy":true}\n')
    assert (await call(r, "GET", "/__lbheartbeat__"))[:2] == (200, b"{}\n")
    version = await call(r, "GET", "/__version__")
    assert json.loads(version.body) == {"name": "upf-test", "version": "1.2.3"}
    metrics = await call(r, "HEAD", "/metrics")
    assert metrics.body == b"# metrics\n" and metrics.content_type == b"text/plain; version=0.0.4"
    assert not r.wants("GET", "/sometopic") and "/metrics" in PATHS


@pytest.mark.parametrize(
    ("result", "fail", "status"), [(None, False, 200), (True, False, 200), (False, False, 503), (None, True, 503)]
)
async def test_heartbeat_follows_the_store_probe(result: object, fail: bool, status: int) -> None:
    """The heartbeat is 200 when the probe returns; 503 with ntfy's error JSON when it raises or says False."""
    reply = await call(routes(result, fail), "GET", "/__heartbeat__")
    assert reply.status == status
    if status == 503:
        assert json.loads(reply.body) == {
            "code": 50301,
            "http": 503,
            "error": "service unavailable: store not responding",
        }
    else:
        assert json.loads(reply.body) == {"status": "ok", "store": "ok"}


async def test_other_methods_are_405() -> None:
    """A POST to an ops path is 405 with an Allow header, as a router answers."""
    reply = await call(routes(), "POST", "/v1/health")
    assert reply.status == 405 and json.loads(reply.body)["code"] == 40501
    assert reply.headers == ((b"allow", b"GET, HEAD"),)


async def test_full_storage_degrades_both_health_endpoints_for_a_window() -> None:
    """A refused write makes /v1/health and /__heartbeat__ 503 saying storage, until the window has
    passed without another refusal."""
    from upf_keyspace.errors import StorageHealth

    storage = StorageHealth(window_secs=0.3)
    r = OpsRoutes("upf-test", "1.2.3", lambda: _none(), lambda: b"", "text/plain", storage=storage)
    assert (await call(r, "GET", "/v1/health")).status == 200
    storage.write_refused()
    health, heartbeat = await call(r, "GET", "/v1/health"), await call(r, "GET", "/__heartbeat__")
    assert (health.status, json.loads(health.body)) == (503, {"healthy": False, "storage": "full"})
    assert (heartbeat.status, json.loads(heartbeat.body)) == (
        503,
        {"status": "degraded", "store": "ok", "storage": "full"},
    )
    await asyncio.sleep(0.35)
    assert (await call(r, "GET", "/v1/health")).status == 200 and (await call(r, "GET", "/__heartbeat__")).status == 200


async def _none() -> None:
    return None


async def test_metrics_answer_scrapers_only() -> None:
    """/metrics was served to anyone who reached the all-in-one (bound where phones reach it): its
    counters tell when users get notifications and fail to log in. Now a peer in UPF_METRICS_ALLOW
    (loopback and private ranges by default) connecting directly; anyone else, or any request that
    came through a reverse proxy (it carries the forwarded header), gets ntfy's 404."""
    from upf_edge.ops import MetricsAccess
    from upf_keyspace import load_settings

    r = OpsRoutes(
        "upf-test", "1.2.3", lambda: asyncio.sleep(0), lambda: b"m 1\n", "text/plain",
        scrapers=MetricsAccess.of(load_settings({})),
    )  # fmt: skip
    proxied = [(b"x-forwarded-for", b"10.0.0.9")]
    for client, headers, status in [
        ("127.0.0.1", [], 200), ("10.1.2.3", [], 200), ("fd00::7", [], 200), ("", [], 200),  # "": a Unix socket
        ("203.0.113.9", [], 404), ("2001:db8::1", [], 404), ("127.0.0.1", proxied, 404),
    ]:  # fmt: skip
        reply = await r("GET", "metrics", headers, b"", None, client)
        assert reply.status == status, (client, headers)
        assert reply.body == (b"m 1\n" if status == 200 else b'{"code":40401,"http":404,"error":"page not found"}\n')
    nobody = MetricsAccess.of(load_settings({"UPF_METRICS_ALLOW": ""}))
    assert not nobody.allows("127.0.0.1", [])
