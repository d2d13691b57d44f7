"""Key encoding: every key kind round-trips, and byte order equals tuple order, stamps included."""

from __future__ import annotations

import fdb.tuple as fdbtuple
from hypothesis import given
from hypothesis import strategies as st

from upf_keyspace import keys
from upf_keyspace.msgid import decode_id, encode_id

topics = st.text(alphabet=st.sampled_from("-_abcXYZ0189"), min_size=1, max_size=64)
nodes = st.text(min_size=1, max_size=20)
stamps = st.binary(min_size=12, max_size=12)


@given(topics, stamps)
def test_queue_key_round_trips(topic, stamp):
    assert keys.unpack_queue_key(keys.queue_key(topic, stamp)) == (topic, stamp)


@given(st.integers(min_value=0, max_value=2**40), topics, stamps)
def test_expiry_key_round_trips(expiry, topic, stamp):
    assert keys.unpack_expiry_key(keys.expiry_key(expiry, topic, stamp)) == (expiry, topic, stamp)


@given(topics, nodes)
def test_affinity_keys_round_trip(topic, node):
    assert keys.unpack_affinity_key(keys.affinity_key(topic, node)) == (topic, node)
    assert keys.unpack_reverse_affinity_key(keys.reverse_affinity_key(node, topic)) == (node, topic)


@given(topics, st.text(max_size=50), stamps)
def test_idem_key_round_trips(topic, idem, stamp):
    assert keys.unpack_idem_key(keys.idem_key(topic, idem, stamp)) == (topic, idem, stamp)


@given(topics, st.lists(stamps, min_size=2, max_size=20, unique=True))
def test_queue_byte_order_is_stamp_order(topic, stamp_list):
    """Within a topic, sorting keys bytewise sorts by stamp: Q is FIFO by commit order."""
    by_key = sorted(stamp_list, key=lambda s: keys.queue_key(topic, s))
    assert by_key == sorted(stamp_list)


@given(st.lists(st.tuples(topics, stamps), min_size=2, max_size=20, unique=True))
def test_byte_order_equals_tuple_order(stamp, items):
    """Byte order of packed keys equals the tuple layer's order of (topic, versionstamp)."""
    packed = sorted(items, key=lambda it: keys.queue_key(*it))
    by_tuple = sorted(items, key=lambda it: fdbtuple.pack((it[0], stamp(it[1][:10], keys._vs(it[1]).user_version))))
    assert [keys.queue_key(*i) for i in packed] == [keys.queue_key(*i) for i in by_tuple]
    assert [(t, s) for t, s in packed] == sorted(items, key=lambda it: (it[0].encode(), it[1]))


@given(topics, stamps, stamps)
def test_queue_after_is_strictly_after(topic, a, b):
    begin, end = keys.queue_after(topic, a)
    key_b = keys.queue_key(topic, b)
    assert (begin <= key_b < end) == (b > a)
    assert end == keys.queue_range(topic)[1] and keys.queue_after(topic, None) == keys.queue_range(topic)


@given(topics, st.integers(min_value=0, max_value=0xFFFF))
def test_incomplete_keys_have_tuple_layer_layout(topic, uv):
    """Placeholder of 10 x 0xff, big-endian user version, then a 4-byte little-endian offset to it."""
    raw = keys.queue_key_incomplete(topic, uv)
    offset = int.from_bytes(raw[-4:], "little")
    assert raw[offset : offset + 10] == b"\xff" * 10
    assert raw[offset + 10 : offset + 12] == uv.to_bytes(2, "big")


@given(topics)
def test_ranges_do_not_collide_across_kinds(topic):
    """A constant level before every variable one: Q of one topic never overlaps another kind."""
    qb, qe = keys.queue_range(topic)
    for other in (
        keys.affinity_range(topic),
        keys.inbox_range(topic, 0),
        keys.idem_range(topic, ""),
        keys.time_index_range(topic),
    ):
        assert qe <= other[0] or other[1] <= qb


@given(stamps)
def test_message_id_round_trips(stamp):
    text = encode_id(stamp)
    assert len(text) == 16 and decode_id(text) == stamp


@given(st.text(max_size=30))
def test_message_id_decoder_never_raises(text):
    out = decode_id(text)
    assert out is None or (len(out) == 12 and encode_id(out) == text)


def test_shard_of_is_stable_fnv1a():
    """fnv1a-32 % K, so other implementations agree: known values."""
    assert keys.shard_of("", 1 << 32) == 0x811C9DC5
    assert keys.shard_of("a", 1 << 32) == 0xE40C292C
    assert 0 <= keys.shard_of("upDEMO0001", 64) < 64


any_text = st.text(max_size=30)  # includes NULs and non-ASCII: the escaping must match the tuple layer


@given(
    any_text, stamps, st.integers(min_value=0, max_value=2**63), any_text, st.integers(0, 0xFFFF), st.integers(0, 4095)
)
def test_fast_encoders_equal_the_tuple_layer(stamp, topic, raw, expiry, idem, uv, shard):
    """The hand-written hot-path encoders produce exactly fdb.tuple's bytes (and decode back through it)."""
    root = ("upf",)
    real = keys._vs(raw)
    vs = stamp(real.tr_version, real.user_version)
    inc = stamp(user_version=uv)
    assert fdbtuple.unpack(keys.queue_key(topic, raw)) == root + ("Q", topic, real)
    assert fdbtuple.unpack(keys.queue_key_incomplete(topic, uv)[:-4]) == root + (
        "Q",
        topic,
        fdbtuple.Versionstamp.incomplete(uv),
    )
    assert keys.queue_key(topic, raw) == fdbtuple.pack(root + ("Q", topic, vs))
    assert keys.expiry_key(expiry, topic, raw) == fdbtuple.pack(root + ("X", expiry, topic, vs))
    assert keys.idem_key(topic, idem, raw) == fdbtuple.pack(root + ("ID", topic, idem, vs))
    assert keys.affinity_key(topic, idem) == fdbtuple.pack(root + ("C", topic, idem))
    assert keys.bell_key(topic, shard) == fdbtuple.pack(root + ("SIG", topic, shard))
    assert keys.queue_key_incomplete(topic, uv) == fdbtuple.pack_with_versionstamp(root + ("Q", topic, inc))
    assert keys.expiry_key_incomplete(expiry, topic, uv) == fdbtuple.pack_with_versionstamp(
        root + ("X", expiry, topic, inc)
    )
    assert keys.inbox_key_incomplete(topic, shard, uv) == fdbtuple.pack_with_versionstamp(
        root + ("IN", topic, shard, inc)
    )
    assert keys.idem_key_incomplete(topic, idem, uv) == fdbtuple.pack_with_versionstamp(root + ("ID", topic, idem, inc))
    assert keys.time_index_key(topic, expiry) == fdbtuple.pack(root + ("QT", topic, expiry))
    assert keys.unpack_time_index_key(keys.time_index_key(topic, expiry)) == (topic, expiry)
    tb, te = keys.time_index_before(topic, expiry)
    assert tb <= keys.time_index_key(topic, max(0, expiry - 1)) < te or expiry == 0
    assert keys.time_index_value_incomplete(uv) == fdbtuple.pack_with_versionstamp((inc,))[1:-4] + bytes(4)  # offset 0
    b, e = keys.expiry_range(expiry)
    assert b == fdbtuple.pack(root + ("X",)) and e == fdbtuple.pack(root + ("X", expiry))


@given(any_text, any_text, stamps, st.integers(0, 0xFFFF))
def test_web_push_keys_equal_the_tuple_layer_and_round_trip(stamp, topic, push_topic, raw_stamp, uv):
    root = ("upf",)
    inc = stamp(user_version=uv)
    raw = keys.push_topic_key_incomplete(topic, push_topic, uv)
    assert raw == fdbtuple.pack_with_versionstamp(root + ("WT", topic, push_topic, inc))
    real = keys._vs(raw_stamp)
    complete = fdbtuple.pack(root + ("WT", topic, push_topic, stamp(real.tr_version, real.user_version)))
    assert keys.unpack_push_topic_key(complete) == (topic, push_topic, raw_stamp)
    b, e = keys.push_topic_range(topic, push_topic)
    assert b < complete < e
    assert keys.vapid_binding_key(topic) == fdbtuple.pack(root + ("VK", topic))
    assert keys.unpack_vapid_binding_key(keys.vapid_binding_key(topic)) == topic
    vb, ve = keys.vapid_binding_range()
    assert vb < keys.vapid_binding_key(topic) < ve


def test_every_prefix_is_distinct_and_documented():
    """Each kind of key is named once in Prefix and drawn in the module docstring."""
    values = [p.value for p in keys.Prefix]
    assert len(values) == len(set(values))
    for value in values:
        assert f'"{value}"' in (keys.__doc__ or ""), value


@given(st.one_of(st.none(), st.binary(min_size=10, max_size=10)), st.integers(0, 0xFFFF))
def test_packable_stamp_writes_the_bindings_bytes(stamp, tr_version, uv):
    """The tests' reference stamp writes what the bindings decode back (no libfdb_c needed to decode)."""
    if tr_version == b"\xff" * 10:
        tr_version = None  # the placeholder itself means incomplete
    raw = stamp(tr_version, uv).to_bytes()
    assert len(raw) == 12
    assert fdbtuple.Versionstamp.from_bytes(raw) == fdbtuple.Versionstamp(tr_version, uv)
