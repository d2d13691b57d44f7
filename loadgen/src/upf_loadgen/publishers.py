"""Fake app servers: one publisher per topic, each publish awaited before the next.

Awaiting makes the server's commit order equal seq order, which is what lets the checker demand
in-order delivery. The schedule is open-loop (absolute due times), so a slow server makes offered
fall behind target visibly instead of silently lowering the load.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from urllib.parse import quote

import msgspec

from .checker import Published
from .http11 import HttpError, Pool
from .metrics import LiveStats, record_us
from .wire import decode_message, encode_payload

__all__ = ["Publisher"]

_MAX_SAMPLES = 5


class Publisher:
    def __init__(
        self,
        *,
        topic: str,
        prefix: str,
        phase: float,
        period: float,
        count: int,
        message_size: int,
        binary: bool,
        timeout: float,
        stats: LiveStats,
        failures: Counter[str],
        samples: list[str],
    ) -> None:
        self.topic = topic
        self.target = f"{prefix}/{quote(topic, safe='')}" + ("?up=1" if binary else "")
        self.headers = {"Content-Type": "application/octet-stream" if binary else "text/plain"}
        self.phase = phase
        self.period = period
        self.count = count
        self.message_size = message_size
        self.binary = binary
        self.timeout = timeout
        self.stats = stats
        self.failures = failures
        self.samples = samples
        self.sent = 0
        self.accepted: dict[int, str] = {}
        self.bad_replies = 0

    def published(self) -> Published:
        return Published(topic=self.topic, sent=self.sent, accepted=self.accepted)

    def _fail(self, key: str, detail: str) -> None:
        self.failures[key] += 1
        if len(self.samples) < _MAX_SAMPLES:
            self.samples.append(f"{self.topic}: {detail}")

    async def run(self, pool: Pool, start: float, end: float) -> None:
        """Publish seq 0..count-1 on schedule; stop at ``end`` even if behind, so runs are bounded."""
        stats = self.stats
        for seq in range(self.count):
            due = start + self.phase + seq * self.period
            now = time.monotonic()
            if now >= end:
                break
            if due > now:
                await asyncio.sleep(due - now)
            sent_ns = time.monotonic_ns()
            body = encode_payload(seq, sent_ns, self.message_size, self.binary)
            self.sent = seq + 1
            stats.offered += 1
            try:
                status, reply = await asyncio.wait_for(
                    pool.request("POST", self.target, body, self.headers), self.timeout
                )
            except TimeoutError:
                stats.errors += 1
                self._fail("timeout", "publish timed out")
                continue
            except (OSError, HttpError) as exc:
                stats.errors += 1
                self._fail("connection", f"{type(exc).__name__}: {exc}")
                continue
            record_us(stats.publish_latency, (time.monotonic_ns() - sent_ns) // 1000)
            if status != 200:
                stats.rejected += 1
                self._fail(str(status), f"HTTP {status}: {reply[:200]!r}")
                continue
            stats.accepted += 1
            try:
                self.accepted[seq] = decode_message(reply).id
            except (msgspec.DecodeError, msgspec.ValidationError):
                self.accepted[seq] = ""
                self.bad_replies += 1
