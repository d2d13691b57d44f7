"""``upf backup FILE`` and ``upf restore FILE``: the durable part of a store, through the Store contract.

What is kept: the format record, users, tokens, ACL entries and the auth version, every queued message
(Q) with its TTL-index (X) and idempotency (ID) entries. What is not: affinity, inboxes, bells,
liveness and request buckets -- soft state the roles rebuild (a subscriber reconnects, a node rings
its own bells), restored stale it would only send pokes to nodes that are gone.

Consistency while the roles run: each page is one snapshot read of at most ``PAGE`` keys, so the file
holds every message committed before the backup began that the janitor had not expired when its page
was read; a message committed during the backup may or may not be in it, always whole (a message is
one Q key). Where a page boundary splits a message from its X entry (the janitor expired it, or it
arrived, between the two pages), restore repairs it: an X or ID entry without its message is dropped,
a message without an X entry gets one from its envelope's expiry. FoundationDB: use ``fdbbackup`` /
``fdbrestore`` for a cluster-consistent backup (README, "Backups"); this command works there too.

Ids never go backwards: the restored messages keep their stamps. The backup ends with a fence, a no-op
commit whose stamp is above every id issued until then; restore raises the store's stamp floor
above it plus ``VERSIONS_PER_SEC`` per second elapsed since (embedded driver: ``raise_stamp_floor``),
so a new message sorts after every restored one and after any the old store issued after the backup
(then lost), and ``since=<any old id>`` keeps working. FoundationDB: see README, "Backups".

File: ``MAGIC``, then length-prefixed msgpack frames: a ``Header``, the ``Pair`` records in key order
by prefix, and an ``End`` with their count (a truncated file is refused before anything is written).
Written to a temporary file, fsynced, renamed; mode 0600 (topics are capabilities).
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Iterator
from typing import BinaryIO

import msgspec

from upf_keyspace import Store, keys
from upf_keyspace.envelope import decode_envelope

__all__ = ["MAGIC", "BackupError", "backup", "restore", "read_backup"]

MAGIC = b"UPF-BACKUP 1\n"
PAGE = 500
"""Keys read per snapshot transaction (each well inside the 5 s lifetime)."""
VERSIONS_PER_SEC = 1_000_000
"""An upper bound of commits per second, as FoundationDB's versions advance (~1e6/s); the embedded
store's fsynced commits stay orders of magnitude below it."""
WRITE_BYTES = 2_000_000
"""Bytes written per restore transaction (FoundationDB's limit is 10 MB)."""
KEPT = (
    keys.Prefix.META,
    keys.Prefix.AUTH_USER,
    keys.Prefix.AUTH_TOKEN,
    keys.Prefix.AUTH_ACCESS,
    keys.Prefix.AUTH_VERSION,
    keys.Prefix.QUEUE,
    keys.Prefix.TIME_INDEX,
    keys.Prefix.EXPIRY,
    keys.Prefix.IDEMPOTENCY,
    keys.Prefix.SCHEDULED,
    keys.Prefix.RELEASED,
    keys.Prefix.STATS,
    keys.Prefix.PUSH_TOPIC,
    keys.Prefix.VAPID_BINDING,
)
"""Durable state: messages (queued and scheduled, with their indexes), auth, VAPID bindings and the
stats counter. Soft state (affinity, inboxes, bells, liveness, rate buckets) is rebuilt by the roles."""
_LEN = struct.Struct(">I")


class BackupError(Exception):
    """A backup file that cannot be restored (not one, truncated, newer), or a store that is not empty."""


class Header(msgspec.Struct, tag="header", array_like=True):
    version: int
    created: int
    """Unix seconds when the backup began."""
    store_format: int


class Pair(msgspec.Struct, tag="kv", array_like=True):
    key: bytes
    value: bytes


class End(msgspec.Struct, tag="end", array_like=True):
    pairs: int
    fence: bytes
    """The stamp of a commit made after the last page was read: above every id issued until then."""
    fenced_at: float
    """Unix time of that commit."""


Frame = Header | Pair | End
_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(Frame).decode


prefix_range = keys.prefix_range


async def _page(store: Store, begin: bytes, end: bytes) -> list[tuple[bytes, bytes]]:
    async def body(tr):
        return await tr.get_range(begin, end, limit=PAGE, snapshot=True)

    return await store.db.transact(body)


async def backup(store: Store, path: str) -> int:
    """Write the store's durable keys to ``path`` (atomically); returns the number of keys written."""
    tmp = f"{path}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    count = 0
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(MAGIC)
            fmt = await store.db.transact(_format)
            _put(f, Header(version=1, created=int(time.time()), store_format=fmt))
            for prefix in KEPT:
                begin, end = prefix_range(prefix)
                while True:
                    rows = await _page(store, begin, end)
                    for k, v in rows:
                        _put(f, Pair(k, v))
                    count += len(rows)
                    if len(rows) < PAGE:
                        break
                    begin = rows[-1][0] + b"\x00"
            fence = await _fence(store)
            _put(f, End(count, fence, time.time()))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return count


async def _fence(store: Store) -> bytes:
    """Commit a no-op (add 0 to the format record) and return its stamp."""

    async def body(tr):
        tr.add(keys.format_key(), keys.pack_i64(0))
        return tr.get_versionstamp()

    return await (await store.db.transact(body))


async def _format(tr) -> int:
    return keys.unpack_i64(await tr.get(keys.format_key(), snapshot=True))


def _put(f: BinaryIO, frame: Frame) -> None:
    data = _encode(frame)
    f.write(_LEN.pack(len(data)) + data)


def read_backup(path: str) -> tuple[Header, End, Iterator[Pair]]:
    """Check the whole file (magic, header, frames, count), then return its header, end and pairs."""
    with open(path, "rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            raise BackupError("not a UPF backup file")
        header = _next(f)
        if not isinstance(header, Header) or header.version != 1:
            raise BackupError("unknown backup version")
        n = 0
        while True:
            frame = _next(f)
            if isinstance(frame, End):
                if frame.pairs != n or f.read(1):
                    raise BackupError("the backup file is damaged (its count does not match)")
                end = frame
                break
            if not isinstance(frame, Pair):
                raise BackupError("the backup file is damaged")
            n += 1

    def pairs() -> Iterator[Pair]:
        with open(path, "rb") as f:
            f.read(len(MAGIC))
            _next(f)
            while isinstance(frame := _next(f), Pair):
                yield frame

    return header, end, pairs()


def _next(f: BinaryIO) -> Frame:
    raw = f.read(_LEN.size)
    if len(raw) != _LEN.size:
        raise BackupError("the backup file is truncated")
    size = _LEN.unpack(raw)[0]
    data = f.read(size)
    if len(data) != size:
        raise BackupError("the backup file is truncated")
    try:
        return _decode(data)
    except msgspec.DecodeError:
        raise BackupError("the backup file is damaged") from None


async def _empty(store: Store) -> bool:
    async def body(tr):
        for prefix in KEPT:
            if prefix is keys.Prefix.META:
                continue
            if await tr.get_range(*prefix_range(prefix), limit=1, snapshot=True):
                return False
        return True

    return await store.db.transact(body)


_prefix_of = keys.prefix_of


def version_floor(end: End, top: bytes, now: float) -> int:
    """The commit version every new id must exceed: above the restored ids and the backup's fence, plus
    ``VERSIONS_PER_SEC`` for each second since the fence, so ids the old store issued after the backup
    (published after it, then lost with the store) stay below too."""
    fenced = max(int.from_bytes(end.fence[:8], "big"), int.from_bytes(top[:8], "big") if top else 0)
    return fenced + max(0, int((now - end.fenced_at) * VERSIONS_PER_SEC) + 1)


async def restore(store: Store, path: str) -> tuple[int, bytes, int]:
    """Write a backup into an empty store; returns (keys written, the largest message stamp, the
    commit version the store must be raised to -- by the caller, once this handle is closed)."""
    header, end, pairs = read_backup(path)
    if header.store_format > await store.db.transact(_format):
        raise BackupError(f"the backup's store format {header.store_format} is newer than this UPF's")
    if not await _empty(store):
        raise BackupError("the store is not empty: restore only into a new store")
    messages: dict[tuple[str, bytes], int] = {}
    """(topic, stamp) -> expiry of every restored message, to repair its X entry."""
    indexed: set[tuple[str, bytes]] = set()
    batch: list[tuple[bytes, bytes]] = []
    size = written = 0
    top = b""

    async def flush() -> None:
        nonlocal batch, size, written
        if not batch:
            return
        rows, batch, size = batch, [], 0

        async def body(tr):
            for k, v in rows:
                tr.set(k, v)

        await store.db.transact(body)
        written += len(rows)

    async def put(k: bytes, v: bytes) -> None:
        nonlocal size
        batch.append((k, v))
        size += len(k) + len(v)
        if size >= WRITE_BYTES or len(batch) >= PAGE:
            await flush()

    for pair in pairs:
        prefix = _prefix_of(pair.key)
        if prefix is keys.Prefix.META:
            continue  # this store's format record stands
        if prefix is keys.Prefix.QUEUE:
            topic, stamp = keys.unpack_queue_key(pair.key)
            messages[topic, stamp] = decode_envelope(pair.value).expires
            top = max(top, stamp)
        elif prefix is keys.Prefix.EXPIRY:
            _, topic, stamp = keys.unpack_expiry_key(pair.key)
            if (topic, stamp) not in messages:
                continue  # its message was expired (or not yet read) when the Q pages were: drop it
            indexed.add((topic, stamp))
        elif prefix is keys.Prefix.IDEMPOTENCY:
            topic, _, stamp = keys.unpack_idem_key(pair.key)
            if (topic, stamp) not in messages:
                continue
        elif prefix is keys.Prefix.SCHEDULED:
            top = max(top, keys.unpack_scheduled_key(pair.key)[1])  # its id was handed out at publish
        elif prefix not in KEPT:
            continue
        await put(pair.key, pair.value)
    for (topic, stamp), expires in messages.items():
        if (topic, stamp) not in indexed:  # expired between its Q and X pages: index it again
            await put(keys.expiry_key(expires, topic, stamp), b"")
    await flush()
    return written, top, version_floor(end, top, time.time())
