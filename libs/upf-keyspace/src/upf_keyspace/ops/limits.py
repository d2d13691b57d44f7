"""Request-limit leases: one small transaction takes a few tokens from a visitor's shared bucket.

Why leases: a fleet must share one budget per visitor, but a read-modify-write of the visitor's
bucket on every request would make that key a hot conflict. A process takes several tokens at a
time and spends them locally (``upf_edge.limiter``), so the bucket is touched once per lease.
"""

from __future__ import annotations

from .. import keys
from ..contract import Transaction
from ..limits import Lease, decode_bucket, encode_bucket, take

__all__ = ["lease"]


async def lease(tr: Transaction, visitor: str, want: int, now: float, burst: int, refill_secs: float) -> Lease:
    """Take up to ``want`` tokens of ``visitor``'s bucket. A refusal writes nothing (the stored level
    plus the refill since is still the truth), so a refused visitor's retries do not conflict."""
    key = keys.bucket_key(visitor)
    raw = await tr.get(key)
    bucket, granted = take(None if raw is None else decode_bucket(raw), want, now, burst, refill_secs)
    if granted.granted:
        tr.set(key, encode_bucket(bucket))
    return granted
