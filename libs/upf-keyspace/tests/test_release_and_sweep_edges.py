"""Edges of scheduled releases, Web Push Topic replacement, expiry and dead-node sweeps that a review
found wrong, each test failing before its fix."""

from __future__ import annotations

import time

import pytest
from msgspec.structs import replace

from upf_keyspace import Envelope, Since, keys


@pytest.fixture
async def store(new_store):
    return await new_store(shard_count=8)


def env(msg: str, t: int, ttl: int = 3600, **kw) -> Envelope:
    return Envelope(time=t, expires=t + ttl, message=msg, **kw)


async def rows(store, prefix: keys.Prefix) -> list:
    async def body(tr):
        return await tr.get_range(*keys.prefix_range(prefix))

    return await store.db.transact(body)


async def messages(store, topic: str, after: bytes | None = None) -> list[str]:
    return [r.envelope.message for r in await store.read_after(topic, after)]


@pytest.mark.parametrize("stored_first", [False, True], ids=["two Topic releases", "plain then Topic"])
async def test_a_release_batch_never_reads_what_it_wrote_so_no_batch_blocks_the_rest(store, stored_first) -> None:
    """A Web Push Topic release reads its topic's Q and WT; after an earlier release of the same topic
    in the same transaction those are unreadable (versionstamped writes), and the whole batch failed,
    every pass, so no scheduled message anywhere was ever released again. The batch now ends before
    such a message, and the next transaction releases it."""
    now = int(time.time())
    if stored_first:
        await store.publish("t", env("old", now, push_topic="p"))
        await store.schedule("t", env("plain", now + 10), now + 10)
    else:
        await store.schedule("t", env("A", now + 10, push_topic="p"), now + 10)
    await store.schedule("t", env("B", now + 10, push_topic="p"), now + 10)
    await store.schedule("victim", env("hello", now + 11), now + 11)
    released = 0
    for _ in range(3):
        released += await store.release_due(now + 20)
    assert released == 3 and await messages(store, "victim") == ["hello"]
    assert await messages(store, "t") == (["plain", "B"] if stored_first else ["B"])  # B replaced what p named


async def test_a_late_release_does_not_make_since_time_skip_later_messages(store) -> None:
    """Released 5 s late, a message due at T+10 had QT[T+10] name its stamp, newer than B published at
    T+12: since=T+12 took that as its cursor and skipped B. A late release is not time-indexed."""
    now = int(time.time())
    await store.schedule("t", env("A", now + 10), now + 10)
    await store.publish("t", env("B", now + 12))
    assert await store.release_due(now + 15) == 1
    cursor = (await store.positions(["t"], Since("time", time=now + 12)))["t"]
    assert "B" in [r.envelope.message for r in await store.read_after("t", cursor)]


async def test_a_topic_replacement_leaves_no_time_index_nor_release_entry(store) -> None:
    """Replacing a message (Web Push Topic) cleared its Q, X and ID entries but not the QT entry naming
    it nor, for a released scheduled message, its SR entry: both stayed for good. The SR entry now
    stays as after an expiry: until the release + the longest TTL, then the janitor clears it."""
    now = int(time.time())
    await store.publish("t", env("A", now, push_topic="p"))
    await store.publish("t", env("B", now + 5, push_topic="p"))  # replaces A
    await store.schedule("t", env("C", now + 10, push_topic="q"), now + 10)
    await store.release_due(now + 10)
    await store.publish("t", env("D", now + 11, push_topic="q"))  # replaces released C
    await store.expire(now + 10**6)
    assert [await rows(store, p) for p in (keys.Prefix.QUEUE, keys.Prefix.TIME_INDEX)] == [[]] * 2
    assert len(await rows(store, keys.Prefix.RELEASED)) == 1
    await store.expire(now + 10 + store.max_ttl_secs + 1)
    assert [await rows(store, p) for p in (keys.Prefix.RELEASED, keys.Prefix.EXPIRY)] == [[]] * 2


async def test_a_ttl_0_message_outlives_its_own_second(store) -> None:
    """TTL 0 (RFC 8030: deliver to a connected user agent, keep nothing) expired in a janitor pass of
    its own second, before the poked pusher read it. A message's expiry second is its own now."""
    now = int(time.time())
    await store.publish("t", env("now", now, ttl=0))
    await store.expire(now)
    assert await messages(store, "t") == ["now"]
    await store.expire(now + 1)
    assert await messages(store, "t") == []


async def test_a_live_node_swept_in_part_holds_its_topics_again(store) -> None:
    """A node partitioned past the liveness limit, swept one batch, then back: its heartbeat said the
    record existed, so it did not hold its topics again, and the janitor, seeing it alive, stopped;
    the cleared topics were never poked again. The sweep marks the record, the heartbeat reads it."""
    now = int(time.time())
    topics = [f"t{i}" for i in range(5)]
    await store.heartbeat("n1", now - 100)
    await store.hold(topics, "n1")
    assert await store.sweep_node("n1", now, 10, 2) == 2  # the janitor's first batch
    assert "n1" in await store.dead_nodes(now, 10)  # still dead to the next pass
    assert await store.heartbeat("n1", now) is False  # back: told to hold its topics again
    assert await store.sweep_node("n1", now, 10, 2) is None
    await store.hold(topics, "n1")  # what the hub does on False
    assert [(await store.publish(t, env("x", now))).poked for t in topics] == [1] * 5


async def test_a_released_messages_id_still_resumes_after_it_release_once_it_expired(store) -> None:
    """since=<a released message's id> resolves through its SR entry to where it was released. The
    janitor cleared SR with the message, so once a short-lived released message expired, its id
    resumed from where it was scheduled and B, published in between and already delivered before it,
    came again. SR now stays until the release + the longest TTL."""
    now = int(time.time())
    a = await store.schedule("t", env("A", now + 10, ttl=60), now + 10)
    await store.publish("t", env("B", now + 5))
    await store.release_due(now + 10)
    assert await messages(store, "t") == ["B", "A"]
    await store.expire(now + 71)
    assert await messages(store, "t") == ["B"]
    cursor = (await store.positions(["t"], Since("stamp", stamp=a.stamp)))["t"]
    assert await store.read_after("t", cursor) == []


async def test_a_node_holding_topics_without_a_liveness_record_is_swept(store) -> None:
    """Its first heartbeat failed, it held topics, then it died: no L key, so dead_nodes never named it
    and every publish to its topics added an inbox entry nobody drained, for good."""
    now = int(time.time())
    await store.heartbeat("alive", now)
    await store.hold(["t"], "alive")
    await store.hold(["t", "u"], "ghost")
    assert await store.dead_nodes(now, 30) == ["ghost"]
    assert await store.sweep_node("ghost", now, 30) == 2
    assert (await store.publish("t", env("x", now))).poked == 1  # only the live holder
    assert await store.dead_nodes(now, 30) == []


async def test_a_released_messages_id_still_resumes_after_its_web_push_topic_replaced_it(store) -> None:
    """The same when a newer message with its Web Push ``Topic`` replaced it: the replacement cleared
    its SR entry, so its id resumed from where it was scheduled and B came again. The replacement now
    holds SR as the janitor's expiry does."""
    now = int(time.time())
    a = await store.schedule("t", replace(env("A", now + 10, ttl=60), push_topic="s"), now + 10)
    await store.publish("t", env("B", now + 5))
    await store.release_due(now + 10)
    await store.publish("t", replace(env("C", now + 11), push_topic="s"))
    assert await messages(store, "t") == ["B", "C"]
    cursor = (await store.positions(["t"], Since("stamp", stamp=a.stamp)))["t"]
    assert await messages(store, "t", cursor) == ["C"]
