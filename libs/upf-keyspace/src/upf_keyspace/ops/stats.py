"""``GET /v1/stats``, fleet-wide: the message count every publish adds to (``publish.add_tally``)
and the samples of it that the janitor takes, from which the rate comes as ntfy computes it (the
difference between the newest and oldest of the last few samples, over the time between them)."""

from __future__ import annotations

from .. import keys
from ..contract import Transaction
from .publish import APPENDS, LEGACY_BYTES, LEGACY_MESSAGES, TALLY

__all__ = ["total", "stored_bytes", "appends", "sample", "samples", "rate"]


async def _tally(tr: Transaction) -> tuple[int, int]:
    """(messages, stored bytes) summed over the tally's slots and the counters it replaced."""
    messages = stored = 0
    for _, v in await tr.get_range(*keys.stat_range(TALLY), snapshot=True):
        v = v[:16].ljust(16, b"\x00")
        messages += int.from_bytes(v[:8], "little")
        stored += int.from_bytes(v[8:], "little", signed=True)
    for _, v in await tr.get_range(*keys.stat_range(LEGACY_MESSAGES), snapshot=True):
        messages += keys.unpack_i64(v)
    for _, v in await tr.get_range(*keys.stat_range(LEGACY_BYTES), snapshot=True):
        stored += keys.unpack_i64(v)
    return messages, stored


async def total(tr: Transaction) -> int:
    return (await _tally(tr))[0]


async def stored_bytes(tr: Transaction) -> int:
    """The fleet's stored message bytes; never below 0 (messages stored before the counter existed
    are taken off when they expire)."""
    return max(0, (await _tally(tr))[1])


async def appends(tr: Transaction) -> int:
    """How many messages ever entered Q (``publish.APPENDS``), fleet-wide."""
    return sum(keys.unpack_i64(v) for _, v in await tr.get_range(*keys.stat_range(APPENDS), snapshot=True))


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
