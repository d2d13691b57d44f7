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
    """A resolved ``since=``: kind is all, none, latest, stamp (a message id) or time (unix secs, inclusive)."""

    kind: str
    stamp: bytes = b""
    time: int = 0


SINCE_ALL = Since("all")
SINCE_NONE = Since("none")
SINCE_LATEST = Since("latest")

_SCAN_BATCH = 512


async def read_after(tr: Transaction, topic: str, after: bytes | None, limit: int) -> list[Stored]:
    """A topic's messages strictly after ``after`` (a stamp), oldest first. Snapshot: a pure read."""
    begin, end = keys.queue_after(topic, after)
    rows = await tr.get_range(begin, end, limit=limit, snapshot=True)
    # A Q key is the topic's prefix (``end`` without its last byte), the tuple layer's versionstamp
    # code, then the 12-byte stamp: slicing it off costs a fraction of a tuple unpack per row.
    size = len(end) + 12
    return [
        Stored(k[-12:] if len(k) == size and k[size - 13] == 0x33 else keys.unpack_queue_key(k)[1], decode_envelope(v))
        for k, v in rows
    ]


async def read_many(tr: Transaction, wants: Sequence[tuple[str, bytes | None, int]]) -> list[list[Stored]]:
    """``read_after`` for several (topic, cursor, limit) in one snapshot transaction, answers in order:
    a pusher's wake-up reads every topic it was poked for at the price of one transaction."""
    return [await read_after(tr, topic, after, limit) for topic, after, limit in wants]


async def position(tr: Transaction, topic: str, since: Since) -> bytes | None:
    """The cursor (read strictly after it; None = from the start) that ``since`` means for ``topic``."""
    if since.kind == "all":
        return None
    if since.kind == "stamp":
        # The id of a released scheduled message names where it was scheduled; resume after its release.
        released = await tr.get_range(*keys.released_range(topic, since.stamp), limit=1, snapshot=True)
        return keys.unpack_released_key(released[0][0])[2] if released else since.stamp
    begin, end = keys.queue_range(topic)
    if since.kind in ("none", "latest"):
        # Not a snapshot read: a publish committing concurrently either lands before this cursor or
        # conflicts with it and sees the affinity written in the same transaction.
        newest = await tr.get_range(begin, end, limit=2, reverse=True)
        skip = 0 if since.kind == "none" else 1
        if len(newest) <= skip:
            return None
        return keys.unpack_queue_key(newest[skip][0])[1]
    if since.kind == "time":
        cursor: bytes | None = None
        while True:
            rows = await tr.get_range(begin, end, limit=_SCAN_BATCH, snapshot=True)
            for k, v in rows:
                if decode_envelope(v).time >= since.time:
                    return cursor
                cursor = keys.unpack_queue_key(k)[1]
            if len(rows) < _SCAN_BATCH:
                return cursor
            begin = rows[-1][0] + b"\x00"
    raise ValueError("unknown since kind")


async def positions(tr: Transaction, topics: Sequence[str], since: Since) -> dict[str, bytes | None]:
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
) -> tuple[dict[str, bytes | None], dict[str, bytes | None]]:
    """``positions`` and, per topic, its ``live_mark``."""
    cursors: dict[str, bytes | None] = {}
    marks: dict[str, bytes | None] = {}
    for t in topics:
        cursors[t] = await position(tr, t, since)
        marks[t] = await live_mark(tr, t, since, cursors[t])
    return cursors, marks
