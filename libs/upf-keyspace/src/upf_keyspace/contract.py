"""The one transaction contract, with FoundationDB's semantics, that both drivers implement.

Everything above the drivers (ops/, the roles) is written against these two protocols only, so the
embedded single host and a FoundationDB fleet run the same code paths.

Semantics every driver keeps (and the contract tests check):
- Serializable transactions: reads see one snapshot; a commit fails with NOT_COMMITTED (1020,
  retryable) if anything it read (non-snapshot) was changed by a transaction that committed after
  its read version.
- ``set_versionstamped_key``: the key holds a 10-byte placeholder and ends with a 4-byte
  little-endian offset to it (the tuple layer's ``pack_with_versionstamp``); at commit the placeholder
  becomes the commit's 10-byte stamp (8-byte big-endian commit version + 2-byte batch order), the same
  for every versionstamped op of the transaction. Reading such a key back before commit is refused.
- ``set_versionstamped_value``: the same, for the value (its last 4 bytes are the offset); the key is
  then unreadable in the transaction. A blind write: it adds no read conflict.
- ``add``: 64-bit little-endian two's-complement add, missing values count as zero.
- ``watch``: created in a transaction, armed at commit; fires once the key's committed value differs
  from the value the transaction saw. It may miss an A->B->A change. Always await it with a timeout.
- Limits, checked before commit with a clear error: key 10,000 bytes (511 on the embedded driver:
  LMDB's, refused with the same code; nor does it write the empty key, 2000), value 100,000 bytes,
  transaction 10,000,000 bytes, lifetime 5 s.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

__all__ = [
    "Transaction",
    "Database",
    "Watch",
    "WatchSet",
    "KEY_LIMIT",
    "VALUE_LIMIT",
    "TRANSACTION_LIMIT",
    "LIFETIME_SECS",
]

KEY_LIMIT = 10_000
VALUE_LIMIT = 100_000
TRANSACTION_LIMIT = 10_000_000
LIFETIME_SECS = 5.0

T = TypeVar("T")


class Watch(Protocol):
    """An awaitable that completes when the watched key's committed value changed."""

    def __await__(self) -> Any: ...

    def cancel(self) -> None: ...

    def done(self) -> bool: ...


class WatchSet(Protocol):
    """Watches on a fixed list of keys, one callback per key, each armed by ``Transaction.arm`` as a
    ``watch`` is: ``callbacks[i]()`` runs on the loop once per arming, when key ``i``'s committed value
    differs from the one that transaction saw (or the watch failed: a spurious call, never a lost one).
    A pusher re-arms dozens of its K bells every wake-up, without a watch object or a waiter each."""

    def cancel(self) -> None:
        """Disarm every key for good: no callback runs after this."""
        ...


class Transaction(Protocol):
    async def get(self, key: bytes, *, snapshot: bool = False) -> bytes | None: ...

    async def get_range(
        self,
        begin: bytes,
        end: bytes,
        *,
        limit: int = 0,
        reverse: bool = False,
        snapshot: bool = False,
    ) -> list[tuple[bytes, bytes]]: ...

    async def get_ranges(
        self, ranges: list[tuple[bytes, bytes, int]], *, snapshot: bool = False
    ) -> list[list[tuple[bytes, bytes]]]:
        """Forward range reads ``(begin, end, limit)`` at once, answers in order, each as ``get_range``
        would give it: a pusher's wake-up reads every poked topic's queue and every rung shard's inbox,
        so FoundationDB gets them in one round trip and the embedded store in one cursor pass."""
        ...

    def set(self, key: bytes, value: bytes) -> None: ...

    def clear(self, key: bytes) -> None: ...

    def clear_range(self, begin: bytes, end: bytes) -> None: ...

    def add(self, key: bytes, param: bytes) -> None: ...

    def set_versionstamped_key(self, key: bytes, value: bytes) -> None: ...

    def set_versionstamped_value(self, key: bytes, value: bytes) -> None: ...

    def add_read_conflict_range(self, begin: bytes, end: bytes) -> None: ...

    def get_versionstamp(self) -> Awaitable[bytes]:
        """The 10-byte commit stamp; resolves after a successful commit. Call before commit."""
        ...

    def watch(self, key: bytes) -> Watch: ...

    def arm(self, ws: WatchSet, indexes: Sequence[int]) -> None:
        """Arm ``ws``'s keys at ``indexes`` at this transaction's read, from its commit on; one armed
        already is armed again at the new value (its earlier arming will not call). A transaction that
        fails leaves the keys it armed unarmed: the caller arms them again."""
        ...

    def next_user_version(self) -> int:
        """A 16-bit counter, reset on every attempt, to tell a transaction's stamped entries apart."""
        ...

    async def commit(self) -> None: ...

    async def on_error(self, exc: BaseException) -> None:
        """Reset for another attempt if ``exc`` is retryable (with backoff), else re-raise it."""
        ...

    def cancel(self) -> None: ...


class Database(Protocol):
    name: str

    def create_transaction(self) -> Transaction: ...

    def watch_set(self, keys: Sequence[bytes], callbacks: Sequence[Callable[[], None]]) -> WatchSet:
        """A watch set on ``keys`` (see ``WatchSet``), none armed yet."""
        ...

    async def transact(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """Run ``fn(tr, *args)`` and commit, retrying by FoundationDB's rules. ``fn`` may run more than
        once, so it must have no side effects outside the transaction."""
        ...

    async def transact_grouped(self, fn: Callable[..., Awaitable[list[T]]], item: Any, **kwargs: Any) -> T:
        """Run ``fn(tr, items, **kwargs)`` over ``item`` and whichever other items, given with the
        same ``fn`` and arguments, the driver groups with it, in one transaction committed (and
        retried) as ``transact`` does; return ``item``'s element of the list ``fn`` returns (one per
        item, in order). Why: concurrent small writes then share a transaction's fixed costs (at
        2,000 publishes/s, 10-17% of the CPU per publish-and-delivery: BENCHMARKS.md, eighteenth
        pass). ``fn`` reads before it writes and does not suspend on anything but its reads; the
        arguments are hashable (they name the group). If a group is refused before its commit (a
        value too large), each item runs alone, so the failure is that item's own. The embedded
        driver runs ``fn`` inside its group commit (``drivers/embedded/grouped.py``), FoundationDB's
        groups a loop turn's items (``_turns``)."""
        ...

    async def close(self) -> None: ...
