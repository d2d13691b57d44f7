"""UPF's operations on each driver's store: publish, read, subscribe positions, inbox, janitor; and the
embedded driver's group commit of publishes."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from msgspec.structs import replace

from upf_keyspace import SINCE_ALL, SINCE_LATEST, SINCE_NONE, Envelope, Since, keys
from upf_keyspace.envelope import encode_envelope
from upf_keyspace.msgid import decode_id, encode_id
from upf_keyspace.ops.publish import IDEM_KEEP_SECS


@pytest.fixture
async def store(new_store):
    return await new_store(shard_count=8)


embedded_only = pytest.mark.parametrize("new_store", ["embedded"], indirect=True)
"""The embedded driver's group commit: these hold its file's write lock (``commits_held``)."""


def env(msg: str, t: int | None = None, ttl: int = 3600) -> Envelope:
    now = int(time.time()) if t is None else t
    return Envelope(time=now, expires=now + ttl, message=msg)


async def test_publish_then_read_in_order(store):
    """Messages of a topic come back oldest first, each id a 16-char position (positions order by
    their decoded bytes: base64url's alphabet is not in ASCII order, so the strings need not sort)."""
    ids = [(await store.publish("t", env(f"m{i}"))).id for i in range(5)]
    got = await store.read_after("t", None)
    assert [m.envelope.message for m in got] == [f"m{i}" for i in range(5)]
    assert [encode_id(m.stamp) for m in got] == ids and all(len(i) == 16 for i in ids)
    positions = [decode_id(i) for i in ids]
    assert positions == sorted(positions)  # type: ignore[type-var]  # decode_id of our own ids: never None


async def test_read_after_cursor_and_limit(store):
    pubs = [await store.publish("t", env(f"m{i}")) for i in range(5)]
    after = await store.read_after("t", pubs[1].stamp, limit=2)
    assert [m.envelope.message for m in after] == ["m2", "m3"]


async def test_cursor_from_another_topic_is_a_global_position(store):
    """An id of topic A positions topic B too: everything in B committed after it."""
    await store.publish("b", env("b-before"))
    marker = await store.publish("a", env("a"))
    await store.publish("b", env("b-after"))
    got = await store.read_after("b", marker.stamp)
    assert [m.envelope.message for m in got] == ["b-after"]


async def test_idempotent_publish_returns_original(store):
    """A retried publish with the same key stores nothing new and returns the original id."""
    first = await store.publish("t", env("one"), idem="req-1")
    again = await store.publish("t", env("two"), idem="req-1")
    other = await store.publish("t", env("three"), idem="req-2")
    assert again.duplicate and again.id == first.id and again.envelope.message == "one"
    assert not other.duplicate
    assert [m.envelope.message for m in await store.read_after("t", None)] == ["one", "three"]


async def test_subscribe_positions(store):
    """since=none starts after the newest, latest before it, all at the start, a stamp right after it."""
    a = await store.publish("t", env("a"))
    b = await store.publish("t", env("b"))
    cur = await store.subscribe(["t", "empty"], "n1", SINCE_NONE)
    assert cur == {"t": b.stamp, "empty": None}
    assert (await store.subscribe(["t"], "n1", SINCE_LATEST))["t"] == a.stamp
    assert (await store.subscribe(["t"], "n1", SINCE_ALL))["t"] is None
    assert (await store.subscribe(["t"], "n1", Since("stamp", stamp=a.stamp)))["t"] == a.stamp


async def test_latest_skips_a_newest_message_past_its_expiry(store):
    """A TTL 0 push on top: until the janitor takes it, latest still meant it, and the subscriber,
    which replays nothing past its expiry, got nothing. Asked at ``time``, latest is the newest one
    not expired."""
    now = int(time.time())
    keep = await store.publish("t", env("keep", t=now - 5))
    await store.publish("t", env("gone", t=now - 2, ttl=1))
    cursor = (await store.positions(["t"], Since("latest", time=now)))["t"]
    assert [m.envelope.message for m in await store.read_after("t", cursor)] == ["keep", "gone"]
    assert keep.stamp > (cursor or b"")


async def test_since_time_is_inclusive(store):
    await store.publish("t", env("old", t=1000))
    mid = await store.publish("t", env("mid", t=2000))
    await store.publish("t", env("new", t=3000))
    cur = await store.positions(["t"], Since("time", time=2000))
    got = await store.read_after("t", cur["t"])
    assert [m.envelope.message for m in got] == ["mid", "new"] and mid.stamp > cur["t"]


async def test_publish_pokes_every_holding_node(store, bells):
    """Affinity is per (topic, node): a publish rings each holder's bell and fills its inbox."""
    await store.subscribe(["t"], "n1", SINCE_NONE)
    await store.subscribe(["t"], "n2", SINCE_NONE)
    shard = keys.shard_of("t", 8)
    b1, b2 = bells(store, "n1"), bells(store, "n2")
    d1 = await store.drain_inbox("n1", shard, b1.set)
    d2 = await store.drain_inbox("n2", shard, b2.set)
    assert d1.topics == set() and d2.topics == set()
    pub = await store.publish("t", env("x"))
    assert pub.poked == 2
    await b1.wait(shard)
    await b2.wait(shard)
    first = await store.drain_inbox("n1", shard, b1.set, d1.last)
    assert first.topics == {"t"}
    again = await store.drain_inbox("n1", shard, b1.set, first.last)  # reads after what it saw: nothing new
    assert again.topics == set()
    await store.clear_inbox("n1", shard, first.last)
    cleared = await store.drain_inbox("n1", shard, b1.set)  # from the start: the clear removed what was read
    assert cleared.topics == set() and cleared.last is None
    await store.publish("t", env("y"))
    await b1.wait(shard)  # re-armed by every drain
    await asyncio.sleep(0.05)
    assert not b2.rang[shard].is_set()  # rang for x and not re-armed since: no second ring


async def test_read_many_answers_each_topic_cursor_and_limit_in_order(store):
    """One transaction reads several (topic, cursor, limit): each answer equals its own read_after."""
    a = [await store.publish("a", env(f"a{i}")) for i in range(4)]
    await store.publish("b", env("b0"))
    wants = [("a", None, 2), ("b", None, 10), ("a", a[1].stamp, 10), ("none", None, 10)]
    got = await store.read_many(wants)
    assert [[r.envelope.message for r in rows] for rows in got] == [["a0", "a1"], ["b0"], ["a2", "a3"], []]
    for (topic, after, limit), rows in zip(wants, got, strict=True):
        assert rows == await store.read_after(topic, after, limit)


async def test_drain_and_clear_several_shards_at_once(store, bells):
    """drain_inboxes reads each shard's pokes after its own position and re-arms each shard's bell;
    clear_inboxes clears each shard up to what was read."""
    by_shard: dict[int, str] = {}
    for i in range(64):
        by_shard.setdefault(keys.shard_of(f"t{i}", 8), f"t{i}")
        if len(by_shard) == 2:
            break
    (s1, t1), (s2, t2) = sorted(by_shard.items())
    b = bells(store, "n1")
    await store.subscribe([t1, t2], "n1", SINCE_NONE)
    await store.publish(t1, env("x"))
    await store.publish(t2, env("y"))
    first = await store.drain_inboxes("n1", {s1: None, s2: None}, b.set)
    assert first.topics == {t1, t2} and first.entries == 2 and set(first.lasts) == {s1, s2} and first.more == []
    again = await store.drain_inboxes("n1", {s1: first.lasts[s1], s2: None}, b.set)
    assert again.topics == {t2} and again.entries == 1 and set(again.lasts) == {s2}  # s1: nothing after its last
    await store.publish(t1, env("z"))
    await b.wait(s1)  # the re-armed bell rings on the next poke
    assert not b.rang[s2].is_set()
    await store.clear_inboxes("n1", first.lasts)
    cleared = await store.drain_inboxes("n1", {s1: None, s2: None}, b.set)
    assert cleared.topics == {t1} and cleared.entries == 1  # only the poke after the cleared one
    assert set(cleared.lasts) == {s1}  # s2 is empty: no last key for it


async def test_drain_of_more_than_a_batch_leaves_its_bell_unarmed(store, bells, monkeypatch):
    """A shard with more than a batch of pokes is named in ``more`` and its bell is not re-armed (the
    caller drains it again at once); the next drain takes the rest and re-arms it. The other shards
    of the same drain are re-armed."""
    from upf_keyspace.ops import inbox

    monkeypatch.setattr(inbox, "_DRAIN_BATCH", 2)
    by_shard: dict[int, list[str]] = {}
    for i in range(200):
        by_shard.setdefault(keys.shard_of(f"t{i}", 8), []).append(f"t{i}")
    (s1, many), (s2, few) = sorted((s, ts) for s, ts in by_shard.items() if len(ts) >= 3)[:2]
    b = bells(store, "n1")
    await store.subscribe([*many[:3], few[0]], "n1", SINCE_NONE)
    for t in [*many[:3], few[0]]:
        await store.publish(t, env("x"))
    first = await store.drain_inboxes("n1", {s1: None, s2: None}, b.set)
    assert first.more == [s1] and first.entries == 3 and first.topics == {*many[:2], few[0]}
    await store.publish(few[0], env("y"))
    await b.wait(s2)  # re-armed by the drain
    await store.publish(many[0], env("y"))
    await asyncio.sleep(0.1)
    assert not b.rang[s1].is_set(), "a shard left with pokes to read was re-armed"
    rest = await store.drain_inboxes("n1", {s1: first.lasts[s1]}, b.set)
    assert rest.more == [s1] and rest.topics == {many[2], many[0]}  # a whole batch again: there may be more
    end = await store.drain_inboxes("n1", {s1: rest.lasts[s1]}, b.set)
    assert end.more == [] and end.entries == 0 and end.lasts == {}
    await store.publish(many[1], env("z"))
    await b.wait(s1)  # read to its end: re-armed


async def test_release_stops_pokes(store):
    await store.subscribe(["t"], "n1", SINCE_NONE)
    await store.release(["t"], "n1")
    assert (await store.publish("t", env("x"))).poked == 0


async def test_expire_removes_due_messages_only(store):
    now = int(time.time())
    old = now - IDEM_KEEP_SECS - 100
    await store.publish("t", env("due", t=old, ttl=10), idem="k")
    await store.publish("t", env("fresh", t=now, ttl=3600))
    assert await store.expire(now) == 1
    assert [m.envelope.message for m in await store.read_after("t", None)] == ["fresh"]
    # published over IDEM_KEEP_SECS ago, its idempotency marker went with it: the same key publishes anew
    assert not (await store.publish("t", env("again"), idem="k")).duplicate


async def test_an_idempotency_key_outlives_its_message_for_a_retry(store):
    """A TTL 0 push retried after its message expired (or was replaced by its Web Push Topic) is
    answered as the original, with its id and times, and not stored again, until ``IDEM_KEEP_SECS``
    after its publish; then the marker's own X entry clears it."""
    now = int(time.time())
    first = await store.publish("t", env("push", t=now - 10, ttl=0), idem="k0")
    assert await store.expire(now) == 1 and await store.read_after("t", None) == []
    retry = await store.publish("t", env("push", t=now, ttl=0), idem="k0")
    assert retry.duplicate and retry.stamp == first.stamp
    assert (retry.envelope.time, retry.envelope.expires) == (now - 10, now - 10)
    assert await store.read_after("t", None) == []
    assert await store.expire(now - 10 + IDEM_KEEP_SECS + 1) == 1  # the marker's hold
    assert not (await store.publish("t", env("push", t=now, ttl=0), idem="k0")).duplicate

    a = await store.publish("r", replace(env("A", t=now, ttl=3600), push_topic="s"), idem="kA")
    await store.publish("r", replace(env("B", t=now, ttl=3600), push_topic="s"), idem="kB")
    again = await store.publish("r", replace(env("A", t=now + 1, ttl=3600), push_topic="s"), idem="kA")
    assert again.duplicate and again.stamp == a.stamp
    assert [m.envelope.message for m in await store.read_after("r", None)] == ["B"]


async def test_dead_node_sweep(store):
    """A node whose heartbeat is old loses its affinities, inbox, bells and liveness record."""
    now = int(time.time())
    assert await store.heartbeat("dead", now - 1000) is False
    assert await store.heartbeat("alive", now) is False
    assert await store.heartbeat("alive", now) is True
    await store.subscribe(["t"], "dead", SINCE_NONE)
    await store.publish("t", env("x"))
    assert await store.dead_nodes(now, 30) == ["dead"]
    assert await store.sweep_node("dead", now, 30) == 1
    assert await store.sweep_node("alive", now, 30) is None
    assert await store.dead_nodes(now, 30) == []
    assert (await store.publish("t", env("y"))).poked == 0

    async def leftovers(tr):
        return await tr.get_range(*keys.node_inbox_range("dead")) + await tr.get_range(*keys.node_bell_range("dead"))

    assert await store.db.transact(leftovers) == []


async def test_format_version_gate(new_store):
    """A store stamped by a newer format is refused at open."""
    from upf_keyspace import FormatVersionError

    s = await new_store()

    async def newer(tr):
        tr.set(keys.format_key(), keys.pack_i64(999))

    await s.db.transact(newer)
    await s.close()
    with pytest.raises(FormatVersionError):
        await new_store()


async def test_ping_reads_the_format(store):
    from upf_keyspace import CURRENT_FORMAT

    assert await store.ping() == CURRENT_FORMAT


async def test_drain_never_loses_a_concurrent_poke(new_store, bells):
    """Publishes racing drains and clears: every poke is reported by exactly one drain, none is cleared unseen."""
    import asyncio

    store = await new_store(shard_count=1)
    try:
        topics = [f"r{i}" for i in range(60)]
        await store.subscribe(topics, "n1", SINCE_NONE)
        reported: list[str] = []

        async def publisher():
            await asyncio.gather(*(store.publish(t, env(t)) for t in topics))

        pub = asyncio.create_task(publisher())
        after = None
        ring = bells(store, "n1", 1)
        while not pub.done():
            d = await store.drain_inbox("n1", 0, ring.set, after)
            reported += d.topics
            if d.last is not None and d.last != after:
                await store.clear_inbox("n1", 0, d.last)  # clearing races the publishes too
            after = d.last
            await asyncio.sleep(0)
        await pub
        d = await store.drain_inbox("n1", 0, ring.set, after)
        reported += d.topics
        assert sorted(reported) == sorted(topics)
    finally:
        await store.close()


@contextlib.contextmanager
def commits_held(store):
    """Hold the store file's write lock, as another process's commit would: the group commit takes
    what waits, then waits for the lock, and once it has it takes what arrived meanwhile too."""
    txn = store.db._reader.env.begin(write=True)
    try:
        yield
    finally:
        txn.abort()


@embedded_only
async def test_publishes_waiting_for_one_commit_share_a_transaction_each_with_its_own_position(store):
    """Plain publishes that wait for the same commit share one grouped transaction: one 10-byte
    commit stamp, a user version each in call order, every message stored in that order, each
    holder poked. The first, taken by an idle group commit that then waits for another process's
    write lock, shares that commit with those that arrived while it waited."""
    await store.subscribe(["b"], "n1", SINCE_NONE)
    with commits_held(store):
        first = asyncio.create_task(store.publish("a", env("m0")))
        await asyncio.sleep(0.05)  # the group commit took it and waits for the lock
        rest = [asyncio.create_task(store.publish("ab"[i % 2], env(f"m{i}"))) for i in range(1, 7)]
        await asyncio.sleep(0.05)
    pubs = [await first, *await asyncio.gather(*rest)]
    assert len({p.stamp[:10] for p in pubs}) == 1
    assert [p.stamp[10:] for p in pubs] == [i.to_bytes(2, "big") for i in range(7)]
    assert [p.poked for p in pubs] == [0, 1] * 3 + [0]
    assert [m.envelope.message for m in await store.read_after("a", None)] == ["m0", "m2", "m4", "m6"]
    assert [(encode_id(m.stamp), m.envelope.message) for m in await store.read_after("b", None)] == [
        (pubs[i].id, f"m{i}") for i in (1, 3, 5)
    ]


@embedded_only
async def test_a_groups_stats_are_summed_per_slot_and_count_every_publish(store):
    """A group adds its stats once per slot (``publish_many``): the totals are still every message
    and every stored byte, whichever slots the topics fall in."""
    topics = [f"t{i}" for i in range(40)]  # more topics than slots: some share one, some do not
    assert len({keys.shard_of(t, 16) for t in topics}) > 1
    before = await store.stored_bytes()
    with commits_held(store):
        first = asyncio.create_task(store.publish("t", env("first")))
        await asyncio.sleep(0.05)
        rest = [asyncio.create_task(store.publish(t, env("x" * (i + 1)))) for i, t in enumerate(topics)]
        await asyncio.sleep(0.05)
    pubs = [await first, *await asyncio.gather(*rest)]
    assert len({p.stamp[:10] for p in pubs[1:]}) == 1  # one grouped transaction
    sizes = [len(encode_envelope(p.envelope)) for p in pubs]
    assert (await store.stats())[0] == 41
    assert await store.appends() == 41
    assert await store.stored_bytes() - before == sum(sizes)


@embedded_only
async def test_a_publish_with_a_push_topic_keeps_its_own_transaction_keyed_ones_are_grouped(store):
    """A Web Push Topic clears what another publish of a group could be writing (the message the
    topic named), so that publish is never grouped; those with an idempotency key are, in a group of
    their own beside the plain ones' in the same commit, and their duplicates are still found."""
    with commits_held(store):
        first = asyncio.create_task(store.publish("t", env("first")))
        await asyncio.sleep(0.05)
        rest = asyncio.gather(
            store.publish("t", env("plain")),
            store.publish("t", Envelope(time=1, expires=int(time.time()) + 60, message="p", push_topic="pt")),
            store.publish("t", env("keyed"), idem="k1"),
            store.publish("t", env("plain too")),
            store.publish("u", env("keyed too"), idem="k2"),
        )
        await asyncio.sleep(0.05)
    pubs = [await first, *await rest]
    assert len({p.stamp[:8] for p in pubs[1:]}) == 1  # one commit
    assert pubs[1].stamp[:10] == pubs[4].stamp[:10]  # the plain ones: one grouped transaction
    assert pubs[3].stamp[:10] == pubs[5].stamp[:10] != pubs[1].stamp[:10]  # the keyed ones: another
    assert pubs[2].stamp[:10] not in {pubs[1].stamp[:10], pubs[3].stamp[:10]}  # the push topic's own
    again = await store.publish("t", env("again"), idem="k1")
    assert again.duplicate and again.id == pubs[3].id and again.envelope.message == "keyed"


@embedded_only
async def test_keyed_publishes_in_one_group_store_each_key_once(store):
    """In one grouped transaction: a key twice stores the first and answers the second with it; a key
    an earlier commit stored answers with that message, also once the message is gone (the marker
    holds its times); a marker without them (written before markers held them) whose message is gone
    publishes anew. Only what was stored is counted."""
    stored = await store.publish("t", env("stored"), idem="old")
    gone = await store.publish("t", env("gone"), idem="expired")
    held = await store.publish("t", env("held"), idem="held")

    async def drop_message(tr):  # Q entries only: the markers are left behind, one as an old one
        tr.clear(keys.queue_key("t", gone.stamp))
        tr.clear(keys.queue_key("t", held.stamp))
        tr.set(keys.idem_key("t", "expired", gone.stamp), b"")

    await store.db.transact(drop_message)
    count = (await store.stats())[0]
    with commits_held(store):
        first = asyncio.create_task(store.publish("u", env("first")))
        await asyncio.sleep(0.05)
        rest = asyncio.gather(
            store.publish("t", env("a"), idem="new"),
            store.publish("t", env("b"), idem="old"),
            store.publish("t", env("c"), idem="new"),
            store.publish("other", env("d"), idem="new"),  # a key is per topic
            store.publish("t", env("e"), idem="expired"),
            store.publish("t", env("f")),
            store.publish("t", env("held again"), idem="held"),
        )
        await asyncio.sleep(0.05)
    await first
    a, b, c, d, e, f, h = await rest
    assert h.duplicate and (h.id, h.envelope.message, h.envelope.time) == (held.id, "held again", held.envelope.time)
    assert len({p.stamp[:10] for p in (a, d, e)}) == 1  # the keyed ones stored: one grouped transaction
    assert not a.duplicate and c.duplicate and (c.id, c.envelope.message) == (a.id, "a")
    assert b.duplicate and (b.id, b.envelope.message) == (stored.id, "stored")
    assert not d.duplicate and d.id != a.id
    assert not e.duplicate and not f.duplicate
    # "f" is plain: it joined the group of "first" (taken before the lock), applied before the keyed one.
    assert [m.envelope.message for m in await store.read_after("t", None)] == ["stored", "f", "a", "e"]
    assert (await store.stats())[0] == count + 5  # first, a, d, e, f
    assert (await store.publish("t", env("g"), idem="expired")).id == e.id  # its new marker holds
    assert (await store.publish("t", env("h"), idem="new")).id == a.id


@embedded_only
async def test_a_group_is_bounded_and_one_bad_publish_fails_alone(store):
    """At most GROUP_MAX publishes share a transaction; one the store refuses (a value over its
    limit) fails alone, and the rest of its group is stored."""
    from upf_keyspace import StoreError
    from upf_keyspace.drivers.embedded.grouped import GROUP_MAX

    n = GROUP_MAX + 11  # GROUP_MAX (the first among them), then 11
    with commits_held(store):
        first = asyncio.create_task(store.publish("t0", env("m0")))
        await asyncio.sleep(0.05)
        rest = asyncio.gather(*(store.publish(f"t{i % 7}", env(f"m{i}")) for i in range(1, n)))
        await asyncio.sleep(0.05)
    many = [await first, *await rest]
    assert [len([p for p in many if p.stamp[:10] == s]) for s in sorted({p.stamp[:10] for p in many})] == [
        GROUP_MAX,
        11,
    ]
    with commits_held(store):
        first = asyncio.create_task(store.publish("x", env("alone")))
        await asyncio.sleep(0.05)
        got = asyncio.gather(
            store.publish("x", env("before")),
            store.publish("x", env("y" * 200_000)),
            store.publish("x", env("after")),
            return_exceptions=True,
        )
        await asyncio.sleep(0.05)
    answers = [await first, *await got]
    assert isinstance(answers[2], StoreError) and answers[2].code == 2103
    assert [m.envelope.message for m in await store.read_after("x", None)] == ["alone", "before", "after"]
    assert sum([len(await store.read_after(f"t{i}", None, limit=1000)) for i in range(7)]) == n


@embedded_only
async def test_a_cancelled_publish_still_commits_with_its_group(store):
    """A caller that goes away stops waiting, not its publish: what was handed to the group commit
    is stored, and the others of its group are answered."""
    with commits_held(store):
        first = asyncio.create_task(store.publish("c", env("in flight")))
        await asyncio.sleep(0.05)
        gone = asyncio.create_task(store.publish("c", env("gone")))
        stays = asyncio.create_task(store.publish("c", env("stays")))
        await asyncio.sleep(0.05)
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
    await asyncio.wait_for(asyncio.gather(first, stays), 5)
    assert [m.envelope.message for m in await store.read_after("c", None)] == ["in flight", "gone", "stays"]


async def test_an_id_past_a_topics_newest_resumes_from_it(store):
    """since=<an id from the future> (foreign, or from before a FoundationDB cluster was wiped): no
    backlog, and the cursor is the topic's newest, so what comes next is delivered; the cursor was the
    id, and every message below it was held back. An id of another topic newer than this one's
    newest message means the same."""
    old = await store.publish("t", env("old"))
    future = Since("stamp", stamp=b"\xd7" + b"\x00" * 11)
    cursors, live = await store.subscribe_live(["t", "empty"], "n1", future)
    assert cursors == {"t": old.stamp, "empty": None} and live == {"t": old.stamp, "empty": None}
    new = await store.publish("t", env("new"))
    assert [m.stamp for m in await store.read_after("t", cursors["t"])] == [new.stamp]
    other = await store.publish("u", env("other"))
    cursors, _ = await store.subscribe_live(["t"], "n1", Since("stamp", stamp=other.stamp))
    assert cursors == {"t": new.stamp}
