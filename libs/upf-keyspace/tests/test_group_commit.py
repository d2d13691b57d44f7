"""The committer's gather: it sleeps for more transactions only while they stream in (some arrived
during the last commit, or it carried several), never for a lone client that awaits each commit in
turn, and not past the point where a closed loop of clients is all back and quiet."""

from __future__ import annotations

import asyncio
import threading

import pytest

from upf_keyspace import SettingsError
from upf_keyspace.drivers.embedded import committer, open_embedded


async def _put(db, key: bytes) -> None:
    async def body(tr):
        tr.set(key, b"1")

    await db.transact(body)


class _Recorder:
    """The committer's gather and commit, wrapped: each batch's size and each gather's sleep are
    recorded, the first commit is held until ``release`` is set, and ``sleeping`` is set once a gather
    sleeps. The tests make their stream with it (transactions queued behind the held commit), not by
    timing: under load, concurrent puts could commit one by one, and the window never opened."""

    def __init__(self, monkeypatch) -> None:
        self.sizes: list[int] = []
        self.waits: list[float] = []
        self.release = threading.Event()
        self.sleeping = threading.Event()
        real_gather = committer._Committer._gather
        real_apply = committer._Committer._apply_batch

        def gather(c, batch, wait):
            self.waits.append(wait)
            if wait:
                self.sleeping.set()
            return real_gather(c, batch, wait)

        def apply(c, f, txn, batch):  # inside the commit: what arrives now waits for the next one
            self.sizes.append(len(batch))
            if len(self.sizes) == 1:
                assert self.release.wait(10)
            return real_apply(c, f, txn, batch)

        monkeypatch.setattr(committer._Committer, "_gather", gather)
        monkeypatch.setattr(committer._Committer, "_apply_batch", apply)

    async def queue_behind_held(self, db, held: bytes, *queued: bytes) -> list[asyncio.Task[None]]:
        """Put ``held`` (its commit is held), then ``queued`` once it is, and wait until they are
        queued behind it; returns the puts' tasks (nothing commits before ``release``)."""
        tasks = [asyncio.create_task(_put(db, held))]
        while not self.sizes:
            await asyncio.sleep(0.001)
        tasks += [asyncio.create_task(_put(db, k)) for k in queued]
        while db._queue.qsize() < len(queued):
            await asyncio.sleep(0.001)
        return tasks

    async def gathering_first(self, db) -> list[asyncio.Task[None]]:
        """Put "first" behind a held commit (so the next batch is a stream's), release it, and return
        the puts' tasks once the committer has taken "first" and gathers."""
        puts = await self.queue_behind_held(db, b"held", b"first")
        self.release.set()
        assert await asyncio.to_thread(self.sleeping.wait, 10)
        return puts

    async def gathering_after_a_commit_of_two(self, db) -> asyncio.Task[None]:
        """Commit two transactions together (the count a quiet needs is two then), then put "x",
        which gathers (the stream goes on), and return its task once it sleeps."""
        puts = await self.queue_behind_held(db, b"held", b"b", b"c")
        self.release.set()
        await asyncio.gather(*puts)
        assert self.sizes[-1] == 2
        self.sleeping.clear()
        first = asyncio.create_task(_put(db, b"x"))
        assert await asyncio.to_thread(self.sleeping.wait, 10)
        return first


async def test_a_lone_sequential_client_never_waits(tmp_path, monkeypatch):
    waits: list[float] = []
    real = committer._Committer._gather
    monkeypatch.setattr(
        committer._Committer, "_gather", lambda self, batch, wait: waits.append(wait) or real(self, batch, wait)
    )
    db = await open_embedded(str(tmp_path / "s.db"))
    try:
        for i in range(20):
            await _put(db, b"k%d" % i)
    finally:
        await db.close()
    assert len(waits) == 20 and set(waits) == {0.0}


async def test_transactions_arriving_during_a_commit_make_the_next_batch_gather(tmp_path, monkeypatch):
    """A commit is held open while two more transactions arrive: the batch after it gathers (sleeps
    _GROUP_WAIT_SECS), takes both, and every transaction commits once. The batch after that one
    gathers too; once a batch of one finds nothing queued, the next does not."""
    monkeypatch.setattr(committer, "_GROUP_WAIT_SECS", 0.5)  # "d" surely arrives within it, even on a slow machine
    sizes, waits = await _held_stream(tmp_path, monkeypatch)
    assert sizes == [1, 2, 1, 1]
    assert waits == [0.0, 0.5, 0.5, 0.0]


async def test_a_setting_of_0_never_sleeps(tmp_path, monkeypatch):
    """UPF_EMBEDDED_COMMIT_WAIT_MS=0: a stream's commit takes what waits when it starts."""
    monkeypatch.setenv("UPF_EMBEDDED_COMMIT_WAIT_MS", "0")
    sizes, waits = await _held_stream(tmp_path, monkeypatch)
    assert sizes == [1, 2, 1, 1]
    assert waits == [0.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize(("ms", "secs"), [("", committer._GROUP_WAIT_SECS), (" 40 ", 0.04), ("100", 0.1)])
async def test_the_setting_replaces_the_default_sleep(tmp_path, monkeypatch, ms, secs):
    monkeypatch.setenv("UPF_EMBEDDED_COMMIT_WAIT_MS", ms)
    db = await open_embedded(str(tmp_path / "s.db"))
    try:
        assert db._group_wait == secs  # what its commit loop sleeps: the stream test above shows it used
        await _put(db, b"k")
    finally:
        await db.close()


@pytest.mark.parametrize("bad", ["lots", "-5", "1.5", "101", "9" * 30])
async def test_a_bad_setting_is_refused_at_open_with_its_name(tmp_path, monkeypatch, bad):
    monkeypatch.setenv("UPF_EMBEDDED_COMMIT_WAIT_MS", bad)
    with pytest.raises(SettingsError, match="UPF_EMBEDDED_COMMIT_WAIT_MS"):
        await open_embedded(str(tmp_path / "s.db"))
    assert not (tmp_path / "s.db").exists()  # refused before anything was made


async def _held_stream(tmp_path, monkeypatch) -> tuple[list[int], list[float]]:
    """The batch sizes and gather sleeps of: a commit held while two more arrive, then two puts in turn."""
    rec = _Recorder(monkeypatch)
    db = await open_embedded(str(tmp_path / "s.db"))
    try:
        puts = await rec.queue_behind_held(db, b"a", b"b", b"c")
        rec.release.set()
        await asyncio.gather(*puts)
        await _put(db, b"d")  # after a batch of two: still a stream, so it gathers
        await _put(db, b"e")  # after a batch of one with nothing queued: a lone client again

        async def read(tr):
            return await tr.get_range(b"a", b"f")

        assert [k for k, _ in await db.transact(read)] == [b"a", b"b", b"c", b"d", b"e"]
    finally:
        rec.release.set()
        await db.close()
    return rec.sizes, rec.waits


async def test_a_stream_that_pauses_longer_than_the_wait_ends(tmp_path, monkeypatch):
    """Concurrent transactions make a stream; the first one arriving after a pause longer than
    _GROUP_WAIT_SECS commits at once: the first publish after a quiet spell does not sleep. The
    stream is two transactions queued behind a held commit (committed together, so the stream goes
    on after them)."""
    rec = _Recorder(monkeypatch)
    monkeypatch.setattr(committer, "_GROUP_WAIT_SECS", 0.5)
    db = await open_embedded(str(tmp_path / "s.db"))
    try:
        puts = await rec.queue_behind_held(db, b"held", b"b", b"c")
        rec.release.set()
        await asyncio.gather(*puts)
        assert rec.sizes[-1] == 2 and rec.waits[-1] == 0.5  # gathered together: a batch of two, the stream goes on
        await asyncio.sleep(0.8)
        await _put(db, b"late")  # after a pause longer than the window: at once
    finally:
        rec.release.set()
        await db.close()
    assert rec.waits[-1] == 0.0


async def test_a_gather_ends_once_enough_transactions_wait(tmp_path, monkeypatch):
    """The gather's sleep ends when _GROUP_TARGET transactions are queued, not at its end: clients
    that each await their commit are not held for the whole window."""
    monkeypatch.setattr(committer, "_GROUP_WAIT_SECS", 30.0)
    monkeypatch.setattr(committer, "_QUIET_MIN_SECS", 30.0)  # only the count ends this gather
    rec = _Recorder(monkeypatch)
    db = await open_embedded(str(tmp_path / "s.db"))
    try:
        puts = await rec.gathering_first(db)
        more = (_put(db, b"m%d" % i) for i in range(committer._GROUP_TARGET))
        await asyncio.wait_for(asyncio.gather(*puts, *more), 15.0)  # well inside the 30 s window
    finally:
        rec.release.set()
        await db.close()
    assert rec.sizes[-1] == committer._GROUP_TARGET + 1


async def test_a_gather_ends_once_enough_mutations_wait_in_fewer_transactions(tmp_path, monkeypatch):
    """A batch of publishes is one transaction of many mutations: the sleep also ends once
    _GROUP_MUTATIONS of them wait, though fewer than _GROUP_TARGET transactions do."""
    monkeypatch.setattr(committer, "_GROUP_WAIT_SECS", 30.0)
    monkeypatch.setattr(committer, "_QUIET_MIN_SECS", 30.0)  # only the count ends this gather
    rec = _Recorder(monkeypatch)
    db = await open_embedded(str(tmp_path / "s.db"))

    async def big(n: int) -> None:
        async def body(tr):
            for i in range(committer._GROUP_MUTATIONS // 2):
                tr.set(b"big%d/%d" % (n, i), b"1")

        await db.transact(body)

    try:
        puts = await rec.gathering_first(db)
        await asyncio.wait_for(asyncio.gather(*puts, big(1), big(2)), 15.0)  # well inside the 30 s window
    finally:
        rec.release.set()
        await db.close()
    assert rec.sizes[-1] == 3 < committer._GROUP_TARGET


def test_a_gather_ends_after_a_silence_of_twice_its_longest_gap_and_never_below_the_floor():
    assert committer.quiet_secs(0.0) == committer._QUIET_MIN_SECS  # no gap seen: only the floor
    assert committer.quiet_secs(0.00001) == committer._QUIET_MIN_SECS  # a burst's gaps: the floor
    assert committer.quiet_secs(0.006) == pytest.approx(0.012)  # a stream that paused 6 ms while gathering


async def test_clients_that_each_await_their_commit_are_not_held_for_the_window(tmp_path, monkeypatch):
    """Two clients, each putting in turn (a closed loop): once both wait and the stream is quiet, the
    gather ends; with a 30 s window they would otherwise wait 30 s a put. The bound is far below that
    (10 puts each: 300 s) but not tight: on a loaded machine a scheduling pause between the two
    clients' puts is a gap like any other, and the quiet it sets (twice it, less 10% a gather) may
    hold the next gathers for seconds."""
    monkeypatch.setattr(committer, "_GROUP_WAIT_SECS", 30.0)
    waits: list[float] = []
    sizes: list[int] = []
    real_gather = committer._Committer._gather

    def gather(c, batch, wait):
        waits.append(wait)
        real_gather(c, batch, wait)
        sizes.append(len(batch))

    monkeypatch.setattr(committer._Committer, "_gather", gather)
    db = await open_embedded(str(tmp_path / "s.db"))

    async def client(name: bytes) -> None:
        for i in range(10):
            await _put(db, b"%s%d" % (name, i))

    try:
        await asyncio.wait_for(asyncio.gather(client(b"a"), client(b"b")), 60.0)  # two windows, not ten

        async def count(tr):
            return len(await tr.get_range(b"a", b"c"))

        assert await db.transact(count) == 20
    finally:
        await db.close()
    assert 30.0 in waits  # they gathered (a stream), and the quiet ended each gather
    assert sizes.count(2) >= 5  # mostly both clients in one commit


async def test_a_stream_that_keeps_arriving_within_the_quiet_keeps_gathering(tmp_path, monkeypatch):
    """Transactions arriving 0.1 s apart for 1 s, with a quiet of 0.5 s: the gather takes them all
    (the quiet counts from the last arrival, not from the gather's start), then ends 0.5 s after the
    last (twice its 0.1 s gaps is under that floor), not at its 30 s window."""
    monkeypatch.setattr(committer, "_GROUP_WAIT_SECS", 30.0)
    monkeypatch.setattr(committer, "_QUIET_MIN_SECS", 0.5)
    rec = _Recorder(monkeypatch)
    db = await open_embedded(str(tmp_path / "s.db"))
    try:
        puts = await rec.gathering_first(db)
        for i in range(10):
            await asyncio.sleep(0.1)
            puts.append(asyncio.create_task(_put(db, b"s%d" % i)))
        await asyncio.wait_for(asyncio.gather(*puts), 10.0)
    finally:
        rec.release.set()
        await db.close()
    assert rec.sizes[-1] == 11  # "first" and the ten that followed it, in one commit


async def test_a_quiet_does_not_end_a_gather_holding_fewer_than_the_last_commit(tmp_path, monkeypatch):
    """After a commit of four, a lone transaction that follows is not committed on the quiet alone: an
    open stream slower than its quiet still gathers (here until the 0.6 s window ends). Its commit of
    one lowers the count the next quiet needs by 10% only."""
    monkeypatch.setattr(committer, "_GROUP_WAIT_SECS", 0.6)
    rec = _Recorder(monkeypatch)
    db = await open_embedded(str(tmp_path / "s.db"))
    try:
        puts = await rec.queue_behind_held(db, b"held", b"b", b"c", b"d", b"e")
        rec.release.set()
        await asyncio.gather(*puts)
        assert rec.sizes[-1] == 4  # the four queued behind the held commit, together
        loop = asyncio.get_running_loop()
        began = loop.time()
        await _put(db, b"lone")  # a stream still (the last batch had four): it gathers
        took = loop.time() - began
        bar = db._bar
    finally:
        rec.release.set()
        await db.close()
    assert rec.sizes[-1] == 1 and rec.waits[-1] == 0.6
    assert took >= 0.5  # the window, not the 1 ms quiet
    assert bar == pytest.approx(4 * committer._BAR_DECAY)  # the commit of one lowers the bar by 10%, not to 1


async def test_the_arrival_that_completes_the_last_commits_count_wakes_the_gather(tmp_path, monkeypatch):
    """After a commit of two, a gather holding one sleeps until a second arrives; that arrival wakes it
    (the submit sets the event), and the quiet that follows ends it: both commit together well inside
    the 30 s window."""
    monkeypatch.setattr(committer, "_GROUP_WAIT_SECS", 30.0)
    rec = _Recorder(monkeypatch)
    db = await open_embedded(str(tmp_path / "s.db"))
    try:
        first = await rec.gathering_after_a_commit_of_two(db)
        await asyncio.sleep(0.1)
        await asyncio.wait_for(asyncio.gather(first, _put(db, b"y")), 10.0)
    finally:
        rec.release.set()
        await db.close()
    assert rec.sizes[-1] == 2 and rec.waits[-1] == 30.0


async def test_a_pause_seen_while_gathering_sets_the_quiet_above_it(tmp_path, monkeypatch):
    """After a commit of two, "x" gathers; "y" comes 0.2 s later (a gap of 0.2 s seen while gathering:
    the quiet becomes 0.4 s, not the 0.05 s floor), and "z" 0.25 s after "y" still joins them: a
    stream that pauses between clumps is not taken for clients that are all back."""
    monkeypatch.setattr(committer, "_GROUP_WAIT_SECS", 30.0)
    monkeypatch.setattr(committer, "_QUIET_MIN_SECS", 0.05)
    rec = _Recorder(monkeypatch)
    db = await open_embedded(str(tmp_path / "s.db"))
    try:
        tasks = [await rec.gathering_after_a_commit_of_two(db)]
        await asyncio.sleep(0.2)
        tasks.append(asyncio.create_task(_put(db, b"y")))
        await asyncio.sleep(0.25)
        tasks.append(asyncio.create_task(_put(db, b"z")))
        await asyncio.wait_for(asyncio.gather(*tasks), 10.0)
    finally:
        rec.release.set()
        await db.close()
    assert rec.sizes[-1] == 3


async def test_a_slow_commit_is_not_a_gap_of_the_gather_after_it(tmp_path, monkeypatch):
    """ "y" is queued during a slow commit of two (0.5 s) and gathers once it ends; "z" (the other
    client, back from that commit) completes the count at once. The 0.5 s between "y" and "z" is the
    commit's, not a pause of the stream: the quiet stays at its floor, not at twice 0.5 s."""
    monkeypatch.setattr(committer, "_GROUP_WAIT_SECS", 30.0)
    rec = _Recorder(monkeypatch)
    db = await open_embedded(str(tmp_path / "s.db"))
    gate, committing = threading.Event(), threading.Event()
    inner = committer._Committer._apply_batch

    def held(c, f, txn, batch):
        committing.set()
        assert gate.wait(10)
        return inner(c, f, txn, batch)

    loop = asyncio.get_running_loop()
    try:
        x = await rec.gathering_after_a_commit_of_two(db)
        monkeypatch.setattr(committer._Committer, "_apply_batch", held)
        x2 = asyncio.create_task(_put(db, b"x2"))  # completes the count: [x, x2] commits, held
        assert await asyncio.to_thread(committing.wait, 10)
        y = asyncio.create_task(_put(db, b"y"))
        while db._queue.qsize() < 1:
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.5)  # the slow commit
        rec.sleeping.clear()
        gate.set()
        await asyncio.gather(x, x2)
        assert await asyncio.to_thread(rec.sleeping.wait, 10)  # "y" gathers: the commit carried two
        began = loop.time()
        await asyncio.wait_for(asyncio.gather(y, _put(db, b"z")), 10.0)
        took = loop.time() - began
    finally:
        rec.release.set()
        gate.set()
        await db.close()
    assert rec.sizes[-2:] == [2, 2] and rec.waits[-1] == 30.0
    assert took < 0.5  # timed from "y": 1 s and more
