"""The only store-facing code of the pusher: sessions per topic, bells, drains, safety poll, keepalive
sweep, heartbeat and affinity.

The design's pusher, exactly:
- Exactly K bell loops per node (K = UPF_SHARD_COUNT), however many connections: each drains its
  shard's inbox (which re-arms the bell watch in the same transaction), drains every local subscriber
  of each poked topic, then waits on the bell with a timeout.
- Q is the only source of truth. Every connect drains from its cursor; a periodic safety poll
  re-drains every live connection, so a lost poke or a stale affinity costs latency, never a message.
- Affinity is per (topic, node): held while at least one local subscriber (of any transport) has the
  topic, released when the last leaves, with per-topic sequencing against a subscriber arriving while
  the release is in flight.

Overload contract: a drain issues at most one read per (connection, topic) at a time (the session
coalesces pokes), never reads for a paused connection, and the safety poll runs its drains in chunks
of ``SAFETY_CHUNK``, yielding to the loop between chunks; so the work in flight is bounded by the
connections that are writable and the pokes that arrived, never by the backlog in Q.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine, Iterable
from typing import TYPE_CHECKING, Any

from upf_keyspace import Settings, Since, Store, Watch

from .session import Close, Command, Read, Send, SessionConfig

if TYPE_CHECKING:
    from .transports import Subscriber

__all__ = ["Hub", "READ_BATCH", "SAFETY_CHUNK"]

log = logging.getLogger("upf.pusher.hub")

READ_BATCH = 32
"""Messages per store read: bounds what one connection may hold beyond its write buffer's high mark."""
SAFETY_CHUNK = 64
"""Connections drained concurrently by the safety poll before it yields."""
SWEEP_YIELD_EVERY = 512
HOLD_CHUNK = 256
_MAX_BELL_WAIT = 60.0


class Hub:
    def __init__(self, settings: Settings, store: Store) -> None:
        self.settings = settings
        self.store = store
        self.node = settings.node_id
        self.config = SessionConfig(batch=READ_BATCH, slow_after=settings.slow_subscriber_timeout_secs)
        self.subs: set[Subscriber] = set()
        """Every attached subscriber (streams and polls), for the sweep, the safety poll and shutdown."""
        self.by_topic: dict[str, set[Subscriber]] = {}
        """Streaming subscribers per topic: the topics this node holds."""
        self._subscribing: set[Subscriber] = set()
        self._affinity: dict[str, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loops: list[asyncio.Task[None]] = []
        self._closing = False
        self.drain_errors = 0

    # --- lifecycle ----------------------------------------------------------------------------------
    async def start(self) -> None:
        """Register liveness, then start the K bell loops, the safety poll, the sweep and the heartbeat."""
        try:
            await self.store.heartbeat(self.node, int(time.time()))
        except Exception:
            log.warning("first heartbeat failed", extra={"node": self.node}, exc_info=True)
        loops: list[Coroutine[Any, Any, None]] = [self._bell_loop(s) for s in range(self.settings.shard_count)]
        loops += [self._safety_loop(), self._sweep_loop(), self._heartbeat_loop()]
        self._loops = [asyncio.create_task(c) for c in loops]

    async def stop(self) -> None:
        """Close every subscriber cleanly, stop the loops, and release this node's affinity."""
        self._closing = True
        held = set(self.by_topic) | set(self._affinity)
        for sub in list(self.subs):
            self.run(sub, sub.session.shutdown())
        for t in self._loops:
            t.cancel()
        pending = list(self._tasks) + list(self._affinity.values())
        for t in pending:
            t.cancel()
        await asyncio.gather(*self._loops, *pending, return_exceptions=True)
        self._loops = []
        topics = sorted(held)
        try:
            for i in range(0, len(topics), HOLD_CHUNK):
                await asyncio.wait_for(self.store.release(topics[i : i + HOLD_CHUNK], self.node), 5.0)
        except Exception:
            log.warning("release on shutdown failed", extra={"node": self.node, "topics": len(topics)}, exc_info=True)

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # --- subscribers --------------------------------------------------------------------------------
    def attach(self, sub: Subscriber, since: Since) -> None:
        """Register ``sub`` locally (so no poke is missed), then resolve its cursors in the store."""
        self.subs.add(sub)
        self._subscribing.add(sub)
        if not sub.session.poll:
            for t in sub.session.topics:
                self.by_topic.setdefault(t, set()).add(sub)
        self._spawn(self._subscribe(sub, since))

    async def _subscribe(self, sub: Subscriber, since: Since) -> None:
        session = sub.session
        topics = list(session.topics)
        try:
            if session.poll:
                cursors = await self.store.positions(topics, since)
            else:
                cursors = await self.store.subscribe(topics, self.node, since)
        except asyncio.CancelledError:
            self._subscribing.discard(sub)
            raise
        except Exception:
            log.warning("subscribe failed", extra={"topics": session.topics_raw}, exc_info=True)
            self._subscribing.discard(sub)
            if not session.closed:
                sub.fail(503, 50301, "service unavailable: the store did not answer")
                session.peer_closed()
            self._forget(sub)
            return
        self._subscribing.discard(sub)
        if session.closed:  # the peer left while the store was resolving
            self._forget(sub)
            return
        sub.accept()
        self.run(sub, session.subscribed(cursors, time.time()))

    def detach(self, sub: Subscriber) -> None:
        """The connection is gone (peer, close or abort)."""
        sub.session.peer_closed()
        if sub in self._subscribing:
            return  # _subscribe forgets it once the store answered, so affinity is not released early
        self._forget(sub)

    def _forget(self, sub: Subscriber) -> None:
        if sub not in self.subs:
            return
        self.subs.discard(sub)
        if sub.session.poll:
            return
        for t in sub.session.topics:
            subs = self.by_topic.get(t)
            if subs is None:
                continue
            subs.discard(sub)
            if not subs:
                del self.by_topic[t]
                self._affinity_changed(t)

    def write_paused(self, sub: Subscriber) -> None:
        self.run(sub, sub.session.write_paused(time.time()))

    def write_resumed(self, sub: Subscriber) -> None:
        self.run(sub, sub.session.write_resumed())

    # --- commands -----------------------------------------------------------------------------------
    def run(self, sub: Subscriber, commands: Iterable[Command]) -> None:
        """Carry out a session's commands in order; reads run as short-lived tasks."""
        for cmd in commands:
            if type(cmd) is Send:
                sub.send(cmd.messages)
            elif type(cmd) is Read:
                self._spawn(self._read(sub, cmd))
            elif type(cmd) is Close:
                sub.close(cmd.reason)

    async def run_and_wait(self, sub: Subscriber, commands: Iterable[Command]) -> None:
        """Like ``run``, but wait for the reads (and the reads they lead to) to finish."""
        reads: list[Read] = []
        for cmd in commands:
            if type(cmd) is Read:
                reads.append(cmd)
            else:
                self.run(sub, (cmd,))
        if reads:
            await asyncio.gather(*(self._read(sub, r) for r in reads))

    async def _read(self, sub: Subscriber, cmd: Read | None) -> None:
        """Drain one (connection, topic) from its cursor, batch after batch, until the session stops asking."""
        session = sub.session
        while cmd is not None:
            try:
                rows = await self.store.read_after(cmd.topic, cmd.after, cmd.limit)
            except asyncio.CancelledError:
                raise
            except Exception:
                self.drain_errors += 1
                log.warning("drain read failed", extra={"topic": cmd.topic}, exc_info=True)
                self.run(sub, session.read_failed(cmd.topic))
                return
            nxt: Read | None = None
            for c in session.batch_read(cmd.topic, rows):
                if type(c) is Read and nxt is None:
                    nxt = c
                else:
                    self.run(sub, (c,))
            cmd = nxt

    # --- pokes --------------------------------------------------------------------------------------
    def poke_topic(self, topic: str) -> None:
        subs = self.by_topic.get(topic)
        if subs:
            for sub in list(subs):
                self.run(sub, sub.session.poke(topic))

    async def _bell_loop(self, shard: int) -> None:
        timeout = min(self.settings.safety_poll_secs, _MAX_BELL_WAIT)
        backoff = 0.05
        while True:
            try:
                d = await self.store.drain_inbox(self.node, shard)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("inbox drain failed", extra={"node": self.node, "shard": shard}, exc_info=True)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            backoff = 0.05
            for topic in d.topics:
                self.poke_topic(topic)
            if d.more:
                d.bell.cancel()
                continue
            await _wait_watch(d.bell, timeout)

    # --- periodic work ------------------------------------------------------------------------------
    async def safety_pass(self) -> None:
        """Re-drain every live connection, in chunks, yielding between them."""
        subs = [s for s in self.subs if not s.session.poll]
        for i in range(0, len(subs), SAFETY_CHUNK):
            chunk = [s for s in subs[i : i + SAFETY_CHUNK] if not s.session.closed]
            if chunk:
                await asyncio.gather(*(self.run_and_wait(s, s.session.poke_all()) for s in chunk))
            await asyncio.sleep(0)

    async def _safety_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.safety_poll_secs)
            try:
                await self.safety_pass()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("safety poll failed", exc_info=True)

    async def sweep(self, now: float, *, keepalive: bool) -> None:
        """Tick every session: keepalives when due, and close the ones paused too long."""
        for i, sub in enumerate(list(self.subs)):
            self.run(sub, sub.session.tick(now, keepalive=keepalive))
            if i % SWEEP_YIELD_EVERY == SWEEP_YIELD_EVERY - 1:
                await asyncio.sleep(0)

    async def _sweep_loop(self) -> None:
        ka = self.settings.keepalive_secs
        interval = max(0.02, min(ka, self.settings.slow_subscriber_timeout_secs / 4))
        next_keepalive = time.monotonic() + ka
        while True:
            await asyncio.sleep(interval)
            mono = time.monotonic()
            due = mono >= next_keepalive - interval / 10
            if due:
                next_keepalive = max(next_keepalive + ka, mono + ka / 2)
            try:
                await self.sweep(time.time(), keepalive=due)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("sweep failed", exc_info=True)

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.heartbeat_secs)
            try:
                existed = await self.store.heartbeat(self.node, int(time.time()))
                if not existed:
                    log.warning("node was swept as dead; holding topics again", extra={"node": self.node})
                    await self.rehold()
                    await self.safety_pass()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("heartbeat failed", extra={"node": self.node}, exc_info=True)

    async def rehold(self) -> None:
        topics = sorted(self.by_topic)
        for i in range(0, len(topics), HOLD_CHUNK):
            await self.store.hold(topics[i : i + HOLD_CHUNK], self.node)

    # --- affinity -----------------------------------------------------------------------------------
    def _affinity_changed(self, topic: str) -> None:
        if self._closing or topic in self._affinity:
            return  # a running worker re-checks the topic before it finishes
        task = asyncio.get_running_loop().create_task(self._affinity_worker(topic))
        self._affinity[topic] = task

    async def _affinity_worker(self, topic: str) -> None:
        """Bring the store's affinity for ``topic`` in line with whether it has local subscribers,
        one operation at a time, until it stays in line (a subscriber may arrive mid-release)."""
        applied = True
        failures = 0
        try:
            while not self._closing:
                want = topic in self.by_topic
                if want == applied:
                    return
                try:
                    if want:
                        await self.store.hold([topic], self.node)
                    else:
                        await self.store.release([topic], self.node)
                    applied = want
                except asyncio.CancelledError:
                    raise
                except Exception:
                    failures += 1
                    log.warning("affinity update failed", extra={"topic": topic, "hold": want}, exc_info=True)
                    if failures >= 5:
                        return  # stale affinity only costs pokes; the heartbeat's re-hold covers a lost hold
                    await asyncio.sleep(0.1 * 2**failures)
        finally:
            self._affinity.pop(topic, None)

    # --- diagnostics --------------------------------------------------------------------------------
    def stats(self) -> dict[str, int]:
        return {
            "connections": len(self.subs),
            "topics": len(self.by_topic),
            "tasks": len(self._tasks),
            "drain_errors": self.drain_errors,
        }


async def _wait_watch(bell: Watch, timeout: float) -> None:
    """Wait for a bell with a timeout (a watch is never awaited without one), then drop it."""
    try:
        await asyncio.wait_for(_as_awaitable(bell), timeout)
    except TimeoutError:
        pass
    except asyncio.CancelledError:
        bell.cancel()
        raise
    except Exception:
        log.warning("bell watch failed", exc_info=True)
        await asyncio.sleep(0.05)  # never spin on a failing watch
    finally:
        if not bell.done():
            bell.cancel()


async def _as_awaitable(bell: Watch) -> None:
    await bell
