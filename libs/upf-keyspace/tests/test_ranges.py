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
    batch.add_all([], [point(k) for k in keys])
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
    batch.add_all([], [point(b"b"), (b"a", b"c")])
    s = batch.to_set()
    assert (s.begins, s.ends) == ([b"a"], [b"c"])


def test_stamped_keys_are_points_like_any_point_write():
    """The committer hands a transaction's stamped keys apart from its other writes: they enter the
    batch's write set exactly as the same keys written as points would, and a range stays a range."""
    stamped = [b"q2", b"q1"]
    writes = [point(b"s"), (b"r", b"t"), point(b"a")]
    one, each = BatchWrites(), BatchWrites()
    one.add_all(stamped, writes)
    each.add_all([], [point(k) for k in stamped] + writes)
    assert (one.points, one.ranges) == (each.points, each.ranges) == ([b"a", b"q1", b"q2", b"s"], [(b"r", b"t")])
    assert one.overlaps_any([(b"q1", b"q1\x00")]) and not one.overlaps_any([(b"b", b"c")])
