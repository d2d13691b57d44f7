"""The thin I/O around :mod:`upf_edge.access`: keeps one process's :class:`Authorizer` current.

Why a watch and not a read per request: authorisation sits on the publish and subscribe hot paths,
and the state changes rarely (a ``upf user ...`` command). The gate loads one snapshot, watches the
auth version key that every change bumps, and swaps in a new authorizer when it moves; a timed
re-check backs the watch up. With no users and no ACL entries and the default ``read-write``,
:meth:`AccessGate.check` returns at once without parsing anything: a UPF without auth costs nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence

from upf_keyspace import Store
from upf_keyspace.auth import AuthState, Permission

from .access import ANONYMOUS, FORBIDDEN, UNAUTHORIZED, Authorizer, Identity
from .errors import STORE_UNAVAILABLE, NtfyError, Problem
from .provision import apply_provisioning, load_provisioning

__all__ = ["AccessGate", "Credential", "auth_param"]

log = logging.getLogger("upf.edge.gate")

RECHECK_SECS = 30.0
"""How long the gate waits on the version watch before reading the version anyway."""

EXPIRY_SLACK_SECS = 0.05
"""How long after a token's expiry its streams are re-checked (its ``expires`` second has passed)."""


_SHARED: weakref.WeakKeyDictionary[Store, AccessGate] = weakref.WeakKeyDictionary()

Credential = tuple[str | None, str | None]
"""(``Authorization``, ``?auth=``) as a request presented them: what :meth:`AccessGate.identify` reads."""


def auth_param(query: Mapping[str, str]) -> str | None:
    """ntfy's ``?authorization=`` or ``?auth=``, as its ``readQueryParam`` reads them: the first that is
    not empty, in that order, trimmed (so a blank one is "", no parameter: the header counts)."""
    for name in ("authorization", "auth"):
        value = query.get(name)
        if value:
            return value.strip()
    return None


class AccessGate:
    __slots__ = (
        "store",
        "default",
        "authorizer",
        "_open",
        "_loaded",
        "_task",
        "_users",
        "_started",
        "_listeners",
        "_expiry",
        "changes",
        "__weakref__",
    )

    def __init__(self, store: Store, default_access: str = "read-write") -> None:
        self.store = store
        self.default = Permission(default_access)
        self.authorizer = Authorizer(AuthState(), self.default)
        self._open = False
        self._loaded = False
        self._task: asyncio.Task[None] | None = None
        self._users = 0
        self._started: asyncio.Future[None] | None = None
        self._listeners: list[Callable[[bool], None]] = []
        self._expiry: asyncio.TimerHandle | None = None
        """Set for the next expiry of a token of the state: the streams it opened end then."""
        self.changes = 0
        """Auth changes told to the listeners so far (new states and token expiries): a subscribe
        that waited on the store compares it to see whether their re-check could have missed it."""

    @classmethod
    async def acquire(cls, store: Store, default_access: str = "read-write") -> AccessGate:
        """The gate of ``store``, started once and shared by every role of the process on that store
        (one watch, one cached state); hand it back with :meth:`release`."""
        gate = _SHARED.get(store)
        if gate is None:
            gate = _SHARED[store] = cls(store, default_access)
            gate._started = asyncio.ensure_future(gate.start())
        gate._users += 1
        assert gate._started is not None
        try:
            await asyncio.shield(gate._started)
        except BaseException:
            gate._users -= 1
            raise
        return gate

    async def release(self) -> None:
        self._users -= 1
        if self._users <= 0:
            _SHARED.pop(self.store, None)
            await self.stop()

    async def start(self) -> None:
        """Apply the declared records (UPF_AUTH_USERS/ACCESS/TOKENS, validated by the entry point at
        start), load the state, then follow its changes in the background. A store that does not
        answer does not stop the role from starting: the gate fails closed (503) until a load succeeds."""
        try:
            declared = load_provisioning()
            if not declared.empty:
                await apply_provisioning(self.store, declared)
            self._install(await self.store.auth_state())
        except Exception:
            log.warning("auth state load failed; refusing requests until it loads", exc_info=True)
        self._task = asyncio.get_running_loop().create_task(self._follow())

    async def stop(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def listen(self, callback: Callable[[bool], None]) -> None:
        """Call ``callback(tokens_only)`` after each auth change this gate installs, and at each token
        expiry (``tokens_only``: only what logged in with a credential can have lost access), so a
        pusher re-checks its streams."""
        self._listeners.append(callback)

    def unlisten(self, callback: Callable[[bool], None]) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(callback)

    def _install(self, state: AuthState) -> None:
        reload = self._loaded
        self.authorizer = Authorizer(state, self.default, self.authorizer._verified)
        self._open = not state.configured and self.default is Permission.READ_WRITE
        self._loaded = True
        if reload:
            self._tell(False)
        self._arm_expiry(EXPIRY_SLACK_SECS)

    def _tell(self, tokens_only: bool) -> None:
        self.changes += 1
        for callback in list(self._listeners):
            try:
                callback(tokens_only)
            except Exception:
                log.exception("auth change listener failed")

    def _arm_expiry(self, at_least: float) -> None:
        """Wake at the state's next token expiry (no timer when no token expires): a token's end is
        an auth change for the streams it opened, though nothing is written. ``at_least`` keeps
        tokens expiring in a row from re-checking every stream more than once a second."""
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        now = time.time()
        ends = [t.expires for _, t in self.authorizer.state.tokens.values() if t.expires > now]
        if ends:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # a gate driven by hand (a test): no streams to end, no loop to wake
                return
            delay = max(min(ends) - now + EXPIRY_SLACK_SECS, at_least)
            self._expiry = loop.call_later(delay, self._expired)

    def _expired(self) -> None:
        self._expiry = None
        self._tell(True)
        self._arm_expiry(1.0)

    async def _follow(self) -> None:
        backoff = 0.1
        while True:
            try:
                version, watch = await self.store.watch_auth()
                if version != self.authorizer.state.version or not self._loaded:
                    await self.refresh()
                    log.info("auth state reloaded", extra={"auth_version": version})
                backoff = 0.1
                try:
                    await asyncio.wait_for(_awaitable(watch), RECHECK_SECS)
                except TimeoutError:
                    pass
                finally:
                    watch.cancel()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("auth state reload failed", exc_info=True)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    async def refresh(self) -> None:
        """Load the auth state now, unless this gate holds it or a later one. The account API calls it
        after its write, so a token it revoked is refused by this process from the reply on, not from
        the watch's wake-up a few milliseconds later (other processes still follow their watch)."""
        state = await self.store.auth_state()
        if not self._loaded or state.version > self.authorizer.state.version:
            self._install(state)

    @property
    def open(self) -> bool:
        """No users, no ACL entries and read-write by default: every request is anonymous and allowed."""
        return self._open

    def identify(self, authorization: str | None, auth_param: str | None) -> Identity:
        """Who the request is (401 NtfyError for bad credentials). ``auth_param`` is ``?auth=``."""
        if self._open:
            return ANONYMOUS
        if not self._loaded:
            raise NtfyError(STORE_UNAVAILABLE)
        return self.authorizer.identify(authorization, auth_param)

    def authorize(self, who: Identity, topics: Sequence[str], *, write: bool) -> None:
        """403 NtfyError unless ``who`` may read (or write) every one of ``topics``."""
        if not self._open:
            self.authorizer.check(who, topics, write=write)

    def refusal(
        self, credential: Credential | None, topics: Iterable[str], seen: dict[Credential, Identity | None]
    ) -> Problem | None:
        """What a new subscribe with ``credential`` (None: anonymous) to ``topics`` would be refused
        with now (401 or 403), or None: an open stream is re-checked as that subscribe. ``seen``
        remembers identities across one re-check of many streams, failures included, so a changed
        password costs one bcrypt per credential, not per stream."""
        if self._open:
            return None
        if credential is None:
            who: Identity | None = ANONYMOUS
        elif credential in seen:
            who = seen[credential]
        else:
            try:
                who = self.authorizer.identify(*credential)
            except NtfyError:
                who = None
            seen[credential] = who
        if who is None:
            return UNAUTHORIZED
        permission = self.authorizer.permission
        return None if all(permission(who, t).read for t in topics) else FORBIDDEN

    def check(
        self, authorization: str | None, auth_param: str | None, topics: Sequence[str], *, write: bool
    ) -> Identity:
        """Both, in ntfy's order (401, then 403)."""
        who = self.identify(authorization, auth_param)
        self.authorize(who, topics, write=write)
        return who


async def _awaitable(watch: object) -> None:
    await watch  # type: ignore[misc]  # a driver's watch: an asyncio future or the bindings' own awaitable, typed as neither
