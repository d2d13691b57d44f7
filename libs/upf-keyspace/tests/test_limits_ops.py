"""Request buckets: ntfy's arithmetic (burst, one token per refill interval, an honest wait) and the
lease transaction that lets every process of a fleet draw on one bucket per visitor."""

from __future__ import annotations

import asyncio

import pytest

from upf_keyspace import keys
from upf_keyspace.limits import Bucket, Lease, decode_bucket, encode_bucket, take


def test_a_new_bucket_is_full_and_grants_at_most_what_it_has():
    bucket, lease = take(None, 6, 1000.0, 60, 5.0)
    assert lease == Lease(6, 54, 0) and bucket == Bucket(54.0, 1000.0)
    bucket, lease = take(Bucket(2.5, 1000.0), 6, 1000.0, 60, 5.0)
    assert lease.granted == 2 and lease.left == 0 and bucket.tokens == pytest.approx(0.5)


def test_refill_is_one_token_per_interval_capped_at_the_burst():
    bucket, lease = take(Bucket(0.0, 1000.0), 10, 1012.0, 60, 5.0)  # 12 s: 2.4 tokens
    assert lease.granted == 2 and bucket.tokens == pytest.approx(0.4)
    _, lease = take(Bucket(0.0, 0.0), 100, 1_000_000.0, 60, 5.0)
    assert lease.granted == 60


def test_an_empty_bucket_says_how_long_until_a_token_and_waiting_that_long_is_enough():
    """Retry-After is whole seconds, never 0 for a refusal, and honest: after it, a token is there."""
    for level, refill in [(0.0, 5.0), (0.4, 5.0), (0.99, 5.0), (0.0, 0.3), (0.5, 1.0), (0.0, 1.0)]:
        empty = Bucket(level, 1000.0)
        _, refused = take(empty, 1, 1000.0, 60, refill)
        assert refused.granted == 0 and refused.wait >= 1
        _, later = take(empty, 1, 1000.0 + refused.wait, 60, refill)
        assert later.granted == 1, (level, refill, refused.wait)
        if refused.wait > 1:
            _, early = take(empty, 1, 1000.0 + refused.wait - 1, 60, refill)
            assert early.granted == 0


def test_a_clock_behind_the_stored_one_neither_refills_nor_moves_time_back():
    bucket, lease = take(Bucket(0.0, 2000.0), 1, 1990.0, 60, 5.0)
    assert lease.granted == 0 and bucket.at == 2000.0


def test_buckets_round_trip_and_have_their_own_key():
    assert decode_bucket(encode_bucket(Bucket(1.5, 2.0))) == Bucket(1.5, 2.0)
    key = keys.bucket_key("ip:192.0.2.1")
    begin, end = keys.bucket_range()
    assert begin < key < end and keys.unpack_bucket_key(key) == "ip:192.0.2.1"


async def test_leases_from_two_stores_share_one_bucket(two_stores):
    """Concurrent leases of one visitor from two stores never grant more than the bucket holds."""
    a, b = two_stores
    now = 5000.0
    grants = await asyncio.gather(*(s.lease_tokens("ip:198.51.100.7", 3, now, 20, 60.0) for s in (a, b) * 10))
    assert sum(g.granted for g in grants) == 20
    refused = await b.lease_tokens("ip:198.51.100.7", 3, now, 20, 60.0)
    assert refused.granted == 0 and refused.wait == 60
    assert (await a.lease_tokens("ip:198.51.100.8", 3, now, 20, 60.0)).granted == 3  # another visitor


async def test_a_refusal_writes_nothing(two_stores):
    a, _ = two_stores
    await a.lease_tokens("user:phil", 1, 100.0, 1, 10.0)
    stored = await a.db.transact(lambda tr: tr.get(keys.bucket_key("user:phil")))
    assert stored is not None
    assert (await a.lease_tokens("user:phil", 1, 105.0, 1, 10.0)).wait == 5
    assert await a.db.transact(lambda tr: tr.get(keys.bucket_key("user:phil"))) == stored
