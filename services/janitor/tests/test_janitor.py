"""The janitor's passes against a real embedded store."""

from __future__ import annotations

import time

import pytest

from upf_janitor import Janitor
from upf_keyspace import SINCE_NONE, Envelope, Settings, keys, open_store


@pytest.fixture
async def store(tmp_path):
    s = await open_store(Settings(store_path=str(tmp_path / "upf.db"), shard_count=4))
    yield s
    await s.close()


async def test_expires_in_batches_until_done(store, monkeypatch):
    """More due messages than one batch: a pass still expires all of them and nothing fresh."""
    import upf_janitor.janitor as jmod

    monkeypatch.setattr(jmod, "EXPIRE_BATCH", 7)
    now = int(time.time())
    for i in range(30):
        await store.publish(f"t{i % 3}", Envelope(time=now - 100, expires=now - 1, message="old"))
    await store.publish("t0", Envelope(time=now, expires=now + 3600, message="fresh"))
    result = await Janitor(store, Settings(heartbeat_secs=10)).run_once(now)
    assert result.expired == 30
    assert [m.envelope.message for m in await store.read_after("t0", None)] == ["fresh"]


async def test_on_a_full_disk_expiry_shrinks_its_batch_until_deletions_fit(store, monkeypatch):
    """A deletion needs fresh pages too: on a nearly full disk a batch of 500 is refused (storage
    full) where small ones fit. The pass shrinks its batch instead of failing every time, so the
    store deletes its way back; a batch of one refused still fails the pass."""
    from upf_keyspace import StoreError
    from upf_keyspace.errors import STORAGE_FULL

    now = int(time.time())
    for i in range(40):
        await store.publish(f"t{i % 4}", Envelope(time=now - 100, expires=now - 1, message="old"))
    real = store.expire
    asked: list[int] = []

    async def nearly_full(at: int, limit: int) -> int:
        asked.append(limit)
        if limit > 10:
            raise StoreError(STORAGE_FULL, "MapFullError")
        return await real(at, limit)

    monkeypatch.setattr(store, "expire", nearly_full)
    result = await Janitor(store, Settings(heartbeat_secs=10)).run_once(now)
    assert result.expired == 40 and asked[:4] == [500, 125, 31, 7]
    assert all(limit <= 14 for limit in asked[4:])  # grows back after each success, refused above 10

    async def always_full(at: int, limit: int) -> int:
        raise StoreError(STORAGE_FULL, "MapFullError")

    monkeypatch.setattr(store, "expire", always_full)
    with pytest.raises(StoreError):
        await Janitor(store, Settings(heartbeat_secs=10)).run_once(now)


async def test_sweeps_only_dead_nodes(store):
    """A node silent for 3 heartbeats loses its records; a live one keeps them."""
    now = int(time.time())
    await store.heartbeat("dead", now - 100)
    await store.heartbeat("live", now)
    await store.subscribe(["a", "b"], "dead", SINCE_NONE)
    await store.subscribe(["a"], "live", SINCE_NONE)
    result = await Janitor(store, Settings(heartbeat_secs=10)).run_once(now)
    assert result.swept_nodes == ["dead"] and result.cleared_affinities == 2
    assert (await store.publish("a", Envelope(time=now, expires=now + 60, message="x"))).poked == 1

    async def dead_records(tr):
        return (
            await tr.get_range(*keys.reverse_affinity_range("dead"))
            + await tr.get_range(*keys.node_bell_range("dead"))
            + [(k, v) for k, v in [(keys.liveness_key("dead"), await tr.get(keys.liveness_key("dead")))] if v]
        )

    assert await store.db.transact(dead_records) == []


async def test_clears_request_buckets_once_they_have_refilled(store, monkeypatch):
    """A refilled bucket is the same as none: cleared (in batches); one still refilling is kept."""
    import upf_janitor.janitor as jmod

    monkeypatch.setattr(jmod, "BUCKET_BATCH", 3)
    now = int(time.time())
    for i in range(7):  # one token each at now - 10: refilled to 60 by now + 290
        await store.lease_tokens(f"ip:192.0.2.{i}", 1, now - 10, 60, 5.0)
    await store.lease_tokens("ip:192.0.2.99", 30, now + 250, 60, 5.0)  # 30 taken: full at now + 400
    result = await Janitor(store, Settings(heartbeat_secs=10)).run_once(now + 300)
    assert result.cleared_buckets == 7

    async def left(tr):
        return [keys.unpack_bucket_key(k) for k, _ in await tr.get_range(*keys.bucket_range())]

    assert await store.db.transact(left) == ["ip:192.0.2.99"]
    assert (await Janitor(store, Settings(heartbeat_secs=10)).run_once(now + 100)).cleared_buckets == 0


async def test_clears_the_other_limits_state_a_dead_node_or_time_leaves_behind(store):
    """A dead pusher's subscription counts, refilled failed-login buckets, past days' message counts,
    day-old rate visitors of unheld topics and topics unused for 16 hours go; what is live stays."""
    from upf_keyspace.limits import day_of

    now = int(time.time())
    await store.heartbeat("dead", now - 100)
    await store.heartbeat("live", now)
    await store.open_subscription("ip:192.0.2.1", "dead", 30)
    await store.open_subscription("ip:192.0.2.1", "live", 30)
    await store.auth_failure("ip:192.0.2.1", now - 3600, 30, 60.0)  # refilled since
    await store.auth_failure("ip:192.0.2.2", now, 30, 60.0)  # not yet
    await store.lease_messages("ip:192.0.2.1", day_of(now) - 1, 5, 100)
    await store.lease_messages("ip:192.0.2.1", day_of(now), 5, 100)
    await store.set_rate_visitors(["upOldTopic0001"], "ip:192.0.2.1", now - 2 * 86_400)
    await store.touch_topics(["upOldTopic0001", "upNewTopic0001"], now - 17 * 3600, 100)
    await store.touch_topics(["upNewTopic0001"], now, 100)
    result = await Janitor(store, Settings(heartbeat_secs=10)).run_once(now)
    assert result.cleared_subscriptions == 1 and result.cleared_buckets >= 1

    async def left(tr):
        rs = await tr.get_range(*keys.subscription_range("ip:192.0.2.1"))
        rf = await tr.get_range(*keys.auth_bucket_range())
        rm = await tr.get_range(*keys.daily_range())
        rv = await tr.get_range(*keys.rate_visitor_range())
        ta = await tr.get_range(*keys.active_topic_range())
        return (
            [keys.unpack_subscription_key(k)[1] for k, _ in rs],
            [k == keys.auth_bucket_key("ip:192.0.2.2") for k, _ in rf],
            [keys.unpack_daily_key(k)[0] for k, _ in rm],
            len(rv),
            [keys.unpack_active_topic_key(k) for k, _ in ta],
        )

    assert await store.db.transact(left) == (["live"], [True], [day_of(now)], 0, ["upNewTopic0001"])
    assert await store.topic_count() == 1


async def test_a_pass_clears_commit_markers_a_minute_old(store):
    """The FoundationDB driver's commit markers (none on this store, so set here) go once a minute
    old; a younger one, which a transact call may still read after a 1021, stays."""
    import os

    from upf_keyspace.ops.janitor import MARKER_KEEP_SECS

    now = int(time.time())
    old = keys.commit_marker_key(now - MARKER_KEEP_SECS - 5, os.urandom(16))
    young = keys.commit_marker_key(now - 2, os.urandom(16))

    async def put(tr):
        tr.set(old, b"\x00" * 10)
        tr.set(young, b"\x00" * 10)

    async def markers(tr):
        return [k for k, _ in await tr.get_range(*keys.prefix_range(keys.Prefix.COMMIT_MARKER))]

    await store.db.transact(put)
    await Janitor(store, Settings(heartbeat_secs=10)).run_once(now)
    assert await store.db.transact(markers) == [young]
