from __future__ import annotations

from collections.abc import Sequence

from .. import keys
from ..contract import Transaction


def hold(tr: Transaction, topics: Sequence[str], node: str) -> None:
    """Record that ``node`` holds subscribers of ``topics``, so publishes poke it."""
    for t in topics:
        tr.set(keys.affinity_key(t, node), b"")
        tr.set(keys.reverse_affinity_key(node, t), b"")


def release(tr: Transaction, topics: Sequence[str], node: str) -> None:
    """Forget ``node``'s hold on ``topics``; keyed per (topic, node), so another node's hold is untouched."""
    for t in topics:
        tr.clear(keys.affinity_key(t, node))
        tr.clear(keys.reverse_affinity_key(node, t))


async def held_topics(tr: Transaction, node: str, limit: int = 0) -> list[str]:
    rows = await tr.get_range(*keys.reverse_affinity_range(node), limit=limit, snapshot=True)
    return [keys.unpack_reverse_affinity_key(k)[1] for k, _ in rows]
