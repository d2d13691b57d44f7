"""The only store-facing code of the pusher: sessions per topic, bells, drains, safety poll, keepalive
sweep, heartbeat and affinity.

The design's pusher, exactly:
- Exactly K bell watches per node (K = UPF_SHARD_COUNT), however many connections, and one bell loop:
  a wake-up drains every rung shard's inbox in one transaction (which re-arms their watches), pokes
  every local subscriber of each poked topic, and the read round that follows reads each
  (topic, cursor) once for all the connections at it, several topics per transaction, then writes
  once per connection, each message framed once per frame kind.
- Q is the only source of truth. Every connect drains from its cursor; a periodic safety poll
  re-drains every live connection, so a lost poke or a stale affinity costs latency, never a message.
- Affinity is per (topic, node): held while at least one local subscriber (of any transport) has the
  topic, released when the last leaves, with per-topic sequencing against a subscriber arriving while
  the release is in flight.

Overload contract: a drain issues at most one read per (connection, topic) at a time (the session
coalesces pokes), never reads for a paused connection, and the safety poll pokes ``SAFETY_CHUNK``
connections at a time, waiting for their read round and yielding to the loop between chunks; so the
work in flight is bounded by the connections that are writable and the pokes that arrived, never by
the backlog in Q.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Coroutine, Iterable
from typing import TYPE_CHECKING, Any

from upf_edge.errors import Problem
from upf_edge.gate import Credential
from upf_keyspace import Settings, Since, Store, Stored, StoreError, message_from_envelope
from upf_keyspace import telemetry as tm

from .release import release_loop
from .session import Close, Command, Phase, Read, ReadMany, Send, SessionConfig
from .transports import frame_refill

if TYPE_CHECKING:
    from .transports import Subscriber

__all__ = ["Hub", "HubMetrics", "READ_BATCH", "SAFETY_CHUNK", "TRANSPORTS", "MAX_LINKS"]

log = logging.getLogger("upf.pusher.hub")

READ_BATCH = 32
"""Messages per store read: bounds what one connection may hold beyond its write buffer's high mark."""
SAFETY_CHUNK = 256
"""Connections the safety poll pokes before it waits for their read round and yields."""
SAFETY_FULL_EVERY = 10
"""Every this many safety passes re-drain every connection even if the store's appends count stood still."""
READ_GROUP = 64
"""(topic, cursor) reads per store transaction in a read round (a multi-topic connection's
``ReadMany`` is never split, so a group holding one may pass it), all sent in one ``get_ranges``: one
snapshot and one cursor pass on the embedded store, one round trip on FoundationDB, and no read checked
against another (they share a version). Bounded so one transaction holds at most 64 x ``READ_BATCH``
rows. It was 8 while each read was its own call: then every read after a concurrent commit was checked
against the ranges read before it. At 8, a wake-up of 200 topics took 25 transactions, and past the
embedded store's 8 snapshots per loop iteration each read opened one of its own: 148,724 vs 130,479
instructions per delivery at 64 (``bench/instr_delivery.py --burst 200``)."""
SWEEP_YIELD_EVERY = 512
HOLD_CHUNK = 256
_MAX_BELL_WAIT = 60.0
INBOX_CLEAR_SECS = 1.0
"""How often a shard's already-read pokes are cleared (a write), at most."""
POLL_RETRY_SECS = 0.5
"""A poll's failed read is tried again after this: no bell or safety pass reaches a poll (it holds
no topic), so without it the poll would wait forever behind its sent head."""
TRANSPORTS = ("ws", "json", "sse", "raw")
MAX_LINKS = 128
"""Links on one ``deliver`` span (the SDK's default limit): a catch-up batch may carry more messages."""
STORE_SILENT = Problem(50301, 503, "service unavailable: the store did not answer")
"""A subscribe whose first reads failed (the writer's 50301, ``STORE_UNAVAILABLE``, words it differently)."""
REVOKE_CHUNK = 1000
"""Subscribers an auth change's re-check looks at between yields to the loop (~1-3 ms of work)."""

_ReadKey = tuple[str, bytes | None, int]
_Wanted = dict[_ReadKey | ReadMany, list[tuple["Subscriber", str]]]
_Outbox = dict["Subscriber", list[tuple[Send, str]]]


_FrameCache = dict[str, dict[bytes, list[Any]]]
"""A read round's framed messages, by frame kind, then stamp (no key tuple to build and hash per
delivery): stamps are unique across topics, and each message is framed at most once per kind however
many connections it goes to. Each entry is ``[frame, deliveries, published_ms, latency cell]``: the
latency is recorded once per entry when the round's writes are done (``_record_latency``), weighted by
its deliveries, not once per connection."""


def _record_latency(frames: _FrameCache, now_ms: float) -> None:
    """Each framed message's publish-to-delivery latency, once per message and frame kind, weighted
    by the connections it was written to."""
    for by_stamp in frames.values():
        for _, deliveries, published_ms, latency in by_stamp.values():
            if published_ms and deliveries:
                latency.record_many(max(0.0, now_ms - published_ms) / 1000.0, deliveries)


def _frame_entry(sub: Subscriber, framed: dict[bytes, list[Any]], topic: str, row: Stored, latency: Any) -> list[Any]:
    """A round's first framing of ``row`` in ``sub``'s frame kind: its ``_FrameCache`` entry."""
    entry = framed[row.stamp] = [
        sub.frame(message_from_envelope(row.stamp, topic, row.envelope)),
        0,
        row.envelope.published_ms,
        latency,
    ]
    return entry


# What started the read chain a delivery came from (a span attribute; safety-poll deliveries are counted).
SUBSCRIBE, BELL, SAFETY, RESUME = "subscribe", "bell", "safety", "resume"


class _TransportCells:
    __slots__ = ("deliveries", "latency", "connections")

    def __init__(self, deliveries: tm.Counter, latency: tm.Histogram, connections: tm.Gauge) -> None:
        self.deliveries = deliveries
        self.latency = latency
        self.connections = connections


class HubMetrics:
    """The pusher's metric cells, made once per hub (the families are process-wide)."""

    __slots__ = (
        "transports",
        "safety",
        "safety_skips",
        "bells",
        "inbox_entries",
        "drains",
        "pauses",
        "slow_closes",
        "silent_closes",
        "drain_errors",
    )

    def __init__(self, registry: tm.Registry) -> None:
        deliveries = registry.counter(
            "upf.pusher.deliveries",
            "queued messages written to subscriber connections (to the socket buffer), by transport",
            attributes=("transport",),
        )
        latency = registry.histogram(
            "upf.pusher.delivery.latency",
            "from the writer's published_ms (just before its commit) to the frame written, by transport",
            unit="s",
            bounds=tm.LATENCY_BUCKETS,
            attributes=("transport",),
        )
        connections = registry.gauge(
            "upf.pusher.connections",
            "open subscriber connections (streams and polls), by transport",
            attributes=("transport",),
        )
        self.transports = {
            t: _TransportCells(deliveries.cell(t), latency.cell(t), connections.cell(t)) for t in TRANSPORTS
        }
        self.safety = registry.counter(
            "upf.pusher.safety_poll.deliveries",
            "messages delivered by the safety poll's re-drain rather than a bell or a subscribe (lost pokes)",
        ).cell()
        self.safety_skips = registry.counter(
            "upf.pusher.safety_poll.skips",
            "safety passes skipped: no message entered the store's queues since the last full pass began",
        ).cell()
        self.bells = registry.counter("upf.pusher.bells", "bell watches that fired (a wake-up, not a timeout)").cell()
        self.inbox_entries = registry.counter("upf.pusher.inbox.entries", "inbox entries drained (one per poke)").cell()
        self.drains = registry.counter(
            "upf.pusher.inbox.drains", "the bell loop's inbox drains (its wake-ups: one drain covers every rung shard)"
        ).cell()
        self.pauses = registry.counter(
            "upf.pusher.slow.pauses", "subscriber connections whose socket buffer crossed the high-water mark"
        ).cell()
        self.slow_closes = registry.counter(
            "upf.pusher.slow.closes", "subscriber connections closed for staying paused too long"
        ).cell()
        self.silent_closes = registry.counter(
            "upf.pusher.silent.closes",
            "WebSocket subscribers closed for sending nothing, not even a pong, for the keepalive interval + 15 s",
        ).cell()
        self.drain_errors = registry.counter("upf.pusher.read.errors", "queue reads that failed (retried later)").cell()


class Hub:
    def __init__(self, settings: Settings, store: Store, telemetry: tm.Telemetry | None = None) -> None:
        self.settings = settings
        self.store = store
        self.telemetry = tm.current() if telemetry is None else telemetry
        self.metrics = HubMetrics(self.telemetry.registry)
        self.node = settings.node_id
        self.config = SessionConfig(batch=READ_BATCH, slow_after=settings.slow_subscriber_timeout_secs)
        self.frame_refill = frame_refill(settings.keepalive_secs)
        """A WebSocket's frame budget's refill a second (``transports.frame_refill``)."""
        self.subs: set[Subscriber] = set()
        """Every attached subscriber (streams and polls), for the sweep, the safety poll and shutdown."""
        self.by_topic: dict[str, Subscriber | set[Subscriber]] = {}
        """Streaming subscribers per topic: the topics this node holds. A topic with one subscriber (the
        UnifiedPush case) maps to it alone: a set would cost each idle connection ~240 bytes more."""
        self._subscribing: set[Subscriber] = set()
        self._affinity: dict[str, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loops: list[asyncio.Task[None]] = []
        self._closing = False
        self.drain_errors = 0
        self._safety_mark: tuple[int, int] | None = None
        """(the store's appends count as the last complete safety pass began, drain errors as it ended)."""
        self._safety_skips = 0
        self._wanted: _Wanted = {}
        self._wanted_many = False  # a ReadMany is among them (the round groups reads by their count)
        """Reads for the next round, by (topic, cursor, limit): the connections waiting on each."""
        self._reader: asyncio.Task[Any] | None = None
        """The task running read rounds: a spawned one, or the bell loop running them inline."""
        self._round_waiters: list[asyncio.Future[None]] = []
        self._rung: set[int] = set()
        """Shards whose bell fired since the bell loop last drained."""
        self._wake: asyncio.Future[None] | None = None
        """What the idle bell loop waits on: a ringing bell resolves it (or the loop's timeout does)."""
        self._in_bell = False
        """The bell loop is poking: it runs the read round itself right after (no task hop)."""
        self._paused: set[Subscriber] = set()
        """Paused connections: between keepalives the sweep only has to look at these."""
        self._on_close: dict[Subscriber, Callable[[], None]] = {}
        """What to run when a subscriber is forgotten (its visitor's subscription count)."""
        self.on_heartbeat: Callable[[], object] | None = None
        """Run at each heartbeat, a wake-up the node takes anyway (the all-in-one's workers leave their
        metrics for each other: ``upf.workers.SharedMetrics``)."""
        self._credentials: dict[Subscriber, Credential] = {}
        """What an authenticated subscriber logged in with, to check again at an auth change; an
        anonymous one (every subscriber of a server without auth) has no entry and costs nothing."""

    # --- lifecycle ----------------------------------------------------------------------------------
    async def start(self) -> None:
        """Register liveness, then start the K bell loops, the safety poll, the sweep, the heartbeat and
        the scheduled-message releaser."""
        try:
            await self.store.heartbeat(self.node, int(time.time()))
        except Exception:
            log.warning("first heartbeat failed", extra={"node": self.node}, exc_info=True)
        appends = await self._appends()
        if appends is not None and not self.subs:
            # A pass over no connection is complete: each one attached from now on drains at its attach.
            self._safety_mark = (appends, self.drain_errors)
        loops: list[Coroutine[Any, Any, None]] = [
            self._bell_loop(),
            self._safety_loop(),
            self._sweep_loop(),
            self._heartbeat_loop(),
        ]
        loops.append(release_loop(self.store, self.settings.release_poll_secs, self.node))
        self._loops = [asyncio.create_task(c) for c in loops]

    async def stop(self) -> None:
        """Close every subscriber cleanly, stop the loops, release this node's affinity, and retire it
        (its liveness record ``SWEPT``)."""
        self._closing = True
        held = set(self.by_topic) | set(self._affinity)
        for sub in list(self.subs):
            self.run(sub, sub.session.shutdown())
        for t in self._loops:
            t.cancel()
        pending = list(self._tasks) + list(self._affinity.values())
        if self._reader is not None:
            pending.append(self._reader)
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
            return  # the heartbeat goes stale instead: the janitor sweeps what is still held
        try:  # released: the janitor may sweep the rest now, and nothing takes this node for running
            await asyncio.wait_for(self.store.retire(self.node), 5.0)
        except Exception:
            log.warning("retire on shutdown failed", extra={"node": self.node}, exc_info=True)

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # --- subscribers --------------------------------------------------------------------------------
    def attach(
        self,
        sub: Subscriber,
        since: Since,
        on_close: Callable[[], None] | None = None,
        credential: Credential | None = None,
    ) -> None:
        """Register ``sub`` locally (so no poke is missed), then resolve its cursors in the store.
        ``on_close`` runs once when the hub forgets it (the request limiter's subscription count);
        ``credential`` is what an authenticated subscriber logged in with (see :meth:`revoke`)."""
        if on_close is not None:
            self._on_close[sub] = on_close
        if credential is not None:
            self._credentials[sub] = credential
        self.subs.add(sub)
        self.metrics.transports[sub.transport_name].connections.add(1)
        self._subscribing.add(sub)
        if not sub.session.poll:
            by_topic = self.by_topic
            for t in sub.session.topics:
                held = by_topic.get(t)
                if held is None:
                    by_topic[t] = sub
                elif isinstance(held, set):
                    held.add(sub)
                elif held is not sub:
                    by_topic[t] = {held, sub}
        self._spawn(self._subscribe(sub, since))

    async def _subscribe(self, sub: Subscriber, since: Since) -> None:
        session = sub.session
        topics = list(session.topics)
        try:
            live = None
            if session.poll:
                cursors = await self.store.positions(topics, since)
            else:
                cursors, live = await self.store.subscribe_live(topics, self.node, since)
        except asyncio.CancelledError:
            self._subscribing.discard(sub)
            raise
        except Exception:
            log.warning("subscribe failed", extra={"topics": len(session.topics)}, exc_info=True)
            self._subscribing.discard(sub)
            if not session.closed:
                sub.fail(STORE_SILENT)
                session.peer_closed()
            self._forget(sub)
            return
        self._subscribing.discard(sub)
        if session.closed:  # the peer left while the store was resolving
            self._forget(sub)
            return
        sub.accept()
        self.run(sub, session.subscribed(cursors, time.time(), live), SUBSCRIBE)

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
        self._credentials.pop(sub, None)
        on_close = self._on_close.pop(sub, None)
        if on_close is not None:
            on_close()
        self._paused.discard(sub)
        self.metrics.transports[sub.transport_name].connections.add(-1)
        if sub.session.poll:
            return
        by_topic = self.by_topic
        for t in sub.session.topics:
            held = by_topic.get(t)
            if isinstance(held, set):
                held.discard(sub)
                if len(held) > 1:
                    continue
                if held:
                    by_topic[t] = held.pop()
                    continue
            elif held is not sub:
                continue
            del by_topic[t]
            self._affinity_changed(t)

    async def revoke(
        self, refusal: Callable[[Credential | None, Collection[str]], Problem | None], *, tokens_only: bool = False
    ) -> int:
        """Close every subscriber ``refusal`` now refuses (given its credential, None for anonymous, and
        its topics), after an auth change: a revoked user, token or ACL entry ends the streams it
        opened, not only the next request. ``tokens_only`` (a token expired): only subscribers that
        logged in with a credential are looked at. Yields to the loop every ``REVOKE_CHUNK``
        subscribers: those attaching meanwhile are checked under the new state already. Each client
        that reconnects gets the answer a new request gets; one whose reply has not begun gets it
        now. Returns how many were closed."""
        candidates = list(self._credentials) if tokens_only else list(self.subs)
        closed = 0
        for i, sub in enumerate(candidates):
            if i and not i % REVOKE_CHUNK:
                await asyncio.sleep(0)
            session = sub.session
            if session.closed or sub not in self.subs:
                continue
            problem = refusal(self._credentials.get(sub), session.topics.keys())
            if problem is None:
                continue
            if session.phase is Phase.SUBSCRIBING:
                sub.fail(problem)  # nothing was written yet: the refusal a new subscribe would get
            self.run(sub, session.revoke())
            closed += 1
        if closed:
            log.info("subscribers revoked", extra={"node": self.node, "closed": closed})
        return closed

    def write_paused(self, sub: Subscriber) -> None:
        session = sub.session
        was_paused = session.paused
        self.run(sub, session.write_paused(time.time()))
        if session.paused and not was_paused:
            self.metrics.pauses.add()
            if sub in self.subs:
                self._paused.add(sub)

    def write_resumed(self, sub: Subscriber) -> None:
        self._paused.discard(sub)
        self.run(sub, sub.session.write_resumed(), RESUME)

    # --- commands -----------------------------------------------------------------------------------
    def run(
        self, sub: Subscriber, commands: Iterable[Command], trigger: str = BELL, out: _Outbox | None = None
    ) -> None:
        """Carry out a session's commands in order. Reads join the next read round; sends are written
        at once, or collected into ``out`` (inside a read round) and written once per connection when
        the round ends. ``trigger`` is what started this chain of reads (subscribe, bell, safety poll,
        resume after a pause)."""
        for cmd in commands:
            if type(cmd) is Send:
                if out is None:
                    self._write(sub, [(cmd, trigger)], {})
                else:
                    sends = out.get(sub)
                    if sends is None:
                        out[sub] = [(cmd, trigger)]
                    else:
                        sends.append((cmd, trigger))
            elif type(cmd) is Read or type(cmd) is ReadMany:
                self._want_read(sub, cmd, trigger)
            elif type(cmd) is Close:
                if out is not None and sub in out:
                    self._write(sub, out.pop(sub), {})  # what was sent before the close goes first
                if cmd.reason == "slow":
                    self.metrics.slow_closes.add()
                sub.close(cmd.reason)

    def _write(
        self, sub: Subscriber, sends: list[tuple[Send, str]], frames: _FrameCache, now_ms: float | None = None
    ) -> None:
        """Write ``sends`` to ``sub`` in one call: events framed for this connection, queued messages
        framed once per frame kind through ``frames`` (shared by a round, which records their latency
        when its writes are done; a write of its own, ``now_ms`` None, records at once). Counts what
        was delivered and, when tracing, wraps the write in one ``deliver`` span linked to each
        message's publish span (its ``traceparent`` from the envelope)."""
        if not sub.writable():
            return  # the transport drops the write: nothing is delivered
        parts: list[bytes] = []
        queued = safety = 0
        cells = self.metrics.transports[sub.transport_name]
        framed: dict[bytes, list[Any]] | None = None
        for cmd, trigger in sends:
            for ev in cmd.events:
                parts.append(sub.frame(ev))
            rows = cmd.rows
            if not rows:
                continue
            queued += len(rows)
            if trigger is SAFETY:
                safety += len(rows)
            if framed is None:
                framed = frames.get(sub.frame_kind)
                if framed is None:
                    framed = frames[sub.frame_kind] = {}
            # Equal lengths by construction; ``strict=True`` would cost a keyword parse per call (zip's
            # fast constructor takes no keywords in 3.11), a twentieth of a fan-out delivery.
            for topic, row in zip(cmd.topics, rows):  # noqa: B905
                entry = framed.get(row.stamp)
                if entry is None:
                    entry = _frame_entry(sub, framed, topic, row, cells.latency)
                entry[1] += 1
                parts.append(entry[0])
        if not queued:
            sub.write(parts)
            return
        if self.telemetry.tracing:
            span = self._deliver_span(sub, sends)
            try:
                sub.write(parts)
            finally:
                span.end()
        else:
            sub.write(parts)
        cells.deliveries.value += queued  # Counter.add, inline: once per write
        if safety:
            self.metrics.safety.add(safety)
        if now_ms is None:  # a write of its own, not a round's: its latencies now
            _record_latency(frames, time.time() * 1000.0)

    def _write_send(self, sub: Subscriber, cmd: Send, trigger: str, frames: _FrameCache, now_ms: float) -> None:
        """A read round's one ``Send`` to a one-topic connection, what a bell ends in. One row, the
        usual case, is written as ``_write`` would write it, without the lists ``_write`` walks and
        builds; anything else (events, several rows, a trace span) goes through ``_write``."""
        rows = cmd.rows
        if len(rows) != 1 or cmd.events or self.telemetry.tracing:
            self._write(sub, [(cmd, trigger)], frames, now_ms)
            return
        if not sub.writable():
            return
        row = rows[0]
        framed = frames.get(sub.frame_kind)
        if framed is None:
            framed = frames[sub.frame_kind] = {}
        cells = self.metrics.transports[sub.transport_name]
        entry = framed.get(row.stamp)
        if entry is None:
            entry = _frame_entry(sub, framed, cmd.topics[0], row, cells.latency)
        entry[1] += 1
        sub.write_one(entry[0])
        cells.deliveries.value += 1
        if trigger is SAFETY:
            self.metrics.safety.add(1)

    def _deliver_span(self, sub: Subscriber, sends: list[tuple[Send, str]]) -> Any:
        from opentelemetry.trace import SpanKind

        queued = [(cmd, trigger) for cmd, trigger in sends if cmd.rows]
        rows = [r for cmd, _ in queued for r in cmd.rows]
        links = []
        for row in rows[:MAX_LINKS]:
            link = tm.link_from_traceparent(row.envelope.traceparent)
            if link is not None:
                links.append(link)
        attributes: dict[str, Any] = {
            "upf.transport": sub.transport_name,
            "upf.trigger": queued[0][1],
            "upf.messages": len(rows),
        }
        if len(rows) == 1:
            cmd = queued[0][0]
            attributes["upf.message.id"] = message_from_envelope(rows[0].stamp, cmd.topics[0], rows[0].envelope).id
        return self.telemetry.tracer.start_span("deliver", kind=SpanKind.CONSUMER, links=links, attributes=attributes)

    # --- read rounds --------------------------------------------------------------------------------
    def _want_read(self, sub: Subscriber, cmd: Read | ReadMany, trigger: str) -> None:
        """Queue ``cmd`` for the next read round, grouped with every other connection reading the
        same topic from the same cursor (one store read serves them all; a ``ReadMany`` is its own
        key, shared only by an identical one)."""
        key: _ReadKey | ReadMany
        if type(cmd) is Read:
            key = (cmd.topic, cmd.after, cmd.limit)
        else:
            key = cmd  # type: ignore[assignment]  # a ReadMany (mypy does not narrow on type() is)
            self._wanted_many = True
        waiting = self._wanted.get(key)
        if waiting is None:
            self._wanted[key] = [(sub, trigger)]
        else:
            waiting.append((sub, trigger))
        if self._reader is None and not self._closing and not self._in_bell:
            self._reader = asyncio.get_running_loop().create_task(self._read_rounds())

    async def _read_rounds(self) -> None:
        """Run read rounds until no read is wanted. A round reads every wanted (topic, cursor) in
        transactions of up to ``READ_GROUP`` reads (each ``ReadMany`` whole), feeds each answer to
        every connection that wanted it, then writes once per connection; the reads those answers
        lead to (a full batch, a poke that came meanwhile) make the next round."""
        try:
            while self._wanted:
                await self._read_round()
                await asyncio.sleep(0)  # a read may not suspend (the embedded store): let I/O and bells in
        finally:
            self._reader = None

    async def _read_round(self) -> None:
        wanted, self._wanted = self._wanted, {}
        many, self._wanted_many = self._wanted_many, False
        waiters, self._round_waiters = self._round_waiters, []
        try:
            keys = list(wanted)
            if not many:  # (topic, cursor) reads only: groups of READ_GROUP
                for i in range(0, len(keys), READ_GROUP):
                    await self._read_group(keys[i : i + READ_GROUP], wanted, False)
                return
            group: list[_ReadKey | ReadMany] = []
            size = 0
            for key in keys:
                n = len(key.topics) if type(key) is ReadMany else 1
                if size and size + n > READ_GROUP:  # a ReadMany is never split: its reads share a snapshot
                    await self._read_group(group, wanted, True)
                    group, size = [], 0
                group.append(key)
                size += n
            if group:
                await self._read_group(group, wanted, True)
        finally:
            for w in waiters:
                if not w.done():
                    w.set_result(None)

    async def _read_group(self, keys: list[_ReadKey | ReadMany], wanted: _Wanted, many: bool) -> None:
        """``many``: ``keys`` may hold ``ReadMany``s, each read as its topics' reads."""
        wants: list[_ReadKey] = keys  # type: ignore[assignment]  # without ReadManys, keys are the reads
        if many:
            wants = []
            for key in keys:
                if type(key) is ReadMany:
                    wants += zip(key.topics, key.afters, [key.limit] * len(key.topics))  # noqa: B905
                else:
                    wants.append(key)  # type: ignore[arg-type]  # not a ReadMany: a (topic, after, limit)
        try:
            answers = await self.store.read_many(wants)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.warning("drain read failed", extra={"reads": len(wants)}, exc_info=True)
            for key in keys:
                topic = key.topics[0] if type(key) is ReadMany else key[0]  # type: ignore[index]  # not a ReadMany: a tuple
                for sub, trigger in wanted[key]:
                    self.drain_errors += 1
                    self.metrics.drain_errors.add()
                    session = sub.session
                    failed = session.read_many_failed() if type(key) is ReadMany else session.read_failed(topic)
                    self.run(sub, failed, trigger)
                    if session.poll:
                        asyncio.get_running_loop().call_later(POLL_RETRY_SECS, self._retry_poll, sub, topic)
            return
        out: _Outbox = {}
        frames: _FrameCache = {}
        now_ms = time.time() * 1000.0
        if many:  # each ReadMany's answers, one per topic, are a slice of the answers
            pairs: list[tuple[_ReadKey, list[Stored]]] = []
            i = 0
            for key in keys:
                if type(key) is ReadMany:
                    n = len(key.topics)
                    part = answers[i : i + n]
                    for sub, trigger in wanted[key]:
                        try:
                            self.run(sub, sub.session.batch_read_many(part), trigger, out)
                        except Exception:  # one broken connection must not stall the round for the others
                            log.warning("delivery failed", exc_info=True)
                    i += n
                else:
                    pairs.append((key, answers[i]))  # type: ignore[arg-type]  # not a ReadMany
                    i += 1
        else:
            pairs = zip(keys, answers)  # type: ignore[assignment]  # noqa: B905  # an answer per key (strict=: see _write)
        for key, rows in pairs:
            topic = key[0]
            for sub, trigger in wanted[key]:
                try:
                    cmds = sub.session.batch_read(topic, rows)
                    if len(cmds) == 1 and type(cmds[0]) is Send and len(sub.session.topics) == 1:
                        # One topic: nothing else of this round goes to it, so no outbox to merge in.
                        self._write_send(sub, cmds[0], trigger, frames, now_ms)
                    else:
                        self.run(sub, cmds, trigger, out)
                except Exception:  # one broken connection must not stall the round for the others
                    log.warning("delivery failed", exc_info=True)
        for sub, sends in out.items():
            try:
                self._write(
                    sub, sends, frames, now_ms
                )  # one Send a connection a round: its topics' rows, in order (session rule 2a)
            except Exception:
                log.warning("delivery failed", exc_info=True)
        _record_latency(frames, now_ms)

    def _retry_poll(self, sub: Subscriber, topic: str) -> None:
        if sub in self.subs and not self._closing:
            self.run(sub, sub.session.poke(topic), RESUME)

    async def _round_done(self) -> None:
        """Wait for the read round that will carry the reads wanted so far (not the ones they lead to)."""
        if not self._wanted:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._round_waiters.append(fut)
        await fut

    # --- pokes --------------------------------------------------------------------------------------
    def poke_topic(self, topic: str) -> None:
        held = self.by_topic.get(topic)
        if held is None:
            return
        for sub in list(held) if isinstance(held, set) else (held,):
            cmds = sub.session.poke(topic)
            if len(cmds) == 1 and (type(cmds[0]) is Read or type(cmds[0]) is ReadMany):  # straight to the round
                self._want_read(sub, cmds[0], BELL)
            elif cmds:
                self.run(sub, cmds)

    async def _bell_loop(self) -> None:
        """One loop for the node's K bells (one watch set). A bell that rings marks its shard rung; the
        loop drains every rung shard's inbox in one read-only transaction (which re-arms their bells),
        pokes the topics, and the read round that follows reads them together. With no bell for
        ``min(safety poll, 60 s)`` it re-drains every shard, re-arming all K (a watch may be lost).
        Pokes already read are cleared at most every ``INBOX_CLEAR_SECS``, off the delivery path, in
        one small write."""
        k = self.settings.shard_count
        timeout = min(self.settings.safety_poll_secs, _MAX_BELL_WAIT)
        backoff = 0.05
        after: dict[int, bytes | None] = dict.fromkeys(range(k))
        cleared: dict[int, bytes | None] = dict.fromkeys(range(k))
        bells = self.store.bells(self.node, [self._bell_callback(shard) for shard in range(k)])
        next_clear = 0.0
        clearing: asyncio.Task[None] | None = None
        rung = self._rung
        rung.update(range(k))
        try:
            while True:
                if not rung:
                    loop = asyncio.get_running_loop()
                    wake = self._wake = loop.create_future()
                    timer = loop.call_later(timeout, _resolve, wake)
                    try:
                        await wake
                    finally:
                        timer.cancel()
                        self._wake = None
                    if not rung:  # the timeout: re-drain every shard
                        rung.update(range(k))
                shards = sorted(rung)
                rung.clear()
                if (clearing is None or clearing.done()) and time.monotonic() >= next_clear:
                    due = {s: a for s, a in after.items() if a is not None and a != cleared[s]}
                    if due:  # a durable write: never awaited here, where it would delay every shard's drain
                        clearing = self._spawn(self._clear_inboxes(due, cleared))
                        next_clear = time.monotonic() + INBOX_CLEAR_SECS
                try:
                    drained = await self.store.drain_inboxes(self.node, {s: after[s] for s in shards}, bells)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.warning("inbox drain failed", extra={"node": self.node, "shards": len(shards)}, exc_info=True)
                    rung.update(shards)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 5.0)
                    continue
                backoff = 0.05
                self.metrics.drains.value += 1
                after.update(drained.lasts)
                if drained.more:  # more than one batch waits (their bells are not re-armed): drain again at once
                    rung.update(drained.more)
                if drained.entries:
                    self.metrics.inbox_entries.add(drained.entries)
                self._in_bell = True
                try:
                    for topic in drained.topics:
                        self.poke_topic(topic)
                finally:
                    self._in_bell = False
                if self._wanted and self._reader is None:
                    # Run the round the pokes asked for here (bells that ring meanwhile gather for one
                    # drain); the reads it leads to (a catch-up's next batch) go on in the reader task.
                    self._reader = asyncio.current_task()
                    try:
                        await self._read_round()
                    except asyncio.CancelledError:
                        raise
                    except Exception:  # never let a delivery bug stop the bells
                        log.warning("read round failed", exc_info=True)
                    finally:
                        self._reader = None
                    if self._wanted and not self._closing:
                        self._reader = asyncio.get_running_loop().create_task(self._read_rounds())
        finally:
            bells.cancel()

    async def _clear_inboxes(self, due: dict[int, bytes], cleared: dict[int, bytes | None]) -> None:
        """Clear the pokes already read, up to ``due`` per shard; on failure the next pass covers them
        (a clear runs from the shard's first key)."""
        try:
            await self.store.clear_inboxes(self.node, due)
        except Exception:
            log.warning("inbox clear failed", extra={"node": self.node, "shards": len(due)}, exc_info=True)
            return
        cleared.update(due)

    def _bell_callback(self, shard: int) -> Callable[[], None]:
        """What ``shard``'s bell calls when it rings: counts it, marks the shard rung, wakes the loop.
        One call, no method chain: a busy node's bells ring dozens of times per wake-up."""
        bells = self.metrics.bells
        rung = self._rung

        def fired() -> None:
            bells.value += 1
            rung.add(shard)
            wake = self._wake
            if wake is not None and not wake.done():
                wake.set_result(None)

        return fired

    # --- periodic work ------------------------------------------------------------------------------
    async def safety_pass(self, *, force: bool = False) -> None:
        """Re-drain every live connection, in chunks, yielding between them.

        Skipped (up to ``SAFETY_FULL_EVERY - 1`` times in a row) when no message entered Q since the
        last complete pass began and no drain failed since: that pass read every queue after its
        start, so this one would find nothing. An idle node's pass is then one read, not one per
        connection; the periodic full pass bounds what a wrong count (a writer of an older release
        counts nothing) could delay."""
        errors = self.drain_errors
        appends = await self._appends()  # unread (None), it vouches for nothing: this pass is full
        if (
            not force
            and appends is not None
            and self._safety_mark == (appends, errors)
            and self._safety_skips < SAFETY_FULL_EVERY - 1
        ):
            self._safety_skips += 1
            self.metrics.safety_skips.add()
            return
        self._safety_mark = None  # a pass cut short vouches for nothing
        subs = [s for s in self.subs if not s.session.poll]
        for i in range(0, len(subs), SAFETY_CHUNK):
            for s in subs[i : i + SAFETY_CHUNK]:
                if not s.session.closed:
                    self.run(s, s.session.poke_all(), SAFETY)
            await self._round_done()
            await asyncio.sleep(0)
        if appends is not None and self.drain_errors == errors:
            self._safety_mark, self._safety_skips = (appends, errors), 0

    async def _appends(self) -> int | None:
        """The store's appends count, or None when it cannot be read (logged)."""
        try:
            return await self.store.appends()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.warning("appends count not read", extra={"node": self.node}, exc_info=True)
            return None

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
        """Tick the sessions: every one when a keepalive is due, else only the paused ones (the only
        ones a tick can close), so an idle node's sweep costs nothing per connection between keepalives.
        A keepalive pass first closes the WebSocket peers gone silent (ntfy's read deadline)."""
        mono = time.monotonic()
        for i, sub in enumerate(list(self.subs if keepalive else self._paused)):
            if keepalive and sub.silent(mono):
                self.metrics.silent_closes.add()
                sub.close("silent")
                continue
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
            if self.on_heartbeat is not None:
                try:
                    self.on_heartbeat()
                except Exception:
                    log.warning("heartbeat hook failed", extra={"node": self.node}, exc_info=True)
            try:
                existed = await self.store.heartbeat(self.node, int(time.time()))
                if not existed:
                    log.warning("node was swept as dead; holding topics again", extra={"node": self.node})
                    await self.rehold()
                    await self.safety_pass(force=True)
            except asyncio.CancelledError:
                raise
            except StoreError as exc:  # its code says it all (a full store, a timeout): no traceback
                log.warning("heartbeat failed: store error", extra={"node": self.node, "store_code": exc.code})
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
                except Exception as exc:
                    failures += 1
                    # A store error's code says it all (a full store, a timeout): no traceback.
                    log.warning(
                        "affinity update failed", extra={"hold": want}, exc_info=not isinstance(exc, StoreError)
                    )
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


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
