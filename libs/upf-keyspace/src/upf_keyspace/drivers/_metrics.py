"""The drivers' metrics and their shared retry loop: transactions, retries and failures by store error
code (both drivers), physical commit batches (the embedded driver's group commit)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from .. import errors
from ..telemetry import COUNT_BUCKETS, LATENCY_BUCKETS, REGISTRY

T = TypeVar("T")

TRANSACTIONS = REGISTRY.counter(
    "upf.store.transactions",
    "transactions run through transact (each may take several attempts)",
    attributes=("driver",),
)
RETRIES = REGISTRY.counter(
    "upf.store.retries",
    "transaction attempts retried, by the FoundationDB error code that caused it (1020: a conflict)",
    attributes=("driver", "code"),
)
FAILURES = REGISTRY.counter(
    "upf.store.failures",
    "transactions that ended with a store error, by FoundationDB error code",
    attributes=("driver", "code"),
)
COMMIT_BATCH = REGISTRY.histogram(
    "upf.store.commit.batch_size",
    "transactions per physical commit (the embedded driver's group commit)",
    unit="1",
    bounds=COUNT_BUCKETS,
    attributes=("driver",),
)
COMMIT_DURATION = REGISTRY.histogram(
    "upf.store.commit.duration",
    "time of one physical commit, fsync included (the embedded driver's group commit)",
    unit="s",
    bounds=LATENCY_BUCKETS,
    attributes=("driver",),
)
COMMIT_LOCK_WAIT = REGISTRY.histogram(
    "upf.store.commit.lock_wait",
    "time a physical commit waited for the store file's write lock, held by another process's commit "
    "(the embedded driver; part of the commit's duration)",
    unit="s",
    bounds=LATENCY_BUCKETS,
    attributes=("driver",),
)


_TRANSACTED: dict[str, Any] = {}
"""Each driver's transaction counter, looked up once (``run`` counts every transaction); made on a
driver's first transaction, so /metrics lists only the driver in use."""


def retried(driver: str, code: int) -> None:
    RETRIES.cell(driver, str(code)).add()


def failed(driver: str, code: int) -> None:
    FAILURES.cell(driver, str(code)).add()


def transacted(driver: str, n: int = 1) -> None:
    cell = _TRANSACTED.get(driver)
    if cell is None:
        cell = _TRANSACTED[driver] = TRANSACTIONS.cell(driver)
    cell.add(n)


async def run(
    driver: str, tr: Any, fn: Callable[..., Awaitable[T]], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> T:
    """The retry loop both drivers share: run ``fn(tr, ...)`` and commit; on a store error let the
    transaction decide (``on_error`` backs off and resets, or raises the error that ends the loop:
    its own when the back-off itself failed), counting what happened under the code raised."""
    transacted(driver)
    while True:
        try:
            result = await fn(tr, *args, **kwargs)
            await tr.commit()
            return result
        except errors.StoreError as exc:
            try:
                await tr.on_error(exc)
            except BaseException as ended:
                failed(driver, ended.code if isinstance(ended, errors.StoreError) else exc.code)
                raise
            retried(driver, exc.code)
        except BaseException:
            tr.cancel()
            raise
