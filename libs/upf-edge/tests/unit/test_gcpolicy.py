"""settle_gc: what startup left is frozen and the thresholds raised, or nothing changes under UPF_GC_TUNE=0."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from upf_edge.gcpolicy import GC_THRESHOLDS, settle_gc


@pytest.fixture
def restore_gc() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


@pytest.mark.usefixtures("restore_gc")
def test_settle_gc_freezes_startup_objects_and_raises_the_thresholds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("UPF_GC_TUNE", raising=False)
    survivor = {"a startup object": [1, 2, 3]}
    assert settle_gc() is True
    assert gc.get_threshold() == GC_THRESHOLDS
    assert gc.get_freeze_count() > 0
    # Frozen objects are in no generation any collection walks.
    assert not any(o is survivor for o in gc.get_objects())
    assert GC_THRESHOLDS[0] > 700  # above CPython's default, or the policy changes nothing


@pytest.mark.usefixtures("restore_gc")
def test_settle_gc_off_keeps_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UPF_GC_TUNE", "0")
    gc.unfreeze()
    before = gc.get_threshold()
    assert settle_gc() is False
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


@pytest.mark.usefixtures("restore_gc")
def test_cycles_are_still_collected_after_settling(monkeypatch: pytest.MonkeyPatch) -> None:
    """A higher threshold delays young collections; it must not stop them."""
    monkeypatch.delenv("UPF_GC_TUNE", raising=False)
    settle_gc()

    class Node:
        pass

    a, b = Node(), Node()
    a.peer, b.peer = b, a  # type: ignore[attr-defined]
    ref = weakref.ref(a)
    del a, b
    assert ref() is not None  # no collection yet: the cycle waits for the next one
    junk = [[] for _ in range(GC_THRESHOLDS[0] + 10)]  # net container allocations past the gen0 threshold
    del junk
    assert ref() is None
