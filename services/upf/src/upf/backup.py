"""``upf backup FILE`` and ``upf restore FILE``: the durable part of a store, through the Store contract.

What is kept: the format record, users, tokens, ACL entries and the auth version, every scheduled
(S, with its SR map once released) and queued message (Q) with its TTL-index (X) and idempotency (ID)
entries. What is not: affinity, inboxes, bells, liveness and request buckets -- soft state the roles
rebuild (a subscriber reconnects, a node rings its own bells), restored stale it would only send pokes
to nodes that are gone.

Consistency while the roles run: each page is one snapshot read of at most ``PAGE`` keys, so the file
holds every message committed before the backup began that the janitor had not expired (nor a Web Push
Topic replaced) when its page was read; a message committed during the backup may or may not be in it,
always whole (a message is one Q key). S and SR are read before Q: the releaser moves a message from S
to Q in one transaction, so one released during the backup is in S, in Q or in both, never in neither;
restore keeps the Q copy of one in both (an S entry whose publish id is a restored message's
``origin_id``, or has an SR entry, was released). Where a page boundary splits a message from its X or
SR entry (the janitor expired it, or it arrived or was released, between the two pages), restore
repairs it: an X, ID or SR entry without its message is dropped (an SR entry the janitor keeps past its
message, and that entry's X, stay), a message without its X or SR entry gets one from its envelope.
FoundationDB: use ``fdbbackup`` / ``fdbrestore`` for a cluster-consistent backup (README, "Backups");
this command works there too.

Ids never go backwards: the restored messages keep their stamps. The backup ends with a fence, a no-op
commit whose stamp is above every id issued until then; restore raises the store's stamp floor
above it plus ``VERSIONS_PER_SEC`` per second elapsed since (embedded driver: ``raise_stamp_floor``),
so a new message sorts after every restored one and after any the old store issued after the backup
(then lost), and ``since=<any old id>`` keeps working. FoundationDB: see README, "Backups".

The stats counter's stored bytes are not copied but summed again from the restored messages (its
page is read after theirs, so a copy would be off by what was published or expired in between, for
good); its message count is copied. A time-index entry (QT) whose message is not in the file is dropped.

File: ``MAGIC``, then length-prefixed msgpack frames: a ``Header``, the ``Pair`` records prefix by prefix
(``KEPT`` order; restore does not rely on it), and an ``End`` with their count and (version 2) the
SHA-256 of every frame before it. Restore reads the whole file before writing anything, and refuses a
truncated or damaged one (a checksum that does not match), a key of a kind this release does not know
and a message that does not decode. Version 1 files (no checksum) are still read.
Written to a temporary file, fsynced, renamed; mode 0600 (topics are capabilities). A path that is a
pipe or a device (``upf backup /dev/stdout | …``) is written into instead.
"""

from __future__ import annotations

import hashlib
import os
import stat
import struct
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

import msgspec
from msgspec.structs import replace

from upf_keyspace import Store, keys
from upf_keyspace.contract import Transaction
from upf_keyspace.envelope import decode_envelope
from upf_keyspace.msgid import decode_id
from upf_keyspace.ops.publish import LEGACY_BYTES, RELEASED_MARK, STAT_SLOTS, TALLY

__all__ = ["MAGIC", "BackupError", "backup", "check_backup", "restore", "read_backup"]

MAGIC = b"UPF-BACKUP 1\n"
VERSION = 2
"""Of the ``Header``: 2 adds the checksum to ``End``; 1 (no checksum) is still restored."""
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
    keys.Prefix.SCHEDULED,
    keys.Prefix.RELEASED,
    keys.Prefix.QUEUE,
    keys.Prefix.TIME_INDEX,
    keys.Prefix.EXPIRY,
    keys.Prefix.IDEMPOTENCY,
    keys.Prefix.STATS,
    keys.Prefix.PUSH_TOPIC,
    keys.Prefix.VAPID_BINDING,
)
"""Durable state: messages (queued and scheduled, with their indexes), auth, VAPID bindings and the
stats counter. Soft state (affinity, inboxes, bells, liveness, rate buckets) is rebuilt by the roles.
S and SR come before Q: a message the releaser moves from S to Q between their pages is then in both
(restore keeps one), not in neither."""
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
    digest: bytes = b""
    """SHA-256 of every frame before this one as written (length prefixes included), then of this
    one's other fields (``_sealed``); version 2 on."""


Frame = Header | Pair | End
_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(Frame).decode


prefix_range = keys.prefix_range


async def _page(store: Store, begin: bytes, end: bytes) -> list[tuple[bytes, bytes]]:
    async def body(tr):
        return await tr.get_range(begin, end, limit=PAGE, snapshot=True)

    return await store.db.transact(body)


async def backup(store: Store, path: str) -> int:
    """Write the store's durable keys to ``path``; returns the number of keys written. A regular file
    (or a new one, or one a symbolic link names) is written atomically: a temporary file beside it,
    fsynced, renamed over it. Anything else that exists (a pipe, ``/dev/stdout``) is written into as
    it is: renaming over it would replace the device or pipe with a file and lose the backup."""
    target = os.path.realpath(path)
    try:
        streamed = not stat.S_ISREG(os.stat(target).st_mode)
    except FileNotFoundError:
        streamed = False
    if streamed:
        with open(target, "wb") as f:
            return await _write(store, f)
    tmp = f"{target}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            count = await _write(store, f)
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return count


async def _write(store: Store, f: BinaryIO) -> int:
    """The backup's bytes, flushed; the number of keys."""
    count = 0
    digest = hashlib.sha256()
    f.write(MAGIC)
    fmt = await store.db.transact(_format)
    _put(f, Header(version=VERSION, created=int(time.time()), store_format=fmt), digest)
    for prefix in KEPT:
        begin, end = prefix_range(prefix)
        while True:
            rows = await _page(store, begin, end)
            for k, v in rows:
                _put(f, Pair(k, v), digest)
            count += len(rows)
            if len(rows) < PAGE:
                break
            begin = rows[-1][0] + b"\x00"
    fence = await _fence(store)
    _put(f, _sealed(End(count, fence, time.time()), digest))
    f.flush()
    return count


async def _fence(store: Store) -> bytes:
    """Commit a no-op (add 0 to the format record) and return its stamp."""

    async def body(tr):
        tr.add(keys.format_key(), keys.pack_i64(0))
        return tr.get_versionstamp()

    return await (await store.db.transact(body))


async def _format(tr) -> int:
    return keys.unpack_i64(await tr.get(keys.format_key(), snapshot=True))


def _sealed(end: End, digest: hashlib._Hash) -> End:
    """``end`` with the checksum of the frames before it and of its own fields (its fence too)."""
    digest.update(_encode(replace(end, digest=b"")))
    return replace(end, digest=digest.digest())


def _put(f: BinaryIO, frame: Frame, digest: hashlib._Hash | None = None) -> None:
    data = _LEN.pack(len(raw := _encode(frame))) + raw
    if digest is not None:
        digest.update(data)
    f.write(data)


def read_backup(path: str) -> tuple[Header, End, Iterator[Pair]]:
    """Check the whole file (magic, header, frames, count, every key's kind and every message), then
    return its header, end and pairs."""
    header, end, _, pairs = check_backup(path)
    return header, end, pairs


@dataclass
class _Survey:
    """What restore must know of the whole file before it writes a key: the file's order does not
    decide what is kept (S comes before the Q copy that supersedes it)."""

    messages: dict[tuple[str, bytes], tuple[bytes, bytes, bytes | None]] = field(default_factory=dict)
    """(topic, stamp) -> its X key and value as the writer makes them, and its publish id if released."""
    released: set[tuple[str, bytes]] = field(default_factory=set)
    """(topic, publish id) of every scheduled message released before Q's (or SR's) pages were read."""
    indexed: set[bytes] = field(default_factory=set)
    """Every X key in the file."""
    mapped: set[tuple[str, bytes, bytes]] = field(default_factory=set)
    """(topic, publish id, Q stamp) of every SR entry in the file."""
    kept_maps: set[tuple[str, bytes, bytes]] = field(default_factory=set)
    """The same, of every X entry that clears an SR entry (``RELEASED_MARK``)."""
    markers: set[tuple[str, str, bytes]] = field(default_factory=set)
    """(topic, key, Q stamp) of every idempotency marker in the file."""
    kept_markers: set[tuple[str, str, bytes]] = field(default_factory=set)
    """The same, of every X entry that clears one (its value is the key)."""
    top: bytes = b""
    """The largest message stamp or scheduled publish id."""
    stored: Counter[int] = field(default_factory=Counter)
    """The bytes of the messages in Q, by stats slot: what the restored counter holds."""
    counted: Counter[int] = field(default_factory=Counter)
    """The message count of each stats slot, as the file has it."""


Checked = tuple[Header, End, _Survey, Iterator[Pair]]
"""A backup file read whole and found sound, ready for ``restore``."""


def check_backup(path: str) -> Checked:
    """``read_backup``, with what its pass over the pairs found for restore: ``upf restore`` calls it
    before a store is opened, so a bad file leaves no empty store behind."""
    survey = _Survey()
    digest = hashlib.sha256()
    unreadable: BackupError | None = None
    with open(path, "rb") as f:
        read = _identity(f)
        if f.read(len(MAGIC)) != MAGIC:
            raise BackupError("not a UPF backup file")
        header = _next(f, digest)
        if not isinstance(header, Header) or header.version not in (1, VERSION):
            raise BackupError("unknown backup version")
        n = 0
        while True:
            frame = _next(f, digest)
            if isinstance(frame, End):
                if frame.pairs != n or f.read(1):
                    raise BackupError("the backup file is damaged (its count does not match)")
                end = frame
                break
            if not isinstance(frame, Pair):
                raise BackupError("the backup file is damaged")
            if unreadable is None:
                try:
                    _survey(survey, frame)
                except BackupError as exc:  # reported once the checksum says whether the file is damaged
                    unreadable = exc
            n += 1
    if header.version >= 2 and end.digest != _sealed(end, digest).digest:
        raise BackupError("the backup file is damaged (its checksum does not match): nothing was restored")
    if unreadable is not None:
        raise unreadable

    def pairs() -> Iterator[Pair]:
        with open(path, "rb") as f:
            if _identity(f) != read:  # replaced (another backup to the same path) since it was checked
                raise BackupError("the backup file changed while it was read: nothing was restored")
            f.read(len(MAGIC))
            _next(f, None)
            while isinstance(frame := _next(f, None), Pair):
                yield frame

    return header, end, survey, pairs()


def _identity(f: BinaryIO) -> tuple[int, int, int, int]:
    """What tells one file at a path from another written there since: device, inode, size, mtime."""
    st = os.fstat(f.fileno())
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _survey(survey: _Survey, pair: Pair) -> None:
    """Note what restore needs of one pair, parsing everything restore or the roles will parse of it:
    a restore that fails on a pair after writing the ones before it leaves a store it refuses next."""
    try:
        prefix = keys.prefix_of(pair.key)
    except (ValueError, IndexError, struct.error):
        raise BackupError(
            "the backup holds a key of a kind this UPF does not know (a newer release's?): nothing was restored"
        ) from None
    try:
        if prefix is keys.Prefix.QUEUE:
            topic, stamp = keys.unpack_queue_key(pair.key)
            env = decode_envelope(pair.value)
            origin = decode_id(env.origin_id) if env.origin_id else None
            if origin is not None:
                survey.released.add((topic, origin))
                x_value = RELEASED_MARK + env.origin_id.encode()
            else:
                x_value = env.idem.encode()
            survey.messages[topic, stamp] = (keys.expiry_key(env.expires, topic, stamp), x_value, origin)
            survey.top = max(survey.top, stamp)
            survey.stored[keys.shard_of(topic, STAT_SLOTS)] += len(pair.value)
        elif prefix is keys.Prefix.STATS:
            name, slot = keys.unpack_stat_key(pair.key)
            if name == TALLY:
                survey.counted[slot] += int.from_bytes(pair.value[:8], "little")
        elif prefix is keys.Prefix.TIME_INDEX:
            keys.unpack_time_index_key(pair.key)
        elif prefix is keys.Prefix.EXPIRY:
            _, topic, stamp = keys.unpack_expiry_key(pair.key)
            survey.indexed.add(pair.key)
            if (origin := _released_origin(pair.value)) is not None:
                survey.kept_maps.add((topic, origin, stamp))
            elif pair.value:
                survey.kept_markers.add((topic, pair.value.decode(), stamp))
        elif prefix is keys.Prefix.IDEMPOTENCY:
            survey.markers.add(keys.unpack_idem_key(pair.key))
        elif prefix is keys.Prefix.SCHEDULED:
            _, origin, _ = keys.unpack_scheduled_key(pair.key)
            decode_envelope(pair.value)  # the releaser's
            survey.top = max(survey.top, origin)  # its id was handed out at publish
        elif prefix is keys.Prefix.RELEASED:
            topic, origin, stamp = keys.unpack_released_key(pair.key)
            survey.released.add((topic, origin))
            survey.mapped.add((topic, origin, stamp))
    except (ValueError, TypeError, IndexError, struct.error, msgspec.MsgspecError):
        raise BackupError(
            f"the backup holds a {prefix.name} entry this UPF cannot read (a damaged file, or a newer "
            "release's?): nothing was restored"
        ) from None


def _next(f: BinaryIO, digest: hashlib._Hash | None) -> Frame:
    """The next frame; every frame but an ``End`` goes into ``digest``, as ``_put`` wrote it."""
    raw = f.read(_LEN.size)
    if len(raw) != _LEN.size:
        raise BackupError("the backup file is truncated")
    size = _LEN.unpack(raw)[0]
    data = f.read(size)
    if len(data) != size:
        raise BackupError("the backup file is truncated")
    try:
        frame = _decode(data)
    except msgspec.DecodeError:
        raise BackupError("the backup file is damaged") from None
    if digest is not None and not isinstance(frame, End):
        digest.update(raw + data)
    return frame


async def _empty(store: Store) -> bool:
    async def body(tr):
        for prefix in KEPT:
            if prefix is keys.Prefix.META:
                continue
            if await tr.get_range(*prefix_range(prefix), limit=1, snapshot=True):
                return False
        return True

    return await store.db.transact(body)


def version_floor(end: End, top: bytes, now: float) -> int:
    """The commit version every new id must exceed: above the restored ids and the backup's fence, plus
    ``VERSIONS_PER_SEC`` for each second since the fence, so ids the old store issued after the backup
    (published after it, then lost with the store) stay below too."""
    fenced = max(int.from_bytes(end.fence[:8], "big"), int.from_bytes(top[:8], "big") if top else 0)
    return fenced + max(0, int((now - end.fenced_at) * VERSIONS_PER_SEC) + 1)


async def _live_node(store: Store, now: int, max_age: int) -> tuple[str, int] | None:
    """A node whose heartbeat is at most ``max_age`` seconds old, with that age (None: none)."""

    async def body(tr):
        for k, v in await tr.get_range(*keys.liveness_range(), snapshot=True):
            age = now - keys.unpack_i64(v)
            if age <= max_age:
                return keys.unpack_liveness_key(k), max(0, age)
        return None

    return await store.db.transact(body)


async def restore(
    store: Store, path: str, *, live_after: int = 0, checked: Checked | None = None
) -> tuple[int, bytes, int]:
    """Write a backup into an empty store; returns (keys written, the largest message stamp, the
    commit version the store must be raised to -- by the caller, once this handle is closed).
    ``live_after``: refuse while a node heartbeated this recently (seconds; 0: no check). Why: a
    running server's store holds no durable state until its first publish, so it passes as empty,
    and its commits between the restore and the stamp floor's raise would take ids that sort before
    the restored ones. ``checked``: ``check_backup(path)``'s, when the caller checked first."""
    header, end, survey, pairs = checked if checked is not None else check_backup(path)
    if header.store_format > await store.db.transact(_format):
        raise BackupError(f"the backup's store format {header.store_format} is newer than this UPF's")
    unfinished = await store.db.transact(_unfinished)
    if not unfinished and not await _empty(store):
        raise BackupError("the store is not empty: restore only into a new store")
    if live_after and (live := await _live_node(store, int(time.time()), live_after)) is not None:
        node, age = live
        raise BackupError(
            f"UPF node {node} uses this store (its heartbeat is {age} s old): stop every UPF process on it "
            f"first; if it has stopped, retry in {live_after - age + 1} s"
        )
    # Marked before the first write, cleared by ``finish_restore`` once the store is whole: a restore
    # stopped half way (killed) left part of the backup, which the roles then served as the store.
    await store.db.transact(_begin, unfinished)
    batch: list[tuple[bytes, bytes]] = []
    size = written = 0

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
        if _kept(survey, pair):
            await put(pair.key, pair.value)
    for (topic, stamp), (x_key, x_value, origin) in survey.messages.items():
        if x_key not in survey.indexed:  # expired (or arrived) between its Q and X pages: index it again
            await put(x_key, x_value)
        if origin is not None and (topic, origin, stamp) not in survey.mapped:  # released between SR and Q
            await put(keys.released_key(topic, origin, stamp), b"")
    for slot in sorted(survey.counted.keys() | survey.stored.keys()):  # the tally, its bytes summed again
        tally = (survey.stored[slot] << 64) + survey.counted[slot]
        await put(keys.stat_key(TALLY, slot), tally.to_bytes(16, "little"))
    await flush()
    return written, survey.top, version_floor(end, survey.top, time.time())


async def _unfinished(tr: Transaction) -> bool:
    return await tr.get(keys.restoring_key()) is not None


async def _begin(tr: Transaction, unfinished: bool) -> None:
    """Mark the store as being restored; an unfinished restore's part is cleared first (every prefix
    a backup writes: restoring again starts from an empty store)."""
    if unfinished:
        for prefix in KEPT:
            if prefix is not keys.Prefix.META:
                tr.clear_range(*prefix_range(prefix))
    tr.set(keys.restoring_key(), b"")


async def finish_restore(store: Store) -> None:
    """The restore is whole (and its stamp floor raised): the roles may serve the store."""

    async def body(tr: Transaction) -> None:
        tr.clear(keys.restoring_key())

    await store.db.transact(body)


def _kept(survey: _Survey, pair: Pair) -> bool:
    """Whether restore writes this pair: a page boundary may have split it from what it belongs to."""
    prefix = keys.prefix_of(pair.key)
    if prefix is keys.Prefix.META or prefix not in KEPT:
        return False  # this store's format record stands; soft state is the roles'
    if prefix is keys.Prefix.EXPIRY:
        _, topic, stamp = keys.unpack_expiry_key(pair.key)
        if (topic, stamp) in survey.messages:
            return True
        # Its message is gone (expired, replaced, or not yet published when the Q pages were read);
        # kept only where it is the janitor's hold on what outlives it (a released message's SR
        # entry, an idempotency marker), which it clears in time.
        origin = _released_origin(pair.value)
        if origin is not None:
            return (topic, origin, stamp) in survey.mapped
        return bool(pair.value) and (topic, pair.value.decode(), stamp) in survey.markers
    if prefix is keys.Prefix.IDEMPOTENCY:
        topic, idem, stamp = keys.unpack_idem_key(pair.key)
        return (topic, stamp) in survey.messages or (topic, idem, stamp) in survey.kept_markers
    if prefix is keys.Prefix.TIME_INDEX:  # the janitor would never clear one whose message is gone
        topic, _ = keys.unpack_time_index_key(pair.key)
        return (topic, pair.value) in survey.messages
    if prefix is keys.Prefix.STATS:  # the tally is written from the survey; the legacy bytes are in it
        name, _ = keys.unpack_stat_key(pair.key)
        return name not in (TALLY, LEGACY_BYTES)
    if prefix is keys.Prefix.SCHEDULED:
        _, origin, topic = keys.unpack_scheduled_key(pair.key)
        return (topic, origin) not in survey.released  # released while S, SR and Q were read: Q's copy stays
    if prefix is keys.Prefix.RELEASED:
        topic, origin, stamp = keys.unpack_released_key(pair.key)
        return (topic, stamp) in survey.messages or (topic, origin, stamp) in survey.kept_maps
    return True


def _released_origin(x_value: bytes) -> bytes | None:
    """The publish id an X entry's value names (a released message's, as the janitor reads it), or None."""
    return decode_id(x_value[1:].decode("ascii", "replace")) if x_value.startswith(RELEASED_MARK) else None
