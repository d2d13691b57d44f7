"""Web Push in the store: a newer message with the same ``Topic`` replaces the stored one in the
queue, and VAPID bindings admit only their key."""

from __future__ import annotations

import time

import msgspec
import pytest

from upf_keyspace import Envelope, keys
from upf_keyspace.ops.publish import IDEM_KEEP_SECS


@pytest.fixture
async def store(new_store):
    return await new_store(shard_count=8)


def env(msg: str, push_topic: str = "", idem: str = "", ttl: int = 3600) -> Envelope:
    now = int(time.time())
    return Envelope(time=now, expires=now + ttl, message=msg, push_topic=push_topic, idem=idem)


async def rows(store, begin: bytes, end: bytes) -> list[tuple[bytes, bytes]]:
    async def body(tr):  # type: ignore[no-untyped-def]
        return await tr.get_range(begin, end)

    return await store.db.transact(body)


async def test_same_push_topic_replaces_in_the_queue(store):
    """Two publishes with one Topic leave the newer only (its own id); other Topics and plain
    messages stay; the replaced one's X entry and Topic marker are gone, and its idempotency marker
    is held as after an expiry, under an X entry of its own (``IDEM_KEEP_SECS`` after its publish)."""
    await store.publish("t", env("plain"))
    first = await store.publish("t", env("old", "news", idem="k1", ttl=7200), idem="k1")
    await store.publish("t", env("other", "sport"))
    second = await store.publish("t", env("new", "news"))
    assert second.id != first.id and second.stamp > first.stamp
    assert [m.envelope.message for m in await store.read_after("t", None)] == ["plain", "other", "new"]
    expiries = await rows(store, *keys.expiry_range(2**40))
    assert keys.expiry_key(first.envelope.expires, "t", first.stamp) not in [k for k, _ in expiries]
    hold = keys.expiry_key(first.envelope.time + IDEM_KEEP_SECS, "t", first.stamp)
    assert len(expiries) == 4 and (hold, b"k1") in expiries
    assert [k for k, _ in await rows(store, *keys.idem_range("t", "k1"))] == [keys.idem_key("t", "k1", first.stamp)]
    markers = await rows(store, *keys.push_topic_range("t", "news"))
    assert [keys.unpack_push_topic_key(k)[2] for k, _ in markers] == [second.stamp]


async def test_push_topic_is_per_upf_topic(store):
    await store.publish("a", env("a1", "x"))
    await store.publish("b", env("b1", "x"))
    assert [m.envelope.message for m in await store.read_after("a", None)] == ["a1"]
    assert [m.envelope.message for m in await store.read_after("b", None)] == ["b1"]


async def test_replacing_an_expired_message_just_appends(store):
    """The janitor already took the old one: the marker is dropped, the new message stored."""
    from upf_keyspace import ops

    old = await store.publish("t", env("old", "n", ttl=-10))
    await store.db.transact(ops.janitor.expire, int(time.time()), 100)
    assert await store.read_after("t", None) == []
    new = await store.publish("t", env("new", "n"))
    assert [m.envelope.message for m in await store.read_after("t", None)] == ["new"]
    markers = await rows(store, *keys.push_topic_range("t", "n"))
    assert [keys.unpack_push_topic_key(k)[2] for k, _ in markers] == [new.stamp] and old.stamp != new.stamp


async def test_the_janitor_clears_an_expired_messages_topic_marker(store):
    """A marker names its message's stamp exactly (the key the janitor clears is the one publish wrote)."""
    from upf_keyspace import ops

    kept = await store.publish("t", env("kept", "stay"))
    gone = await store.publish("t", env("gone", "once", ttl=-10))
    assert [keys.unpack_push_topic_key(k)[2] for k, _ in await rows(store, *keys.push_topic_range("t", "once"))] == [
        gone.stamp
    ]
    await store.db.transact(ops.janitor.expire, int(time.time()), 100)
    assert await rows(store, *keys.push_topic_range("t", "once")) == []
    assert [keys.unpack_push_topic_key(k)[2] for k, _ in await rows(store, *keys.push_topic_range("t", "stay"))] == [
        kept.stamp
    ]


async def test_idempotent_retry_does_not_replace(store):
    first = await store.publish("t", env("one", "n"), idem="r")
    again = await store.publish("t", env("one", "n"), idem="r")
    assert again.duplicate and again.id == first.id
    assert [m.envelope.message for m in await store.read_after("t", None)] == ["one"]


async def test_vapid_binding_first_key_wins_until_reset(store):
    assert await store.vapid_admit("up1", None, bind=True)  # no key: admitted, binds nothing
    assert await store.vapid_binding("up1") is None
    assert await store.vapid_admit("up1", "KEY-A", bind=False)  # not a UnifiedPush publish: no binding
    assert await store.vapid_binding("up1") is None
    assert await store.vapid_admit("up1", "KEY-A", bind=True)
    assert await store.vapid_binding("up1") == "KEY-A"
    assert await store.vapid_admit("up1", "KEY-A", bind=True)
    assert not await store.vapid_admit("up1", "KEY-B", bind=True)
    assert not await store.vapid_admit("up1", None, bind=False)
    assert await store.vapid_bindings() == [("up1", "KEY-A")]
    assert await store.vapid_reset("up1")
    assert not await store.vapid_reset("up1")
    assert await store.vapid_admit("up1", "KEY-B", bind=True)
    assert await store.vapid_bindings() == [("up1", "KEY-B")]


def test_envelope_push_fields_round_trip():
    e = env("m", "news")
    raw = msgspec.msgpack.encode(msgspec.structs.replace(e, urgency="high"))
    from upf_keyspace.envelope import decode_envelope

    back = decode_envelope(raw)
    assert back.push_topic == "news" and back.urgency == "high"


async def test_stored_bytes_follow_publish_replacement_and_expiry(store):
    """UPF_MAX_STORE_BYTES' counter: a publish adds its stored value, a Topic replacement and the
    janitor's expiry take theirs off; it never reads below zero."""
    from upf_keyspace import encode_envelope, ops

    assert await store.stored_bytes() == 0
    a = env("a" * 100, ttl=-10)
    b = env("b" * 50, "slot")
    await store.publish("t", a)
    await store.publish("u", b)
    assert await store.stored_bytes() == len(encode_envelope(a)) + len(encode_envelope(b))
    c = env("c" * 10, "slot")
    await store.publish("u", c)  # replaces b
    assert await store.stored_bytes() == len(encode_envelope(a)) + len(encode_envelope(c))
    await store.db.transact(ops.janitor.expire, int(time.time()), 100)  # a expired
    assert await store.stored_bytes() == len(encode_envelope(c))


async def test_one_tally_counts_messages_and_bytes_and_older_stores_counters_are_added_in(store):
    """A publish counts its message and its bytes with one 16-byte add (``ops.publish.TALLY``);
    taking bytes off never disturbs the message count, and the two 8-byte counters of stores written
    before the tally are still read."""
    from upf_keyspace import encode_envelope, ops

    a = env("a" * 100, ttl=-10)
    await store.publish("t", a)
    await store.publish("u", env("b"))
    stored = len(encode_envelope(a)) + len(encode_envelope(env("b")))
    assert (await store.stats())[0] == 2
    assert await store.stored_bytes() == stored

    async def legacy(tr):
        tr.add(keys.stat_key(ops.publish.LEGACY_MESSAGES, 3), keys.pack_i64(5))
        tr.add(keys.stat_key(ops.publish.LEGACY_BYTES, 7), keys.pack_i64(1000))

    await store.db.transact(legacy)
    assert (await store.stats())[0] == 7
    assert await store.stored_bytes() == stored + 1000

    async def take_off(tr):  # more than this slot ever counted: its byte half goes negative
        ops.publish.add_tally(tr, "t", 0, -5000)

    await store.db.transact(take_off)
    assert (await store.stats())[0] == 7  # no borrow from the byte half into the message count
    assert await store.stored_bytes() == 0  # clamped
    await store.db.transact(ops.janitor.expire, int(time.time()), 100)
    assert (await store.stats())[0] == 7
