"""Tokens' last uses in batches: the first after a quiet spell at once, the rest at most every
``WRITE_SECS``, each token's latest use with its client as a trusted proxy names it; a store that
fails loses that batch only."""

from __future__ import annotations

import asyncio
import ipaddress
import logging

import pytest

from upf_edge import tokenuse
from upf_edge.tokenuse import TokenUses, origin_of

TRUSTED = (ipaddress.ip_network("10.0.0.0/8"),)


class Recorder:
    def __init__(self) -> None:
        self.batches: list[dict[str, tuple[str, int, str]]] = []
        self.fail = False

    async def record_token_uses(self, uses: dict[str, tuple[str, int, str]]) -> int:
        if self.fail:
            raise OSError("store down")
        self.batches.append(dict(uses))
        return len(uses)


async def _until(check, timeout: float = 2.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.01)


def test_the_origin_is_the_client_a_trusted_proxy_names() -> None:
    assert origin_of("10.1.2.3", "203.0.113.7, 10.9.9.9", TRUSTED) == "203.0.113.7"
    assert origin_of("192.0.2.1", "203.0.113.7", TRUSTED) == "192.0.2.1"  # not a trusted peer: ignored
    assert origin_of("", None, TRUSTED) == ""  # a Unix socket's peer


async def test_uses_are_written_at_once_then_batched(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tokenuse, "WRITE_SECS", 0.3)
    store = Recorder()
    clock = [1000.0]
    uses = TokenUses(store, TRUSTED, lambda: clock[0])  # type: ignore[arg-type]  # the one Store method it calls
    uses.note("d1", "phil", "10.0.0.1", "203.0.113.7")
    await _until(lambda: len(store.batches) == 1)
    assert store.batches[0] == {"d1": ("phil", 1000, "203.0.113.7")}
    clock[0] = 1000.1
    uses.note("d1", "phil", "192.0.2.5", None)
    clock[0] = 1002.0
    uses.note("d1", "phil", "192.0.2.6", None)  # the latest use of a token wins
    uses.note("d2", "ann", "192.0.2.7", None)
    await asyncio.sleep(0.05)
    assert len(store.batches) == 1  # within WRITE_SECS of the last batch: it waits
    await _until(lambda: len(store.batches) == 2)
    assert store.batches[1] == {"d1": ("phil", 1002, "192.0.2.6"), "d2": ("ann", 1002, "192.0.2.7")}


async def test_a_failed_batch_is_logged_and_the_next_use_is_written(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(tokenuse, "WRITE_SECS", 0.0)
    store = Recorder()
    store.fail = True
    uses = TokenUses(store, TRUSTED, lambda: 5.0)  # type: ignore[arg-type]  # the one Store method it calls
    with caplog.at_level(logging.WARNING, logger="upf.edge.tokenuse"):
        uses.note("d1", "phil", "192.0.2.1", None)
        await _until(lambda: any(r.msg == "token uses not recorded" for r in caplog.records))
    store.fail = False
    uses.note("d1", "phil", "192.0.2.2", None)
    await _until(lambda: store.batches == [{"d1": ("phil", 5, "192.0.2.2")}])
