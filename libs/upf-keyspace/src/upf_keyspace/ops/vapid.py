"""VAPID-restricted topics: a topic bound to the one VAPID public key allowed to publish to it.

A binding is written by the first valid VAPID publish to an unbound UnifiedPush topic (when the
server restricts topics) and removed only by an operator (``upf vapid reset``).
"""

from __future__ import annotations

from .. import keys
from ..contract import Transaction


async def admit(tr: Transaction, topic: str, key: str | None, bind: bool) -> bool:
    """May a publish carrying the verified VAPID ``key`` (None: no valid one) go to ``topic``? A bound
    topic admits its key only; an unbound one admits anyone and, with ``bind`` and a key, binds it."""
    bkey = keys.vapid_binding_key(topic)
    bound = await tr.get(bkey)
    if bound is not None:
        return key is not None and bound.decode("utf-8") == key
    if key and bind:
        tr.set(bkey, key.encode("utf-8"))
    return True


async def bindings(tr: Transaction) -> list[tuple[str, str]]:
    rows = await tr.get_range(*keys.vapid_binding_range(), snapshot=True)
    return [(keys.unpack_vapid_binding_key(k), v.decode("utf-8")) for k, v in rows]


async def binding(tr: Transaction, topic: str) -> str | None:
    raw = await tr.get(keys.vapid_binding_key(topic))
    return None if raw is None else raw.decode("utf-8")


async def reset(tr: Transaction, topic: str) -> bool:
    """Unbind ``topic``; False when it was not bound."""
    bkey = keys.vapid_binding_key(topic)
    if await tr.get(bkey) is None:
        return False
    tr.clear(bkey)
    return True
