"""The scheduled-message releaser every pusher runs: when a scheduled message is due, move it into Q
(``Store.release_due``: one transaction, so exactly once however many pushers race for it, and a
releaser killed mid-way changed nothing). The move pokes the topic's holders like a publish, so the
delivering pusher hears of it through its bell, whichever node released it.

Between looks a releaser sleeps until the earliest due time, or until a scheduling rings the schedule
bell it watches (one might be due sooner), and at most ``poll_secs``: the backstop for a missed bell.
So an idle node takes no wake-up for it.

``next_sleep`` is the pure part: how long to wait before looking again.
"""

from __future__ import annotations

import asyncio
import logging
import time

from upf_keyspace import Store, Watch

__all__ = ["RELEASE_BATCH", "next_sleep", "release_loop", "release_once"]

log = logging.getLogger("upf.pusher.release")

RELEASE_BATCH = 100
"""Messages moved per transaction (each is a Q, X, SR and maybe IN write: far below the size limits)."""


def next_sleep(now: float, due: int | None, poll_secs: float) -> float:
    """Seconds until the next look: at the earliest due time, but at least every ``poll_secs`` (a message
    scheduled meanwhile may be due sooner) and never a busy loop."""
    if due is None:
        return poll_secs
    return max(0.01, min(poll_secs, due - now))


async def release_once(store: Store, now: float) -> int:
    """Release everything due at ``now``, batch by batch, until a batch finds nothing; how many messages
    were moved. Not until a short batch: a batch ends early before a message it must not release in
    the same transaction (``ops.schedule.release_due``)."""
    moved = 0
    while n := await store.release_due(now, RELEASE_BATCH):
        moved += n
    return moved


async def release_loop(store: Store, poll_secs: float, node: str) -> None:
    while True:
        sleep = poll_secs
        watch: Watch | None = None
        try:
            now = time.time()
            due, watch = await store.watch_due()
            if due is not None and due <= now:
                watch.cancel()
                watch = None
                moved = await release_once(store, now)
                if moved:
                    log.info("scheduled messages released", extra={"node": node, "released": moved})
                due, watch = await store.watch_due()
            sleep = next_sleep(time.time(), due, poll_secs)
        except asyncio.CancelledError:
            if watch is not None:
                watch.cancel()
            raise
        except Exception:
            log.warning("scheduled release failed", extra={"node": node}, exc_info=True)
            sleep = min(sleep, 1.0)
        if watch is None:
            await asyncio.sleep(sleep)
        else:
            await _wait(watch, sleep, node)


async def _wait(watch: Watch, secs: float, node: str) -> None:
    """Until the schedule bell rings or ``secs`` pass. A watch that fails (a store error, a watch
    limit) ends the wait without ending the loop, which then polls as it did before the bell."""
    waiter = asyncio.ensure_future(watch)
    try:
        await asyncio.wait((waiter,), timeout=secs)
    finally:
        waiter.cancel()
        watch.cancel()
    if waiter.done() and not waiter.cancelled() and waiter.exception() is not None:
        log.warning("schedule watch failed", extra={"node": node}, exc_info=waiter.exception())
        await asyncio.sleep(min(secs, 1.0))
