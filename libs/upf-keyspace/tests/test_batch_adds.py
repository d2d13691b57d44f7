"""The committer sums a batch's atomic adds per key and writes each sum once: the file must end as if
every mutation had been applied in order, one by one, with FoundationDB's semantics."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable

import lmdb
from hypothesis import given, settings
from hypothesis import strategies as st

from upf_keyspace.drivers.embedded import committer, mutations, open_embedded
from upf_keyspace.drivers.embedded.mutations import _add_le, _Applier

_KEYS = [b"k%d" % i for i in range(5)]
_START = {b"k0": b"\x05", b"k1": b"\xff" * 8, b"k3": b"abc"}

_op = st.one_of(
    st.tuples(st.just("set"), st.sampled_from(_KEYS), st.binary(max_size=9)),
    st.tuples(st.just("clear"), st.sampled_from(_KEYS), st.just(b"")),
    st.tuples(
        st.just("add"),
        st.sampled_from(_KEYS),
        st.sampled_from([1, 2, 8, 16]).flatmap(lambda n: st.binary(min_size=n, max_size=n)),
    ),
    st.tuples(st.just("add"), st.sampled_from(_KEYS), st.binary(max_size=3)),
    st.tuples(st.just("clear_range"), st.sampled_from(_KEYS), st.sampled_from([*_KEYS, b"l"])),
)


def _model(start: dict[bytes, bytes], ops: list[tuple[str, bytes, bytes]]) -> dict[bytes, bytes]:
    """Each mutation applied on its own, in order: the reference."""
    kv = dict(start)
    for kind, a, b in ops:
        if kind == "set":
            kv[a] = b
        elif kind == "clear":
            kv.pop(a, None)
        elif kind == "add":
            kv[a] = _add_le(kv.get(a), b)
        else:
            for k in [k for k in kv if a <= k < b]:
                del kv[k]
    return kv


def _applied(run: Callable[[_Applier], None]) -> dict[bytes, bytes]:
    """What a scratch LMDB file holding ``_START`` holds after ``run`` fed its batch and it flushed."""
    with tempfile.TemporaryDirectory() as d:
        env = lmdb.open(d, max_dbs=1, sync=False)
        db = env.open_db(b"kv")
        with env.begin(write=True) as txn:
            for k, v in _START.items():
                txn.put(k, v, db=db)
        txn = env.begin(write=True)
        try:
            applier = _Applier(txn, db)
            run(applier)
            applier.flush()
            return dict(txn.cursor(db=db))
        finally:
            txn.abort()
            env.close()


@settings(max_examples=300, deadline=None)
@given(st.lists(_op, max_size=40))
def test_a_batch_ends_as_its_mutations_applied_one_by_one(ops):
    def run(applier: _Applier) -> None:
        for kind, a, b in ops:
            if kind == "set":
                applier.put(a, b)
            elif kind == "clear":
                applier.delete(a)
            elif kind == "add":
                applier.add(a, b)
            else:
                applier.delete_range(a, b)

    assert _applied(run) == _model(_START, ops)


_STAMP = bytes(range(1, 11))
_KINDS = {
    "set": mutations._SET,
    "clear": mutations._CLEAR,
    "add": mutations._ADD,
    "clear_range": mutations._CLEAR_RANGE,
}


def _incomplete(key: bytes) -> bytes:
    """``key`` with a placeholder stamp inserted after its first byte, as the tuple layer packs one."""
    return key[:1] + b"\xff" * 10 + key[1:] + (1).to_bytes(4, "little")


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            _op, st.tuples(st.sampled_from(["vs_key", "vs_value"]), st.sampled_from(_KEYS), st.binary(max_size=4))
        )
    )
)
def test_a_transactions_mutation_list_applies_as_its_mutations_one_by_one(ops):
    """``apply``, the committer's path, stamps keys and values where their offsets say and otherwise
    agrees with the mutations applied one by one."""
    model_ops: list[tuple[str, bytes, bytes]] = []
    muts: list[tuple[int, bytes, bytes]] = []
    for kind, a, b in ops:
        if kind == "vs_key":
            muts.append((mutations._VS_KEY, _incomplete(a), b))
            model_ops.append(("set", a[:1] + _STAMP + a[1:], b))
        elif kind == "vs_value":
            muts.append((mutations._VS_VALUE, a, _incomplete(b"v" + b)))
            model_ops.append(("set", a, b"v" + _STAMP + b))
        else:
            muts.append((_KINDS[kind], a, b))
            model_ops.append((kind, a, b))
    stamped: list[bytes] = []
    assert _applied(lambda applier: applier.apply(muts, _STAMP, stamped)) == _model(_START, model_ops)
    assert stamped == [k[:1] + _STAMP + k[1:] for kind, k, _ in ops if kind == "vs_key"]


async def test_concurrent_adds_sets_and_clears_on_hot_keys_end_as_in_submission_order(tmp_path, monkeypatch):
    """Transactions that land in one batch add to, overwrite and clear the same keys (a stats slot and a
    bell, as publishes and drains do): the result is theirs applied in the order they committed."""
    sizes: list[int] = []
    real = committer._Committer._apply_batch

    def apply_batch(self, f, txn, batch):
        sizes.append(len(batch))
        return real(self, f, txn, batch)

    monkeypatch.setattr(committer._Committer, "_apply_batch", apply_batch)
    db = await open_embedded(str(tmp_path / "s.db"))
    ops: list[tuple[str, bytes, bytes]] = []
    for i in range(400):
        key = _KEYS[i % 2]
        if i % 97 == 50:
            ops.append(("clear", key, b""))
        elif i % 61 == 30:
            ops.append(("set", key, b"\x10\x00"))
        else:
            width = 8 if i % 5 else 2  # a width change settles the pending sum first
            ops.append(("add", key, (i * 7919 % (1 << (8 * width))).to_bytes(width, "little")))

    async def one(kind: str, key: bytes, value: bytes) -> None:
        async def body(tr):
            if kind == "clear":
                tr.clear(key)
            elif kind == "set":
                tr.set(key, value)
            else:
                tr.add(key, value)

        await db.transact(body)

    async def read(tr):
        return {k: await tr.get(k) for k in _KEYS[:2]}

    try:
        await asyncio.gather(*(one(*op) for op in ops))  # each submits in this order: no body awaits
        got = await db.transact(read)
    finally:
        await db.close()
    want = _model({}, ops)
    assert got == {k: want.get(k) for k in _KEYS[:2]}
    assert max(sizes) > 1, sizes  # some transactions shared a batch, so the sums were exercised
