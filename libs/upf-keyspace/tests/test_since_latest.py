"""since=latest resolves to just before the topic's newest cached row: ``X-Cache: no`` rows and poll
requests (kept only for live delivery, never replayed) on top of the queue are skipped, in one bounded read."""

from __future__ import annotations

import time

import pytest

from upf_keyspace import SINCE_LATEST, Envelope
from upf_keyspace.ops import read


@pytest.fixture
async def store(new_store):
    return await new_store(shard_count=8)


def env(msg: str, **kw) -> Envelope:
    now = int(time.time())
    return Envelope(time=now, expires=now + 3600, message=msg, **kw)


async def latest(store, topic: str) -> tuple[bytes | None, list[str]]:
    """The cursor since=latest resolves to, and the messages a reader after it gets."""
    cursor = (await store.positions([topic], SINCE_LATEST))[topic]
    return cursor, [m.envelope.message for m in await store.read_after(topic, cursor)]


async def test_uncached_newest_rows_are_skipped(store):
    await store.publish("t", env("cached1"))
    c2 = await store.publish("t", env("cached2"))
    c3 = await store.publish("t", env("cached3"))
    await store.publish("t", env("uncached", nocache=True))
    await store.publish("t", env("New message", event="poll_request", poll_id="x", nocache=True))
    cursor, after = await latest(store, "t")
    assert cursor == c2.stamp and after == ["cached3", "uncached", "New message"]
    # The live mark a stream gets is the newest row: everything after cached3 there is replay (skipped).
    _, marks = await store.subscribe_live(["t"], "n1", SINCE_LATEST)
    assert marks["t"] == (await store.read_after("t", c3.stamp))[-1].stamp
    # An uncached row below a cached newest one changes nothing: the newest is replayed.
    await store.publish("t", env("cached4"))
    assert (await latest(store, "t"))[1] == ["cached4"]


async def test_the_oldest_row_is_the_newest_cached(store):
    await store.publish("t", env("only-cached"))
    await store.publish("t", env("uncached", nocache=True))
    assert await latest(store, "t") == (None, ["only-cached", "uncached"])


async def test_an_event_row_that_is_cached_counts(store):
    """A cached message_delete / message_clear is a message the subscriber is sent: it can be latest."""
    await store.publish("t", env("m"))
    await store.publish("t", env("", event="message_delete", sequence_id="s"))
    await store.publish("t", env("u", nocache=True))
    _, after = await latest(store, "t")
    assert after == ["", "u"]


async def test_only_uncached_rows_replay_nothing(store):
    for i in range(3):
        await store.publish("t", env(f"u{i}", nocache=True))
    cursor, after = await latest(store, "t")
    assert after == [] and cursor is not None
    assert await latest(store, "empty") == (None, [])


async def test_one_bounded_read(store):
    """Whatever the queue holds, since=latest is one range read of at most ``_LATEST_SCAN + 1`` rows;
    past that many uncached rows on top, nothing is replayed (as since=none)."""
    for i in range(5):
        await store.publish("t", env(f"c{i}"))
    for i in range(read._LATEST_SCAN + 5):
        await store.publish("t", env(f"u{i}", nocache=True))
    reads: list[int] = []

    class Counting:
        def __init__(self, tr):
            self._tr = tr

        async def get_range(self, begin, end, **kw):
            rows = await self._tr.get_range(begin, end, **kw)
            reads.append(len(rows))
            return rows

        def __getattr__(self, name):
            return getattr(self._tr, name)

    async def body(tr):
        return await read.position(Counting(tr), "t", SINCE_LATEST)

    cursor = await store.db.transact(body)
    assert reads == [read._LATEST_SCAN + 1]
    assert await store.read_after("t", cursor) == []
