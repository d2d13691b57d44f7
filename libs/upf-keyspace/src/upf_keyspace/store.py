"""The facade every role uses: one method per UPF operation, each one retried transaction.

Picks the driver once at open (FoundationDB when a cluster file is configured, else the embedded
file), checks the format version, and keeps retry policy in one place (the driver's ``transact``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence

import msgspec

from . import keys, ops
from .auth import AuthState, Permission, Token, User
from .contract import Database, Watch, WatchSet
from .envelope import Envelope
from .errors import StoreError
from .limits import Failure, Lease
from .msgid import encode_id
from .ops.inbox import Drained, Pokes
from .ops.read import Since, Stored
from .settings import Settings

__all__ = ["Store", "Published", "Drained", "Pokes", "open_store", "open_database"]


class Published(msgspec.Struct, frozen=True):
    stamp: bytes
    envelope: Envelope
    duplicate: bool
    """True when an idempotency key matched an earlier publish: nothing new was stored."""
    poked: int = 0

    @property
    def id(self) -> str:
        return encode_id(self.stamp)


async def open_database(settings: Settings) -> Database:
    if settings.fdb_cluster_file:
        from .drivers.foundation import open_foundationdb

        return await open_foundationdb(settings.fdb_cluster_file)
    from .drivers.embedded import open_embedded

    return await open_embedded(settings.store_path)


async def open_store(settings: Settings, *, restoring: bool = False) -> Store:
    """The store, its format checked; ``restoring``: for ``upf restore``, which may find its own
    unfinished restore (every other opener refuses it: ``UnfinishedRestoreError``)."""
    db = await open_database(settings)
    try:
        await db.transact(ops.meta.check_format, restoring)
    except BaseException:
        await db.close()
        raise
    return Store(db, shard_count=settings.shard_count, max_ttl_secs=settings.default_ttl_secs)


def _published(commit: bytes, pending: ops.publish.Pending) -> Published:
    """A committed publish: its position is the commit's stamp and its user version."""
    return Published(commit + pending.user_version.to_bytes(2, "big"), pending.envelope, False, pending.poked)


class Store:
    def __init__(self, db: Database, *, shard_count: int, max_ttl_secs: int = 0) -> None:
        self.db = db
        self.shard_count = shard_count
        self.max_ttl_secs = max_ttl_secs
        """The longest a message is kept (UPF_DEFAULT_TTL_SECS caps every TTL): how long a released
        scheduled message's id keeps resolving to its release (``expire``); 0: no longer than it."""

    async def close(self) -> None:
        await self.db.close()

    async def ping(self) -> int:
        """One cheap read (the format record): what a ``__heartbeat__`` endpoint asks of the store."""

        async def body(tr):  # type: ignore[no-untyped-def]  # a transaction body: typed by the op it returns
            return keys.unpack_i64(await tr.get(keys.format_key(), snapshot=True))

        return await self.db.transact(body)

    async def publish(self, topic: str, envelope: Envelope, *, idem: str = "") -> Published:
        """One publish: it shares a transaction with the others the driver groups with it
        (``Database.transact_grouped``; those with an idempotency key in a group of their own); one
        with a Web Push ``Topic`` has its own (it clears the message the topic named, which another
        publish of a group may be writing)."""
        if not idem and not envelope.push_topic:
            pending = await self.db.transact_grouped(
                ops.publish.publish_many, (topic, envelope), shard_count=self.shard_count
            )
            assert pending.commit_stamp is not None
            return _published(await pending.commit_stamp, pending)
        if envelope.push_topic:
            pending = await self.db.transact(
                ops.publish.publish,
                topic,
                envelope,
                shard_count=self.shard_count,
                idem=idem,
                keep_released_secs=self.max_ttl_secs,
            )
        else:
            pending = await self.db.transact_grouped(
                ops.publish.publish_keyed, (topic, envelope, idem), shard_count=self.shard_count
            )
        if pending.duplicate_of is not None:
            return Published(pending.duplicate_of, pending.envelope, True)
        assert pending.commit_stamp is not None
        published = _published(await pending.commit_stamp, pending)
        return Published(published.stamp, published.envelope, True) if pending.repeat else published

    async def vapid_admit(self, topic: str, key: str | None, *, bind: bool) -> bool:
        """Whether a publish with the verified VAPID ``key`` may go to ``topic`` (see ops.vapid.admit)."""
        return await self.db.transact(ops.vapid.admit, topic, key, bind)

    async def vapid_bindings(self) -> list[tuple[str, str]]:
        """Every VAPID-restricted topic and its key."""
        return await self.db.transact(ops.vapid.bindings)

    async def vapid_binding(self, topic: str) -> str | None:
        return await self.db.transact(ops.vapid.binding, topic)

    async def vapid_reset(self, topic: str) -> bool:
        """Unbind ``topic`` (the next valid VAPID publish binds it again); False if it was not bound."""
        return await self.db.transact(ops.vapid.reset, topic)

    async def read_after(self, topic: str, after: bytes | None, limit: int = 256) -> list[Stored]:
        return await self.db.transact(ops.read.read_after, topic, after, limit)

    async def read_many(self, wants: Sequence[tuple[str, bytes | None, int]]) -> list[list[Stored]]:
        """Several (topic, cursor, limit) reads in one snapshot transaction, answers in order."""
        return await self.db.transact(ops.read.read_many, wants)

    async def subscribe(self, topics: Sequence[str], node: str, since: Since) -> dict[str, bytes | None]:
        """Hold ``topics`` for ``node`` and resolve ``since`` to a cursor per topic, atomically: any
        publish either lands at or before the cursor or sees the affinity and pokes ``node``."""

        async def body(tr):  # type: ignore[no-untyped-def]  # a transaction body: typed by the op it returns
            ops.affinity.hold(tr, topics, node)
            return await ops.read.positions(tr, topics, since)

        try:
            found = await self.db.transact(body)
        except StoreError as exc:
            if not exc.storage_full:
                raise
            # The store refuses writes: stream without the affinity, read-only. Nothing can be
            # published meanwhile; the safety poll delivers what is published once space returns.
            found = await self.db.transact(ops.read.positions, topics, since)
        return await self._resumed(found, since)

    async def subscribe_live(
        self, topics: Sequence[str], node: str, since: Since
    ) -> tuple[dict[str, bytes | None], dict[str, bytes | None]]:
        """``subscribe`` that also returns each topic's live mark (``ops.read.live_mark``): what is above
        it arrived while the subscriber was connected, so ``X-Cache: no`` messages there are sent."""

        async def body(tr):  # type: ignore[no-untyped-def]  # a transaction body: typed by the op it returns
            ops.affinity.hold(tr, topics, node)
            return await ops.read.positions_and_marks(tr, topics, since)

        try:
            found, marks = await self.db.transact(body)
        except StoreError as exc:
            if not exc.storage_full:
                raise
            # As ``subscribe``: the store refuses writes, so stream without the affinity (the safety poll).
            found, marks = await self.db.transact(ops.read.positions_and_marks, topics, since)
        return await self._resumed(found, since), marks

    async def schedule(self, topic: str, envelope: Envelope, due: int) -> Published:
        """Keep ``envelope`` hidden until ``due`` (unix secs); its id is the one delivered later."""
        pending = await self.db.transact(ops.schedule.schedule, topic, envelope, due)
        assert pending.commit_stamp is not None
        return _published(await pending.commit_stamp, pending)

    async def next_due(self) -> int | None:
        return await self.db.transact(ops.schedule.next_due)

    async def watch_due(self) -> tuple[int | None, Watch]:
        """The earliest due time and a watch that fires when a message is scheduled (await it with a
        timeout, then cancel it)."""
        return await self.db.transact(ops.schedule.watch_due)

    async def release_due(self, now: float, limit: int = 100) -> int:
        """Move scheduled messages due at ``now`` (unix secs) into Q (exactly once, whichever node runs it)."""
        return await self.db.transact(
            ops.schedule.release_due,
            int(now),
            limit,
            shard_count=self.shard_count,
            now_ms=int(now * 1000),
            keep_released_secs=self.max_ttl_secs,
        )

    async def stats(self) -> tuple[int, float]:
        """``/v1/stats``: the fleet's message total and its rate per second (ntfy's fields)."""

        async def body(tr):  # type: ignore[no-untyped-def]  # a transaction body: typed by the op it returns
            return await ops.stats.total(tr), await ops.stats.samples(tr)

        total, history = await self.db.transact(body)
        return total, ops.stats.rate(history)

    async def stored_bytes(self) -> int:
        """What ``UPF_MAX_STORE_BYTES`` bounds: the bytes of every stored message, fleet-wide."""
        return int(await self.db.transact(ops.stats.stored_bytes))

    async def appends(self) -> int:
        """How many messages ever entered Q, fleet-wide: only grows (a pusher's safety pass compares it)."""
        return int(await self.db.transact(ops.stats.appends))

    async def sample_stats(self, now: int, every: int = 60, keep: int = 10) -> bool:
        return await self.db.transact(ops.stats.sample, now, every, keep)

    async def positions(self, topics: Sequence[str], since: Since) -> dict[str, bytes | None]:
        """Resolve ``since`` without holding the topics (``poll=1`` reads and leaves)."""
        return await self._resumed(await self.db.transact(ops.read.positions, topics, since), since)

    async def _resumed(
        self, found: Mapping[str, bytes | None | ops.read.Resume], since: Since
    ) -> dict[str, bytes | None]:
        """Finish the time positions that need an unindexed queue scanned: one bounded batch per
        transaction, yielding to the event loop between them (the embedded driver's reads do not)."""
        out: dict[str, bytes | None] = {}
        for topic, cursor in found.items():
            while isinstance(cursor, ops.read.Resume):
                await asyncio.sleep(0)
                cursor = await self.db.transact(ops.read.scan_time, topic, since.time, cursor.after)
            out[topic] = cursor
        return out

    async def hold(self, topics: Sequence[str], node: str) -> None:
        async def body(tr):  # type: ignore[no-untyped-def]  # a transaction body: typed by the op it returns
            ops.affinity.hold(tr, topics, node)

        await self.db.transact(body)

    async def release(self, topics: Sequence[str], node: str) -> None:
        async def body(tr):  # type: ignore[no-untyped-def]  # a transaction body: typed by the op it returns
            ops.affinity.release(tr, topics, node)

        await self.db.transact(body)

    def bells(self, node: str, callbacks: Sequence[Callable[[], None]]) -> WatchSet:
        """A watch set on ``node``'s bells, one per shard (``callbacks[shard]`` when it rings), unarmed:
        the drains arm them."""
        return self.db.watch_set(ops.inbox.bell_keys(node, len(callbacks)), callbacks)

    async def drain_inbox(self, node: str, shard: int, bells: WatchSet, after: bytes | None = None) -> Drained:
        """The topics poked since ``after`` (a read-only transaction), re-arming the shard's bell."""
        return await self.db.transact(ops.inbox.drain, node, shard, bells, after)

    async def clear_inbox(self, node: str, shard: int, upto: bytes) -> None:
        await self.db.transact(ops.inbox.clear, node, shard, upto)

    async def drain_inboxes(self, node: str, afters: Mapping[int, bytes | None], bells: WatchSet) -> Pokes:
        """``drain_inbox`` for several shards (shard -> after) in one read-only transaction, their
        pokes together."""
        return await self.db.transact(ops.inbox.drain_many, node, afters, bells)

    async def clear_inboxes(self, node: str, uptos: Mapping[int, bytes]) -> None:
        """``clear_inbox`` for several shards (shard -> upto) in one transaction."""
        await self.db.transact(ops.inbox.clear_many, node, uptos)

    async def heartbeat(self, node: str, now: int) -> bool:
        return await self.db.transact(ops.inbox.heartbeat, node, now)

    async def retire(self, node: str) -> None:
        """The node stopped cleanly (see ``ops.inbox.retire``)."""
        await self.db.transact(ops.inbox.retire, node)

    async def expire(self, now: int, limit: int = 500) -> int:
        return await self.db.transact(ops.janitor.expire, now, limit, self.max_ttl_secs)

    async def dead_nodes(self, now: int, max_age: int) -> list[str]:
        return await self.db.transact(ops.janitor.dead_nodes, now, max_age)

    async def sweep_node(self, node: str, now: int, max_age: int, limit: int = 500) -> int | None:
        return await self.db.transact(ops.janitor.sweep_node, node, now, max_age, limit)

    async def clear_commit_markers(self, now: int) -> None:
        """Drop the FoundationDB driver's commit markers a minute old (see ``ops.janitor``)."""
        await self.db.transact(ops.janitor.clear_commit_markers, now)

    async def lease_tokens(self, visitor: str, want: int, now: float, burst: int, refill_secs: float) -> Lease:
        """Up to ``want`` request tokens from ``visitor``'s fleet-wide bucket (see ``ops.limits``)."""
        return await self.db.transact(ops.limits.lease, visitor, want, now, burst, refill_secs)

    async def sweep_buckets(
        self, now: float, burst: int, refill_secs: float, after: bytes | None = None, limit: int = 500
    ) -> tuple[int, bytes | None]:
        """Clear refilled request buckets in one batch (see ``ops.limits.sweep``)."""
        return await self.db.transact(ops.limits.sweep, now, burst, refill_secs, after, limit)

    async def auth_failure(self, visitor: str, now: float, burst: int, refill_secs: float) -> Failure:
        """Charge one failed login to ``visitor``'s fleet-wide bucket (see ``ops.limits.auth_failure``)."""
        return await self.db.transact(ops.limits.auth_failure, visitor, now, burst, refill_secs)

    async def sweep_auth_buckets(
        self, now: float, burst: int, refill_secs: float, after: bytes | None = None, limit: int = 500
    ) -> tuple[int, bytes | None]:
        return await self.db.transact(ops.limits.sweep_auth, now, burst, refill_secs, after, limit)

    async def lease_messages(self, visitor: str, day: int, want: int, limit: int) -> int:
        """Up to ``want`` of ``visitor``'s daily messages (see ``ops.limits.lease_messages``)."""
        return await self.db.transact(ops.limits.lease_messages, visitor, day, want, limit)

    async def sweep_days(self, today: int) -> None:
        await self.db.transact(ops.limits.sweep_days, today)

    async def open_subscription(self, visitor: str, node: str, limit: int) -> int | None:
        """Count an open subscription of ``visitor`` on ``node``; None when the fleet's are at ``limit``."""
        return await self.db.transact(ops.limits.open_subscription, visitor, node, limit)

    async def close_subscription(self, visitor: str, node: str) -> None:
        await self.db.transact(ops.limits.close_subscription, visitor, node)

    async def reset_node_subscriptions(
        self, node: str, limit: int = 500, now: int | None = None, max_age: int = 0
    ) -> int | None:
        return await self.db.transact(ops.limits.reset_node_subscriptions, node, limit, now, max_age)

    async def stale_subscription_nodes(self, now: int, max_age: int) -> list[str]:
        return await self.db.transact(ops.limits.stale_subscription_nodes, now, max_age)

    async def set_rate_visitors(self, topics: list[str], visitor: str, now: float) -> None:
        await self.db.transact(ops.limits.set_rate_visitors, topics, visitor, now)

    async def rate_visitor(self, topic: str, now: float) -> str | None:
        """The subscriber a UnifiedPush publish to ``topic`` is charged to (see ``ops.limits``)."""
        return await self.db.transact(ops.limits.rate_visitor, topic, now)

    async def sweep_rate_visitors(
        self, now: float, after: bytes | None = None, limit: int = 500
    ) -> tuple[int, bytes | None]:
        return await self.db.transact(ops.limits.sweep_rate_visitors, now, after, limit)

    async def touch_topics(self, topics: list[str], now: int, limit: int) -> bool:
        """Count ``topics`` as active; False when a new one would pass the fleet's ``limit``."""
        return await self.db.transact(ops.limits.touch_topics, topics, now, limit)

    async def sweep_topics(self, now: int, after: bytes | None = None, limit: int = 500) -> tuple[int, bytes | None]:
        return await self.db.transact(ops.limits.sweep_topics, now, after, limit)

    async def topic_count(self) -> int:
        async def body(tr):  # type: ignore[no-untyped-def]  # a transaction body: typed by the op it returns
            return keys.unpack_i64(await tr.get(keys.topic_count_key(), snapshot=True))

        return await self.db.transact(body)

    # --- auth (users, tokens, ACL); roles cache auth_state() and reload when watch_auth() fires -------
    async def auth_state(self) -> AuthState:
        return await self.db.transact(ops.auth.load_state)

    async def watch_auth(self) -> tuple[int, Watch]:
        """The auth version now and a watch that fires when it changes (await it with a timeout)."""

        async def body(tr):  # type: ignore[no-untyped-def]  # a transaction body: typed by the op it returns
            return await ops.auth.version(tr), tr.watch(keys.auth_version_key())

        return await self.db.transact(body)

    async def add_user(self, name: str, user: User) -> None:
        await self.db.transact(ops.auth.add_user, name, user)

    async def put_user(self, name: str, user: User) -> None:
        await self.db.transact(ops.auth.put_user, name, user)

    async def get_user(self, name: str) -> User | None:
        return await self.db.transact(ops.auth.get_user, name)

    async def delete_user(self, name: str) -> None:
        await self.db.transact(ops.auth.delete_user, name)

    async def list_users(self) -> dict[str, User]:
        return await self.db.transact(ops.auth.list_users)

    async def set_access(self, name: str, pattern: str, permission: Permission, *, provisioned: bool = False) -> None:
        await self.db.transact(ops.auth.set_access, name, pattern, permission, provisioned=provisioned)

    async def reset_access(self, name: str | None = None, pattern: str | None = None) -> int:
        return await self.db.transact(ops.auth.reset_access, name, pattern)

    async def add_token(self, name: str, digest: str, token: Token) -> None:
        await self.db.transact(ops.auth.add_token, name, digest, token)

    async def create_token(self, name: str, digest: str, token: Token) -> None:
        """``add_token`` as the token API does it: the user's oldest beyond ntfy's 60 are pruned."""
        await self.db.transact(ops.auth.add_token, name, digest, token, prune=True)

    async def change_token(self, name: str, digest: str, label: str | None, expires: int | None) -> Token | None:
        return await self.db.transact(ops.auth.change_token, name, digest, label, expires)

    async def record_token_uses(self, uses: Mapping[str, tuple[str, int, str]]) -> int:
        """Tokens' last uses, digest -> (owner, unix seconds, origin) (see ``ops.auth.record_token_uses``)."""
        return await self.db.transact(ops.auth.record_token_uses, uses)

    async def list_tokens(self, name: str) -> dict[str, Token]:
        return await self.db.transact(ops.auth.list_tokens, name)

    async def remove_token(self, name: str, digest: str) -> bool:
        return await self.db.transact(ops.auth.remove_token, name, digest)
