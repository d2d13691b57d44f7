"""A transaction's mutations and how a batch applies them to the file."""

from __future__ import annotations

import sqlite3

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
    """Applies a batch's mutations in order, but runs consecutive puts as one ``executemany``: the
    committer's Python time is what competes with the event loop for the GIL."""

    __slots__ = ("conn", "puts", "pending", "added")

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.puts: list[tuple[bytes, bytes]] = []
        self.pending: set[bytes] = set()
        self.added: dict[bytes, bytes | None] = {}  # values of keys this batch atomically added to

    def flush(self) -> None:
        if self.puts:
            self.conn.executemany("INSERT OR REPLACE INTO kv VALUES (?, ?)", self.puts)
            self.puts.clear()
            self.pending.clear()

    def put(self, key: bytes, value: bytes) -> None:
        self.puts.append((key, value))
        self.pending.add(key)
        if key in self.added:
            self.added[key] = value

    def add(self, key: bytes, param: bytes) -> None:
        if key in self.added:
            base = self.added[key]
        else:
            if key in self.pending:
                self.flush()
            row = self.conn.execute("SELECT v FROM kv WHERE k = ?", (key,)).fetchone()
            base = row[0] if row else None
        value = _add_le(base, param)
        self.puts.append((key, value))
        self.pending.add(key)
        self.added[key] = value

    def delete(self, key: bytes) -> None:
        self.flush()
        self.conn.execute("DELETE FROM kv WHERE k = ?", (key,))
        if key in self.added:
            self.added[key] = None

    def delete_range(self, begin: bytes, end: bytes) -> None:
        self.flush()
        self.conn.execute("DELETE FROM kv WHERE k >= ? AND k < ?", (begin, end))
        for k in [k for k in self.added if begin <= k < end]:
            self.added[k] = None


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
