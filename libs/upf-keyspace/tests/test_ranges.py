"""The conflict-checking intervals: the points-only fast path of a batch's write set answers every
overlap question exactly as the general, coalesced set does."""

from __future__ import annotations

import random

from upf_keyspace.drivers._ranges import BatchWrites, IntervalSet, point


def test_points_only_write_set_agrees_with_the_general_set():
    rnd = random.Random(7)
    keys = [bytes(rnd.randrange(4) for _ in range(rnd.randrange(1, 4))) for _ in range(200)]
    keys += [keys[0], keys[1] + b"\x00"]  # a duplicate and an adjacent point
    batch = BatchWrites()
    for k in keys:
        batch.add(*point(k))
    fast = batch.to_set()
    general = IntervalSet([point(k) for k in keys])
    probes = [
        tuple(sorted((bytes(rnd.randrange(4) for _ in range(3)), bytes(rnd.randrange(4) for _ in range(2)))))
        for _ in range(2000)
    ]
    probes += [point(k) for k in keys] + [(k, k + b"\x00\x00") for k in keys]
    for b, e in probes:
        if b >= e:
            continue  # an empty range is never read (get_range returns early)
        assert fast.overlaps(b, e) == general.overlaps(b, e), (b, e)
    assert fast.begins == sorted(set(keys))
    decoded = IntervalSet.decode(fast.encode())
    assert (decoded.begins, decoded.ends) == (fast.begins, fast.ends)


def test_write_set_with_ranges_takes_the_general_path():
    batch = BatchWrites()
    batch.add(*point(b"b"))
    batch.add(b"a", b"c")
    s = batch.to_set()
    assert (s.begins, s.ends) == ([b"a"], [b"c"])


def test_add_all_is_add_for_each_write():
    """The committer's one call per transaction keeps the same write set as a call per write: the
    stamped keys as points, a point write as a point, a range as a range."""
    stamped = [b"q2", b"q1"]
    writes = [point(b"s"), (b"r", b"t"), point(b"a")]
    one, each = BatchWrites(), BatchWrites()
    one.add_all(stamped, writes)
    for k in stamped:
        each.add(*point(k))
    for b, e in writes:
        each.add(b, e)
    assert (one.points, one.ranges) == (each.points, each.ranges) == ([b"a", b"q1", b"q2", b"s"], [(b"r", b"t")])
    assert one.overlaps_any([(b"q1", b"q1\x00")]) and not one.overlaps_any([(b"b", b"c")])
