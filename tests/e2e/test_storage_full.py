"""A full store, black box: the all-in-one process on a store file with a size quota
(UPF_EMBEDDED_MAX_BYTES; the store then refuses writes with STORAGE_FULL, as on a full disk: a tmpfs needs
privileges these machines do not give). Publishes fill it with short-lived messages until refused."""

from __future__ import annotations

import asyncio
import time

import httpx

from tests.clients.ntfy import error_body, poll, subscribe

BODY = "x" * 3500


async def _publish(c: httpx.AsyncClient, base: str, topic: str, body: str, ttl: int | None = None) -> httpx.Response:
    return await c.post(f"{base}/{topic}", content=body.encode(), headers={"TTL": str(ttl)} if ttl else {})


async def _timed(c: httpx.AsyncClient, base: str, topic: str, body: str, ttl: int | None = None):
    started = time.monotonic()
    r = await _publish(c, base, topic, body, ttl)
    return r, time.monotonic() - started


async def test_full_store_answers_507_fast_reports_degraded_and_recovers(fleet):
    upf = fleet.start(
        "upf", node="allinone", UPF_EMBEDDED_MAX_BYTES=str(1536 * 1024), UPF_LIMIT_REQUEST_BURST="1000000"
    )
    async with httpx.AsyncClient(timeout=30) as c:
        kept = [(await _publish(c, upf.base, "upKEEP01", f"keep{i}")).json()["id"] for i in range(5)]
        acked = 0
        refused: list[tuple[httpx.Response, float]] = []
        for _ in range(100):  # 10 at a time until the store refuses
            replies = await asyncio.gather(*(_timed(c, upf.base, "upFILL01", BODY, ttl=4) for _ in range(10)))
            acked += sum(r.status_code == 200 for r, _ in replies)
            refused = [(r, secs) for r, secs in replies if r.status_code != 200]
            if refused:
                break
        assert refused and acked > 50
        for r, secs in refused:  # every refusal at once, as ntfy-style JSON
            assert error_body(r) == {"code": 50702, "http": 507, "error": "insufficient storage: the store is full"}
            assert secs < 2.0

        health = await c.get(f"{upf.base}/v1/health")
        assert (health.status_code, health.json()) == (503, {"healthy": False, "storage": "full"})
        heartbeat = await c.get(f"{upf.base}/__heartbeat__")
        assert heartbeat.status_code == 503 and heartbeat.json()["storage"] == "full"
        # Stored messages are still served, every acknowledged one, polled and streamed.
        assert [f.id for f in await poll(upf.base, "upKEEP01")] == kept
        async with subscribe(upf.base, "upKEEP01", "json", "since=all") as s:
            assert [f.id for f in await s.messages(5)] == kept

        # The janitor expires the 4 s messages, freeing space: publishes of the same size succeed
        # again and health recovers by itself (10 s after the last refusal).
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            r = await _publish(c, upf.base, "upFILL01", BODY, ttl=4)
            health = await c.get(f"{upf.base}/v1/health")
            if r.status_code == 200 and health.status_code == 200:
                break
            assert r.status_code in (200, 507), r.text
            await asyncio.sleep(0.5)
        assert r.status_code == 200 and health.status_code == 200, (r.text, health.text)
        assert (await c.get(f"{upf.base}/__heartbeat__")).status_code == 200
        assert (await _publish(c, upf.base, "upKEEP01", "after")).status_code == 200
        assert [f.message for f in await poll(upf.base, "upKEEP01")] == [f"keep{i}" for i in range(5)] + ["after"]
    log = upf.log_path.read_text(errors="replace")  # the whole log: log() keeps only its tail
    assert "Traceback" not in log
    assert 1 <= log.count("embedded store full: writes refused") <= 2


async def test_store_bytes_bound_answers_507_keeps_what_is_stored_and_recovers(fleet):
    """UPF_MAX_STORE_BYTES (issue 10's storage bound): once the fleet's stored message bytes reach it,
    publishes get 507 50702 (within the writers' one-second view of the total), nothing stored is lost,
    and publishes resume once the janitor has expired enough."""
    upf = fleet.start("upf", node="allinone", UPF_MAX_STORE_BYTES="20000", UPF_LIMIT_REQUEST_BURST="1000000")
    async with httpx.AsyncClient(timeout=30) as c:
        kept = [(await _publish(c, upf.base, "upBOUND01", f"keep{i}")).json()["id"] for i in range(3)]
        acked, refused = 0, None
        for _ in range(60):  # 1 KB messages that live 4 s, until refused
            r = await _publish(c, upf.base, "upBOUND02", "y" * 1000, ttl=4)
            if r.status_code != 200:
                refused = r
                break
            acked += 1
            await asyncio.sleep(0.05)
        assert refused is not None and 15 <= acked < 60, acked
        assert error_body(refused) == {"code": 50702, "http": 507, "error": "insufficient storage: the store is full"}
        assert [f.id for f in await poll(upf.base, "upBOUND01")] == kept  # nothing stored is touched
        assert len(await poll(upf.base, "upBOUND02")) == acked
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:  # the 4 s messages expire: the bound admits publishes again
            r = await _publish(c, upf.base, "upBOUND03", "z")
            if r.status_code == 200:
                break
            await asyncio.sleep(0.5)
        assert r.status_code == 200, r.text
        assert [f.id for f in await poll(upf.base, "upBOUND01")] == kept
