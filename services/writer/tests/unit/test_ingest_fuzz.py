"""Fuzz the network-facing parsers: whatever arrives is accepted (and the result encodes, for the
store and for the wire) or rejected with a documented ntfy error -- never another exception."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from upf_edge import NtfyError
from upf_keyspace import encode_envelope, message_from_envelope
from upf_keyspace.wire import encode_json
from upf_writer import ingest
from upf_writer.httpio import decode_headers, decode_query
from upf_writer.ingest import Limits

LIMITS = Limits(max_message_bytes=4096, default_ttl_secs=3600, public_url="https://push.example")
STAMP = bytes(12)

KNOWN = [
    "x-title", "title", "t", "x-message", "message", "m", "x-priority", "priority", "prio", "p", "x-tags", "tags",
    "tag", "ta", "x-click", "click", "x-icon", "icon", "x-markdown", "markdown", "md", "x-unifiedpush", "unifiedpush",
    "up", "content-type", "content-encoding", "ttl", "idempotency-key", "x-idempotency-key", "content-length",
    "authorization",
]  # fmt: skip
INTERESTING = [
    "1", "0", "yes", "true", "aes128gcm", "u=3, i", "high", "6", "https://x", "=?UTF-8?B?w6k=?=", "=?utf-8?q?a_b?=",
    "text/markdown", "-1", "99999999999999999999999", "a\\nb", " ", "",
]  # fmt: skip

names = st.one_of(st.sampled_from(KNOWN), st.text(min_size=1, max_size=12))
values = st.one_of(st.sampled_from(INTERESTING), st.text(max_size=300), st.text(max_size=5000))
params = st.dictionaries(names, values, max_size=12)
bodies = st.one_of(
    st.binary(max_size=300), st.binary(min_size=4000, max_size=4200), st.text(max_size=300).map(str.encode)
)
topics = st.one_of(
    st.from_regex(r"[-_A-Za-z0-9]{1,64}", fullmatch=True),
    st.text(max_size=70),
    st.sampled_from(sorted(ingest.DISALLOWED_TOPICS)),
)


def assert_encodes(ingested: ingest.Ingested) -> None:
    encode_envelope(ingested.envelope)
    encode_json(message_from_envelope(STAMP, ingested.topic, ingested.envelope))
    assert ingested.envelope.message
    assert len(ingested.idem) <= 200


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow])
@given(topic=topics, headers=params, query=params, body=bodies, now=st.integers(0, 2**40))
def test_publish_fuzz(topic: str, headers: dict[str, str], query: dict[str, str], body: bytes, now: int) -> None:
    """POST /{topic}: accepted and encodable, or rejected with a catalogued problem."""
    try:
        ingest.check_content_length(headers, LIMITS.max_message_bytes, ingest.MESSAGE_TOO_LARGE)
        got = ingest.ingest_publish(topic, headers, query, body, now=now, limits=LIMITS)
    except NtfyError as exc:
        assert exc.problem in ingest.CATALOG
        return
    assert_encodes(got)
    assert got.envelope.time <= got.envelope.expires <= got.envelope.time + LIMITS.default_ttl_secs


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=50),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
publish_docs = st.fixed_dictionaries(
    {},
    optional={
        "topic": st.one_of(st.from_regex(r"[A-Za-z0-9]{1,10}", fullmatch=True), json_values),
        "message": st.one_of(st.text(max_size=5000), json_values),
        "title": st.one_of(st.text(max_size=50), json_values),
        "priority": st.one_of(st.integers(-10, 10), json_values),
        "tags": st.one_of(st.lists(st.text(max_size=10), max_size=5), json_values),
        "click": json_values,
        "icon": st.one_of(st.just("https://i"), json_values),
        "markdown": json_values,
    },
)
json_bodies = st.one_of(
    publish_docs.map(lambda d: json.dumps(d).encode()),
    st.binary(max_size=200),
    json_values.map(lambda v: json.dumps(v).encode()),
)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(body=json_bodies, headers=params, query=params)
def test_json_publish_fuzz(body: bytes, headers: dict[str, str], query: dict[str, str]) -> None:
    """POST /: accepted and encodable, or rejected with a catalogued problem."""
    try:
        got = ingest.ingest_json(headers, query, body, now=1, limits=LIMITS)
    except NtfyError as exc:
        assert exc.problem in ingest.CATALOG
        return
    assert_encodes(got)


pushkeys = st.one_of(
    st.from_regex(r"https://push\.example/[-_A-Za-z0-9]{0,70}([/?#].{0,20})?", fullmatch=True),
    st.text(max_size=40),
    json_values,
)
matrix_docs = st.builds(
    lambda key, extra, wrap: wrap(key, extra),
    pushkeys,
    json_values,
    st.sampled_from([
        lambda k, e: {"notification": {"devices": [{"pushkey": k}], "x": e}},
        lambda k, e: {"notification": {"devices": [e, {"pushkey": k}]}},
        lambda k, e: {"notification": e},
        lambda k, e: e,
    ]),
).map(lambda d: json.dumps(d).encode())  # fmt: skip


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(body=st.one_of(matrix_docs, st.binary(max_size=200)))
def test_matrix_fuzz(body: bytes) -> None:
    """POST /_matrix/push/v1/notify: a publish, a rejected pushkey, or a catalogued problem."""
    try:
        out = ingest.ingest_matrix(body, now=1, limits=LIMITS)
    except NtfyError as exc:
        assert exc.problem in ingest.CATALOG
        return
    if out.ingested is not None:
        assert_encodes(out.ingested)
        assert out.ingested.envelope.message == body.decode()


@settings(max_examples=300)
@given(
    raw=st.lists(st.tuples(st.binary(max_size=20), st.binary(max_size=200)), max_size=10), qs=st.binary(max_size=300)
)
def test_http_decoding_fuzz(raw: list[tuple[bytes, bytes]], qs: bytes) -> None:
    """Arbitrary header and query bytes decode to str mappings that ingest then handles."""
    headers = decode_headers(raw)
    query = decode_query(qs)
    try:
        got = ingest.ingest_publish("t", headers, query, b"x", now=1, limits=LIMITS)
    except NtfyError as exc:
        assert exc.problem in ingest.CATALOG
        return
    assert_encodes(got)


@settings(max_examples=500)
@given(qs=st.text(alphabet="ab=&%+;x1 é", max_size=40))
def test_query_fast_path_matches_parse_qsl(qs: str) -> None:
    """The unescape-free fast path of decode_query gives what parse_qsl gives (first value wins)."""
    from urllib.parse import parse_qsl

    expected: dict[str, str] = {}
    for k, v in parse_qsl(qs, keep_blank_values=True, errors="replace"):
        expected.setdefault(k, v)
    assert decode_query(qs.encode()) == expected
