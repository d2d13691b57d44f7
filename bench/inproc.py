"""The writer's publish path in process, without HTTP: ``WriterFront`` on the store the UPF_* environment
names, set up as the writer's app sets it up (the access gate, the shared request limiter, the serving
collector policy of ``upf_edge.gcpolicy``). For the bench's in-process tools (bench/edge_cost.py
--front, bench/instr_publish.py), which run it in a child process so that each measurement has its own
settings and store."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from upf_edge.gate import AccessGate
from upf_edge.gcpolicy import settle_gc
from upf_edge.limiter import RequestLimiter
from upf_keyspace.settings import load_settings
from upf_keyspace.store import open_store
from upf_writer.context import WriterContext
from upf_writer.front import WriterFront

__all__ = ["open_front"]


async def open_front() -> tuple[WriterFront, Callable[[], Awaitable[None]]]:
    """The front and the coroutine function that releases the gate and closes the store."""
    s = load_settings()
    store = await open_store(s)
    ctx = WriterContext(s, store)
    ctx.gate = await AccessGate.acquire(store, s.auth_default_access)
    ctx.limiter = RequestLimiter.shared(store, s)
    settle_gc()  # as the roles do once they serve (UPF_GC_TUNE=0: CPython's defaults)

    async def close() -> None:
        assert ctx.gate is not None
        await ctx.gate.release()
        await store.close()

    return WriterFront(ctx, frozenset()), close
