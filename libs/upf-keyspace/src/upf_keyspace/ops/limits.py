"""Request-limit leases: one small transaction takes a few tokens from a visitor's shared bucket.

Why leases: a fleet must share one budget per visitor, but a read-modify-write of the visitor's
bucket on every request would make that key a hot conflict. A process takes several tokens at a
time and spends them locally (``upf_edge.limiter``), so the bucket is touched once per lease.
"""

from __future__ import annotations

from .. import keys
from ..contract import Transaction
from ..limits import Lease, decode_bucket, encode_bucket, is_full, take

__all__ = ["lease", "sweep"]


async def lease(tr: Transaction, visitor: str, want: int, now: float, burst: int, refill_secs: float) -> Lease:
    """Take up to ``want`` tokens of ``visitor``'s bucket. A refusal writes nothing (the stored level
    plus the refill since is still the truth), so a refused visitor's retries do not conflict."""
    key = keys.bucket_key(visitor)
    raw = await tr.get(key)
    bucket, granted = take(None if raw is None else decode_bucket(raw), want, now, burst, refill_secs)
    if granted.granted:
        tr.set(key, encode_bucket(bucket))
    return granted


async def sweep(
    tr: Transaction, now: float, burst: int, refill_secs: float, after: bytes | None, limit: int
) -> tuple[int, bytes | None]:
    """Clear the buckets among the next ``limit`` after key ``after`` that have refilled to the burst
    (a full bucket is the same as none), so a visitor seen once does not stay in the store. Returns
    how many were cleared and the key to continue after (None: the end). The reads are not snapshot
    reads: a lease committing meanwhile makes this transaction retry instead of losing its take."""
    begin, end = keys.bucket_range()
    if after is not None:
        begin = after + b"\x00"
    rows = await tr.get_range(begin, end, limit=limit)
    cleared = 0
    for key, raw in rows:
        if is_full(decode_bucket(raw), now, burst, refill_secs):
            tr.clear(key)
            cleared += 1
    return cleared, rows[-1][0] if len(rows) == limit else None
