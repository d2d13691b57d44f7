"""Errors of the transaction contract. Codes are FoundationDB's, so callers and the retry loop treat
both drivers alike; messages are static and details go in attributes."""

from __future__ import annotations

import contextlib
import os
import time

__all__ = [
    "StoreError",
    "NOT_COMMITTED",
    "COMMIT_UNKNOWN_RESULT",
    "TRANSACTION_TOO_OLD",
    "FUTURE_VERSION",
    "TRANSACTION_TIMED_OUT",
    "TRANSACTION_CANCELLED",
    "ACCESSED_UNREADABLE",
    "TOO_MANY_WATCHES",
    "USED_DURING_COMMIT",
    "TRANSACTION_INVALID_VERSION",
    "NO_COMMIT_VERSION",
    "KEY_TOO_LARGE",
    "VALUE_TOO_LARGE",
    "TRANSACTION_TOO_LARGE",
    "CLIENT_INVALID_OPERATION",
    "DATABASE_LOCKED",
    "STORAGE_FULL",
    "READERS_FULL",
    "REFUSED_BEFORE_COMMIT",
    "StorageHealth",
    "STORAGE",
    "FormatVersionError",
    "UnfinishedRestoreError",
]

NOT_COMMITTED = 1020
COMMIT_UNKNOWN_RESULT = 1021
TRANSACTION_TOO_OLD = 1007
FUTURE_VERSION = 1009
TRANSACTION_CANCELLED = 1025
TRANSACTION_TIMED_OUT = 1031
TOO_MANY_WATCHES = 1032
ACCESSED_UNREADABLE = 1036
DATABASE_LOCKED = 1038
USED_DURING_COMMIT = 2017
TRANSACTION_INVALID_VERSION = 2020
NO_COMMIT_VERSION = 2021
CLIENT_INVALID_OPERATION = 2000
TRANSACTION_TOO_LARGE = 2101
KEY_TOO_LARGE = 2102
VALUE_TOO_LARGE = 2103
STORAGE_FULL = 9507
"""UPF's own code (FoundationDB has none: a cluster short of space throttles commits, which then end
in ``transaction_timed_out`` 1031 at the 5 s timeout). The embedded driver raises it when a commit
would pass UPF_EMBEDDED_MAX_BYTES, LMDB's map is full, or the OS says ENOSPC. Not retryable:
retrying a full disk only delays the answer."""

READERS_FULL = 9508
"""UPF's own code, the embedded driver's: every reader slot of the store file (LMDB's reader table,
1,024 for all its processes) is taken by live processes' open snapshots, after the slots of dead ones
were reclaimed. Retryable: snapshots end within a loop turn, and the retry's backoff waits them out."""

REFUSED_BEFORE_COMMIT = frozenset({KEY_TOO_LARGE, VALUE_TOO_LARGE, TRANSACTION_TOO_LARGE, CLIENT_INVALID_OPERATION})
"""What a transaction's own writes cause, raised before its commit is sent: it certainly did not
commit, so its work may be redone in smaller parts (``Store.publish``'s shared transactions)."""

_RETRYABLE = frozenset(
    {NOT_COMMITTED, COMMIT_UNKNOWN_RESULT, TRANSACTION_TOO_OLD, FUTURE_VERSION, DATABASE_LOCKED, READERS_FULL}
)

_DESCRIPTIONS = {
    NOT_COMMITTED: "transaction not committed due to conflict with another transaction",
    COMMIT_UNKNOWN_RESULT: "transaction may or may not have committed",
    TRANSACTION_TOO_OLD: "transaction is too old to perform reads or be committed",
    FUTURE_VERSION: "request for future version",
    TRANSACTION_CANCELLED: "operation aborted because the transaction was cancelled",
    TRANSACTION_TIMED_OUT: "operation aborted because the transaction timed out",
    TOO_MANY_WATCHES: "too many watches currently set",
    ACCESSED_UNREADABLE: "read or wrote an unreadable key",
    DATABASE_LOCKED: "database is locked",
    USED_DURING_COMMIT: "operation issued while a commit was outstanding",
    TRANSACTION_INVALID_VERSION: "transaction does not have a valid commit version",
    NO_COMMIT_VERSION: "transaction is read-only and therefore does not have a commit version",
    CLIENT_INVALID_OPERATION: "invalid API call",
    TRANSACTION_TOO_LARGE: "transaction exceeds byte limit",
    KEY_TOO_LARGE: "key length exceeds limit",
    VALUE_TOO_LARGE: "value length exceeds limit",
    STORAGE_FULL: "storage is full: the write was refused",
    READERS_FULL: "every reader slot of the store file is taken",
}


class StoreError(Exception):
    """An error with FoundationDB's code; ``retryable`` says whether the retry loop runs the body again."""

    def __init__(self, code: int, detail: str = "") -> None:
        self.code = code
        self.detail = detail
        super().__init__(_DESCRIPTIONS.get(code, "store error"))

    @property
    def retryable(self) -> bool:
        return self.code in _RETRYABLE

    @property
    def storage_full(self) -> bool:
        return self.code == STORAGE_FULL

    @property
    def maybe_committed(self) -> bool:
        return self.code == COMMIT_UNKNOWN_RESULT

    def __repr__(self) -> str:
        return f"StoreError({self.code}, {self.detail!r})"


class StorageHealth:
    """Whether writes are being refused for lack of space, for the health endpoints: degraded until
    ``window_secs`` have passed without a refusal. Not cleared by the next successful write: on a
    nearly full store small writes still fit while publishes do not, and health must not flap with
    them. The window also lets a node a load balancer took out of rotation back in to try again (its
    next refused write re-detects a full disk at once). Drivers report from any thread.

    ``share(marker)``: refusals also touch ``marker``'s mtime (no new blocks needed, so it works on a
    full disk), and every process that shares it sees them: the embedded store's processes on one
    host (the all-in-one's workers, or a writer and a pusher) answer health alike."""

    def __init__(self, window_secs: float = 10.0) -> None:
        self.window_secs = window_secs
        self._refused_at: float | None = None
        self._marker: str | None = None

    def share(self, marker: str) -> None:
        self._marker = marker

    def write_refused(self) -> None:
        self._refused_at = time.monotonic()
        if self._marker is not None:
            with contextlib.suppress(OSError):
                os.utime(self._marker)

    def degraded(self) -> bool:
        refused_at = self._refused_at
        if refused_at is not None and time.monotonic() - refused_at < self.window_secs:
            return True
        if self._marker is not None:
            try:
                return abs(time.time() - os.stat(self._marker).st_mtime) < self.window_secs
            except OSError:
                return False
        return False


STORAGE = StorageHealth()
"""The process's one: a role process has one store."""


class StoreOpenError(RuntimeError):
    """The store cannot be used at all (a path that is a directory or on a read-only disk, a cluster
    file FoundationDB refuses, a newer format): a setting to fix, which no restart cures. Entry points
    print it as one line and exit 2, which also stops the all-in-one's supervisor restarting workers."""


class FormatVersionError(StoreOpenError):
    """The store was written by a newer format than this role understands; refusing to start."""


class UnfinishedRestoreError(StoreOpenError):
    """``upf restore`` into this store did not finish (it was stopped): part of a backup, no stamp
    floor. Refusing to serve it; restoring again finishes it."""
