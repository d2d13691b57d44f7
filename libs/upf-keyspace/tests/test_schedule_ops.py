"""Scheduled delivery, X-Cache: no live marks and /v1/stats at the store level (each driver)."""

from __future__ import annotations

import asyncio
import time

import msgspec
import pytest

from upf_keyspace import SINCE_ALL, SINCE_NONE, Envelope, Since, keys, message_from_envelope
from upf_keyspace.msgid import decode_id
from upf_keyspace.ops import stats


@pytest.fixture
async def store(new_store):
    return await new_store(shard_count=8)


def env(msg: str, t: int | None = None, ttl: int = 3600, **kw) -> Envelope:
    now = int(time.time()) if t is None else t
    return Envelope(time=now, expires=now + ttl, message=msg, **kw)


async def test_scheduled_is_hidden_until_released_then_keeps_its_id(store):
    now = int(time.time())
    s = await store.schedule("t", env("later", t=now + 100), now + 100)
    assert await store.read_after("t", None) == []  # hidden from polls and subscribers
    assert await store.next_due() == now + 100
    assert await store.release_due(now + 99) == 0
    assert await store.release_due(now + 100.25) == 1
    (row,) = await store.read_after("t", None)
    assert row.envelope.published_ms == (now + 100) * 1000 + 250  # latency counts from the release
    assert row.envelope.origin_id == s.id and row.stamp > s.stamp
    assert message_from_envelope(row.stamp, "t", row.envelope).id == s.id  # the id the publisher got
    assert await store.next_due() is None and await store.release_due(now + 200) == 0


async def test_a_scheduling_rings_the_releasers_watch_and_a_release_does_not(new_store):
    """The watch from watch_due fires when another handle on the store (another process) schedules a
    message; the release that follows rings nothing, so releasers do not wake one another in a loop."""
    releaser = await new_store(shard_count=8)
    writer = await new_store(shard_count=8)
    try:
        now = int(time.time())
        due, watch = await releaser.watch_due()
        assert due is None and not watch.done()
        await writer.schedule("t", env("x", t=now), now + 5)
        await asyncio.wait_for(watch, 5)
        due, watch = await releaser.watch_due()
        assert due == now + 5
        assert await writer.release_due(now + 5) == 1
        await asyncio.sleep(0.3)
        assert not watch.done()
        watch.cancel()
        assert (await releaser.watch_due())[0] is None
    finally:
        await releaser.close()
        await writer.close()


async def test_release_pokes_the_holder(store, bells):
    now = int(time.time())
    await store.subscribe(["t"], "n1", SINCE_NONE)
    await store.schedule("t", env("x", t=now), now)
    await store.release_due(now)
    drained = await store.drain_inbox("n1", keys.shard_of("t", 8), bells(store, "n1").set)
    assert drained.topics == {"t"}


async def test_racing_releasers_release_exactly_once(new_store):
    """Four handles on one store (as four processes) release the same 40 due messages concurrently."""
    stores = [await new_store(shard_count=8) for _ in range(4)]
    try:
        now = int(time.time())
        ids = {(await stores[0].schedule(f"t{i % 3}", env(f"m{i}", t=now), now)).id for i in range(40)}
        moved = list(await asyncio.gather(*(s.release_due(now, limit=7) for s in stores for _ in range(4))))
        while n := await stores[0].release_due(now, limit=7):
            moved.append(n)
        rows = [r for t in ("t0", "t1", "t2") for r in await stores[0].read_after(t, None)]
        assert sorted(r.envelope.origin_id for r in rows) == sorted(ids)  # each once, none lost
        assert sum(moved) == 40  # and every releaser's count agrees: nothing was moved twice
    finally:
        for s in stores:
            await s.close()


async def test_since_a_scheduled_id_resumes_after_its_release(store):
    """since=<id of a released scheduled message> is the Q position of its release, not of its scheduling:
    messages published between the two are not replayed again, and neither is the message itself."""
    now = int(time.time())
    s = await store.schedule("t", env("sched", t=now), now)
    await store.publish("t", env("between"))
    await store.release_due(now)
    after = await store.publish("t", env("after"))
    since = Since("stamp", stamp=s.stamp)
    cur = await store.subscribe(["t"], "n1", since)
    assert [r.envelope.message for r in await store.read_after("t", cur["t"])] == ["after"]
    assert (await store.positions(["other"], since))["other"] == s.stamp  # other topics: the raw position
    assert after.stamp > cur["t"]


async def test_since_a_scheduled_id_resumes_every_topic_of_the_subscription_after_its_release(store):
    """The connection that got the scheduled message (the ntfy app's, one since= for all its topics)
    got it at its release, after what its other topics had published meanwhile: those are not
    replayed. A subscription without the message's topic resumes from the raw position (above)."""
    now = int(time.time())
    s = await store.schedule("t1", env("sched", t=now), now)
    await store.publish("t2", env("t2-between"))
    await store.release_due(now)
    after = await store.publish("t2", env("t2-after"))
    since = Since("stamp", stamp=s.stamp)
    for cur in (
        await store.subscribe(["t1", "t2"], "n1", since),
        (await store.subscribe_live(["t2", "t1"], "n1", since))[0],
        await store.positions(["t2", "t1"], since),
    ):
        assert cur["t1"] == cur["t2"] > s.stamp
        assert [r.envelope.message for r in await store.read_after("t2", cur["t2"])] == ["t2-after"]
        assert await store.read_after("t1", cur["t1"]) == []
    assert after.stamp > cur["t2"]


async def test_janitor_clears_the_released_index(store):
    """The message goes at its expiry; its SR entry at its release + the longest TTL (``Store.max_ttl_secs``,
    UPF_DEFAULT_TTL_SECS), when no message it could be resumed across is left."""
    now = int(time.time())
    await store.schedule("t", env("x", t=now, ttl=5), now)
    await store.release_due(now)
    assert await store.db.transact(lambda tr: tr.get_range(*keys._range("SR")))
    assert await store.expire(now + 10) == 1
    assert await store.read_after("t", None) == []
    assert await store.db.transact(lambda tr: tr.get_range(*keys._range("SR")))
    assert await store.expire(now + store.max_ttl_secs + 2) == 1
    assert await store.db.transact(lambda tr: tr.get_range(*keys._range("SR"))) == []
    assert await store.db.transact(lambda tr: tr.get_range(*keys._range("X"))) == []


async def test_live_marks(store):
    a = await store.publish("t", env("a", nocache=True))
    b = await store.publish("t", env("b"))
    cur, live = await store.subscribe_live(["t", "empty"], "n1", SINCE_ALL)
    assert cur == {"t": None, "empty": None}
    assert live == {"t": b.stamp, "empty": None}
    cur, live = await store.subscribe_live(["t"], "n1", SINCE_NONE)
    assert cur == live == {"t": b.stamp}
    cur, live = await store.subscribe_live(["t"], "n1", Since("stamp", stamp=a.stamp))
    assert (cur["t"], live["t"]) == (a.stamp, b.stamp)


def test_nocache_reply_has_no_expires():
    e = env("x", nocache=True)
    stamp = decode_id("AAAAAAAAAAEAAAAA")
    assert stamp is not None
    assert message_from_envelope(stamp, "t", e).expires == 0
    assert message_from_envelope(stamp, "t", msgspec.structs.replace(e, nocache=False)).expires == e.expires


async def test_stats_count_publishes_schedules_not_releases_or_duplicates(store):
    now = int(time.time())
    await store.publish("a", env("1"))
    await store.publish("b", env("2"), idem="k")
    await store.publish("b", env("2"), idem="k")  # a replay: not a new message
    await store.schedule("c", env("3", t=now), now)
    await store.release_due(now)
    assert (await store.stats()) == (3, 0.0)
    assert await store.sample_stats(now, every=60, keep=3)
    assert not await store.sample_stats(now + 30, every=60, keep=3)  # too soon
    for _ in range(5):
        await store.publish("a", env("more"))
    assert await store.sample_stats(now + 60, every=60, keep=3)
    total, rate = await store.stats()
    assert total == 8 and rate == pytest.approx(5 / 60)
    for k in range(2, 6):
        await store.sample_stats(now + 60 * k, every=60, keep=3)
    history = await store.db.transact(stats.samples)
    assert [t for t, _ in history] == [now + 180, now + 240, now + 300]


def test_rate_is_ntfys():
    assert stats.rate([]) == 0.0 and stats.rate([(5, 10)]) == 0.0
    assert stats.rate([(0, 10), (60, 70), (120, 250)]) == pytest.approx(2.0)


# --- keys and settings ------------------------------------------------------------------------------------
def test_scheduled_and_released_keys_round_trip_and_order_by_due():
    s1, s2 = b"\x00" * 9 + b"\x01\x00\x00", b"\x00" * 9 + b"\x02\x00\x00"
    k = keys.scheduled_key(100, s1, "t")
    assert keys.unpack_scheduled_key(k) == (100, s1, "t")
    assert keys.scheduled_key(99, s2, "z") < k < keys.scheduled_key(100, s2, "a") < keys.scheduled_key(101, s1, "a")
    begin, end = keys.scheduled_due_range(100)
    assert begin < k < end and not begin < keys.scheduled_key(101, s1, "a") < end
    r = keys.released_key("t", s1, s2)
    assert keys.unpack_released_key(r) == ("t", s1, s2)
    lo, hi = keys.released_range("t", s1)
    assert lo < r < hi and not lo < keys.released_key("t", s2, s1) < hi
    # no new kind collides with the older ones that share a first letter
    assert not keys._range("S")[0] < keys.bell_key("n", 1) < keys._range("S")[1]


def test_scheduling_settings():
    from upf_keyspace import SettingsError, load_settings

    s = load_settings({})
    assert (s.delay_min_secs, s.delay_max_secs, s.release_poll_secs, s.nocache_keep_secs, s.stats_sample_secs) == (
        10, 259_200, 10.0, 120, 60)  # fmt: skip
    s = load_settings({"UPF_DELAY_MIN_SECS": "2", "UPF_DELAY_MAX_SECS": "60", "UPF_NOCACHE_KEEP_SECS": "5"})
    assert (s.delay_min_secs, s.delay_max_secs, s.nocache_keep_secs) == (2, 60, 5)
    for bad in ({"UPF_DELAY_MIN_SECS": "x"}, {"UPF_DELAY_MAX_SECS": "0"}, {"UPF_RELEASE_POLL_SECS": "0"},
                {"UPF_DELAY_MIN_SECS": "100", "UPF_DELAY_MAX_SECS": "50"}):  # fmt: skip
        with pytest.raises(SettingsError) as info:
            load_settings(bad)
        assert "UPF_" in str(info.value)
