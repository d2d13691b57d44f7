"""The write log's head tally: it may only say "nothing under this head changed" for versions it
has all seen, in whatever order they arrived."""

from __future__ import annotations

from upf_keyspace.drivers._ranges import IntervalSet, point
from upf_keyspace.drivers.embedded import writelog
from upf_keyspace.drivers.embedded.writelog import _HeadTally

A = b"\x02upf\x00\x02C\x00"  # a head: 8 bytes
B = b"\x02upf\x00\x02Q\x00"


def _tally() -> _HeadTally:
    """A tally some range-cache hit has asked already (a fresh one tallies nothing: see below)."""
    t = _HeadTally()
    t.wanted = True
    return t


def _set(*keys: bytes) -> IntervalSet:
    return IntervalSet([point(k) for k in keys])


def test_quiet_only_over_an_unbroken_run_of_tallied_versions():
    t = _tally()
    assert not t.quiet(A, 0, 1)  # nothing tallied
    t.add(10, _set(B + b"x"))
    t.add(12, _set(B + b"y"))  # 11 is missing (another process's commit, not read back yet)
    assert t.quiet(A, 9, 10)
    assert not t.quiet(A, 9, 12)  # 11 unseen: it might have written under A
    assert not t.quiet(A, 8, 10)  # 9 came before the run started
    t.add(11, _set(A + b"t1"))
    assert t.upto == 12
    assert not t.quiet(A, 10, 12)
    assert t.quiet(A, 11, 12)
    assert t.quiet(B + b"", 12, 12)


def test_a_write_spanning_heads_makes_every_head_unquiet():
    t = _tally()
    t.add(1, _set(B + b"x"))
    t.add(2, IntervalSet([(b"\x02upf\x00\x02A", b"\x02upf\x00\x02Z")]))
    assert not t.quiet(A, 1, 2)
    assert t.quiet(A, 2, 2)


def test_heads_past_the_cap_count_as_wide(monkeypatch):
    monkeypatch.setattr(writelog, "_HEADS_KEPT", 2)
    t = _tally()
    t.add(1, _set(b"head-001x", b"head-002x"))
    t.add(2, _set(b"head-003x"))  # not kept: counts as a wide write
    assert not t.quiet(b"head-001", 1, 2)
    t.add(3, _set(b"head-002x"))
    assert not t.quiet(b"head-001", 1, 3)
    assert t.quiet(b"head-001", 2, 3)  # 3 wrote only head-002


def test_short_keys_have_no_head():
    t = _tally()
    t.add(1, _set(b"abc"))  # shorter than a head: could sort into any range
    assert not t.quiet(A, 0, 1)


def test_heads_found_by_runs_equal_head_of_every_interval():
    """IntervalSet.heads bisects once per head; it must say what head_of over each interval says,
    also around 0x00/0xff bytes and for ranges that leave their head."""
    import random

    from upf_keyspace.drivers._ranges import head_of

    rng = random.Random(7)
    for _ in range(3000):
        ranges = []
        for _ in range(rng.randint(0, 12)):
            a = bytes(rng.choice(b"\x00\x01\xfe\xff") for _ in range(rng.randint(5, 11)))
            b = bytes(rng.choice(b"\x00\x01\xfe\xff") for _ in range(rng.randint(5, 11)))
            ranges.append(point(a) if rng.random() < 0.6 else (min(a, b), max(a, b)))
        s = IntervalSet(ranges)
        each = {head_of(b, e) for b, e in zip(s.begins, s.ends, strict=True)}
        assert s.heads() == (None if None in each else frozenset(each)), ranges


def test_a_gap_that_never_fills_restarts_the_run_past_it(monkeypatch):
    """Another process's commit never read back must not keep the tally from answering (nor grow its
    memory) for good: past _EARLY_KEPT later versions the run restarts after them."""
    monkeypatch.setattr(writelog, "_EARLY_KEPT", 4)
    t = _tally()
    t.add(1, _set(B + b"x"))
    for v in range(3, 9):  # 2 is never tallied
        t.add(v, _set(B + b"x"))
    assert len(t._early) <= 4
    assert not t.quiet(A, 1, 8)  # 2 unseen, still unknown
    t.add(9, _set(B + b"y"))
    t.add(10, _set(B + b"y"))
    assert t.quiet(A, t.start, t.upto) and t.upto >= 9


def test_a_tally_nobody_asked_tallies_nothing_and_the_first_question_starts_it():
    """A process whose range cache never hits (a pusher) pays nothing per commit; the first
    ``quiet`` answers False and starts the tally, which then answers from the next unbroken run."""
    t = _HeadTally()
    t.add(1, _set(B + b"x"))
    assert t.upto == -1 and not t.last  # nothing tallied
    assert not t.quiet(A, 1, 1)  # the first question: not known, and the tally starts
    assert t.wanted
    t.add(3, _set(B + b"y"))  # 2 was skipped (it raced the start): the run begins after it
    assert not t.quiet(A, 1, 3)
    assert t.quiet(A, 2, 3)
    t.add(4, _set(A + b"z"))
    assert not t.quiet(A, 3, 4)
