"""``GET /v1/stats``, fleet-wide: the message counter every publish adds to (``publish.count_message``)
and the samples of it that the janitor takes, from which the rate comes as ntfy computes it (the
difference between the newest and oldest of the last few samples, over the time between them)."""

from __future__ import annotations

from .. import keys
from ..contract import Transaction

__all__ = ["total", "stored_bytes", "sample", "samples", "rate"]


async def total(tr: Transaction) -> int:
    rows = await tr.get_range(*keys.stat_range("messages"), snapshot=True)
    return sum(keys.unpack_i64(v) for _, v in rows)


async def stored_bytes(tr: Transaction) -> int:
    """The fleet's stored message bytes (``publish.count_bytes``); never below 0 (messages stored
    before the counter existed are taken off when they expire)."""
    rows = await tr.get_range(*keys.stat_range("bytes"), snapshot=True)
    return max(0, sum(keys.unpack_i64(v) for _, v in rows))


async def samples(tr: Transaction) -> list[tuple[int, int]]:
    """(unix secs, messages) oldest first."""
    rows = await tr.get_range(*keys.stat_sample_range(), snapshot=True)
    return [(keys.unpack_stat_sample_key(k), keys.unpack_i64(v)) for k, v in rows]


async def sample(tr: Transaction, now: int, every: int, keep: int) -> bool:
    """Record the counter now unless the newest sample is younger than ``every`` seconds; keep the
    newest ``keep``. Returns whether a sample was taken. Several janitors conflict on the range read
    and retry, so samples stay ``every`` apart."""
    rows = await tr.get_range(*keys.stat_sample_range())
    if rows and now - keys.unpack_stat_sample_key(rows[-1][0]) < every:
        return False
    tr.set(keys.stat_sample_key(now), keys.pack_i64(await total(tr)))
    for k, _ in rows[: max(0, len(rows) + 1 - keep)]:
        tr.clear(k)
    return True


def rate(history: list[tuple[int, int]]) -> float:
    """Messages per second between the oldest and newest sample (0 with fewer than two)."""
    if len(history) < 2 or history[-1][0] <= history[0][0]:
        return 0.0
    return (history[-1][1] - history[0][1]) / (history[-1][0] - history[0][0])
