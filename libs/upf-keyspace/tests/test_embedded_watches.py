"""The embedded driver's watch bookkeeping: the running count behind the watch limit, and the
shortcuts that skip work on a wake-up, each pinned by a case where a wrong shortcut would miss a change."""

from __future__ import annotations

import asyncio

import pytest

from upf_keyspace import errors
from upf_keyspace.drivers.embedded import transaction

PREFIX = b"\x01test-watches/"


async def _put(db, items: dict[bytes, bytes]) -> None:
    async def body(tr):
        for k, v in items.items():
            tr.set(k, v)

    await db.transact(body)


async def _watch(db, key: bytes):
    async def body(tr):
        return tr.watch(key)

    return await db.transact(body)


def _counted(db) -> int:
    return sum(len(s) for s in db._watches.values())


async def test_watch_count_follows_arms_fires_and_cancels(pair):
    """The running count equals the registered watches through arming (two on one key), a change
    firing one, a cancel, and the limit counts it."""
    a, _ = pair
    k1, k2 = PREFIX + b"1", PREFIX + b"2"
    await _put(a, {k1: b"0", k2: b"0"})
    w1 = await _watch(a, k1)
    w1b = await _watch(a, k1)
    w2 = await _watch(a, k2)
    assert a._watch_count() == _counted(a) == 3
    await _put(a, {k1: b"1"})
    await asyncio.wait_for(asyncio.gather(w1.future, w1b.future), 2.0)
    await asyncio.sleep(0)  # the done callbacks unregister
    assert a._watch_count() == _counted(a) == 1
    w2.cancel()
    w2.cancel()
    await asyncio.sleep(0)
    assert a._watch_count() == _counted(a) == 0
    again = await _watch(a, k1)  # a key watched before: counted afresh
    assert a._watch_count() == _counted(a) == 1
    again.cancel()


async def test_a_watch_makes_its_future_only_when_asked_and_in_its_state(pair):
    """A watch nobody awaits has no future; one asked for after the watch fired or was cancelled comes
    back done that way; a fire that lands between an awaiter's cancellation and the watch hearing of
    it neither raises nor leaves the watch registered."""
    a, _ = pair
    k = PREFIX + b"lazy"
    await _put(a, {k: b"0"})
    fired, cancelled, abandoned = await _watch(a, k), await _watch(a, k), await _watch(a, k)
    assert fired._future is None and not fired.done()
    cancelled.cancel()
    assert cancelled.done() and cancelled.future.cancelled()
    abandoned.future.cancel()  # what an awaiter's timeout does; the watch learns of it a loop turn later
    assert abandoned.done()
    abandoned._fire()  # a check firing it in between: no result set on the cancelled future
    assert abandoned.future.cancelled()
    await _put(a, {k: b"1"})
    for _ in range(100):
        if fired.done():
            break
        await asyncio.sleep(0.01)
    assert fired._future is None  # fired without ever making one
    assert fired.future.done() and not fired.future.cancelled() and fired.future.result() is None
    await asyncio.sleep(0)
    assert a._watch_count() == _counted(a) == 0


async def test_watch_limit_uses_the_running_count(pair, monkeypatch):
    a, _ = pair
    monkeypatch.setattr(transaction, "_MAX_WATCHES", 3)
    await _put(a, {PREFIX + b"x": b"0"})
    held = [await _watch(a, PREFIX + b"x") for _ in range(3)]
    with pytest.raises(errors.StoreError) as info:
        await _watch(a, PREFIX + b"x")
    assert info.value.code == errors.TOO_MANY_WATCHES
    held[0].cancel()
    await asyncio.sleep(0)
    held.append(await _watch(a, PREFIX + b"x"))  # room again once one is gone
    for w in held:
        w.cancel()


async def test_an_arming_over_the_limit_arms_none_of_its_keys(pair, monkeypatch):
    """A watch set's arming that would pass the limit is refused whole: no key of it is armed, and the
    room it did not take is there for the next arming."""
    a, _ = pair
    monkeypatch.setattr(transaction, "_MAX_WATCHES", 3)
    keys = [PREFIX + b"w" + bytes([i]) for i in range(4)]
    await _put(a, dict.fromkeys(keys, b"0"))
    ws = a.watch_set(keys, [lambda: None] * 4)
    tr = a.create_transaction()
    with pytest.raises(errors.StoreError) as info:
        tr.arm(ws, [0, 1, 2, 3])
    assert info.value.code == errors.TOO_MANY_WATCHES
    tr.arm(ws, [0, 1, 2])
    await tr.commit()
    assert a._watch_count() == _counted(a) == 3
    ws.cancel()
    assert a._watch_count() == 0


async def test_keys_are_found_in_memcmp_order_and_come_back_as_bytes(pair):
    """LMDB's default comparator is memcmp, then length: FoundationDB's byte order, shorter first."""
    a, _ = pair
    ks = [
        PREFIX + b"k",
        PREFIX + b"k\x00",
        PREFIX + b"k\x00\x00",
        PREFIX + b"k\x7f",
        PREFIX + b"k\x80",
        PREFIX + b"k\xff",
    ]
    await _put(a, {k: k[-1:] for k in ks})

    async def read(tr):
        points = [await tr.get(k) for k in ks]
        return points, await tr.get_range(PREFIX + b"k\x00", PREFIX + b"k\xff"), await tr.get(PREFIX + b"k\x01")

    points, rows, missing = await a.transact(read)
    assert points == [k[-1:] for k in ks] and all(type(p) is bytes for p in points)
    assert rows == [(k, k[-1:]) for k in ks[1:-1]] and all(type(k) is bytes for k, _ in rows)
    assert missing is None


async def test_arming_without_a_read_still_sees_a_change_a_check_already_passed(pair):
    """A watch's value read at v is armed without re-reading only while no check has moved past v:
    here another watch's check consumes the change first, so the arm must re-read and fire."""
    a, b = pair
    a.fallback_poll_secs = 30.0  # the backstop must not be what fires it
    key, other = PREFIX + b"moved", PREFIX + b"other"
    await _put(a, {key: b"0", other: b"0"})
    keep = await _watch(a, other)  # keeps checks running on a
    tr = a.create_transaction()
    w = tr.watch(key)
    await _put(b, {key: b"1"})
    deadline = asyncio.get_running_loop().time() + 2.0
    while a._watch_version <= w.version and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)
    assert a._watch_version > w.version  # the check covering b's commit ran before the arm
    await tr.commit()
    await asyncio.wait_for(w.future, 1.0)
    keep.cancel()


@pytest.mark.parametrize("writer", ["same handle", "other handle"])
async def test_a_commit_announced_while_nothing_was_watched_is_checked_when_armed(pair, writer):
    """A commit announced while a handle watched nothing moves no check; a watch read before it and
    armed after it without a read must still fire promptly (not at the backstop poll)."""
    a, b = pair
    a.fallback_poll_secs = 30.0
    key = PREFIX + b"quiet"
    await _put(a, {key: b"0"})
    await asyncio.sleep(0.05)
    assert not a._watches
    tr = a.create_transaction()
    w = tr.watch(key)
    await _put(a if writer == "same handle" else b, {key: b"1"})
    await asyncio.sleep(0.1)  # the announcement arrives and finds nothing watched
    await tr.commit()
    await asyncio.wait_for(w.future, 1.0)


async def test_arming_without_a_read_keeps_a_watch_on_its_own_write(pair):
    """A transaction that writes a key and watches it arms on the value it wrote: its own commit does
    not fire it, the next change does."""
    a, b = pair
    key = PREFIX + b"own"

    async def write_and_watch(tr):
        tr.set(key, b"mine")
        return tr.watch(key)

    w = await a.transact(write_and_watch)
    await asyncio.sleep(0.1)
    assert not w.done()
    await _put(b, {key: b"theirs"})
    await asyncio.wait_for(w.future, 2.0)


def test_written_keys_match_testing_every_key_against_every_set():
    """The interval walk, and the key-by-key search of a set much bigger than the watched keys, find
    exactly the watched keys a brute-force overlap test finds, edges included (a key at an interval's
    begin is written, one at its end is not; k and k+NUL differ)."""
    import random

    from upf_keyspace.drivers._ranges import IntervalSet, point
    from upf_keyspace.drivers.embedded.watches import _written

    rng = random.Random(9)
    alphabet = [b"", b"\x00", b"a", b"a\x00", b"b", b"\xff"]

    def key() -> bytes:
        return b"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 3)))

    for i in range(2000):
        watched = sorted({key() for _ in range(rng.randint(0, 8))})
        sets = []
        for _ in range(rng.randint(0, 3)):
            ranges = []
            for _ in range(rng.randint(0, 4 if i % 2 else 60)):  # even rounds: sets bigger than the watched keys
                k = key()
                ranges.append(point(k) if rng.random() < (0.5 if i % 2 else 0.95) else tuple(sorted((k, key()))))
            sets.append(IntervalSet(ranges))
        expected = {k for k in watched if any(s.overlaps(*point(k)) for s in sets)}
        got = _written(watched, sets)
        assert sorted(got) == sorted(expected) and len(got) == len(set(got))


def test_written_keys_cut_to_the_watched_heads_match_testing_every_key_against_every_set():
    """Cut to the slices under the watched keys' heads (a node's bells share one head; a commit of
    publishes writes hundreds of keys under others), the search finds exactly what a brute-force
    overlap test finds: keys shorter than a head, heads ending in 0xff, wider intervals within and
    across heads, and heads kept from an earlier check whose keys are no longer watched."""
    import random

    from upf_keyspace.drivers._ranges import HEAD_BYTES, IntervalSet, point
    from upf_keyspace.drivers.embedded.watches import _SLICED_ABOVE, _Heads, _written

    rng = random.Random(11)
    prefixes = [b"\x02upf\x00\x02SI", b"\x02upf\x00\x02Q\x00", b"\x02upf\x00\x02Q\xff", b"\xff" * HEAD_BYTES, b"ab"]
    tails = [b"", b"\x00", b"a", b"a\x00", b"b", b"\xff", b"c", b"d"]

    def key() -> bytes:
        prefix = rng.choices(prefixes, weights=(20, 20, 4, 4, 1))[0]
        return prefix + b"".join(rng.choice(tails) for _ in range(rng.randint(0, 4)))

    heads = _Heads()
    sliced = 0
    for i in range(1000):
        watched = {key(): None for _ in range(rng.randint(1, 60))}
        sets = []
        for _ in range(rng.randint(1, 3)):
            ranges = []
            for _ in range(rng.randint(0, 150)):
                k = key()
                ranges.append(point(k) if rng.random() < (0.995 if i % 2 else 0.95) else tuple(sorted((k, key()))))
            sets.append(IntervalSet(ranges))
        expected = {k for k in watched if any(s.overlaps(*point(k)) for s in sets)}
        bounds = heads.of(watched.keys())
        sliced += sum(len(s.begins) > _SLICED_ABOVE and 2 * len(bounds) < len(watched) for s in sets)
        got = _written(watched, sets, heads)
        assert sorted(got) == sorted(expected) and len(got) == len(set(got))
    assert sliced > 500  # the sliced search ran, not only the others


async def test_a_range_clear_and_a_point_write_fire_exactly_the_watches_under_them(pair):
    a, b = pair
    names = [b"a", b"b", b"b\x00", b"c", b"d", b"e"]
    await _put(a, {PREFIX + n: b"0" for n in names})
    ws = {n: await _watch(a, PREFIX + n) for n in names}

    async def write(tr):
        tr.clear_range(PREFIX + b"b", PREFIX + b"c")  # b and b\x00, not c
        tr.set(PREFIX + b"e", b"1")

    await b.transact(write)
    await asyncio.wait_for(asyncio.gather(*(ws[n].future for n in (b"b", b"b\x00", b"e"))), 2.0)
    await asyncio.sleep(0.1)
    assert [n for n in names if ws[n].done()] == [b"b", b"b\x00", b"e"]
    for w in ws.values():
        w.cancel()


@pytest.mark.parametrize("writer", ["same handle", "other handle"])
async def test_a_watch_set_calls_from_the_firing_check_reuses_its_watches_and_never_calls_after_a_cancel(pair, writer):
    """A watch set's key calls its callback from the check that fires it, once per arming; it stays
    registered while fired and arming it again reuses the same watch object, so a node's bells leave
    the registry as it was however often they ring; a cancelled set leaves it and never calls."""
    a, b = pair
    a.fallback_poll_secs = 30.0
    k1, k2, k3 = PREFIX + b"cb1", PREFIX + b"cb2", PREFIX + b"cb3"
    await _put(a, {k1: b"0", k2: b"0", k3: b"0"})
    fired: list[int] = []
    rang = asyncio.Event()

    def on_fire(i: int) -> None:
        assert ws.members[i].done()  # fired before it calls
        fired.append(i)
        rang.set()

    ws = a.watch_set([k1, k2, k3], [lambda i=i: on_fire(i) for i in range(3)])
    members = list(ws.members)

    async def arm(tr, indexes):
        tr.arm(ws, indexes)

    await a.transact(arm, [0, 1])
    assert a._watch_count() == _counted(a) == 2  # k3 is not armed
    writes = a if writer == "same handle" else b
    for n in range(3):
        rang.clear()
        await _put(writes, {k1: b"%d" % (n + 1), k3: b"%d" % (n + 1)})
        await asyncio.wait_for(rang.wait(), 2.0)
        await asyncio.sleep(0.02)
        assert fired == [0] * (n + 1)  # k2 unwritten, k3 unarmed: neither calls
        assert a._watch_count() == _counted(a) == 2
        await _put(writes, {k1: b"again %d" % n})  # fired, not armed again yet: no second call
        await asyncio.sleep(0.05)
        assert fired == [0] * (n + 1)
        await a.transact(arm, [0])
        assert a._watch_count() == _counted(a) == 2
    assert ws.members == members  # the same objects, armed again
    await a.transact(arm, [0, 1])  # armed again while armed: still one registration each
    assert a._watch_count() == _counted(a) == 2
    ws.cancel()
    assert a._watch_count() == _counted(a) == 0
    await a.transact(arm, [0, 1, 2])  # a cancelled set is never armed again
    await _put(writes, {k1: b"x", k2: b"x", k3: b"x"})
    await asyncio.sleep(0.1)
    assert fired == [0, 0, 0] and a._watch_count() == 0


async def test_a_watch_set_refuses_a_callback_count_unlike_its_keys_and_another_handles_transaction(pair):
    """A set with one callback too few is refused when made; arming it in another handle's (another
    process's) transaction is refused, and arms nothing."""
    a, b = pair
    with pytest.raises(ValueError, match="one callback per key"):
        a.watch_set([PREFIX + b"x", PREFIX + b"y"], [lambda: None])
    ws = a.watch_set([PREFIX + b"x"], [lambda: None])

    async def arm(tr):
        tr.arm(ws, [0])

    with pytest.raises(TypeError, match="another store"):
        await b.transact(arm)
    assert a._watch_count() == 0 and b._watch_count() == 0
    ws.cancel()


async def test_a_watch_set_armed_while_its_key_changes_fires_at_once(pair):
    """An arming takes its transaction's read: a write committed between that read and the commit that
    arms it calls at once (as a watch does), and one already seen by that read does not."""
    a, b = pair
    a.fallback_poll_secs = 30.0
    k = PREFIX + b"mid"
    await _put(a, {k: b"0"})
    fired: list[int] = []
    ws = a.watch_set([k], [lambda: fired.append(1)])

    async def arm_after_a_write(tr):
        await tr.get(k)
        await _put(b, {k: b"1"})  # another handle commits after this transaction's read
        tr.arm(ws, [0])

    await a.transact(arm_after_a_write)
    for _ in range(50):
        if fired:
            break
        await asyncio.sleep(0.01)
    assert fired == [1]

    async def arm(tr):
        tr.arm(ws, [0])

    await a.transact(arm)  # reads "1": no change since
    await asyncio.sleep(0.1)
    assert fired == [1]
    ws.cancel()


async def test_a_watch_armed_at_the_version_of_the_check_that_fired_takes_the_value_it_read(pair):
    """A node re-arms a fired bell at the version of the check that fired it; the watch takes the value
    that check read instead of reading it again, so a write of that same value does not fire it and
    the next change does."""
    a, b = pair
    a.fallback_poll_secs = 30.0
    k = PREFIX + b"rearm"
    await _put(a, {k: b"0"})
    first = await _watch(a, k)
    await _put(b, {k: b"1"})
    await asyncio.wait_for(first.future, 2.0)
    version, values = a._checked_values
    assert values == {k: b"1"}
    again = await _watch(a, k)  # no commit since the check: the same version
    assert (again.version, again.value) == (version, b"1")
    await _put(b, {k: b"1"})  # the value it holds: no change
    await asyncio.sleep(0.2)
    assert not again.done()
    await _put(b, {k: b"2"})
    await asyncio.wait_for(again.future, 2.0)


async def test_a_watch_whose_awaiter_gives_up_is_unregistered(pair):
    """Cancelling the task that awaits a watch cancels its future behind the watch's back (a
    ``wait_for`` timeout): the watch must still leave the registry, or abandoned ones pile up."""
    a, _ = pair
    key = PREFIX + b"abandoned"
    await _put(a, {key: b"0"})
    for _ in range(3):
        w = await _watch(a, key)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(w, 0.01)
        await asyncio.sleep(0)  # the future's done-callbacks run
        assert w.future.cancelled()
    assert a._watch_count() == _counted(a) == 0
