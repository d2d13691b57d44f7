"""One subscriber connection as a sans-I/O state machine: events in, commands out.

It knows nothing of sockets, transports or the store. The hub feeds it events (cursors resolved, a
batch read, a poke, write paused/resumed, a tick, the peer gone) and carries out the commands it
returns, in order: ``Send`` (events as ntfy Message objects, queued messages as their stored rows),
``Read`` (a topic's queue after a cursor) and ``Close``.

Rule 1, phases (``RULES`` below is the whole table; an event missing from it for the current phase
is ignored)::

    SUBSCRIBING --subscribed--> CATCHING_UP --caught_up--> LIVE
         |                          |  (poll=1) --finished--> CLOSED
         +--peer_closed/shutdown/---+--peer_closed/shutdown/revoked/slow--> CLOSED  (from LIVE too)
            revoked

Rule 2, delivery: a connection receives only stamps newer than its per-topic cursor, and the cursor
moves to the last stamp handed out in a ``Send``. At most one read per (connection, topic) is in
flight; a poke that arrives meanwhile sets a "drain again" flag.

Rule 2a, order: a connection receives its stamps in increasing order across all its topics (stamps
are globally ordered bytes), in every phase, so that its client's last id is a safe ``since=`` for all
of them (the ntfy app sends one for all). A one-topic connection reads its topic (``Read``). A
connection on several reads all of them in one snapshot (``ReadMany``), every time any of them needs
reading: a topic whose read ends short of its limit has nothing more up to that snapshot, so every
row up to the lowest last row of a topic whose read was full is known, and goes out merged by stamp;
the rest waits, buffered, for the next ``ReadMany``. (Reading only the poked topics, or each topic
on its own, let a row of one topic committed after another topic's read go out before that topic's
earlier row: a client cut between the two, resuming from the later id, never got the earlier one.)

Rule 2b, ``X-Cache: no``: such a row is sent only if it is above the topic's live mark (the newest
stamp when the subscription started; a poll's is above everything). Only the catch-up can meet rows at
or below it: once LIVE, the cursor has passed every row that existed at subscribe time.

Rule 2d, TTL: a replayed row (at or below the live mark) is not sent once the clock has passed its
``expires`` (whole seconds, the publish's second plus the TTL: a ``TTL: 0`` row is past at once), as RFC 8030
5.2 asks of a push service: a ``TTL: 0`` Web Push message reaches only a subscriber that was connected
when it arrived. The janitor deletes such rows later, on its own schedule. Rows that arrive while the
subscription is live go out at once, whatever their TTL. ``expires`` is the writer's clock and the
check the pusher's: skew between hosts shortens or lengthens a replay's TTL by as much.

Rule 2c, filters (ntfy's ``id``/``message``/``title``/``priority``/``tags``, ``filters.Filter``): a
row that does not pass its session's filter is not sent, and the cursor moves past it all the same.
Only a ``FilteredSession`` has a filter; a plain ``Session``'s ``filter`` is the class's None, so an
unfiltered connection costs no more memory, and its delivery one ``is None`` test per ``Send``.

Rule 3, backpressure (the overload contract): while the transport is paused no ``Read`` is issued,
and the rows of a read that was already in flight are held in the session (at most one read's rows
per topic) until the transport resumes; so the socket buffer holds at most one ``Send`` (one read's
rows, or while catching up one merge round) beyond the transport's high-water mark. A read asks for
``limit()`` rows: a batch, shared out among the topics of a connection on many, so that a merge round
or a resume is at most a few batches (or a row per topic), whatever the topic count. The store is the buffer. On resume, reading continues from the cursor. A connection paused for
``slow_after`` seconds or more is closed at the next tick (``Close("slow")``); its client resumes with
``since=<last id>`` and loses nothing.
"""

from __future__ import annotations

import enum
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence

import msgspec

from upf_keyspace import Envelope, Message, Stored, message_from_envelope

from .filters import Filter
from .framing import event as make_event

__all__ = [
    "Phase",
    "RULES",
    "Session",
    "FilteredSession",
    "SessionConfig",
    "Send",
    "Read",
    "ReadMany",
    "Close",
    "Command",
    "new_session",
]


class Phase(enum.Enum):
    SUBSCRIBING = "subscribing"
    """Registered locally; the store is resolving ``since`` (and, for streams, holding the topics)."""
    CATCHING_UP = "catching_up"
    """Replaying the backlog after the cursors, merged across topics in stamp order."""
    LIVE = "live"
    """Caught up; each poke reads its topic from the cursor (every topic, on a multi-topic connection)."""
    CLOSED = "closed"

    # Members are singletons compared by identity: hash them so too, in C. Enum's own __hash__ is a
    # Python call, and every session event looks up (phase, event) in RULES.
    __hash__ = object.__hash__


class Send(msgspec.Struct, frozen=True):
    """Frames to write, in order: ``events`` (open, keepalive) first, then queued ``rows``.

    Queued rows stay rows (the shared ``Stored`` objects of a read, with their topic) rather than
    per-connection Message objects, so the hub frames each message once per transport and shares
    the bytes among every connection it goes to."""

    events: Sequence[Message] = ()
    rows: Sequence[Stored] = ()
    topics: Sequence[str] = ()
    """The topic of each row (a merged catch-up interleaves topics)."""

    @property
    def messages(self) -> list[Message]:
        """The ntfy Message objects this sends (events, then rows): tests and diagnostics."""
        return [
            *self.events,
            *(message_from_envelope(r.stamp, t, r.envelope) for t, r in zip(self.topics, self.rows, strict=True)),
        ]

    @property
    def envelopes(self) -> list[Envelope] | None:
        """The queued messages' stored envelopes, or None when this sends only events."""
        return [r.envelope for r in self.rows] if self.rows else None


class Read(msgspec.Struct, frozen=True):
    topic: str
    after: bytes | None
    limit: int


class ReadMany(msgspec.Struct, frozen=True):
    """Every topic of a multi-topic connection, each after its own position, in one snapshot (rule
    2a); answered with ``Session.batch_read_many``, one list of rows per topic, in order."""

    topics: tuple[str, ...]
    afters: tuple[bytes | None, ...]
    limit: int


class Close(msgspec.Struct, frozen=True):
    reason: str
    """``done`` (a poll has sent everything), ``slow`` (stayed paused too long), ``shutdown``, or
    ``denied`` (an auth change revoked the subscriber's access)."""


Command = Send | Read | ReadMany | Close

# The code below names members through these: in 3.11 ``Phase.LIVE`` goes through the metaclass's
# ``__getattr__`` hook (EnumType defines one), ~850 instructions, and a session checks its phase per event.
_S, _C, _L, _X = Phase.SUBSCRIBING, Phase.CATCHING_UP, Phase.LIVE, Phase.CLOSED

RULES: dict[tuple[Phase, str], Phase] = {
    (_S, "subscribed"): _C,
    (_S, "poke"): _S,  # the catch-up that follows reads everything after the cursor anyway
    (_S, "write_paused"): _S,
    (_S, "write_resumed"): _S,
    (_S, "peer_closed"): _X,
    (_S, "shutdown"): _X,
    (_S, "revoked"): _X,
    (_C, "poke"): _C,
    (_C, "batch_read"): _C,
    (_C, "read_failed"): _C,
    (_C, "write_paused"): _C,
    (_C, "write_resumed"): _C,
    (_C, "tick"): _C,
    (_C, "caught_up"): _L,
    (_C, "finished"): _X,
    (_C, "slow"): _X,
    (_C, "peer_closed"): _X,
    (_C, "shutdown"): _X,
    (_C, "revoked"): _X,
    (_L, "poke"): _L,
    (_L, "batch_read"): _L,
    (_L, "read_failed"): _L,
    (_L, "write_paused"): _L,
    (_L, "write_resumed"): _L,
    (_L, "tick"): _L,
    (_L, "slow"): _X,
    (_L, "peer_closed"): _X,
    (_L, "shutdown"): _X,
    (_L, "revoked"): _X,
}


class SessionConfig:
    """Shared by every session of a hub, so a session holds one pointer instead of copies."""

    __slots__ = ("batch", "slow_after", "clock")

    def __init__(self, *, batch: int = 32, slow_after: float = 60.0, clock: Callable[[], float] = time.time) -> None:
        self.batch = batch
        self.slow_after = slow_after
        self.clock = clock
        """Read while catching up, for rule 2d (the only event that carries no time of its own)."""


_SHARED_BATCHES = 4
"""A connection's reads together ask for at most this many batches (``Session.limit``)."""

_NOTHING_LIVE = b"\xff" * 12
"""The live mark of a poll: above every stamp, so nothing it reads counts as live."""


class _Topic:
    __slots__ = ("cursor", "reading", "dirty", "more", "buffer", "live")

    def __init__(self) -> None:
        self.cursor: bytes | None = None
        self.live: bytes | None = None
        """Rows at or below this stamp are replay (None: none are); ``X-Cache: no`` rows there are skipped."""
        self.reading = False
        self.dirty = False
        self.more = False
        self.buffer: deque[Stored] | None = None


class Session:
    __slots__ = ("topics_raw", "poll", "phase", "paused", "paused_at", "topics", "config")

    filter: Filter | None = None
    """The subscriber's filters: None here, for every session but a ``FilteredSession`` (its own slot)."""

    def __init__(self, topics: Sequence[str], topics_raw: str, config: SessionConfig, *, poll: bool = False) -> None:
        self.topics_raw = topics_raw
        self.poll = poll
        self.config = config
        self.phase = _S
        self.paused = False
        self.paused_at = 0.0
        self.topics: dict[str, _Topic] = {t: _Topic() for t in topics}

    def __repr__(self) -> str:
        return f"Session({self.topics_raw!r}, {self.phase.name}, paused={self.paused})"

    @property
    def closed(self) -> bool:
        return self.phase is _X

    def limit(self) -> int:
        """Rows a ``ReadMany`` asks for of each topic (a ``Read`` of a one-topic connection asks for a
        batch): a batch, shared out among the topics of a connection on more than
        ``_SHARED_BATCHES`` (at least one row each). What one merge round or one resume after a pause
        writes is then at most ~``_SHARED_BATCHES`` batches (or a row per topic): with a batch per
        topic, a connection on 128 topics that never read wrote 128 batches into its socket's buffer
        (14-39 MB of 4 KB messages, held until it was closed as slow). Computed, not stored: a slot
        would cost every idle subscriber."""
        n = len(self.topics)
        batch = self.config.batch
        return batch if n <= _SHARED_BATCHES else max(1, _SHARED_BATCHES * batch // n)

    def cursor(self, topic: str) -> bytes | None:
        return self.topics[topic].cursor

    def _step(self, event: str) -> bool:
        nxt = RULES.get((self.phase, event))
        if nxt is None:
            return False
        self.phase = nxt
        return True

    # --- events -------------------------------------------------------------------------------------
    def subscribed(
        self, cursors: Mapping[str, bytes | None], now: float, live: Mapping[str, bytes | None] | None = None
    ) -> list[Command]:
        """The store resolved ``since`` to a cursor per topic: send ``open`` (streams), then catch up.
        ``live``: each topic's newest stamp at subscribe (``Store.subscribe_live``); without it the
        cursor stands in for it. A poll has no live part."""
        if not self._step("subscribed"):
            return []
        one = len(self.topics) == 1
        for t, ts in self.topics.items():
            ts.cursor = cursors.get(t)
            ts.live = _NOTHING_LIVE if self.poll else (live.get(t) if live is not None else ts.cursor)
            ts.more = one  # one topic: unknown until read; several (rule 2a): "the last read was full"
            ts.dirty = False
            ts.buffer = deque() if one else None
        out: list[Command] = [] if self.poll else [Send([make_event("open", self.topics_raw, int(now))])]
        return out + (self._merge() if one else self._read_all())

    def poke(self, topic: str) -> list[Command]:
        """The topic may have new messages (a bell, or the safety poll)."""
        ts = self.topics.get(topic)
        if ts is None:
            return []
        if self.phase is _L:  # RULES: (LIVE, poke) stays LIVE, so the table needs no look-up here
            if self.paused or ts.reading:  # ``_live_read``, inline (dirty is set): once per delivery
                ts.dirty = True
                return []
            if len(self.topics) > 1:
                return self._read_all()
            ts.reading = True
            ts.more = ts.dirty = False
            return [Read(topic, ts.cursor, self.config.batch)]
        if not self._step("poke") or self.phase is _S:
            return []
        ts.dirty = True
        if len(self.topics) > 1:
            return self._read_all()
        return self._merge()  # CATCHING_UP

    def poke_all(self) -> list[Command]:
        if len(self.topics) > 1:  # one ReadMany reads them all
            return self.poke(next(iter(self.topics)))
        out: list[Command] = []
        for t in self.topics:
            out += self.poke(t)
        return out

    def batch_read(self, topic: str, rows: Sequence[Stored]) -> list[Command]:
        """A ``Read`` returned ``rows`` (oldest first); a full batch means there may be more."""
        ts = self.topics.get(topic)
        if ts is None:
            return []
        ts.reading = False
        if self.phase is not _L and not self._step("batch_read"):  # (LIVE, batch_read) stays LIVE
            return []
        full = len(rows) >= self.config.batch
        cur = ts.cursor
        if cur is None or not rows or rows[0].stamp > cur:
            fresh = rows  # the usual case: shared as is with every connection that read it
        else:
            fresh = [r for r in rows if r.stamp > cur]
        if self.phase is _C:
            ts.more = full
            if ts.buffer is None:
                ts.buffer = deque()
            ts.buffer.extend(fresh)
            return self._merge()
        ts.more = full
        if self.paused:
            # The read was issued before the pause was known: hold its rows until the socket drains.
            if fresh:
                if ts.buffer is None:
                    ts.buffer = deque()
                ts.buffer.extend(fresh)
            return []
        out: list[Command] = []
        if fresh:
            ts.cursor = fresh[-1].stamp
            if self.filter is None:
                out.append(Send(rows=fresh, topics=[topic] * len(fresh)))
            else:
                kept = self.filter.rows(fresh)
                if kept:
                    out.append(Send(rows=kept, topics=[topic] * len(kept)))
        if full or ts.dirty:  # else _live_read would find nothing to read
            out += self._live_read(topic, ts)
        return out

    def read_failed(self, topic: str) -> list[Command]:
        """A ``Read`` failed: remember the topic needs reading; the next poke or safety poll retries."""
        ts = self.topics.get(topic)
        if ts is None:
            return []
        ts.reading = False
        if self._step("read_failed"):
            ts.dirty = True
        return []

    def batch_read_many(self, answers: Sequence[Sequence[Stored]]) -> list[Command]:
        """A ``ReadMany`` returned each topic's rows (oldest first), in the order of ``topics``."""
        if self.phase is not _L and not self._step("batch_read"):
            return []
        limit = self.limit()
        # An answer per topic; strict= would cost zip() a keyword parse on 3.11.
        for ts, rows in zip(self.topics.values(), answers):  # noqa: B905
            ts.reading = False
            ts.more = len(rows) >= limit
            if rows:
                buf = ts.buffer
                if buf is None:
                    buf = ts.buffer = deque()
                last = buf[-1].stamp if buf else ts.cursor
                buf.extend(rows if last is None or rows[0].stamp > last else [r for r in rows if r.stamp > last])
        return self._step_many()

    def read_many_failed(self) -> list[Command]:
        """A ``ReadMany`` failed: as ``read_failed``, for every topic (the next poke reads them all)."""
        for ts in self.topics.values():
            ts.reading = False
        if self._step("read_failed"):
            next(iter(self.topics.values())).dirty = True
        return []

    def write_paused(self, now: float) -> list[Command]:
        if self._step("write_paused") and not self.paused:
            self.paused = True
            self.paused_at = now
        return []

    def write_resumed(self) -> list[Command]:
        if not self._step("write_resumed"):
            return []
        self.paused = False
        if len(self.topics) > 1 and (self.phase is _C or self.phase is _L):
            return self._step_many()
        if self.phase is _C:
            return self._merge()
        if self.phase is _L:
            return self._flush_held() + self._live_reads()
        return []

    def tick(self, now: float, *, keepalive: bool) -> list[Command]:
        """The periodic sweep: close a subscriber paused too long; send a keepalive when one is due."""
        if not self._step("tick"):
            return []
        if self.paused and now - self.paused_at >= self.config.slow_after:
            self._step("slow")
            return [Close("slow")]
        if keepalive and not self.poll and not self.paused:
            return [Send([make_event("keepalive", self.topics_raw, int(now))])]
        return []

    def peer_closed(self) -> list[Command]:
        self._step("peer_closed")
        return []

    def shutdown(self) -> list[Command]:
        if self._step("shutdown"):
            return [Close("shutdown")]
        return []

    def revoke(self) -> list[Command]:
        """An auth change took the subscriber's access to one of its topics (or its credentials)."""
        if self._step("revoked"):
            return [Close("denied")]
        return []

    # --- rules --------------------------------------------------------------------------------------
    def _merge(self) -> list[Command]:
        """Hand out the buffered backlog in global stamp order, as far as every topic's next stamp is known."""
        if self.paused:
            return []
        rows: list[Stored] = []
        topics: list[str] = []
        reads: list[Command] = []
        done = False
        now = 0.0  # read from the clock at the first replayed row
        while True:
            waiting = False
            best: tuple[str, _Topic] | None = None
            for t, ts in self.topics.items():
                buf = ts.buffer
                if not buf:
                    if ts.more:
                        waiting = True
                        if not ts.reading:
                            ts.reading = True
                            reads.append(Read(t, ts.cursor, self.config.batch))
                elif best is None or buf[0].stamp < best[1].buffer[0].stamp:  # type: ignore[index]  # best only holds a topic whose buffer is non-empty
                    best = (t, ts)
            if waiting:
                break
            if best is None:
                done = True
                break
            t, ts = best
            row = ts.buffer.popleft()  # type: ignore[union-attr]  # the same: chosen for its non-empty buffer
            ts.cursor = row.stamp
            if ts.live is not None and row.stamp <= ts.live:  # a replay: rules 2b and 2d
                if not now:
                    now = self.config.clock()
                if _not_replayed(row, now):
                    continue
            rows.append(row)
            topics.append(t)
        if rows and self.filter is not None:
            rows, topics = self.filter.rows_and_topics(rows, topics)
        out: list[Command] = [Send(rows=rows, topics=topics)] if rows else []
        out += reads
        if done:
            for ts in self.topics.values():
                ts.buffer = None
                ts.more = False
            if self.poll:
                self._step("finished")
                out.append(Close("done"))
            else:
                self._step("caught_up")
                out += self._live_reads()
        return out

    def _read_all(self) -> list[Command]:
        """One ``ReadMany`` of every topic, each after what it holds (rule 2a); none while paused or
        while one is in flight (a topic is marked to read again instead)."""
        topics = self.topics.values()
        first = next(iter(topics))
        if self.paused or first.reading:  # (every topic's ``reading`` is set together)
            first.dirty = True
            return []
        afters: list[bytes | None] = []
        for ts in topics:
            ts.reading = True
            ts.dirty = False
            buf = ts.buffer
            afters.append(buf[-1].stamp if buf else ts.cursor)
        return [ReadMany(tuple(self.topics), tuple(afters), self.limit())]

    def _step_many(self) -> list[Command]:
        """Rule 2a: send, merged by stamp, every buffered row up to the lowest last row of a topic whose
        read was full (all of them if none was); read all again if one was full or a poke came; a
        catch-up with nothing left goes live (a poll ends)."""
        if self.paused:
            return []
        cap: bytes | None = None
        again = False
        for ts in self.topics.values():
            if ts.more:  # known only up to what it holds (b"": nothing yet, so nothing can go)
                again = True
                last = ts.buffer[-1].stamp if ts.buffer else ts.cursor or b""
                if cap is None or last < cap:
                    cap = last
            elif ts.dirty:
                again = True
        picked: list[tuple[bytes, str, Stored]] = []
        for t, ts in self.topics.items():
            buf = ts.buffer
            while buf and (cap is None or buf[0].stamp <= cap):
                r = buf.popleft()
                ts.cursor = r.stamp
                picked.append((r.stamp, t, r))
            if buf is not None and not buf:
                ts.buffer = None  # an empty deque is ~600 bytes a topic: held only while rows wait
        rows: list[Stored] = []
        topics: list[str] = []
        if picked:
            picked.sort(key=_first)
            now = 0.0  # read from the clock at the first replayed row
            for _, t, r in picked:
                live = self.topics[t].live
                if live is not None and r.stamp <= live:  # a replay: rules 2b and 2d
                    if not now:
                        now = self.config.clock()
                    if _not_replayed(r, now):
                        continue
                rows.append(r)
                topics.append(t)
            if rows and self.filter is not None:
                rows, topics = self.filter.rows_and_topics(rows, topics)
        out: list[Command] = [Send(rows=rows, topics=topics)] if rows else []
        if again:
            return out + self._read_all()
        if self.phase is _C:
            for ts in self.topics.values():
                ts.buffer = None
            if self.poll:
                self._step("finished")
                out.append(Close("done"))
            else:
                self._step("caught_up")
        return out

    def _flush_held(self) -> list[Command]:
        """Send what a one-topic connection's LIVE read returned while it was paused (a connection on
        several holds its rows in ``_step_many``'s buffers)."""
        ((t, ts),) = self.topics.items()
        rows = ts.buffer
        ts.buffer = None
        if not rows:
            return []
        ts.cursor = rows[-1].stamp
        kept: Sequence[Stored] = list(rows)
        topics = [t] * len(kept)
        if self.filter is not None:
            kept, topics = self.filter.rows_and_topics(kept, topics)
        return [Send(rows=kept, topics=topics)] if kept else []

    def _live_read(self, topic: str, ts: _Topic) -> list[Command]:
        if self.paused or ts.reading or not (ts.more or ts.dirty):
            return []
        ts.reading = True
        ts.more = ts.dirty = False
        return [Read(topic, ts.cursor, self.config.batch)]

    def _live_reads(self) -> list[Command]:
        out: list[Command] = []
        for t, ts in self.topics.items():
            out += self._live_read(t, ts)
        return out


def _first(item: tuple[bytes, str, Stored]) -> bytes:
    return item[0]


def _not_replayed(row: Stored, now: float) -> bool:
    """Rules 2b and 2d, for a row at or below its topic's live mark: ``X-Cache: no``, or past its expiry."""
    env = row.envelope
    return env.nocache or env.expires < now


class FilteredSession(Session):
    """A session whose subscriber asked for filters (``filter``): the only sessions that pay for one."""

    __slots__ = ("filter",)

    def __init__(
        self,
        topics: Sequence[str],
        topics_raw: str,
        config: SessionConfig,
        filter: Filter,
        *,
        poll: bool = False,
    ) -> None:
        super().__init__(topics, topics_raw, config, poll=poll)
        self.filter = filter

    def __repr__(self) -> str:
        return f"FilteredSession({self.topics_raw!r}, {self.phase.name}, paused={self.paused}, {self.filter!r})"


def new_session(
    topics: Sequence[str], topics_raw: str, config: SessionConfig, *, poll: bool = False, filter: Filter | None = None
) -> Session:
    """A ``Session``, or a ``FilteredSession`` when ``filter`` is set."""
    if filter is None:
        return Session(topics, topics_raw, config, poll=poll)
    return FilteredSession(topics, topics_raw, config, filter, poll=poll)


def messages_of(commands: Iterable[Command]) -> list[Message]:
    """Every message the commands send, in order (a test and diagnostics helper)."""
    return [m for c in commands if isinstance(c, Send) for m in c.messages]
