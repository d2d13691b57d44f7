"""Grouping by loop turn: ``transact_grouped`` over a driver's ``transact``, for a driver that cannot
run a function inside its commit (FoundationDB's commit is the cluster's).

The first item of a turn with a grouped transaction already in flight leads: it yields once for the
turn's other items to join, then runs them all in one transaction. An item with nothing in flight
runs alone at once (a sequential caller waits for nothing)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from .. import errors
from ..contract import LIFETIME_SECS

T = TypeVar("T")

TURN_MAX = 128
"""At most this many items share a transaction."""

_Item = tuple[Any, "asyncio.Future[Any]"]


class TurnGroups:
    """One open group per (function, arguments) at a time; ``transact`` is the driver's."""

    def __init__(self, transact: Callable[..., Awaitable[Any]]) -> None:
        self._transact = transact
        self._open: dict[Any, list[_Item]] = {}
        self._in_flight = 0  # grouped transactions between their start and their commit
        self._running: set[asyncio.Task[None]] = set()

    async def run(self, fn: Callable[..., Awaitable[list[T]]], item: Any, kwargs: dict[str, Any]) -> T:
        key = (fn, tuple(sorted(kwargs.items())))
        joining = self._open.get(key)
        if joining is not None and len(joining) < TURN_MAX - 1:
            done: asyncio.Future[T] = asyncio.get_running_loop().create_future()
            joining.append((item, done))
            return await done
        if not self._in_flight:  # nothing to share a commit with
            return (await self._alone(fn, item, kwargs))[0]
        followers: list[_Item] = []
        self._open[key] = followers
        try:
            await asyncio.sleep(0)  # the turn's other items join
        except BaseException:  # cancelled: the leader's caller went away, the others still run
            if self._open.get(key) is followers:
                del self._open[key]
            if followers:
                self._spawn(fn, followers, kwargs)
            raise
        if self._open.get(key) is followers:
            del self._open[key]
        if not followers:
            return (await self._alone(fn, item, kwargs))[0]
        mine: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._spawn(fn, [(item, mine), *followers], kwargs)
        return await mine

    async def _alone(self, fn: Callable[..., Awaitable[list[T]]], item: Any, kwargs: dict[str, Any]) -> list[T]:
        self._in_flight += 1
        try:
            results: list[T] = await self._transact(fn, [item], **kwargs)
            return results
        finally:
            self._in_flight -= 1

    def _spawn(self, fn: Callable[..., Awaitable[list[Any]]], group: list[_Item], kwargs: dict[str, Any]) -> None:
        task = asyncio.get_running_loop().create_task(self._run_group(fn, group, kwargs))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _run_group(
        self, fn: Callable[..., Awaitable[list[Any]]], group: list[_Item], kwargs: dict[str, Any]
    ) -> None:
        """Run a group and answer each caller (one that went away is skipped; its item runs all the
        same). Refused before its commit, or failed in the function (which runs before the commit),
        each item runs alone, so the failure is the one item's."""
        results: list[Any]
        try:
            self._in_flight += 1
            try:
                results = await self._transact(fn, [item for item, _ in group], **kwargs)
            except Exception as exc:
                if isinstance(exc, errors.StoreError) and exc.code not in errors.REFUSED_BEFORE_COMMIT:
                    raise  # the commit's own failure (it may even have committed): every item's
                if len(group) == 1:
                    raise
                results = await asyncio.gather(
                    *(self._alone_one(fn, item, kwargs) for item, _ in group), return_exceptions=True
                )
            finally:
                self._in_flight -= 1
        except asyncio.CancelledError:
            for _, done in group:
                done.cancel()
            raise
        except Exception as exc:
            results = [exc] * len(group)
        for (_, done), result in zip(group, results, strict=True):
            if done.done():
                continue
            if isinstance(result, BaseException):
                done.set_exception(result)
            else:
                done.set_result(result)

    async def _alone_one(self, fn: Callable[..., Awaitable[list[Any]]], item: Any, kwargs: dict[str, Any]) -> Any:
        return (await self._alone(fn, item, kwargs))[0]

    async def close(self) -> None:
        """Let groups in flight finish first; a stuck one cannot hold the close."""
        if self._open:
            await asyncio.sleep(0)  # a leader yields once before it runs: let it start
        if self._running:
            await asyncio.wait(list(self._running), timeout=LIFETIME_SECS)
