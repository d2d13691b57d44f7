"""A transaction's mutations and how a batch applies them to the file."""

from __future__ import annotations

from typing import cast

import lmdb

# Mutation kinds, in a transaction's ordered mutation list.
_SET, _CLEAR, _CLEAR_RANGE, _ADD, _VS_KEY, _VS_VALUE = range(6)


def _add_le(base: bytes | None, param: bytes) -> bytes:
    """FoundationDB's ADD: little-endian, the existing value zero-extended or truncated to the param's length."""
    n = len(param)
    a = int.from_bytes((base or b"")[:n].ljust(n, b"\x00"), "little")
    b = int.from_bytes(param, "little")
    return ((a + b) % (1 << (8 * n))).to_bytes(n, "little") if n else b""


def _stamp_key(raw: bytes, stamp10: bytes) -> bytes:
    key, off = raw[:-4], int.from_bytes(raw[-4:], "little")
    return key[:off] + stamp10 + key[off + 10 :]


class _Applier:
    """Applies a batch's mutations in order inside the committer's write transaction.

    Atomic adds to one key are summed across the batch and written once, at ``flush``: every publish
    adds to a stats slot and to each holder's bell, so a batch of hundreds would otherwise read and
    rewrite the same few keys hundreds of times, each LMDB call a round trip through the GIL. The sum
    is exact: FoundationDB's ADD is addition modulo the param's width, so adds of one width compose.
    A write, clear or add of another width to a key first settles (or drops) its pending sum."""

    __slots__ = ("txn", "db", "pending")

    def __init__(self, txn: lmdb.Transaction, db: lmdb._Database) -> None:
        self.txn = txn
        self.db = db
        self.pending: dict[bytes, tuple[int, int]] = {}  # key -> (param width, summed param)

    def put(self, key: bytes, value: bytes) -> None:
        self.pending.pop(key, None)  # overwritten: the adds before it no longer matter
        self.txn.put(key, value, db=self.db)

    def add(self, key: bytes, param: bytes) -> None:
        n = len(param)
        held = self.pending.get(key)
        if held is not None and held[0] != n:
            self._settle(key, held)
            held = None
        self.pending[key] = (n, int.from_bytes(param, "little") + (held[1] if held is not None else 0))

    def delete(self, key: bytes) -> None:
        self.pending.pop(key, None)
        self.txn.delete(key, db=self.db)

    def delete_range(self, begin: bytes, end: bytes) -> None:
        if self.pending:
            for k in [k for k in self.pending if begin <= k < end]:
                del self.pending[k]
        cur = self.txn.cursor(db=self.db)
        if not cur.set_range(begin):
            return
        while True:
            k = cast(bytes, cur.key())  # b"" once past the last key
            if not k or k >= end:
                return
            cur.delete()  # and moves to the next key

    def flush(self) -> None:
        """Write every pending sum (before the batch's commit)."""
        for key, held in self.pending.items():
            self._settle(key, held)
        self.pending.clear()

    def _settle(self, key: bytes, held: tuple[int, int]) -> None:
        n, total = held
        base = cast("bytes | None", self.txn.get(key, db=self.db))  # bytes: no transaction uses buffers=True
        self.txn.put(key, _add_le(base, (total % (1 << (8 * n))).to_bytes(n, "little")), db=self.db)


def _apply(applier: _Applier, mutations: list[tuple[int, bytes, bytes]], stamp: bytes) -> list[bytes]:
    """Apply one transaction's mutations with its stamp; returns the keys it stamped (point writes)."""
    stamped: list[bytes] = []
    for kind, a, b in mutations:
        if kind == _VS_KEY:
            key = _stamp_key(a, stamp)
            applier.put(key, b)
            stamped.append(key)
        elif kind == _SET:
            applier.put(a, b)
        elif kind == _VS_VALUE:
            applier.put(a, _stamp_key(b, stamp))
        elif kind == _ADD:
            applier.add(a, b)
        elif kind == _CLEAR:
            applier.delete(a)
        elif kind == _CLEAR_RANGE:
            applier.delete_range(a, b)
    return stamped
