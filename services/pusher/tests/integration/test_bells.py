"""How the hub waits on its bell watches: a fire callback on a watch that takes one (the embedded
store's; no task and no loop handle per rung shard per wake-up), a waiter task on any other awaitable
watch (FoundationDB's bridge), and the same outcome either way: a fired bell marks its shard rung and
wakes the loop, a cancelled one does nothing, a failed one rings late (never a spin)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from upf_pusher_testkit import MS, Client, publish, settings_for

from upf_keyspace import Store
from upf_pusher.hub import Hub


class _FutureWatch:
    """An awaitable watch over a public asyncio ``future``, without a fire callback."""

    def __init__(self) -> None:
        self.future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def __await__(self) -> Any:
        return self.future.__await__()

    def cancel(self) -> None:
        self.future.cancel()

    def done(self) -> bool:
        return self.future.done()


class _CallbackWatch(_FutureWatch):
    """Shaped like the embedded store's watch: ``when_fired`` takes what its firing calls."""

    def __init__(self) -> None:
        super().__init__()
        self.callback: Callable[[], None] | None = None

    def when_fired(self, callback: Callable[[], None]) -> None:
        self.callback = callback

    def fire(self) -> None:
        self.future.set_result(None)
        if self.callback is not None:
            self.callback()

    def cancel(self) -> None:
        self.callback = None
        super().cancel()


class _OpaqueWatch:
    """Shaped like FoundationDB's bridge: awaitable, its future private."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __await__(self) -> Any:
        return self._inner.__await__()

    def cancel(self) -> None:
        self._inner.cancel()

    def done(self) -> bool:
        return self._inner.done()


async def test_a_bell_that_takes_a_callback_rings_through_it_at_once(tmp_path: Any, store: Store) -> None:
    hub = Hub(settings_for(tmp_path), store)
    rang = hub.metrics.bells.value  # the cells are process-wide
    bell = _CallbackWatch()
    hub._wake = asyncio.get_running_loop().create_future()
    hub._watch_bells({2: bell})  # type: ignore[dict-item]
    assert not hub._tasks  # no waiter task
    assert hub._rung == set()
    bell.fire()
    assert hub._rung == {2}  # rung by the firing call itself, in the same loop iteration
    assert hub._wake.done()
    assert hub.metrics.bells.value == rang + 1


async def test_cancelled_bell_does_not_ring(tmp_path: Any, store: Store) -> None:
    hub = Hub(settings_for(tmp_path), store)
    rang = hub.metrics.bells.value  # the cells are process-wide
    for bell in (_CallbackWatch(), _OpaqueWatch(_FutureWatch())):
        hub._watch_bells({1: bell})  # type: ignore[dict-item]
        bell.cancel()
    await asyncio.sleep(20 * MS)
    assert hub._rung == set()
    assert hub.metrics.bells.value == rang


async def test_failed_bell_rings_late_and_is_not_counted(tmp_path: Any, store: Store) -> None:
    hub = Hub(settings_for(tmp_path), store)
    rang = hub.metrics.bells.value  # the cells are process-wide
    inner = _FutureWatch()
    hub._watch_bells({3: _OpaqueWatch(inner)})  # type: ignore[dict-item]
    inner.future.set_exception(RuntimeError("watch lost"))
    for _ in range(5):
        await asyncio.sleep(0)
    assert hub._rung == set()  # not at once: a failing watch must not make the loop spin
    await asyncio.sleep(150 * MS)
    assert hub._rung == {3}
    assert hub.metrics.bells.value == rang


async def test_opaque_bell_gets_a_waiter_task(tmp_path: Any, store: Store) -> None:
    hub = Hub(settings_for(tmp_path), store)
    rang = hub.metrics.bells.value  # the cells are process-wide
    inner = _FutureWatch()
    hub._watch_bells({0: _OpaqueWatch(inner)})  # type: ignore[dict-item]
    assert len(hub._tasks) == 1
    inner.future.set_result(None)
    for _ in range(5):
        await asyncio.sleep(0)
    assert hub._rung == {0}
    assert hub.metrics.bells.value == rang + 1


async def test_opaque_bells_still_deliver(start_pusher: Any, store: Store) -> None:
    """Every bell the store returns wrapped like FoundationDB's: messages still arrive by bell, once each."""
    real = store.drain_inboxes

    async def drain_opaque(node: str, afters: Any) -> Any:
        drained = await real(node, afters)
        for d in drained.values():
            d.bell = _OpaqueWatch(d.bell)
        return drained

    store.drain_inboxes = drain_opaque  # type: ignore[method-assign]
    pusher = await start_pusher()
    safety = pusher.hub.metrics.safety.value
    client = await Client("json").open(pusher.port, "/opaque/json")
    try:
        assert (await client.next())["event"] == "open"
        sent = [await publish(store, "opaque", f"m{i}") for i in range(5)]
        assert [m["id"] for m in await client.messages(5)] == [p.id for p in sent]
        assert all(e["event"] != "message" for e in await client.quiet(200))
        assert pusher.hub.metrics.safety.value == safety  # by bell, not by the safety poll
    finally:
        await client.close()
