"""Tokens' last use (ntfy's ``last_access`` and ``last_origin``), written in batches as ntfy's
``EnqueueTokenUpdate`` does: a request that logged in with a token costs a dict store, and the store
sees at most one small transaction per process every ``WRITE_SECS`` while tokens are in use.

Why not a write per use: a client sending its token on every publish would double the publish's
transactions. Why no timer while no token is used: an idle node takes no wake-ups. The first use
after a quiet spell is written at once, so a listing soon shows a token that just came back into use;
uses not yet written when a process stops are lost (at most ``WRITE_SECS`` of them), as in ntfy.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from upf_keyspace import Store

from .limits import Network, client_address, parse_address

__all__ = ["TokenUses", "WRITE_SECS", "origin_of"]

log = logging.getLogger("upf.edge.tokenuse")

WRITE_SECS = 5.0
"""The most often a process writes its tokens' uses (ntfy: every 33 s, to SQLite). A batch is one
transaction of a read and a write per token used since the last: cheap enough to keep listings fresh."""


def origin_of(peer: str, forwarded: str | None, trusted: Sequence[Network]) -> str:
    """The client's address as ntfy records a token's origin: the one a trusted proxy forwarded (as
    the request limits read it), else the peer's ("" or the peer's name when it is no IP)."""
    address = parse_address(peer)
    return peer if address is None else str(client_address(address, forwarded, trusted))


class TokenUses:
    """One process's token uses not yet written: digest -> (owner, second, peer, forwarded)."""

    __slots__ = ("store", "trusted", "clock", "_pending", "_armed", "_written", "_task")

    def __init__(self, store: Store, trusted: Sequence[Network], clock: Callable[[], float]) -> None:
        self.store = store
        self.trusted = trusted
        self.clock = clock
        self._pending: dict[str, tuple[str, int, str, str | None]] = {}
        self._armed = False
        self._written = -WRITE_SECS  # when the last batch was written (clock seconds)
        self._task: asyncio.Task[None] | None = None

    def note(self, digest: str, user: str, peer: str, forwarded: str | None) -> None:
        """A request logged in as ``user`` with the token of ``digest``."""
        now = self.clock()
        self._pending[digest] = (user, int(now), peer, forwarded)
        if not self._armed:
            self._armed = True
            delay = max(0.0, self._written + WRITE_SECS - now)
            asyncio.get_running_loop().call_later(delay, self._start)

    def _start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.write())

    async def write(self) -> None:
        """Write what is pending in one transaction; a failure is logged and the batch dropped (a last
        use is a hint for whoever lists tokens, never what access depends on)."""
        batch, self._pending = self._pending, {}
        self._armed = False
        self._written = self.clock()
        if not batch:
            return
        uses = {d: (user, at, origin_of(peer, fwd, self.trusted)) for d, (user, at, peer, fwd) in batch.items()}
        try:
            await self.store.record_token_uses(uses)
        except Exception as exc:
            log.warning("token uses not recorded", extra={"tokens": len(uses), "error": type(exc).__name__})
