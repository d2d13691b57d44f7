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
from collections.abc import Sequence

from upf_keyspace import Store
from upf_keyspace.auth import AuthState, Permission

from .access import ANONYMOUS, Authorizer, Identity, parse_credentials

__all__ = ["AccessGate"]

log = logging.getLogger("upf.edge.gate")

RECHECK_SECS = 30.0
"""How long the gate waits on the version watch before reading the version anyway."""


class AccessGate:
    __slots__ = ("store", "default", "authorizer", "_open", "_task")

    def __init__(self, store: Store, default_access: str = "read-write") -> None:
        self.store = store
        self.default = Permission(default_access)
        self.authorizer = Authorizer(AuthState(), self.default)
        self._open = self.default is Permission.READ_WRITE
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Load the state, then follow its changes in the background."""
        self._install(await self.store.auth_state())
        self._task = asyncio.get_running_loop().create_task(self._follow())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def _install(self, state: AuthState) -> None:
        self.authorizer = Authorizer(state, self.default)
        self._open = not state.configured and self.default is Permission.READ_WRITE

    async def _follow(self) -> None:
        backoff = 0.1
        while True:
            try:
                version, watch = await self.store.watch_auth()
                if version != self.authorizer.state.version:
                    self._install(await self.store.auth_state())
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

    def check(
        self, authorization: str | None, auth_param: str | None, topics: Sequence[str], *, write: bool
    ) -> Identity:
        """Authenticate and authorise one request, in ntfy's order (401, then 403); raises
        :class:`~upf_edge.errors.NtfyError`. ``auth_param`` is ``?auth=`` (or ``?authorization=``)."""
        if self._open:
            return ANONYMOUS
        authz = self.authorizer
        who = authz.authenticate(parse_credentials(authorization, auth_param), time.time())
        authz.check(who, topics, write=write)
        return who


async def _awaitable(watch: object) -> None:
    await watch  # type: ignore[misc]
