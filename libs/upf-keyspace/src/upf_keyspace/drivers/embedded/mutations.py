"""A transaction's mutations and how a batch applies them to the file."""

from __future__ import annotations

from typing import cast

import lmdb

from .._ranges import point

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
    """Applies a batch's mutations in order inside the committer's write transaction."""

    __slots__ = ("txn", "db")

    def __init__(self, txn: lmdb.Transaction, db: lmdb._Database) -> None:
        self.txn = txn
        self.db = db

    def put(self, key: bytes, value: bytes) -> None:
        self.txn.put(key, value, db=self.db)

    def add(self, key: bytes, param: bytes) -> None:
        base = cast("bytes | None", self.txn.get(key, db=self.db))  # bytes: no transaction uses buffers=True
        self.txn.put(key, _add_le(base, param), db=self.db)

    def delete(self, key: bytes) -> None:
        self.txn.delete(key, db=self.db)

    def delete_range(self, begin: bytes, end: bytes) -> None:
        cur = self.txn.cursor(db=self.db)
        if not cur.set_range(begin):
            return
        while True:
            k = cast(bytes, cur.key())  # b"" once past the last key
            if not k or k >= end:
                return
            cur.delete()  # and moves to the next key


def _apply(applier: _Applier, mutations: list[tuple[int, bytes, bytes]], stamp: bytes) -> list[tuple[bytes, bytes]]:
    stamped: list[tuple[bytes, bytes]] = []
    for kind, a, b in mutations:
        if kind == _VS_KEY:
            key = _stamp_key(a, stamp)
            applier.put(key, b)
            stamped.append(point(key))
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
