from __future__ import annotations

from collections.abc import Sequence

import msgspec

from .. import keys
from ..contract import Transaction
from ..envelope import Envelope, decode_envelope


class Stored(msgspec.Struct, frozen=True):
    stamp: bytes
    envelope: Envelope


class Since(msgspec.Struct, frozen=True):
    """A resolved ``since=``: kind is all, none, latest, stamp (a message id) or time (unix secs,
    inclusive). For latest, ``time`` is when it was asked (0: not known): a message expiring before it
    is no subscriber's newest."""

    kind: str
    stamp: bytes = b""
    time: int = 0


SINCE_ALL = Since("all")
SINCE_NONE = Since("none")
SINCE_LATEST = Since("latest")

_SCAN_BATCH = 512
_LATEST_SCAN = 32
"""How many of a topic's newest rows ``since=latest`` looks through for the newest cached one (one read
of one more row than this). Rows not to be cached (``X-Cache: no``, ``poll_request``) stay in Q only
``UPF_NOCACHE_KEEP_SECS`` for live delivery and are never replayed, so ``latest`` skips them, as ntfy
(which never stores them) does; past this many of them on top of the queue, ``latest`` replays
nothing, as ``none``."""


async def read_after(tr: Transaction, topic: str, after: bytes | None, limit: int) -> list[Stored]:
    """A topic's messages strictly after ``after`` (a stamp), oldest first. Snapshot: a pure read."""
    begin, end = keys.queue_after(topic, after)
    return _stored(end, await tr.get_range(begin, end, limit=limit, snapshot=True))


async def read_many(tr: Transaction, wants: Sequence[tuple[str, bytes | None, int]]) -> list[list[Stored]]:
    """``read_after`` for several (topic, cursor, limit) in one snapshot transaction and one
    ``get_ranges``, answers in order: a pusher's wake-up reads every topic it was poked for at once."""
    ranges = []
    for topic, after, limit in wants:
        begin, end = keys.queue_after(topic, after)
        ranges.append((begin, end, limit))
    answers = await tr.get_ranges(ranges, snapshot=True)
    # An answer per range; strict= would cost zip() a keyword parse on 3.11, a wake-up's every read.
    return [_stored(r[1], rows) for r, rows in zip(ranges, answers)]  # noqa: B905


def _stored(end: bytes, rows: list[tuple[bytes, bytes]]) -> list[Stored]:
    # A Q key is the topic's prefix (``end`` without its last byte), the tuple layer's versionstamp
    # code, then the 12-byte stamp: slicing it off costs a fraction of a tuple unpack per row.
    size = len(end) + 12
    out: list[Stored] = []  # a loop, not a comprehension: on 3.11 that is a function object and a frame per read
    for k, v in rows:
        out.append(
            Stored(
                k[-12:] if len(k) == size and k[size - 13] == 0x33 else keys.unpack_queue_key(k)[1], decode_envelope(v)
            )
        )
    return out


class Resume(msgspec.Struct, frozen=True):
    """``since=<time>`` needs more of an unindexed queue scanned: continue after ``after`` (see
    ``scan_time``) in another transaction, so no transaction reads more than one batch."""

    after: bytes | None


_TIME_MAX = (1 << 63) - 1


async def position(tr: Transaction, topic: str, since: Since) -> bytes | None | Resume:
    """The cursor (read strictly after it; None = from the start) that ``since`` means for ``topic``.
    A time is resolved from the time index in one read; only a topic without index entries before
    the time (rows written before the index existed) is scanned, one bounded batch here, and the
    caller resumes a ``Resume`` with ``scan_time``."""
    if since.kind == "all":
        return None
    if since.kind == "stamp":
        return since.stamp  # (a released scheduled message's id: resolved by ``_released``)
    begin, end = keys.queue_range(topic)
    # "none" and "latest" are not snapshot reads: a publish committing concurrently either lands
    # before this cursor or conflicts with it and sees the affinity written in the same transaction.
    if since.kind == "none":
        newest = await tr.get_range(begin, end, limit=1, reverse=True)
        return keys.unpack_queue_key(newest[0][0])[1] if newest else None
    if since.kind == "latest":
        # Just before the newest row a subscriber is sent from the backlog: the newest cached one
        # not past its expiry (the janitor may not have taken it yet).
        newest = await tr.get_range(begin, end, limit=_LATEST_SCAN + 1, reverse=True)
        for i, (_, value) in enumerate(newest[:_LATEST_SCAN]):
            env = decode_envelope(value)
            if not env.nocache and not env.expires < since.time:
                return keys.unpack_queue_key(newest[i + 1][0])[1] if i + 1 < len(newest) else None
        return keys.unpack_queue_key(newest[0][0])[1] if newest else None  # none cached near the top
    if since.kind == "time":
        second = max(min(since.time, _TIME_MAX), -_TIME_MAX)
        # The last message of the newest second before the time: everything after it is at or after
        # the time (as far as writers' clocks agree). Snapshot, like every read of a time position.
        entry = await tr.get_range(*keys.time_index_before(topic, second), limit=1, reverse=True, snapshot=True)
        if entry:
            return entry[0][1][:12]
        # No entry before the time: the usual reason is that the topic starts at or after it (one
        # more key read); otherwise its older rows predate the index and are scanned.
        first = await tr.get_range(begin, end, limit=1, snapshot=True)
        if not first or decode_envelope(first[0][1]).time >= second:
            return None
        return await scan_time(tr, topic, second, None)
    raise ValueError("unknown since kind")


async def scan_time(tr: Transaction, topic: str, second: int, after: bytes | None) -> bytes | None | Resume:
    """One batch of the fallback for queues without index entries before ``second``: the cursor
    before the first message at or after ``second``, or where to resume. Indexed topics end here in
    one read (their first message is already at or after the time)."""
    rows = await tr.get_range(*keys.queue_after(topic, after), limit=_SCAN_BATCH, snapshot=True)
    cursor = after
    for k, v in rows:
        if decode_envelope(v).time >= second:
            return cursor
        cursor = keys.unpack_queue_key(k)[1]
    if len(rows) < _SCAN_BATCH:
        return cursor
    return Resume(cursor)


async def _released(tr: Transaction, topics: Sequence[str], since: Since) -> Since:
    """``since`` as the position to resume every topic from. The id of a released scheduled message
    names where it was scheduled, on its own topic; the subscriber got it at its release, after the
    messages of its other topics published meanwhile, so every topic resumes after its release (from
    the scheduling position, a connection's other topics would replay those: duplicates)."""
    if since.kind != "stamp":
        return since
    for topic in topics:
        released = await tr.get_range(*keys.released_range(topic, since.stamp), limit=1, snapshot=True)
        if released:
            return Since("stamp", keys.unpack_released_key(released[0][0])[2])
    return since


async def positions(tr: Transaction, topics: Sequence[str], since: Since) -> dict[str, bytes | None | Resume]:
    since = await _released(tr, topics, since)
    return {t: await position(tr, t, since) for t in topics}


async def live_mark(tr: Transaction, topic: str, since: Since, cursor: bytes | None) -> bytes | None:
    """The newest stamp of ``topic`` when the subscription starts (None: the queue is empty). Rows at or
    below it are replay, above it live: an ``X-Cache: no`` message is only ever sent live. Not a
    snapshot read, for the reason ``position`` gives for ``none``."""
    if since.kind == "none":
        return cursor  # position() just read exactly this
    begin, end = keys.queue_range(topic)
    newest = await tr.get_range(begin, end, limit=1, reverse=True)
    return keys.unpack_queue_key(newest[0][0])[1] if newest else None


async def positions_and_marks(
    tr: Transaction, topics: Sequence[str], since: Since
) -> tuple[dict[str, bytes | None | Resume], dict[str, bytes | None]]:
    """``positions`` (a ``Resume`` for the caller to finish, as ``positions``) and, per topic, its
    ``live_mark``. An id past a topic's newest message resumes from that message: the same backlog
    (none), and a live subscription is then sent what comes next. Why: an id from the future (a
    foreign one, or one from before a FoundationDB cluster was wiped, whose versions start again
    near 0) held back every message of the topic until the store's stamps passed it."""
    cursors: dict[str, bytes | None | Resume] = {}
    marks: dict[str, bytes | None] = {}
    since = await _released(tr, topics, since)
    for t in topics:
        cursor = await position(tr, t, since)
        mark = marks[t] = await live_mark(tr, t, since, None if isinstance(cursor, Resume) else cursor)
        if since.kind == "stamp" and isinstance(cursor, bytes) and (mark is None or cursor > mark):
            cursor = mark
        cursors[t] = cursor
    return cursors, marks
