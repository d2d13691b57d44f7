"""A visitor's request token bucket as the keyspace stores it, and ntfy's bucket arithmetic. Pure.

Why here and not with the front doors: the lease transaction (``ops.limits``) applies this arithmetic
to the stored bucket, and the keyspace library must not depend on the edge. A bucket holds at most
``burst`` tokens and gains one every ``refill_secs``; a missing bucket is a full one.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import msgspec

__all__ = ["Bucket", "Lease", "take", "is_full", "encode_bucket", "decode_bucket"]

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


def is_full(bucket: Bucket, now: float, burst: int, refill_secs: float) -> bool:
    """Refilled to the burst by ``now``: the same as no bucket, so the janitor may clear it."""
    return bucket.tokens + max(0.0, now - bucket.at) / refill_secs >= burst


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(Bucket)


def encode_bucket(bucket: Bucket) -> bytes:
    return _ENCODER.encode(bucket)


def decode_bucket(raw: bytes) -> Bucket:
    return _DECODER.decode(raw)
