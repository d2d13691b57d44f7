"""The releaser's pure part: when to look for due scheduled messages next."""

from __future__ import annotations

import asyncio
import time

import pytest

from upf_pusher.release import RELEASE_BATCH, next_sleep, release_loop, release_once


def test_sleeps_until_the_earliest_due_time_but_polls_at_least_every_poll_secs():
    assert next_sleep(100.0, None, 1.0) == 1.0  # nothing scheduled
    assert next_sleep(100.0, 100, 1.0) == 0.01  # due now: never a busy loop
    assert next_sleep(100.2, 101, 1.0) == pytest.approx(0.8)
    assert next_sleep(100.0, 500, 1.0) == 1.0  # far off: something sooner may be scheduled meanwhile


class _FailingWatch:
    """A watch the store cannot keep (FoundationDB's watch limit, a store error): it fails at once."""

    def __await__(self):  # type: ignore[no-untyped-def]
        async def fail() -> None:
            raise RuntimeError("too many watches")

        return fail().__await__()

    def cancel(self) -> None:
        pass

    def done(self) -> bool:
        return True


class _Store:
    def __init__(self) -> None:
        self.looks = 0
        self.due: int | None = None
        self.released = 0

    async def watch_due(self):  # type: ignore[no-untyped-def]
        self.looks += 1
        return self.due, _FailingWatch()

    async def release_due(self, now: float, limit: int) -> int:
        if self.due is not None and self.due <= now:
            self.due = None
            self.released += 1
            return 1
        return 0


async def test_a_failing_watch_degrades_to_a_one_second_poll_and_never_ends_the_loop():
    store = _Store()
    task = asyncio.create_task(release_loop(store, 60.0, "n1"))  # type: ignore[arg-type]
    try:
        await asyncio.sleep(0.05)
        store.due = int(time.time())
        for _ in range(300):
            if store.released:
                break
            await asyncio.sleep(0.01)
        assert store.released == 1 and not task.done()
        assert store.looks <= 4  # a failed watch costs a second of sleep, not a busy loop
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_release_once_goes_on_past_a_short_batch_until_one_finds_nothing():
    """A batch may end early, before a message it must not release in the same transaction (a Web
    Push Topic release of a topic the batch already wrote): the releaser takes the next batch at once
    rather than waiting for its next look."""
    batches = [3, 1, 2, 0]
    asked: list[int] = []

    class Batches:
        async def release_due(self, now: float, limit: int) -> int:
            asked.append(limit)
            return batches.pop(0)

    assert await release_once(Batches(), 100.0) == 6  # type: ignore[arg-type]
    assert asked == [RELEASE_BATCH] * 4
