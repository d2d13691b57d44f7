"""The checker on synthetic logs: each kind of fault is reported as exactly that fault."""

from __future__ import annotations

from upf_loadgen.checker import Published, Received, Violations, check_stream, check_topic


def pub(n: int, rejected: tuple[int, ...] = ()) -> Published:
    return Published(topic="t", sent=n, accepted={s: f"id{s}" for s in range(n) if s not in rejected})


def rec(seqs: list[int], sub: int = 0, ids: list[str] | None = None) -> Received:
    return Received(topic="t", sub=sub, seqs=seqs, ids=ids if ids is not None else [f"id{s}" for s in seqs])


def test_clean_log_passes() -> None:
    v = check_topic(pub(10), [rec(list(range(10)))])
    assert v.clean
    assert v.violations == Violations()
    assert v.delivered == 10 and v.accepted == 10 and v.subscribers == 1


def test_single_loss_in_the_middle_is_loss_and_one_gap() -> None:
    seqs = [s for s in range(10) if s != 4]
    v = check_topic(pub(10), [rec(seqs)])
    assert not v.clean
    assert v.violations == Violations(loss=1, gaps=1)
    assert v.gap_ranges == [(0, 4, 4)]
    assert v.tail_loss_from == []


def test_loss_at_the_tail_is_loss_but_not_a_gap() -> None:
    v = check_topic(pub(10), [rec(list(range(7)))])
    assert v.violations == Violations(loss=3)
    assert v.gap_ranges == []
    assert v.tail_loss_from == [(0, 7)]


def test_run_of_missing_seqs_is_one_gap() -> None:
    seqs = [0, 1, 2, 6, 7, 8, 9]
    v = check_topic(pub(10), [rec(seqs)])
    assert v.violations == Violations(loss=3, gaps=1)
    assert v.gap_ranges == [(0, 3, 5)]


def test_two_separate_holes_are_two_gaps() -> None:
    seqs = [0, 2, 3, 4, 7, 8, 9]
    v = check_topic(pub(10), [rec(seqs)])
    assert v.violations == Violations(loss=3, gaps=2)
    assert v.gap_ranges == [(0, 1, 1), (0, 5, 6)]


def test_duplicate_is_reported_and_not_counted_as_loss_or_order() -> None:
    seqs = [0, 1, 2, 3, 3, 4, 5]
    v = check_topic(pub(6), [rec(seqs)])
    assert v.violations == Violations(duplicates=1)
    assert v.duplicate_seqs == [(0, 3)]
    assert v.delivered == 6


def test_late_duplicate_of_an_old_seq_is_a_duplicate_not_out_of_order() -> None:
    v = check_topic(pub(5), [rec([0, 1, 2, 3, 4, 1])])
    assert v.violations == Violations(duplicates=1)


def test_swapped_pair_is_one_out_of_order() -> None:
    seqs = [0, 1, 3, 2, 4, 5]
    v = check_topic(pub(6), [rec(seqs)])
    assert v.violations == Violations(out_of_order=1)
    assert v.out_of_order_seqs == [(0, 2)]


def test_one_message_delayed_far_is_one_out_of_order_not_a_gap() -> None:
    seqs = [0, 2, 3, 4, 5, 6, 1]
    v = check_topic(pub(7), [rec(seqs)])
    assert v.violations == Violations(out_of_order=1)
    assert v.gap_ranges == []


def test_rejected_publish_not_delivered_is_not_loss() -> None:
    v = check_topic(pub(6, rejected=(2,)), [rec([0, 1, 3, 4, 5])])
    assert v.clean
    assert v.accepted == 5


def test_rejected_publish_that_was_delivered_anyway_is_not_a_violation() -> None:
    # a publish that timed out may still have committed; its delivery is allowed
    v = check_topic(pub(4, rejected=(2,)), [rec([0, 1, 2, 3])])
    assert v.clean


def test_rejected_seq_inside_a_hole_does_not_split_it() -> None:
    v = check_topic(pub(8, rejected=(3,)), [rec([0, 1, 5, 6, 7])])
    # 2 and 4 are lost, 3 was rejected: one hole spanning 2..4, two lost messages
    assert v.violations == Violations(loss=2, gaps=1)
    assert v.gap_ranges == [(0, 2, 4)]


def test_unknown_seq_is_unexpected() -> None:
    v = check_topic(pub(3), [rec([0, 1, 2, 99])])
    assert v.violations == Violations(unexpected=1)


def test_id_differing_from_publish_reply_is_reported() -> None:
    v = check_topic(pub(3), [rec([0, 1, 2], ids=["id0", "other", "id2"])])
    assert v.violations == Violations(id_mismatch=1)


def test_corrupt_and_foreign_frames_are_counted() -> None:
    r = Received(topic="t", seqs=[0, 1], ids=["id0", "id1"], corrupt=2, foreign=1)
    v = check_topic(pub(2), [r])
    assert v.violations == Violations(corrupt=2, unexpected=1)


def test_each_subscriber_is_checked_on_its_own() -> None:
    good = rec(list(range(5)), sub=0)
    lossy = rec([0, 1, 3, 4], sub=1)
    v = check_topic(pub(5), [good, lossy])
    assert v.subscribers == 2
    assert v.delivered == 9
    assert v.violations == Violations(loss=1, gaps=1)
    assert v.gap_ranges == [(1, 2, 2)]


def test_subscriber_that_received_nothing_loses_everything_as_tail() -> None:
    sc = check_stream(pub(4), rec([]))
    assert sc.violations == Violations(loss=4)
    assert sc.tail_loss_from == 0
