"""Grouped transactions (``Database.transact_grouped``): the contract on every driver, the embedded
driver's run inside its group commit, and the loop-turn grouping FoundationDB's driver uses (run
here over the embedded driver's ``transact``, the only one this machine has)."""

from __future__ import annotations

import asyncio
import contextlib

import lmdb
import pytest

from upf_keyspace import StoreError, errors
from upf_keyspace.contract import VALUE_LIMIT
from upf_keyspace.drivers._turns import TURN_MAX, TurnGroups
from upf_keyspace.drivers.embedded import open_embedded
from upf_keyspace.drivers.embedded.mutations import KEY_LIMIT_LMDB


async def put_all(tr, items, *, prefix):
    """Each item is (name, value): set it, answer the commit stamp and the name."""
    stamp = tr.get_versionstamp()
    for name, value in items:
        tr.set(prefix + name.encode(), value)
    return [(stamp, name) for name, _ in items]


async def copy_then_mark(tr, items, *, prefix):
    """Read each item's source key, then write it under the item's name (reads before writes)."""
    found = [await tr.get(prefix + src.encode()) for src, _ in items]
    for (_, dst), value in zip(items, found, strict=True):
        tr.set(prefix + dst.encode(), value or b"none")
    return found


@contextlib.contextmanager
def commits_held(db):
    """Hold the file's write lock (as another process's commit would): the group commit takes what
    waits, then waits for the lock; once it has it, it takes what arrived meanwhile too."""
    txn = db._reader.env.begin(write=True)
    try:
        yield
    finally:
        txn.abort()


async def read(db, key):
    async def body(tr):
        return await tr.get(key)

    return await db.transact(body)


# --- the contract ----------------------------------------------------------------------------------


async def test_grouped_items_get_their_own_answers_in_order(db, prefix):
    got = await asyncio.gather(*(db.transact_grouped(put_all, (f"k{i}", b"%d" % i), prefix=prefix) for i in range(5)))
    assert [name for _, name in got] == [f"k{i}" for i in range(5)]
    stamps = [await stamp for stamp, _ in got]
    assert all(len(s) == 10 for s in stamps)
    for i in range(5):
        assert await read(db, prefix + b"k%d" % i) == b"%d" % i


async def test_a_refused_item_fails_alone(db, prefix):
    """A value over the limit refuses the whole group before its commit: each item then runs alone,
    so only the bad one fails (with the limit's code) and the others are stored."""
    got = await asyncio.gather(
        *(db.transact_grouped(put_all, (f"r{i}", b"x" * (200_000 if i == 2 else 10)), prefix=prefix) for i in range(5)),
        return_exceptions=True,
    )
    assert isinstance(got[2], StoreError) and got[2].code == 2103
    for i in (0, 1, 3, 4):
        assert await read(db, prefix + b"r%d" % i) == b"x" * 10
    assert await read(db, prefix + b"r2") is None


async def stamp_all(tr, items, *, prefix):
    """Each item is (name, how): a versionstamped key and a versionstamped value under its name, well
    formed (``how`` "ok"), a key shorter than 14 bytes ("short"), a key with its offset past it
    ("past"), or a value too short for a stamp ("value")."""
    stamp = tr.get_versionstamp()
    for name, how in items:
        uv = tr.next_user_version().to_bytes(2, "big")
        head = prefix + b"vs/" + name.encode() + b"\x00"
        off = len(head) if how != "past" else len(head) + 5
        key = b"short" if how == "short" else head + b"\xff" * 10 + uv + off.to_bytes(4, "little")
        tr.set_versionstamped_key(key, b"by key")
        value = b"short" if how == "value" else b"\xff" * 10 + uv + b"\x00\x00\x00\x00"
        tr.set_versionstamped_value(prefix + b"vv/" + name.encode(), value)
    return [(stamp, name) for name, _ in items]


async def test_grouped_stamped_writes_carry_the_commit_stamp_and_a_malformed_one_fails_alone(db, prefix):
    """A grouped transaction's versionstamped keys and values get its commit's 10 bytes and each
    write's user version; a key or value too short for a stamp, or a key whose offset points past it,
    is refused with 2000 before the commit, and only that item fails."""
    got = await asyncio.gather(
        *(
            db.transact_grouped(stamp_all, (f"s{i}", how), prefix=prefix)
            for i, how in enumerate(("ok", "short", "ok", "past", "value"))
        ),
        return_exceptions=True,
    )
    for i in (1, 3, 4):
        assert isinstance(got[i], StoreError) and got[i].code == 2000

    async def stored(i):
        async def body(tr):
            keyed = await tr.get_range(prefix + b"vs/s%d\x00" % i, prefix + b"vs/s%d\x01" % i)
            return keyed, await tr.get(prefix + b"vv/s%d" % i)

        return await db.transact(body)

    for i in (0, 2):
        stamp = await got[i][0]
        keyed, value = await stored(i)
        assert len(keyed) == 1 and keyed[0][1] == b"by key"
        assert keyed[0][0][-12:-2] == stamp and value is not None and value[:10] == stamp
        assert keyed[0][0][-2:] == value[10:12]  # one user version for the item's two writes
    for i in (1, 3, 4):
        assert await stored(i) == ([], None)  # nothing of a refused item is stored


async def test_grouped_reads_see_what_committed_before(db, prefix):
    async def seed(tr):
        tr.set(prefix + b"src", b"seeded")

    await db.transact(seed)
    assert await db.transact_grouped(copy_then_mark, ("src", "dst"), prefix=prefix) == b"seeded"
    assert await read(db, prefix + b"dst") == b"seeded"


# --- the embedded driver: inside the group commit --------------------------------------------------


@pytest.fixture
async def edb(tmp_path):
    database = await open_embedded(str(tmp_path / "store.db"))
    yield database
    await database.close()


async def test_items_waiting_for_one_commit_share_one_transaction(edb):
    with commits_held(edb):
        first = asyncio.create_task(edb.transact_grouped(put_all, ("a", b"1"), prefix=b"p/"))
        await asyncio.sleep(0.05)  # taken alone by the idle group commit, which now waits for the lock
        rest = asyncio.gather(*(edb.transact_grouped(put_all, (f"b{i}", b"2"), prefix=b"p/") for i in range(4)))
        other = asyncio.create_task(edb.transact_grouped(put_all, ("c", b"3"), prefix=b"q/"))  # other arguments
        await asyncio.sleep(0.05)
    one = await first
    group = await rest
    alone = await other
    stamps = [await one[0], *[await s for s, _ in group], await alone[0]]
    assert len(set(stamps[:5])) == 1  # the first and those that came while it waited for the lock: one group
    assert stamps[-1] != stamps[0] and stamps[0][:8] == stamps[-1][:8]  # q/'s own group, in the same commit


async def stamp_sized(tr, items, *, extra):
    """Each item is (name, what): a versionstamped key ("key") or value ("value") whose stamped form
    is exactly the driver's limit (LMDB's for a key), plus ``extra`` bytes."""
    for name, what in items:
        uv = tr.next_user_version().to_bytes(2, "big")
        if what == "key":
            head = b"s/" + name.encode() + b"\x00"
            head += b"p" * (KEY_LIMIT_LMDB - 12 - len(head) + extra)
            tr.set_versionstamped_key(head + b"\xff" * 10 + uv + len(head).to_bytes(4, "little"), b"v")
        else:
            tail = b"t" * (VALUE_LIMIT - 12 + extra)
            tr.set_versionstamped_value(b"s/" + name.encode(), b"\xff" * 10 + uv + tail + b"\x00\x00\x00\x00")
    return [name for name, _ in items]


@pytest.mark.parametrize("what, code", [("key", errors.KEY_TOO_LARGE), ("value", errors.VALUE_TOO_LARGE)])
async def test_a_stamped_write_at_the_limit_is_stored_and_one_byte_over_fails_alone(edb, what, code):
    """The group commit sizes a stamped write by its stamped form (the offset dropped), which may be
    exactly the limit (LMDB's 511 bytes for a key); one byte more refuses that item alone, with the
    limit's code."""
    at, over = await asyncio.gather(
        edb.transact_grouped(stamp_sized, (f"{what}-at", what), extra=0),
        edb.transact_grouped(stamp_sized, (f"{what}-over", what), extra=1),
        return_exceptions=True,
    )
    assert at == f"{what}-at"
    assert isinstance(over, StoreError) and over.code == code

    async def stored(tr):
        return await tr.get_range(b"s/", b"s0")

    rows = await edb.transact(stored)
    assert len(rows) == 1  # the item at the limit, nothing of the refused one
    k, v = rows[0]
    assert (len(k), len(v)) == ((KEY_LIMIT_LMDB, 1) if what == "key" else (len(f"s/{what}-at"), VALUE_LIMIT))


async def test_a_stamped_write_past_the_transaction_limit_fails_its_item_alone(edb):
    """Stamped values that together pass the transaction's byte limit refuse the item that wrote
    them (2101), as a plain write's would; a small item grouped with it is stored."""

    async def many(tr, items):
        for name, count in items:
            for i in range(count):
                uv = tr.next_user_version().to_bytes(2, "big")
                value = b"\xff" * 10 + uv + b"t" * 90_000 + b"\x00\x00\x00\x00"
                tr.set_versionstamped_value(b"m/" + name.encode() + b"/%03d" % i, value)
        return [name for name, _ in items]

    big, small = await asyncio.gather(
        edb.transact_grouped(many, ("big", 120)), edb.transact_grouped(many, ("small", 1)), return_exceptions=True
    )
    assert isinstance(big, StoreError) and big.code == errors.TRANSACTION_TOO_LARGE
    assert small == "small"

    async def names(tr):
        return [k for k, _ in await tr.get_range(b"m/", b"m0")]

    assert await edb.transact(names) == [b"m/small/000"]


async def test_a_grouped_read_sees_the_same_commits_earlier_transactions(edb):
    """Grouped items run after the batch's other transactions, in its write transaction: their
    reads see those writes, and their stamps order after them."""

    async def seed(tr):
        tr.set(b"p/src", b"from the batch")
        return tr.get_versionstamp()

    with commits_held(edb):
        first = asyncio.create_task(edb.transact_grouped(put_all, ("a", b"1"), prefix=b"p/"))
        await asyncio.sleep(0.05)
        seeded = asyncio.create_task(edb.transact(seed))
        copied = asyncio.create_task(edb.transact_grouped(copy_then_mark, ("src", "dst"), prefix=b"p/"))
        await asyncio.sleep(0.05)
    await first
    seed_stamp = await (await seeded)
    assert await copied == b"from the batch"
    assert await read(edb, b"p/dst") == b"from the batch"
    assert (await read(edb, b"p/src")) == b"from the batch" and len(seed_stamp) == 10


async def test_a_read_after_a_write_or_a_suspension_is_refused_and_fails_only_its_item(edb):
    async def read_after_write(tr, items):
        tr.set(b"p/w", b"1")
        await tr.get(b"p/w")
        return items

    async def suspends(tr, items):
        await asyncio.sleep(0)
        return items

    async def raises(tr, items):
        raise ValueError("a bug")

    with commits_held(edb):
        first = asyncio.create_task(edb.transact_grouped(put_all, ("a", b"1"), prefix=b"p/"))
        await asyncio.sleep(0.05)
        got = asyncio.gather(
            edb.transact_grouped(read_after_write, 1),
            edb.transact_grouped(suspends, 2),
            edb.transact_grouped(raises, 3),
            edb.transact_grouped(put_all, ("ok", b"stored"), prefix=b"p/"),
            return_exceptions=True,
        )
        await asyncio.sleep(0.05)
    await first
    answers = await got
    assert isinstance(answers[0], StoreError) and answers[0].code == 2000
    assert isinstance(answers[1], StoreError) and answers[1].code == 2000
    assert isinstance(answers[2], ValueError)
    assert answers[3][1] == "ok" and await read(edb, b"p/ok") == b"stored"
    assert await read(edb, b"p/w") is None


async def put_or_raise(tr, items, *, prefix):
    """``put_all`` for (name, value) items, but a value None is a bug: it raises ValueError."""
    out = []
    for name, value in items:
        if value is None:
            raise ValueError("one item's bug")
        tr.set(prefix + name.encode(), value)
        out.append(name)
    return out


async def test_one_items_bug_fails_that_item_not_the_others_grouped_with_it(edb):
    """A grouped function raising something other than a refusal (a bug on one item's input) ran
    before the commit, so nothing of it was applied: each item runs alone, and only the bad one fails
    (before, every item of the group got the bug's exception and none was stored)."""
    with commits_held(edb):
        first = asyncio.create_task(edb.transact_grouped(put_all, ("first", b"1"), prefix=b"g/"))
        await asyncio.sleep(0.05)
        got = asyncio.gather(
            *(edb.transact_grouped(put_or_raise, (f"n{i}", None if i == 2 else b"v"), prefix=b"g/") for i in range(5)),
            return_exceptions=True,
        )
        await asyncio.sleep(0.05)
    await first
    answers = await got
    assert isinstance(answers[2], ValueError) and [a for i, a in enumerate(answers) if i != 2] == [
        "n0",
        "n1",
        "n3",
        "n4",
    ]
    assert [await read(edb, b"g/n%d" % i) for i in range(5)] == [b"v", b"v", None, b"v", b"v"]


async def test_a_commit_after_close_began_is_refused_not_left_waiting(tmp_path):
    """``close`` stops the committer behind a marker: a transaction that commits after it began (one
    backing off, say) is refused at once (before, it waited forever)."""
    db = await open_embedded(str(tmp_path / "store.db"))
    tr = db.create_transaction()
    tr.set(b"k", b"v")
    closing = asyncio.create_task(db.close())
    await asyncio.sleep(0)  # close has begun: it awaits the committer's exit
    with pytest.raises(StoreError) as err:
        await asyncio.wait_for(tr.commit(), 2.0)
    assert err.value.code == errors.CLIENT_INVALID_OPERATION
    await closing


async def test_unhashable_arguments_fail_at_the_caller_not_in_the_group_commit(edb):
    """The arguments name the group: a list cannot, and the caller learns it before anything is
    handed over; the next grouped call still commits."""
    with pytest.raises(TypeError):
        await edb.transact_grouped(put_all, ("a", b"1"), prefix=[b"p/"])
    await edb.transact_grouped(put_all, ("b", b"2"), prefix=b"p/")
    assert await read(edb, b"p/b") == b"2"


async def test_watches_see_grouped_writes_in_this_process_and_another(tmp_path):
    """A grouped write reaches the write log like any other: a watch on its key fires in the
    process that wrote it and in another one on the file (a pusher's bell)."""
    path = str(tmp_path / "store.db")
    a, b = await open_embedded(path), await open_embedded(path)
    try:

        async def watch(tr):
            return tr.watch(b"p/bell")

        here, there = await a.transact(watch), await b.transact(watch)
        await a.transact_grouped(put_all, ("bell", b"rung"), prefix=b"p/")
        await asyncio.wait_for(asyncio.gather(here, there), 5)
    finally:
        await a.close()
        await b.close()


async def test_a_failed_commit_fails_its_grouped_items(tmp_path, monkeypatch):
    """The store refusing the commit (full) fails every grouped item of it, with STORAGE_FULL."""
    monkeypatch.setenv("UPF_EMBEDDED_MAX_BYTES", str(256 << 10))
    monkeypatch.setattr(errors, "STORAGE", errors.StorageHealth())  # not this process's health for 10 s
    db = await open_embedded(str(tmp_path / "store.db"))
    try:
        failed: list[tuple[str, BaseException]] = []
        for i in range(200):
            names = [f"f{i}-{j}" for j in range(8)]
            got = await asyncio.gather(
                *(db.transact_grouped(put_all, (n, b"z" * 4000), prefix=b"p/") for n in names),
                return_exceptions=True,
            )
            failed = [(n, a) for n, a in zip(names, got, strict=True) if isinstance(a, BaseException)]
            if failed:
                break
        assert failed and all(isinstance(a, StoreError) and a.storage_full for _, a in failed)
        assert [await read(db, b"p/" + n.encode()) for n, _ in failed] == [None] * len(failed)
    finally:
        await db.close()


@pytest.mark.parametrize("grouped", [False, True])
async def test_a_write_the_file_refuses_fails_its_transaction_alone(edb, monkeypatch, grouped):
    """A physical commit that fails for one transaction's writes (a write LMDB refuses, injected
    here) is committed again one transaction a commit: the others sharing it are stored on their
    first attempt, and only the bad one fails (retryably, as a failed commit always did)."""
    from upf_keyspace.drivers.embedded import mutations

    real_flush = mutations._Applier.flush

    def flush(applier):  # type: ignore[no-untyped-def]
        if any(k.startswith(b"p/poison") for k in applier.writes):
            raise lmdb.BadValsizeError("injected: a write the file refuses")
        return real_flush(applier)

    monkeypatch.setattr(mutations._Applier, "flush", flush)
    attempts: dict[str, int] = {}

    async def counted_put(tr, items, *, prefix):  # type: ignore[no-untyped-def]
        for name, _ in items:
            attempts[name] = attempts.get(name, 0) + 1
        return await put_all(tr, items, prefix=prefix)

    def start(name: str) -> asyncio.Task:  # type: ignore[type-arg]
        item = (name, b"v")
        if grouped:
            return asyncio.create_task(edb.transact_grouped(counted_put, item, prefix=b"p/"))
        return asyncio.create_task(edb.transact(counted_put, [item], prefix=b"p/"))

    with commits_held(edb):  # all of them wait for the same commit
        good = [start(f"good{i}") for i in range(6)]
        poison = start("poison")
        await asyncio.sleep(0.1)
    done = await asyncio.wait_for(asyncio.gather(*good), timeout=10)
    assert len(done) == 6
    for i in range(6):
        assert await read(edb, b"p/good%d" % i) == b"v"
        # Stored on the first attempt, never retried with the bad one: a transaction's body ran once
        # (the committer applies its writes again); a grouped function runs inside each commit, so
        # once in the group that failed and once alone.
        assert attempts[f"good{i}"] == (2 if grouped else 1)
    assert not poison.done() or isinstance(poison.exception(), StoreError)
    poison.cancel()
    with contextlib.suppress(asyncio.CancelledError, StoreError):
        await poison
    assert await read(edb, b"p/poison") is None


# --- the loop-turn grouping (FoundationDB's driver) ------------------------------------------------


@pytest.fixture
async def turns(edb):
    groups = TurnGroups(edb.transact)
    yield groups
    await groups.close()


async def test_items_of_one_turn_share_a_transaction_while_one_is_in_flight(turns):
    """The first item, with nothing in flight, runs alone; the turn's others share one transaction,
    each answered in order."""
    got = await asyncio.gather(*(turns.run(put_all, (f"k{i}", b"v"), {"prefix": b"t/"}) for i in range(6)))
    stamps = [await stamp for stamp, _ in got]
    assert [name for _, name in got] == [f"k{i}" for i in range(6)]
    assert stamps[0] != stamps[1] and len(set(stamps[1:])) == 1


async def test_a_turn_group_is_bounded_and_a_refused_item_fails_alone(turns):
    n = TURN_MAX + 11  # the first alone, then TURN_MAX, then 10
    got = await asyncio.gather(*(turns.run(put_all, (f"n{i}", b"v"), {"prefix": b"t/"}) for i in range(n)))
    stamps = [await stamp for stamp, _ in got]
    assert [stamps.count(s) for s in sorted(set(stamps))] == [1, TURN_MAX, 10]
    bad = await asyncio.gather(
        *(turns.run(put_all, (f"b{i}", b"x" * (200_000 if i == 2 else 1)), {"prefix": b"t/"}) for i in range(4)),
        return_exceptions=True,
    )
    assert isinstance(bad[2], StoreError) and [type(r) for i, r in enumerate(bad) if i != 2] == [tuple] * 3


async def test_one_items_bug_in_a_turn_group_fails_that_item_alone(turns, edb):
    """As in the group commit: a bug on one item's input fails that item, the others of its turn are
    run alone and stored."""
    got = await asyncio.gather(
        *(turns.run(put_or_raise, (f"u{i}", None if i == 3 else b"v"), {"prefix": b"u/"}) for i in range(5)),
        return_exceptions=True,
    )
    assert isinstance(got[3], ValueError) and [g for i, g in enumerate(got) if i != 3] == ["u0", "u1", "u2", "u4"]
    assert [await read(edb, b"u/u%d" % i) for i in range(5)] == [b"v", b"v", b"v", None, b"v"]


async def test_a_leader_cancelled_while_it_gathers_leaves_the_others_to_commit(turns, edb):
    first = asyncio.create_task(turns.run(put_all, ("in flight", b"1"), {"prefix": b"c/"}))
    await asyncio.sleep(0)  # it runs up to its commit: a transaction is in flight
    leader = asyncio.create_task(turns.run(put_all, ("leader", b"1"), {"prefix": b"c/"}))
    follower = asyncio.create_task(turns.run(put_all, ("follower", b"1"), {"prefix": b"c/"}))
    await asyncio.sleep(0)  # the leader yields for one turn, the follower joins it
    assert sum(len(v) for v in turns._open.values()) == 1
    leader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leader
    await asyncio.wait_for(asyncio.gather(first, follower), 5)
    assert [await read(edb, b"c/" + k) for k in (b"in flight", b"leader", b"follower")] == [b"1", None, b"1"]
