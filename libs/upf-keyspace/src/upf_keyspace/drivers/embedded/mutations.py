"""A transaction's mutations and how a batch applies them to the file."""

from __future__ import annotations

from typing import cast

import lmdb

from ... import errors
from ...contract import KEY_LIMIT, VALUE_LIMIT

# Mutation kinds, in a transaction's ordered mutation list.
_SET, _CLEAR, _CLEAR_RANGE, _ADD, _VS_KEY, _VS_VALUE = range(6)


KEY_LIMIT_LMDB = min(KEY_LIMIT, 511)
"""The longest key this driver writes: LMDB's, as py-lmdb builds it (``MDB_MAXKEYSIZE``; a test holds
``Environment.max_key_size()`` to it), not FoundationDB's 10,000. A longer key passed the contract's
check, then failed the physical commit (``MDB_BAD_VALSIZE``) and with it every transaction of the
batch; each was retried as a conflict, the long one up to the retry limit. It is now refused when
written, with FoundationDB's code for a key too large (2102). UPF's own keys stay under ~300 bytes (a
64-character topic and a 200-character idempotency key)."""


def check_sizes(key: bytes, value: bytes) -> int:
    """The key and value limits (``KEY_LIMIT_LMDB``, the contract's ``VALUE_LIMIT``), before a write is
    kept; returns the bytes it adds. LMDB cannot store the empty key either (FoundationDB can): set,
    cleared or added to, it failed the physical commit as a key too long did, and is refused here."""
    if not key:
        raise empty_key()
    return check_range_sizes(key, value)


def empty_key() -> errors.StoreError:
    """What writing or watching the empty key raises (a watch on it would fail every watch check)."""
    return errors.StoreError(errors.CLIENT_INVALID_OPERATION, "the embedded store takes no empty key")


def check_range_sizes(key: bytes, value: bytes) -> int:
    """``check_sizes`` for a range clear's ``begin`` and ``end``: its begin may be the empty key (the
    first of the keyspace), which it only seeks."""
    if len(key) > KEY_LIMIT_LMDB:
        raise errors.StoreError(errors.KEY_TOO_LARGE, f"{len(key)} bytes")
    if len(value) > VALUE_LIMIT:
        raise errors.StoreError(errors.VALUE_TOO_LARGE, f"{len(value)} bytes")
    return len(key) + len(value)


def check_stamped(raw: bytes, what: str) -> int:
    """A versionstamped key or value (``what``): a 10-byte placeholder at the offset its last 4 bytes
    give; returns that offset."""
    if len(raw) < 14:
        raise errors.StoreError(errors.CLIENT_INVALID_OPERATION, f"versionstamped {what} shorter than 14 bytes")
    offset = int.from_bytes(raw[-4:], "little")
    if offset + 10 > len(raw) - 4:
        raise errors.StoreError(errors.CLIENT_INVALID_OPERATION, f"versionstamp offset past the {what}")
    return offset


def check_user_version(uv: int) -> int:
    """A transaction's user version: two bytes of the stamp, so at most 65536 stamped entries."""
    if uv > 0xFFFF:
        raise errors.StoreError(errors.CLIENT_INVALID_OPERATION, "more than 65536 stamped entries")
    return uv


def _add_le(base: bytes | None, param: bytes) -> bytes:
    """FoundationDB's ADD: little-endian, the existing value zero-extended or truncated to the param's length."""
    n = len(param)
    a = int.from_bytes((base or b"")[:n].ljust(n, b"\x00"), "little")
    b = int.from_bytes(param, "little")
    return ((a + b) % (1 << (8 * n))).to_bytes(n, "little") if n else b""


def stamp_at(raw: bytes, off: int, stamp10: bytes) -> bytes:
    """A versionstamped key or value with its placeholder at ``off`` replaced and its offset dropped."""
    return raw[:off] + stamp10 + raw[off + 10 : -4]


def _stamp_key(raw: bytes, stamp10: bytes) -> bytes:
    return stamp_at(raw, int.from_bytes(raw[-4:], "little"), stamp10)


class _Applier:
    """Applies a batch's mutations in order inside the committer's write transaction.

    Writes are kept in a dict until ``flush`` and reach LMDB in one ``putmulti`` call: each LMDB call
    from Python parses its arguments and releases and retakes the GIL, and a key written twice in a
    batch (a topic's time-index entry for the current second) is written once. Atomic adds to one key
    are summed across the batch and settled at ``flush``: every publish adds to a stats slot and to
    each holder's bell, so a batch of hundreds would otherwise read and rewrite the same few keys
    hundreds of times. The sum is exact: FoundationDB's ADD is addition modulo the param's width, so
    adds of one width compose. A write, clear or add of another width to a key first settles (or
    drops) its pending sum; a range clear drops what is kept in its range and clears the file at
    once, so what is kept is always newer than the file."""

    __slots__ = ("txn", "db", "pending", "writes")

    def __init__(self, txn: lmdb.Transaction, db: lmdb._Database) -> None:
        self.txn = txn
        self.db = db
        self.pending: dict[bytes, tuple[int, int]] = {}  # key -> (param width, summed param)
        self.writes: dict[bytes, bytes | None] = {}  # key -> its last value in the batch, None: cleared

    def put(self, key: bytes, value: bytes) -> None:
        self.pending.pop(key, None)  # overwritten: the adds before it no longer matter
        self.writes[key] = value

    def add(self, key: bytes, param: bytes) -> None:
        n = len(param)
        held = self.pending.get(key)
        if held is not None and held[0] != n:
            self._settle(key, held)
            held = None
        self.pending[key] = (n, int.from_bytes(param, "little") + (held[1] if held is not None else 0))

    def delete(self, key: bytes) -> None:
        self.pending.pop(key, None)
        self.writes[key] = None

    def delete_range(self, begin: bytes, end: bytes) -> None:
        for kept in (self.pending, self.writes):
            if kept:
                for k in [k for k in kept if begin <= k < end]:
                    del kept[k]
        cur = self.txn.cursor(db=self.db)
        if not cur.set_range(begin):
            return
        while True:
            k = cast(bytes, cur.key())  # b"" once past the last key
            if not k or k >= end:
                return
            cur.delete()  # and moves to the next key

    def apply(self, mutations: list[tuple[int, bytes, bytes]], stamp: bytes, stamped: list[bytes]) -> None:
        """Apply one transaction's mutations with its stamp, appending the keys it stamped to ``stamped``."""
        writes, pending = self.writes, self.pending
        for kind, a, b in mutations:
            if kind == _SET:  # first: a grouped transaction's stamped writes are sets too
                if pending:
                    pending.pop(a, None)
                writes[a] = b
            elif kind == _VS_KEY:
                key = _stamp_key(a, stamp)
                if pending:
                    pending.pop(key, None)
                writes[key] = b
                stamped.append(key)
            elif kind == _ADD:
                self.add(a, b)
            elif kind == _VS_VALUE:
                if pending:
                    pending.pop(a, None)
                writes[a] = _stamp_key(b, stamp)
            elif kind == _CLEAR:
                self.delete(a)
            elif kind == _CLEAR_RANGE:
                self.delete_range(a, b)

    def flush(self) -> None:
        """Settle every pending sum and write what is kept (before the batch's commit)."""
        for key, held in self.pending.items():
            self._settle(key, held)
        self.pending.clear()
        writes = self.writes
        if not writes:
            return
        txn, db = self.txn, self.db
        puts = [(k, v) for k, v in writes.items() if v is not None]
        if len(puts) < len(writes):
            for k, v in writes.items():
                if v is None:
                    txn.delete(k, db=db)
        if puts:
            with txn.cursor(db=db) as cur:
                cur.putmulti(puts)
        writes.clear()

    def _settle(self, key: bytes, held: tuple[int, int]) -> None:
        n, total = held
        writes = self.writes
        if key in writes:
            base = writes[key]
        else:  # bytes: no transaction uses buffers=True
            base = cast("bytes | None", self.txn.get(key, db=self.db))
        writes[key] = _add_le(base, (total % (1 << (8 * n))).to_bytes(n, "little"))
