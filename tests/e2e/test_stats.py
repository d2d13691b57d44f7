"""GET /v1/stats, black box: fleet-wide totals across two writers, and a rate from the janitor's samples."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.clients.ntfy import publish

pytestmark = pytest.mark.slow


async def test_stats_count_the_whole_fleet(fleet):
    w1 = fleet.start("upf_writer", node="w1")
    w2 = fleet.start("upf_writer", node="w2")
    fleet.start("upf_janitor", node="j1", UPF_STATS_SAMPLE_SECS="1")
    async with httpx.AsyncClient(timeout=10) as c:
        first = (await c.get(f"{w1.base}/v1/stats")).json()
        assert first == {"messages": 0, "messages_rate": 0.0}
        for i in range(6):
            await publish((w1, w2)[i % 2].base, "statsT", f"m{i}")
        await publish(w1.base, "statsT", "later", headers={"X-Delay": "1h"})  # counted when published, as ntfy
        r = await c.get(f"{w2.base}/v1/stats")
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
        assert r.json()["messages"] == 7
        rate = 0.0
        for _ in range(40):  # the janitor samples every second; publish between samples
            await publish(w2.base, "statsT", "more")
            await asyncio.sleep(0.25)
            rate = (await c.get(f"{w1.base}/v1/stats")).json()["messages_rate"]
            if rate > 0:
                break
        assert 0 < rate < 100
