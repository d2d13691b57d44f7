"""A visitor's request token bucket as the keyspace stores it, and ntfy's bucket arithmetic. Pure.

Why here and not with the front doors: the lease transaction (``ops.limits``) applies this arithmetic
to the stored bucket, and the keyspace library must not depend on the edge. A bucket holds at most
``burst`` tokens and gains one every ``refill_secs``; a missing bucket is a full one.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import msgspec

__all__ = [
    "Bucket",
    "Lease",
    "Failure",
    "take",
    "fail",
    "is_full",
    "encode_bucket",
    "decode_bucket",
    "DAY_SECS",
    "day_of",
    "secs_to_next_day",
    "take_count",
    "RateVisitor",
    "RATE_VISITOR_SECS",
    "encode_rate_visitor",
    "decode_rate_visitor",
]

_EPSILON = 1e-9
"""Float slack, so that waiting exactly the announced seconds always yields the token."""


class Bucket(msgspec.Struct, frozen=True, array_like=True):
    """The level at ``at`` (unix seconds); the refill since then is computed, never stored."""

    tokens: float
    at: float


class Lease(NamedTuple):
    """What one take granted (``granted`` tokens, ``left`` whole ones remaining in the bucket) and,
    when it granted nothing, the whole seconds until a token will be there (``wait``, at least 1)."""

    granted: int
    left: int
    wait: int


def take(bucket: Bucket | None, want: int, now: float, burst: int, refill_secs: float) -> tuple[Bucket, Lease]:
    """Take up to ``want`` whole tokens from ``bucket`` at ``now``: the new bucket and the lease.
    ``at`` never moves backwards, so hosts whose clocks disagree cannot refill the same span twice."""
    if bucket is None:
        level, at = float(burst), now
    else:
        at = max(now, bucket.at)
        level = min(float(burst), bucket.tokens + max(0.0, now - bucket.at) / refill_secs)
    granted = max(0, min(want, int(level + _EPSILON)))
    level = max(0.0, level - granted)
    wait = 0 if granted else max(1, math.ceil((1.0 - level) * refill_secs - _EPSILON))
    return Bucket(level, at), Lease(granted, int(level + _EPSILON), wait)


class Failure(NamedTuple):
    """One failed login as the fleet's bucket saw it: ``counted`` (False: the visitor was already
    blocked, the failure was not charged) and ``blocked`` (whole seconds until a login is allowed
    again; 0 while it still is)."""

    counted: bool
    blocked: int


def _level(bucket: Bucket | None, now: float, burst: int, refill_secs: float) -> tuple[float, float]:
    if bucket is None:
        return float(burst), now
    return min(float(burst), bucket.tokens + max(0.0, now - bucket.at) / refill_secs), max(now, bucket.at)


def _blocked_for(level: float, refill_secs: float) -> int:
    """ntfy allows a login while its failure bucket holds more than one token: the whole seconds
    until it does again (0 when it does now)."""
    if level > 1.0 + _EPSILON:
        return 0
    return int((1.0 - level) * refill_secs + _EPSILON) + 1


def fail(bucket: Bucket | None, now: float, burst: int, refill_secs: float) -> tuple[Bucket | None, Failure]:
    """Charge one failed login to ``bucket`` (ntfy: burst 30, one back per minute, logins allowed while
    more than one token is left). A visitor already blocked is not charged (the new bucket is None:
    nothing to write), so a blocked brute-forcer's attempts cost no write."""
    level, at = _level(bucket, now, burst, refill_secs)
    if _blocked_for(level, refill_secs):
        return None, Failure(False, _blocked_for(level, refill_secs))
    level = max(0.0, level - 1.0)
    return Bucket(level, at), Failure(True, _blocked_for(level, refill_secs))


def is_full(bucket: Bucket, now: float, burst: int, refill_secs: float) -> bool:
    """Refilled to the burst by ``now``: the same as no bucket, so the janitor may clear it."""
    return bucket.tokens + max(0.0, now - bucket.at) / refill_secs >= burst


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(Bucket)


def encode_bucket(bucket: Bucket) -> bytes:
    return _ENCODER.encode(bucket)


def decode_bucket(raw: bytes) -> Bucket:
    return _DECODER.decode(raw)


DAY_SECS = 86_400


def day_of(now: float) -> int:
    """The UTC day number of ``now`` (ntfy resets its daily counters at midnight UTC)."""
    return int(now // DAY_SECS)


def secs_to_next_day(now: float) -> int:
    """Whole seconds until the next UTC midnight (at least 1)."""
    return max(1, math.ceil((day_of(now) + 1) * DAY_SECS - now))


def take_count(count: int, want: int, limit: int) -> int:
    """How many of ``want`` a counter at ``count`` may still grant under ``limit``."""
    return max(0, min(want, limit - count))


RATE_VISITOR_SECS = 86_400
"""How long a UnifiedPush topic's subscriber stays its rate visitor once no node holds the topic
(ntfy forgets a visitor unseen for a day)."""


class RateVisitor(msgspec.Struct, frozen=True, array_like=True):
    """The visitor that last subscribed to a UnifiedPush topic, and when (unix seconds)."""

    visitor: str
    at: float


_RV_DECODER = msgspec.msgpack.Decoder(RateVisitor)


def encode_rate_visitor(rv: RateVisitor) -> bytes:
    return _ENCODER.encode(rv)


def decode_rate_visitor(raw: bytes) -> RateVisitor:
    return _RV_DECODER.decode(raw)
