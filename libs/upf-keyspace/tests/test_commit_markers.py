"""Commit markers (keys: TX), written by the FoundationDB driver only: their keys, their value, and
the janitor's sweep of them (``ops.janitor.clear_commit_markers``) on the embedded store, where the
sweep must work (and cost one blind range clear) though no marker is ever written there."""

from __future__ import annotations

import os
import time

import fdb.tuple as fdbtuple
from hypothesis import given
from hypothesis import strategies as st

from upf_keyspace import Settings, keys, open_store
from upf_keyspace.drivers.embedded.mutations import check_stamped
from upf_keyspace.ops.janitor import MARKER_KEEP_SECS


@given(st.integers(min_value=0, max_value=2**40), st.binary(min_size=16, max_size=16))
def test_marker_keys_are_tuples_and_round_trip(second, txid):
    key = keys.commit_marker_key(second, txid)
    assert key == fdbtuple.pack(("upf", "TX", second, txid))
    assert keys.unpack_commit_marker_key(key) == (second, txid)
    assert keys.prefix_of(key) is keys.Prefix.COMMIT_MARKER
    begin, end = keys.commit_markers_before(second + 1)
    assert begin < key < end
    assert not (begin <= key < keys.commit_markers_before(second)[1])


def test_the_marker_value_becomes_the_bare_commit_stamp():
    """A valid versionstamped value (placeholder at offset 0), that leaves exactly the 10-byte stamp."""
    value = keys.commit_marker_value_incomplete()
    assert check_stamped(value, "value") == 0
    assert len(value) - 4 == 10


async def test_clear_commit_markers_drops_only_markers_a_minute_old(tmp_path):
    now = int(time.time())
    store = await open_store(Settings(store_path=str(tmp_path / "upf.db")))
    try:
        old = keys.commit_marker_key(now - MARKER_KEEP_SECS - 1, os.urandom(16))
        young = keys.commit_marker_key(now - MARKER_KEEP_SECS, os.urandom(16))
        neighbour = keys.topic_count_key()  # "TN" sorts just before "TX"

        async def put(tr):
            for k in (old, young, neighbour):
                tr.set(k, b"s" * 10)

        async def markers(tr):
            return [k for k, _ in await tr.get_range(*keys.prefix_range(keys.Prefix.COMMIT_MARKER))]

        await store.db.transact(put)
        await store.clear_commit_markers(now)
        assert await store.db.transact(markers) == [young]
        assert await store.topic_count() == int.from_bytes(b"s" * 8, "little", signed=True)
        await store.clear_commit_markers(now)  # nothing to clear: still a harmless blind clear
    finally:
        await store.close()
