"""Disjoint sorted key intervals: the conflict-checking core shared by the embedded driver's
transaction (its reads) and committer (recent commits' writes)."""

from __future__ import annotations

import bisect
from collections.abc import Iterable

import msgspec


def point(key: bytes) -> tuple[bytes, bytes]:
    return key, key + b"\x00"


HEAD_BYTES = 8
"""A key's head is its first 8 bytes: under a tuple-layer root such as ("upf",) that is the root and a
short kind prefix ("C", "Q", "ST"), so commits of publishes and a subscriber's affinity read have
different heads. Any other keyspace is still answered right, only filtered less."""


def head_of(begin: bytes, end: bytes) -> bytes | None:
    """The head every key in [begin, end) shares, or None when they need not share one.

    If begin and end agree on their first HEAD_BYTES bytes, a key k with begin <= k < end agrees with
    them too (a shorter or different k sorts before begin or after end)."""
    h = begin[:HEAD_BYTES]
    return h if len(h) == HEAD_BYTES and end[:HEAD_BYTES] == h else None


_ENCODE = msgspec.msgpack.Encoder().encode
_DECODE = msgspec.msgpack.Decoder(tuple[list[bytes], list[bytes]]).decode
"""One decoder for the type, built once: ``msgspec.msgpack.decode(raw, type=...)`` builds the type's
converter on every call (~4 times the decode itself), and a pusher decodes each commit it reads back."""


class IntervalSet:
    """Half-open [begin, end) byte intervals, coalesced so that both begins and ends stay sorted."""

    __slots__ = ("begins", "ends")

    def __init__(self, ranges: Iterable[tuple[bytes, bytes]] = ()) -> None:
        merged: list[list[bytes]] = []
        for b, e in sorted(r for r in ranges if r[0] < r[1]):
            if merged and b <= merged[-1][1]:
                if e > merged[-1][1]:
                    merged[-1][1] = e
            else:
                merged.append([b, e])
        self.begins = [m[0] for m in merged]
        self.ends = [m[1] for m in merged]

    def __bool__(self) -> bool:
        return bool(self.begins)

    def overlaps(self, begin: bytes, end: bytes) -> bool:
        i = bisect.bisect_right(self.ends, begin)  # first interval whose end is past ``begin``
        return i < len(self.begins) and self.begins[i] < end

    def overlaps_any(self, ranges: Iterable[tuple[bytes, bytes]]) -> bool:
        return any(self.overlaps(b, e) for b, e in ranges)

    def heads(self) -> frozenset[bytes] | None:
        """The heads of every interval (see head_of), or None if some interval has none: what the
        write log's head tally keeps of a commit (not kept here: the cached write sets of 10,000
        subscribes would each carry a set).

        One bisect per distinct head, not a slice per interval: begins are sorted, so the intervals
        under one head are a run, and only the run's last end can leave the head (every earlier end
        lies between two begins under it)."""
        begins, ends = self.begins, self.ends
        found = []
        i, n = 0, len(begins)
        while i < n:
            h = begins[i][:HEAD_BYTES]
            if len(h) < HEAD_BYTES:
                return None
            stripped = h.rstrip(b"\xff")
            j = bisect.bisect_left(begins, stripped[:-1] + bytes((stripped[-1] + 1,)), i) if stripped else n
            if not ends[j - 1].startswith(h):
                return None
            found.append(h)
            i = j
        return frozenset(found)

    def encode(self) -> bytes:
        return _ENCODE([self.begins, self.ends])

    @classmethod
    def decode(cls, raw: bytes) -> IntervalSet:
        s = cls.__new__(cls)  # not __init__: the encoded intervals are coalesced already
        s.begins, s.ends = _DECODE(raw)
        return s


class BatchWrites:
    """Writes of the transactions accepted so far in one physical commit, checked against each later
    transaction's reads. Point writes stay in a sorted list, so the check is a bisect, not a rebuild."""

    __slots__ = ("points", "ranges")

    def __init__(self) -> None:
        self.points: list[bytes] = []
        self.ranges: list[tuple[bytes, bytes]] = []

    def add_all(self, keys: list[bytes], writes: list[tuple[bytes, bytes]]) -> None:
        """One transaction's writes, in one call: the single ``keys`` it stamped and its other
        ``writes`` (a point as a point, a wider interval as a range)."""
        points = self.points
        for k in keys:
            bisect.insort(points, k)
        for begin, end in writes:
            if end == begin + b"\x00":
                # Most points are written by many transactions of a batch (the stats slots): a
                # duplicate costs a bisect, not the move of the list's tail.
                i = bisect.bisect_left(points, begin)
                if i == len(points) or points[i] != begin:
                    points.insert(i, begin)
            else:
                self.ranges.append((begin, end))

    def overlaps_any(self, reads: Iterable[tuple[bytes, bytes]]) -> bool:
        points, ranges = self.points, self.ranges
        for b, e in reads:
            i = bisect.bisect_left(points, b)
            if i < len(points) and points[i] < e:
                return True
            if ranges and any(rb < e and b < re for rb, re in ranges):
                return True
        return False

    def to_set(self) -> IntervalSet:
        if self.ranges:
            return IntervalSet([(p, p + b"\x00") for p in self.points] + self.ranges)
        # Points only (a batch of publishes): already sorted, so skip the general sort and merge.
        # Adjacent points stay separate intervals; they are still disjoint and sorted, which is all
        # ``overlaps`` needs.
        s = IntervalSet()
        s.begins = list(dict.fromkeys(self.points))  # a stamped key can repeat a written point
        s.ends = [p + b"\x00" for p in s.begins]
        return s
