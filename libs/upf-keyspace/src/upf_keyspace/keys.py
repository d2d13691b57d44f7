"""Every UPF key, built and parsed here and nowhere else.

All keys are tuple-encoded (FoundationDB's tuple layer, so byte order equals tuple order) under the
root subspace ``("upf",)``. A constant string level stands before every variable level, so two kinds
of key can never collide::

    ("upf",)
    ├── "META" / "format"                              -> FormatVersion (LE i64)
    ├── "META" / "restoring"                           -> b""                    an unfinished restore
    ├── "Q"   / topic:str / stamp:Versionstamp          -> Envelope (msgpack)     durable queue, source of truth
    ├── "QT"  / topic:str / second:int                  -> stamp (12 bytes)       time index: the topic's last message of that second
    ├── "X"   / expiry:int / topic:str / stamp:Versionstamp -> idem key (utf-8) TTL index, janitor scans it
    ├── "C"   / topic:str / node:str                    -> ""                     affinity (soft): node holds topic
    ├── "CN"  / node:str / topic:str                    -> ""                     reverse affinity, for dead-node sweeps
    ├── "IN"  / node:str / shard:int / stamp:Versionstamp -> topic (utf-8)      per-node inbox (advisory poke)
    ├── "SIG" / node:str / shard:int                    -> counter (LE i64)       watched bell, one per shard
    ├── "L"   / node:str                                -> heartbeat unix secs (LE i64)   liveness
    ├── "ID"  / topic:str / idem:str / stamp:Versionstamp -> ""                   idempotent-publish marker
    ├── "AU"  / user:str                                -> auth.User (msgpack)    users (password hash, role)
    ├── "AT"  / user:str / digest:str                   -> auth.Token (msgpack)   access tokens, by SHA-256 digest
    ├── "AA"  / user:str / pattern:str                  -> auth.Access (msgpack)  ACL entries ("*" = everyone)
    ├── "AV"                                            -> counter (LE i64)       auth version, bumped by every change
    ├── "RL"  / visitor:str                             -> limits.Bucket (msgpack) a visitor's request token bucket
    ├── "S"   / due:int / stamp:Versionstamp / topic:str -> Envelope (msgpack)   scheduled (X-Delay), not yet in Q
    ├── "SR"  / topic:str / origin:bytes / stamp:Versionstamp -> ""             a released scheduled message: its
    │                                                                            publish id -> its Q stamp
    ├── "SB"                                            -> counter (LE i64)       schedule bell, rung by every scheduling
    ├── "ST"  / name:str / slot:int                     -> counter (LE)           fleet-wide stats (atomic adds; "tally":
    │                                                                            16 bytes, messages | stored bytes)
    ├── "SH"  / unix:int                                -> counter (LE i64)       samples of the messages counter
    ├── "WT"  / topic:str / push_topic:str / stamp:Versionstamp -> ""             Web Push Topic: its last Q entry
    ├── "VK"  / topic:str                               -> VAPID key (utf-8)      topic bound to a VAPID key
    ├── "RF"  / visitor:str                             -> limits.Bucket (msgpack) a visitor's failed-login bucket
    ├── "RM"  / day:int / visitor:str                   -> count (LE i64)         messages a visitor published that UTC day
    ├── "RS"  / visitor:str / node:str                  -> count (LE i64)         a visitor's open subscriptions on a node
    ├── "RSN" / node:str / visitor:str                  -> ""                     reverse of RS, for dead-node sweeps
    ├── "RV"  / topic:str                               -> limits.RateVisitor (msgpack) a UnifiedPush topic's subscriber
    ├── "TA"  / topic:str                               -> last access unix secs (LE i64)  an active topic (total-topics cap)
    ├── "TN"                                            -> counter (LE i64)       how many TA entries there are
    └── "TX"  / second:int / txid:bytes                 -> stamp (10 bytes)       FoundationDB commit marker: that
                                                                                 commit applied (read after a 1021)

Stamps are 12 bytes: 10 commit bytes assigned at commit plus a 2-byte user version, so one
transaction's Q, X, IN and ID entries of one message share one stamp: one message, one id.

QT makes ``since=<time>`` two reads at most: every publish sets (topic, its second) to its own stamp
with a versionstamped value, a blind write (no read, so publishes never conflict on it; the last
commit of the second wins, which is the entry's meaning), and the newest entry before a time is the
cursor for that time. The janitor clears an entry with the message it names. A topic with no entry
before the time (rows written before the index existed) is scanned instead, one bounded batch per
transaction (``ops.read.scan_time``); those rows age out with their TTL.

TX is written by the FoundationDB driver only: each write transaction of a ``transact`` call also
sets the call's marker (its start second, a random txid) to its commit's stamp, so the attempt after
a commit_unknown_result (1021) can tell whether that commit applied, and then not apply it twice
(``drivers/foundation.py``). The janitor clears markers a minute old with one range clear.
"""

from __future__ import annotations

import enum
import functools
import importlib.util
import struct
import sys
import types
from collections.abc import Callable
from typing import Any, cast

import fdb.tuple as fdbtuple
from fdb.tuple import Versionstamp

__all__ = [
    "Prefix",
    "ROOT",
    "format_key",
    "queue_key",
    "queue_key_incomplete",
    "queue_range",
    "queue_after",
    "unpack_queue_key",
    "time_index_key",
    "time_index_value_incomplete",
    "time_index_before",
    "time_index_range",
    "unpack_time_index_key",
    "expiry_key_incomplete",
    "expiry_range",
    "unpack_expiry_key",
    "expiry_key",
    "affinity_key",
    "affinity_range",
    "unpack_affinity_key",
    "reverse_affinity_key",
    "reverse_affinity_range",
    "holders_range",
    "unpack_reverse_affinity_key",
    "inbox_key_incomplete",
    "inbox_range",
    "node_inbox_range",
    "bell_key",
    "node_bell_range",
    "liveness_key",
    "liveness_range",
    "unpack_liveness_key",
    "idem_key_incomplete",
    "idem_range",
    "idem_key",
    "unpack_idem_key",
    "user_key",
    "user_range",
    "unpack_user_key",
    "token_key",
    "token_range",
    "unpack_token_key",
    "access_key",
    "access_range",
    "unpack_access_key",
    "auth_version_key",
    "schedule_bell_key",
    "bucket_key",
    "bucket_range",
    "unpack_bucket_key",
    "scheduled_key",
    "scheduled_key_incomplete",
    "scheduled_due_range",
    "unpack_scheduled_key",
    "released_key_incomplete",
    "released_key",
    "released_range",
    "unpack_released_key",
    "stat_key",
    "stat_range",
    "stat_sample_key",
    "stat_sample_range",
    "unpack_stat_sample_key",
    "unpack_stat_key",
    "push_topic_key",
    "push_topic_key_incomplete",
    "push_topic_range",
    "unpack_push_topic_key",
    "vapid_binding_key",
    "vapid_binding_range",
    "unpack_vapid_binding_key",
    "prefix_range",
    "prefix_of",
    "auth_bucket_key",
    "auth_bucket_range",
    "daily_key",
    "daily_range",
    "unpack_daily_key",
    "subscription_key",
    "subscription_range",
    "unpack_subscription_key",
    "node_subscription_key",
    "node_subscription_range",
    "unpack_node_subscription_key",
    "rate_visitor_key",
    "rate_visitor_range",
    "unpack_rate_visitor_key",
    "active_topic_key",
    "active_topic_range",
    "unpack_active_topic_key",
    "topic_count_key",
    "commit_marker_key",
    "commit_marker_value_incomplete",
    "commit_markers_before",
    "unpack_commit_marker_key",
    "shard_of",
    "pack_i64",
    "ONE",
    "unpack_i64",
    "strinc",
    "stamp_of",
]

# Versionstamps are encoded here, by the tuple layer's documented type code 0x33 (_pack_stamped,
# _pack_vs), never through fdb.tuple: its Versionstamp.to_bytes needs fdb.impl, which exists only once
# libfdb_c is loaded (fdb-facts.md section 1). The property tests check the bytes against fdb.tuple.


def _modernise_six_importer() -> None:
    """fdb 7.3 vendors ``six`` 1.11, whose meta-path importer lacks ``find_spec`` (six added it in 1.16,
    benjaminp/six#352); pytest's importlib mode, this repo's import mode, calls ``find_spec`` on every
    meta-path entry and fails collecting tests/e2e without it. The pinned bindings ship no newer six and
    pytest has no option around it, so this stays (for the tool): it adds the method six itself added."""
    for imp in sys.meta_path:
        if type(imp).__name__ == "_SixMetaPathImporter" and not hasattr(imp, "find_spec"):

            def find_spec(fullname: str, path: object = None, target: object = None, _imp: object = imp) -> object:
                if _imp.find_module(fullname, path) is None:  # type: ignore[attr-defined]  # six 1.11 importer API, untyped
                    return None
                return importlib.util.spec_from_loader(fullname, _imp)  # type: ignore[arg-type]  # six's importer is its own loader

            imp.find_spec = find_spec  # type: ignore[method-assign, assignment]  # adding the method six 1.16 added is the point


_modernise_six_importer()


class Prefix(str, enum.Enum):
    """The constant first level under the root; named once, parsed back through this enum."""

    META = "META"
    QUEUE = "Q"
    TIME_INDEX = "QT"
    EXPIRY = "X"
    AFFINITY = "C"
    AFFINITY_BY_NODE = "CN"
    INBOX = "IN"
    BELL = "SIG"
    LIVENESS = "L"
    IDEMPOTENCY = "ID"
    AUTH_USER = "AU"
    AUTH_TOKEN = "AT"
    AUTH_ACCESS = "AA"
    AUTH_VERSION = "AV"
    RATE_BUCKET = "RL"
    SCHEDULED = "S"
    RELEASED = "SR"
    SCHEDULE_BELL = "SB"
    STATS = "ST"
    STATS_SAMPLE = "SH"
    PUSH_TOPIC = "WT"
    VAPID_BINDING = "VK"
    AUTH_FAILURES = "RF"
    DAILY_MESSAGES = "RM"
    SUBSCRIPTIONS = "RS"
    SUBSCRIPTIONS_BY_NODE = "RSN"
    RATE_VISITOR = "RV"
    ACTIVE_TOPIC = "TA"
    TOPIC_COUNT = "TN"
    COMMIT_MARKER = "TX"


_P: Any = types.SimpleNamespace(**{m.name: m.value for m in Prefix})
"""``Prefix``'s values as plain attributes (``_P.QUEUE == "Q"``): ``Prefix.QUEUE.value`` is a
Python-level descriptor call, and every key the hot path builds paid one."""

# The bindings ship no type information: their two tuple-layer calls used here, typed once.
_tuple_pack: Callable[[tuple[object, ...]], bytes] = fdbtuple.pack
_tuple_unpack: Callable[..., tuple[Any, ...]] = fdbtuple.unpack

ROOT = _tuple_pack(("upf",))
_I64 = struct.Struct("<q")
_PLACEHOLDER = b"\xff" * 10


def _enc(item: object) -> bytes:
    """The tuple layer's encoding of one element, for the element types UPF keys use; anything else
    goes through fdb.tuple itself. The property tests check equality with ``fdb.tuple.pack``."""
    if type(item) is str:
        return b"\x02" + item.encode("utf-8").replace(b"\x00", b"\x00\xff") + b"\x00"
    if type(item) is int and 0 <= item < 1 << 64:
        if item == 0:
            return b"\x14"
        n = (item.bit_length() + 7) // 8
        return bytes((0x14 + n,)) + item.to_bytes(n, "big")
    return _tuple_pack((item,))


_enc_recent: Callable[[int], bytes] = functools.lru_cache(maxsize=256)(_enc)
"""``_enc`` of a unix second: every publish encodes the current one (its time-index key)."""


@functools.lru_cache(maxsize=65536)
def _prefix(*items: object) -> bytes:
    """Packed ROOT + items; cached because the same topics, nodes and shards recur on the hot path."""
    return ROOT + b"".join(_enc(i) for i in items)


def _pack(*items: object) -> bytes:
    return _prefix(*items)


def _pack_stamped(prefix: bytes, stamp: bytes, *tail: object) -> bytes:
    key = prefix + b"\x33" + stamp
    return key + b"".join(map(_enc, tail)) if tail else key


def _pack_vs(prefix: bytes, user_version: int, *tail: object) -> bytes:
    """Key with an incomplete versionstamp after ``prefix``, then the 4-byte little-endian offset."""
    key = prefix + b"\x33" + _PLACEHOLDER + user_version.to_bytes(2, "big")
    if tail:
        key += b"".join(map(_enc, tail))
    return key + (len(prefix) + 1).to_bytes(4, "little")


def _unpack(key: bytes, prefix: Prefix, arity: int) -> tuple[Any, ...]:
    if not key.startswith(ROOT):
        raise ValueError("key is outside the upf root")
    items = _tuple_unpack(key, prefix_len=len(ROOT))
    if len(items) != arity + 1 or Prefix(items[0]) is not prefix:
        raise ValueError("key is not of the expected kind")
    return items[1:]


def _range(*items: object) -> tuple[bytes, bytes]:
    """Every key strictly inside the tuple prefix ``items`` (the tuple layer's range)."""
    p = _prefix(*items)
    return p + b"\x00", p + b"\xff"


def strinc(key: bytes) -> bytes:
    """The first key after every key that starts with ``key`` (FoundationDB's strinc)."""
    key = key.rstrip(b"\xff")
    if not key:
        raise ValueError("key must contain a byte other than 0xff")
    return key[:-1] + bytes([key[-1] + 1])


def stamp_of(vs: Versionstamp) -> bytes:
    """12 raw bytes of a complete versionstamp."""
    tr_version: bytes = vs.tr_version
    return tr_version + struct.pack(">H", vs.user_version)


def _vs(stamp: bytes) -> Versionstamp:
    return Versionstamp(stamp[:10], struct.unpack(">H", stamp[10:12])[0])


def pack_i64(n: int) -> bytes:
    return _I64.pack(n)


ONE = pack_i64(1)
"""The atomic add that counts one (a bell rung, a counter bumped)."""


def unpack_i64(raw: bytes | None) -> int:
    if not raw:
        return 0
    n: int = _I64.unpack(raw[:8].ljust(8, b"\x00"))[0]
    return n


@functools.lru_cache(maxsize=65536)
def shard_of(topic: str, shard_count: int) -> int:
    """fnv1a-32 of the topic, so writers and pushers of any language agree on the shard (cached: a
    publish asks for it three times, byte by byte in Python)."""
    h = 0x811C9DC5
    for b in topic.encode("utf-8"):
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h % shard_count


# --- META -------------------------------------------------------------------------------------------
def format_key() -> bytes:
    return _pack(_P.META, "format")


def restoring_key() -> bytes:
    """Set while ``upf restore`` writes a backup into the store, cleared once it is whole (with its
    stamp floor raised): a store that holds it is refused by every role."""
    return _pack(_P.META, "restoring")


# --- Q ----------------------------------------------------------------------------------------------
def queue_key(topic: str, stamp: bytes) -> bytes:
    return _pack_stamped(_prefix(_P.QUEUE, topic), stamp)


def queue_key_incomplete(topic: str, user_version: int) -> bytes:
    return _pack_vs(_prefix(_P.QUEUE, topic), user_version)


def queue_range(topic: str) -> tuple[bytes, bytes]:
    return _range(_P.QUEUE, topic)


def queue_after(topic: str, stamp: bytes | None) -> tuple[bytes, bytes]:
    """The range of a topic's queue strictly after ``stamp`` (all of it when None). Built from the
    prefix once: a pusher's wake-up asks for one per topic it reads."""
    p = _prefix(_P.QUEUE, topic)
    return (p + b"\x00" if stamp is None else _pack_stamped(p, stamp) + b"\x00"), p + b"\xff"


def unpack_queue_key(key: bytes) -> tuple[str, bytes]:
    topic, vs = _unpack(key, Prefix.QUEUE, 2)
    return topic, stamp_of(vs)


# --- QT ---------------------------------------------------------------------------------------------
def time_index_key(topic: str, second: int) -> bytes:
    return _prefix(_P.TIME_INDEX, topic) + _enc_recent(second)


def time_index_value_incomplete(user_version: int) -> bytes:
    """A versionstamped value: the placeholder, the user version, then the offset (0) of the placeholder."""
    return _PLACEHOLDER + user_version.to_bytes(2, "big") + b"\x00\x00\x00\x00"


def time_index_range(topic: str) -> tuple[bytes, bytes]:
    return _range(_P.TIME_INDEX, topic)


def time_index_before(topic: str, second: int) -> tuple[bytes, bytes]:
    """A topic's time-index entries of seconds strictly before ``second``."""
    return time_index_range(topic)[0], time_index_key(topic, second)


def unpack_time_index_key(key: bytes) -> tuple[str, int]:
    topic, second = _unpack(key, Prefix.TIME_INDEX, 2)
    return topic, second


# --- X ----------------------------------------------------------------------------------------------
# ``_prefix(_P.EXPIRY, expiry)`` is cached: every publish of a second shares it.
def expiry_key(expiry: int, topic: str, stamp: bytes) -> bytes:
    return _pack_stamped(_prefix(_P.EXPIRY, expiry) + _enc(topic), stamp)


def expiry_key_incomplete(expiry: int, topic: str, user_version: int) -> bytes:
    return _pack_vs(_prefix(_P.EXPIRY, expiry) + _enc(topic), user_version)


def expiry_range(until: int) -> tuple[bytes, bytes]:
    """Every X entry with expiry < until."""
    return _prefix(_P.EXPIRY), _prefix(_P.EXPIRY) + _enc(until)


def unpack_expiry_key(key: bytes) -> tuple[int, str, bytes]:
    expiry, topic, vs = _unpack(key, Prefix.EXPIRY, 3)
    return expiry, topic, stamp_of(vs)


# --- C / CN -----------------------------------------------------------------------------------------
def affinity_key(topic: str, node: str) -> bytes:
    return _pack(_P.AFFINITY, topic, node)


def affinity_range(topic: str) -> tuple[bytes, bytes]:
    return _range(_P.AFFINITY, topic)


@functools.lru_cache(maxsize=65536)
def unpack_affinity_key(key: bytes) -> tuple[str, str]:
    """Cached: every publish unpacks its topic's holders, and the same (topic, node) keys recur."""
    topic, node = _unpack(key, Prefix.AFFINITY, 2)
    return topic, node


def reverse_affinity_key(node: str, topic: str) -> bytes:
    return _pack(_P.AFFINITY_BY_NODE, node, topic)


def reverse_affinity_range(node: str) -> tuple[bytes, bytes]:
    return _range(_P.AFFINITY_BY_NODE, node)


def holders_range() -> tuple[bytes, bytes]:
    """Every node's reverse affinities: the nodes that hold a topic, one after another."""
    return _range(_P.AFFINITY_BY_NODE)


def unpack_reverse_affinity_key(key: bytes) -> tuple[str, str]:
    node, topic = _unpack(key, Prefix.AFFINITY_BY_NODE, 2)
    return node, topic


# --- IN / SIG ---------------------------------------------------------------------------------------
def inbox_key_incomplete(node: str, shard: int, user_version: int) -> bytes:
    return _pack_vs(_prefix(_P.INBOX, node, shard), user_version)


@functools.lru_cache(maxsize=4096)
def inbox_range(node: str, shard: int) -> tuple[bytes, bytes]:
    """Cached: a node drains dozens of its shards per wake-up."""
    return _range(_P.INBOX, node, shard)


def node_inbox_range(node: str) -> tuple[bytes, bytes]:
    return _range(_P.INBOX, node)


@functools.lru_cache(maxsize=4096)
def bell_key(node: str, shard: int) -> bytes:
    """Cached: a node re-arms dozens of its bells per wake-up, a writer rings one per publish."""
    return _pack(_P.BELL, node, shard)


def node_bell_range(node: str) -> tuple[bytes, bytes]:
    return _range(_P.BELL, node)


# --- L ----------------------------------------------------------------------------------------------
def liveness_key(node: str) -> bytes:
    return _pack(_P.LIVENESS, node)


def liveness_range() -> tuple[bytes, bytes]:
    return _range(_P.LIVENESS)


def unpack_liveness_key(key: bytes) -> str:
    (node,) = _unpack(key, Prefix.LIVENESS, 1)
    return cast(str, node)


# --- ID ---------------------------------------------------------------------------------------------
def idem_key_incomplete(topic: str, idem: str, user_version: int) -> bytes:
    return _pack_vs(_prefix(_P.IDEMPOTENCY, topic) + _enc(idem), user_version)


def idem_key(topic: str, idem: str, stamp: bytes) -> bytes:
    return _pack_stamped(_prefix(_P.IDEMPOTENCY, topic) + _enc(idem), stamp)


def idem_range(topic: str, idem: str) -> tuple[bytes, bytes]:
    p = _prefix(_P.IDEMPOTENCY, topic) + _enc(idem)
    return p + b"\x00", p + b"\xff"


def unpack_idem_key(key: bytes) -> tuple[str, str, bytes]:
    topic, idem, vs = _unpack(key, Prefix.IDEMPOTENCY, 3)
    return topic, idem, stamp_of(vs)


# --- AU / AT / AA / AV --------------------------------------------------------------------------------
def user_key(user: str) -> bytes:
    return _pack(_P.AUTH_USER, user)


def user_range() -> tuple[bytes, bytes]:
    return _range(_P.AUTH_USER)


def unpack_user_key(key: bytes) -> str:
    (user,) = _unpack(key, Prefix.AUTH_USER, 1)
    return cast(str, user)


def token_key(user: str, digest: str) -> bytes:
    return _pack(_P.AUTH_TOKEN, user, digest)


def token_range(user: str | None = None) -> tuple[bytes, bytes]:
    """Every token, or one user's."""
    return _range(_P.AUTH_TOKEN) if user is None else _range(_P.AUTH_TOKEN, user)


def unpack_token_key(key: bytes) -> tuple[str, str]:
    user, digest = _unpack(key, Prefix.AUTH_TOKEN, 2)
    return user, digest


def access_key(user: str, pattern: str) -> bytes:
    return _pack(_P.AUTH_ACCESS, user, pattern)


def access_range(user: str | None = None) -> tuple[bytes, bytes]:
    """Every ACL entry, or one user's ("*" is everyone's)."""
    return _range(_P.AUTH_ACCESS) if user is None else _range(_P.AUTH_ACCESS, user)


def unpack_access_key(key: bytes) -> tuple[str, str]:
    user, pattern = _unpack(key, Prefix.AUTH_ACCESS, 2)
    return user, pattern


def auth_version_key() -> bytes:
    return _pack(_P.AUTH_VERSION)


def bucket_key(visitor: str) -> bytes:
    return _pack(_P.RATE_BUCKET, visitor)


def bucket_range() -> tuple[bytes, bytes]:
    return _range(_P.RATE_BUCKET)


def unpack_bucket_key(key: bytes) -> str:
    (visitor,) = _unpack(key, Prefix.RATE_BUCKET, 1)
    return cast(str, visitor)


# --- S / SR -----------------------------------------------------------------------------------------
def scheduled_key(due: int, stamp: bytes, topic: str) -> bytes:
    return _pack_stamped(_prefix(_P.SCHEDULED) + _enc(due), stamp, topic)


def scheduled_key_incomplete(due: int, topic: str, user_version: int) -> bytes:
    return _pack_vs(_prefix(_P.SCHEDULED) + _enc(due), user_version, topic)


def scheduled_due_range(until: int) -> tuple[bytes, bytes]:
    """Every scheduled message due at or before ``until``, earliest first."""
    return _prefix(_P.SCHEDULED), _prefix(_P.SCHEDULED) + _enc(until + 1)


def unpack_scheduled_key(key: bytes) -> tuple[int, bytes, str]:
    due, vs, topic = _unpack(key, Prefix.SCHEDULED, 3)
    return due, stamp_of(vs), topic


def schedule_bell_key() -> bytes:
    """Watched by every releaser, so a message scheduled sooner than the earliest it knew wakes it."""
    return _pack(_P.SCHEDULE_BELL)


def released_key_incomplete(topic: str, origin: bytes, user_version: int) -> bytes:
    return _pack_vs(_prefix(_P.RELEASED, topic) + _enc(origin), user_version)


def released_key(topic: str, origin: bytes, stamp: bytes) -> bytes:
    return _pack_stamped(_prefix(_P.RELEASED, topic) + _enc(origin), stamp)


def released_range(topic: str, origin: bytes) -> tuple[bytes, bytes]:
    p = _prefix(_P.RELEASED, topic) + _enc(origin)
    return p + b"\x00", p + b"\xff"


def unpack_released_key(key: bytes) -> tuple[str, bytes, bytes]:
    topic, origin, vs = _unpack(key, Prefix.RELEASED, 3)
    return topic, origin, stamp_of(vs)


# --- ST / SH ----------------------------------------------------------------------------------------
def stat_key(name: str, slot: int) -> bytes:
    return _pack(_P.STATS, name, slot)


def stat_range(name: str) -> tuple[bytes, bytes]:
    return _range(_P.STATS, name)


def unpack_stat_key(key: bytes) -> tuple[str, int]:
    name, slot = _unpack(key, Prefix.STATS, 2)
    return name, slot


def stat_sample_key(unix: int) -> bytes:
    return _pack(_P.STATS_SAMPLE, unix)


def stat_sample_range() -> tuple[bytes, bytes]:
    return _range(_P.STATS_SAMPLE)


def unpack_stat_sample_key(key: bytes) -> int:
    (unix,) = _unpack(key, Prefix.STATS_SAMPLE, 1)
    return cast(int, unix)


# --- WT / VK ----------------------------------------------------------------------------------------
def push_topic_key_incomplete(topic: str, push_topic: str, user_version: int) -> bytes:
    return _pack_vs(_prefix(_P.PUSH_TOPIC, topic) + _enc(push_topic), user_version)


def push_topic_key(topic: str, push_topic: str, stamp: bytes) -> bytes:
    return _pack_stamped(_prefix(_P.PUSH_TOPIC, topic) + _enc(push_topic), stamp)


def push_topic_range(topic: str, push_topic: str) -> tuple[bytes, bytes]:
    """The markers of one (topic, Web Push Topic): normally one, the stamp of its last message."""
    p = _prefix(_P.PUSH_TOPIC, topic) + _enc(push_topic)
    return p + b"\x00", p + b"\xff"


def unpack_push_topic_key(key: bytes) -> tuple[str, str, bytes]:
    topic, push_topic, vs = _unpack(key, Prefix.PUSH_TOPIC, 3)
    return topic, push_topic, stamp_of(vs)


def vapid_binding_key(topic: str) -> bytes:
    return _pack(_P.VAPID_BINDING, topic)


def vapid_binding_range() -> tuple[bytes, bytes]:
    return _range(_P.VAPID_BINDING)


def unpack_vapid_binding_key(key: bytes) -> str:
    (topic,) = _unpack(key, Prefix.VAPID_BINDING, 1)
    return cast(str, topic)


# --- any kind ---------------------------------------------------------------------------------------
def prefix_range(prefix: Prefix) -> tuple[bytes, bytes]:
    """Every key of one kind, the bare ``("upf", prefix)`` key (AV) included: a backup copies the
    keyspace kind by kind."""
    p = _prefix(prefix.value)
    return p, p + b"\xff"


def prefix_of(key: bytes) -> Prefix:
    """The kind of any UPF key; ValueError outside the root or for a kind this release does not know."""
    if not key.startswith(ROOT):
        raise ValueError("key is outside the upf root")
    return Prefix(_tuple_unpack(key, prefix_len=len(ROOT))[0])


# --- RF / RM / RS / RSN -------------------------------------------------------------------------------
def auth_bucket_key(visitor: str) -> bytes:
    return _pack(_P.AUTH_FAILURES, visitor)


def auth_bucket_range() -> tuple[bytes, bytes]:
    return _range(_P.AUTH_FAILURES)


def daily_key(day: int, visitor: str) -> bytes:
    return _pack(_P.DAILY_MESSAGES, day, visitor)


def daily_range(before: int | None = None) -> tuple[bytes, bytes]:
    """Every daily count, or those of days before ``before``."""
    if before is None:
        return _range(_P.DAILY_MESSAGES)
    return _prefix(_P.DAILY_MESSAGES) + b"\x00", _prefix(_P.DAILY_MESSAGES) + _enc(before)


def unpack_daily_key(key: bytes) -> tuple[int, str]:
    day, visitor = _unpack(key, Prefix.DAILY_MESSAGES, 2)
    return day, visitor


def subscription_key(visitor: str, node: str) -> bytes:
    return _pack(_P.SUBSCRIPTIONS, visitor, node)


def subscription_range(visitor: str) -> tuple[bytes, bytes]:
    return _range(_P.SUBSCRIPTIONS, visitor)


def unpack_subscription_key(key: bytes) -> tuple[str, str]:
    visitor, node = _unpack(key, Prefix.SUBSCRIPTIONS, 2)
    return visitor, node


def node_subscription_key(node: str, visitor: str) -> bytes:
    return _pack(_P.SUBSCRIPTIONS_BY_NODE, node, visitor)


def node_subscription_range(node: str | None = None) -> tuple[bytes, bytes]:
    """Every node's reverse entries, or one node's."""
    if node is None:
        return _range(_P.SUBSCRIPTIONS_BY_NODE)
    return _range(_P.SUBSCRIPTIONS_BY_NODE, node)


def unpack_node_subscription_key(key: bytes) -> tuple[str, str]:
    node, visitor = _unpack(key, Prefix.SUBSCRIPTIONS_BY_NODE, 2)
    return node, visitor


def rate_visitor_key(topic: str) -> bytes:
    return _pack(_P.RATE_VISITOR, topic)


def rate_visitor_range() -> tuple[bytes, bytes]:
    return _range(_P.RATE_VISITOR)


def unpack_rate_visitor_key(key: bytes) -> str:
    (topic,) = _unpack(key, Prefix.RATE_VISITOR, 1)
    return str(topic)


def active_topic_key(topic: str) -> bytes:
    return _pack(_P.ACTIVE_TOPIC, topic)


def active_topic_range() -> tuple[bytes, bytes]:
    return _range(_P.ACTIVE_TOPIC)


def unpack_active_topic_key(key: bytes) -> str:
    (topic,) = _unpack(key, Prefix.ACTIVE_TOPIC, 1)
    return str(topic)


def topic_count_key() -> bytes:
    return _pack(_P.TOPIC_COUNT)


# --- TX ---------------------------------------------------------------------------------------------
def commit_marker_key(second: int, txid: bytes) -> bytes:
    """Built past ``_prefix``'s cache: a txid never recurs, it would only evict the hot keys."""
    return _prefix(_P.COMMIT_MARKER) + _enc(second) + _enc(txid)


def commit_marker_value_incomplete() -> bytes:
    """A versionstamped value that becomes the bare 10-byte commit stamp: the placeholder, then its
    offset (0)."""
    return _PLACEHOLDER + b"\x00\x00\x00\x00"


def commit_markers_before(second: int) -> tuple[bytes, bytes]:
    """Every commit marker of a second before ``second``."""
    p = _prefix(_P.COMMIT_MARKER)
    return p + b"\x00", p + _enc(second)


def unpack_commit_marker_key(key: bytes) -> tuple[int, bytes]:
    second, txid = _unpack(key, Prefix.COMMIT_MARKER, 2)
    return second, txid
