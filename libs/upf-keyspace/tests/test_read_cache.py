"""Reads that avoid the file: a small range result is reused only while no commit (of this handle
or another) wrote into it, and a reused read still conflicts like any other."""

from __future__ import annotations

KEY = b"\x01test-other/bell"


async def _set(db, value: bytes) -> None:
    async def body(tr):
        tr.set(KEY, value)

    await db.transact(body)


async def _write(db, fn) -> None:
    async def body(tr):
        fn(tr)

    await db.transact(body)


async def _rows(db, begin: bytes, end: bytes):
    async def body(tr):
        return await tr.get_range(begin, end)

    return await db.transact(body)


async def test_cached_small_range_sees_commits_of_this_and_other_handles(pair):
    """A small range result is reused only while no commit wrote into it: a write by this handle or
    by another (not in this handle's memory: its write set comes from the file's log) is seen."""
    a, b = pair
    begin, end = b"\x01test-cache/", b"\x01test-cache0"
    assert await _rows(a, begin, end) == []
    assert await _rows(a, begin, end) == []  # now from the cache
    assert (begin, end, 0, False) in a._range_cache
    await _set(b, b"unrelated")  # a commit elsewhere that leaves the range alone
    assert await _rows(a, begin, end) == []

    async def put(tr, k, v):
        tr.set(k, v)

    await b.transact(put, begin + b"x", b"1")
    assert await _rows(a, begin, end) == [(begin + b"x", b"1")]
    await a.transact(put, begin + b"y", b"2")
    assert await _rows(a, begin, end) == [(begin + b"x", b"1"), (begin + b"y", b"2")]


async def test_cached_read_still_conflicts(pair):
    """A transaction whose range read came from the cache still fails (and retries) if another
    commit wrote into the range after its snapshot: the read is recorded as before."""
    a, b = pair
    begin, end = b"\x01test-cache/", b"\x01test-cache0"
    await _rows(a, begin, end)  # cached
    attempts = []

    async def body(tr):
        rows = await tr.get_range(begin, end)
        attempts.append(len(rows))
        if len(attempts) == 1:

            async def sneak(tr2):
                tr2.set(begin + b"z", b"!")

            await b.transact(sneak)
        tr.set(begin + b"count", str(len(rows)).encode())

    await a.transact(body)
    assert attempts == [0, 1]
    assert (begin + b"count", b"1") in await _rows(a, begin, end)


async def test_only_small_range_results_are_kept(pair):
    a, _ = pair
    begin, end = b"\x01test-big/", b"\x01test-big0"

    async def put(tr):
        tr.set(begin + b"a", b"x" * 2000)

    await a.transact(put)
    assert await _rows(a, begin, end) == [(begin + b"a", b"x" * 2000)]
    assert (begin, end, 0, False) not in a._range_cache


class _CountingReads:
    """Counts the handle's range reads from the file."""

    def __init__(self, db, monkeypatch) -> None:
        self.n = 0
        real = db._read_range

        def counted(*args):
            self.n += 1
            return real(*args)

        monkeypatch.setattr(db, "_read_range", counted)


async def test_a_cached_range_many_commits_old_is_read_again_not_scanned(pair, monkeypatch):
    """Checking a cached range against every commit since it was cached costs more than one read
    once many commits passed: when the head tally cannot rule them out (here they write under the
    range's head), past _RANGE_CACHE_SCAN commits the range is read from the file, and the answer is
    the same."""
    from upf_keyspace.drivers.embedded import reads

    a, _ = pair
    begin, end = b"\x01test-stale/", b"\x01test-stale0"
    assert await _rows(a, begin, end) == []
    for i in range(reads._RANGE_CACHE_SCAN + 2):
        await _write(a, lambda tr, i=i: tr.set(b"\x01test-stale-%d" % i, b""))  # same head, not in the range
    scanned: list[tuple[int, int]] = []
    real = a._changed_since
    monkeypatch.setattr(a, "_changed_since", lambda lo, hi, ranges: scanned.append((lo, hi)) or real(lo, hi, ranges))
    reads_ = _CountingReads(a, monkeypatch)
    assert await _rows(a, begin, end) == []
    assert not [s for s in scanned if s[1] - s[0] > reads._RANGE_CACHE_SCAN]
    assert reads_.n == 1


async def test_commits_under_other_heads_keep_the_cached_range_without_a_read(pair, monkeypatch):
    """A publish's affinity read at 1,000 topics round-robin: many commits since the topic's last
    publish, none under the range's head, are ruled out by the head tally and the file is not read;
    a few commits under the same head but outside the range are bisected and passed too."""
    a, _ = pair
    begin, end = b"\x01test-head/C/t1/", b"\x01test-head/C/t10"
    assert await _rows(a, begin, end) == []
    await _set(a, b"warm")
    assert await _rows(a, begin, end) == []  # the first hit asks the tally, which starts counting then
    for i in range(40):
        await _set(a, b"%d" % i)  # KEY's head differs from the range's
    reads_ = _CountingReads(a, monkeypatch)
    assert await _rows(a, begin, end) == []
    assert reads_.n == 0
    await _write(a, lambda tr: tr.set(b"\x01test-head/C/t2/n", b""))  # same head, another topic
    assert await _rows(a, begin, end) == []
    assert reads_.n == 0


async def test_a_write_into_the_range_or_a_wide_clear_after_many_commits_is_seen(pair):
    """The heads only rule commits out: a commit that wrote into the range, or cleared a span wider
    than one head (no heads to rule it out), is checked and seen, however many commits came before."""
    a, b = pair
    begin, end = b"\x01test-head/C/t1/", b"\x01test-head/C/t10"
    assert await _rows(a, begin, end) == []
    await _set(a, b"warm")
    assert await _rows(a, begin, end) == []  # the first hit asks the tally, which starts counting then
    for i in range(40):
        await _set(a, b"%d" % i)
    await _write(a, lambda tr: tr.set(begin + b"n1", b"1"))
    assert await _rows(a, begin, end) == [(begin + b"n1", b"1")]
    for i in range(40):
        await _set(a, b"%d" % i)
    assert await _rows(a, begin, end) == [(begin + b"n1", b"1")]  # cached again
    await _write(a, lambda tr: tr.clear_range(b"\x01test-", b"\x01test-i"))
    assert await _rows(a, begin, end) == []
    await _write(b, lambda tr: tr.set(begin + b"n2", b"2"))  # another handle: not in a's memory
    assert await _rows(a, begin, end) == [(begin + b"n2", b"2")]


async def test_reads_with_a_large_limit_are_not_kept(pair):
    """A drain's read (a limit above what the cache keeps) moves on to a later start key and is never
    asked again: keeping it would only push the small reads that are asked again out of the cache."""
    from upf_keyspace.drivers.embedded.reads import _RANGE_CACHE_ROWS

    a, _ = pair
    begin, end = b"\x01test-drain/", b"\x01test-drain0"

    async def read(tr, limit):
        return await tr.get_range(begin, end, limit=limit)

    assert await a.transact(read, _RANGE_CACHE_ROWS + 1) == []
    assert (begin, end, _RANGE_CACHE_ROWS + 1, False) not in a._range_cache
    assert await a.transact(read, _RANGE_CACHE_ROWS) == []
    assert (begin, end, _RANGE_CACHE_ROWS, False) in a._range_cache


async def test_get_ranges_with_limits_skip_the_cache(pair):
    """A pusher's read of a connection's many topics asks for a row or two of each (a shared batch):
    ranges with a limit start past their last answer next time, so they go to the file in one pass
    and leave the cache to the unlimited ones (a publish's affinity reads), which it still holds."""
    a, b = pair
    ranges = [(b"\x01test-q%03d/" % i, b"\x01test-q%03d0" % i, 1) for i in range(8)]

    async def put(tr, k, v):
        tr.set(k, v)

    await b.transact(put, ranges[3][0] + b"m1", b"1")
    await b.transact(put, ranges[3][0] + b"m2", b"2")

    async def read(tr, rs):
        return await tr.get_ranges(rs)

    got = await a.transact(read, ranges)
    assert got == [[]] * 3 + [[(ranges[3][0] + b"m1", b"1")]] + [[]] * 4  # the limit still holds
    assert not any((begin, end, 1, False) in a._range_cache for begin, end, _ in ranges)
    unlimited = [(begin, end, 0) for begin, end, _ in ranges[:2]]
    assert await a.transact(read, unlimited) == [[], []]
    assert all((begin, end, 0, False) in a._range_cache for begin, end, _ in unlimited)
