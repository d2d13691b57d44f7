"""Delivery correctness, decided from logs alone so it can be tested on synthetic data.

Each topic has one publisher sending seq 0,1,2,... and awaiting each publish, so the server's commit
order is seq order and every subscriber must see the accepted seqs exactly once, in increasing order.
Publishes that were rejected or failed may or may not have been committed, so their delivery is
neither required nor a violation.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import msgspec

__all__ = ["Published", "Received", "Violations", "TopicVerdict", "check_topic", "check_stream", "MAX_RANGES"]

MAX_RANGES = 10


class Published(msgspec.Struct, kw_only=True):
    """What the publisher of one topic did: seqs 0..sent-1 were attempted; ``accepted`` maps each
    seq that got a 200 to the message id in the reply (``""`` if the reply had none)."""

    topic: str
    sent: int
    accepted: dict[int, str]


class Received(msgspec.Struct, kw_only=True):
    """One subscriber's ``message`` frames in arrival order (seq and id), plus frames it could not use."""

    topic: str
    sub: int = 0
    seqs: Sequence[int]
    ids: Sequence[str] = ()
    corrupt: int = 0
    foreign: int = 0


class Violations(msgspec.Struct, kw_only=True):
    loss: int = 0
    """accepted seqs a subscriber never received"""
    duplicates: int = 0
    """extra copies of a seq already received"""
    out_of_order: int = 0
    """seqs that arrived after a higher seq"""
    gaps: int = 0
    """holes: runs of lost seqs followed by a later delivered seq (loss at the tail is not a gap)"""
    id_mismatch: int = 0
    """delivered id differs from the id the publish reply gave"""
    corrupt: int = 0
    """frames that did not decode or whose body differs from what was sent"""
    unexpected: int = 0
    """seqs never published, or messages for another topic"""

    def total(self) -> int:
        return (
            self.loss
            + self.duplicates
            + self.out_of_order
            + self.gaps
            + self.id_mismatch
            + self.corrupt
            + self.unexpected
        )

    def add(self, other: Violations) -> None:
        self.loss += other.loss
        self.duplicates += other.duplicates
        self.out_of_order += other.out_of_order
        self.gaps += other.gaps
        self.id_mismatch += other.id_mismatch
        self.corrupt += other.corrupt
        self.unexpected += other.unexpected


class TopicVerdict(msgspec.Struct, kw_only=True):
    topic: str
    clean: bool
    sent: int
    accepted: int
    subscribers: int
    delivered: int
    """first receipts of a seq, summed over subscribers"""
    violations: Violations
    gap_ranges: list[tuple[int, int, int]] = []
    """(subscriber, first seq, last seq) of the first few holes"""
    tail_loss_from: list[tuple[int, int]] = []
    """(subscriber, first lost seq) where delivery stopped before the end"""
    out_of_order_seqs: list[tuple[int, int]] = []
    """(subscriber, seq) of the first few late arrivals"""
    duplicate_seqs: list[tuple[int, int]] = []
    """(subscriber, seq) of the first few duplicates"""


class StreamCheck(msgspec.Struct, kw_only=True):
    violations: Violations
    delivered: int
    gap_ranges: list[tuple[int, int]]
    tail_loss_from: int | None
    out_of_order_seqs: list[int]
    duplicate_seqs: list[int]


def check_stream(pub: Published, rec: Received) -> StreamCheck:
    v = Violations(corrupt=rec.corrupt, unexpected=rec.foreign)
    ids: Sequence[str] = rec.ids if rec.ids else [""] * len(rec.seqs)
    seen: set[int] = set()
    high = -1
    ooo: list[int] = []
    dups: list[int] = []
    for seq, mid in zip(rec.seqs, ids, strict=True):
        if seq in seen:
            v.duplicates += 1
            if len(dups) < MAX_RANGES:
                dups.append(seq)
            continue
        seen.add(seq)
        if seq < 0 or seq >= pub.sent:
            v.unexpected += 1
            continue
        if seq < high:
            v.out_of_order += 1
            if len(ooo) < MAX_RANGES:
                ooo.append(seq)
        else:
            high = seq
        want = pub.accepted.get(seq)
        if want and mid and mid != want:
            v.id_mismatch += 1

    ranges: list[tuple[int, int]] = []
    tail_from: int | None = None
    run_start: int | None = None
    run_end = -1
    for seq in range(pub.sent):
        if seq not in pub.accepted:
            continue  # a rejected seq neither extends nor breaks a hole
        if seq in seen:
            if run_start is not None:
                v.gaps += 1
                if len(ranges) < MAX_RANGES:
                    ranges.append((run_start, run_end))
                run_start = None
            continue
        v.loss += 1
        if run_start is None:
            run_start = seq
        run_end = seq
    if run_start is not None:
        if run_start < high:
            # a later seq (one whose publish failed yet was delivered) arrived after the hole
            # started, so delivery went on past it: a hole, not a stalled tail
            v.gaps += 1
            if len(ranges) < MAX_RANGES:
                ranges.append((run_start, run_end))
        else:
            tail_from = run_start
    delivered = sum(1 for s in seen if 0 <= s < pub.sent)
    return StreamCheck(
        violations=v,
        delivered=delivered,
        gap_ranges=ranges,
        tail_loss_from=tail_from,
        out_of_order_seqs=ooo,
        duplicate_seqs=dups,
    )


def check_topic(pub: Published, received: Iterable[Received]) -> TopicVerdict:
    total = Violations()
    delivered = 0
    subs = 0
    gap_ranges: list[tuple[int, int, int]] = []
    tails: list[tuple[int, int]] = []
    ooo: list[tuple[int, int]] = []
    dups: list[tuple[int, int]] = []
    for rec in received:
        subs += 1
        sc = check_stream(pub, rec)
        total.add(sc.violations)
        delivered += sc.delivered
        gap_ranges.extend((rec.sub, a, b) for a, b in sc.gap_ranges)
        if sc.tail_loss_from is not None:
            tails.append((rec.sub, sc.tail_loss_from))
        ooo.extend((rec.sub, s) for s in sc.out_of_order_seqs)
        dups.extend((rec.sub, s) for s in sc.duplicate_seqs)
    return TopicVerdict(
        topic=pub.topic,
        clean=total.total() == 0,
        sent=pub.sent,
        accepted=len(pub.accepted),
        subscribers=subs,
        delivered=delivered,
        violations=total,
        gap_ranges=gap_ranges[:MAX_RANGES],
        tail_loss_from=tails[:MAX_RANGES],
        out_of_order_seqs=ooo[:MAX_RANGES],
        duplicate_seqs=dups[:MAX_RANGES],
    )
