"""Fuzz the publish parameters test_ingest_fuzz.py does not name: scheduling (X-Delay/X-At/X-In and
their aliases, any form: durations, unix times, natural times, garbage), X-Cache, sequence ids (parameter
and path), X-Poll-ID, and the JSON publish's delay/cache/sequence_id. Every input is an encodable
message obeying the rule it asked for, or a catalogued ntfy error; never another exception."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from upf_edge import NtfyError
from upf_keyspace import encode_envelope, message_from_envelope
from upf_keyspace.wire import encode_json
from upf_writer import ingest
from upf_writer.ingest import Limits

from .test_ingest_fuzz import assert_encodes

LIMITS = Limits(max_message_bytes=4096, default_ttl_secs=3600, public_url="https://push.example", nocache_keep_secs=120)
NOW = 1_700_000_000
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

DELAY_NAMES = ["x-delay", "delay", "x-at", "at", "x-in", "in"]
CACHE_NAMES = ["x-cache", "cache"]
SID_NAMES = ["x-sequence-id", "sequence-id", "sequence_id", "sid"]
POLL_NAMES = ["x-poll-id", "poll-id", "poll_id"]

delays = st.one_of(
    st.integers(-10**6, 10**6).map(lambda s: f"{s}s"),
    st.tuples(st.integers(0, 10**5), st.sampled_from(["s", "m", "h", "d", "ms", "min", "mins", "hour", "hours", "day", "days", "w", "x", ""]))
    .map(lambda t: f"{t[0]}{t[1]}"),
    st.integers(NOW - 100, NOW + 400_000).map(str),  # unix times around the window [now+10 s, now+3 d]
    st.integers(0, 2**70).map(str),
    st.sampled_from([
        "tomorrow", "tomorrow, 3pm", "10am", "3:30pm", "noon", "in 30 minutes", "30 min", "1h30m", "1.5h", " 2h ",
        "-1h", "0", "", " ", "99999999999999999999999", "9" * 400 + "s", "1e9", "NaN", "∞", "\x00", "mañana",
    ]),
    st.text(max_size=30),
)  # fmt: skip
caches = st.one_of(st.sampled_from(["no", "0", "false", "yes", "1", "true", "NO", "off", "", " "]), st.text(max_size=8))
sids = st.one_of(st.from_regex(r"[-_A-Za-z0-9]{1,64}", fullmatch=True), st.text(max_size=70), st.just("a" * 65))
poll_ids = st.one_of(st.from_regex(r"[A-Za-z0-9]{1,20}", fullmatch=True), st.text(max_size=40), st.just("p" * 2000))


def pick(names: list[str], values: st.SearchStrategy[str]) -> st.SearchStrategy[dict[str, str]]:
    return st.dictionaries(st.sampled_from(names), values, max_size=2)


def check(got: ingest.Ingested, asked: dict[str, str]) -> None:
    """What was accepted obeys what was asked."""
    assert_encodes(got)
    env = got.envelope
    if env.event == ingest.EVENT_POLL_REQUEST:
        assert env.nocache and env.message == ingest.POLL_REQUEST_MESSAGE and env.poll_id
        return
    if got.due:
        assert NOW + LIMITS.delay_min_secs <= got.due <= NOW + LIMITS.delay_max_secs
        assert env.time == got.due and not env.nocache
    if env.nocache:
        assert not got.due and env.expires - env.time <= LIMITS.nocache_keep_secs
    if env.sequence_id:
        assert ingest.validate_sequence_id(env.sequence_id) == env.sequence_id


@SETTINGS
@given(
    headers=st.builds(lambda *ds: {k: v for d in ds for k, v in d.items()},
                      pick(DELAY_NAMES, delays), pick(CACHE_NAMES, caches), pick(SID_NAMES, sids), pick(POLL_NAMES, poll_ids)),
    query=st.builds(lambda *ds: {k: v for d in ds for k, v in d.items()},
                    pick(DELAY_NAMES, delays), pick(CACHE_NAMES, caches), pick(SID_NAMES, sids), pick(POLL_NAMES, poll_ids)),
    path_sid=st.one_of(st.just(""), sids),
    body=st.one_of(st.binary(max_size=50), st.text(max_size=50).map(str.encode)),
)  # fmt: skip
def test_scheduling_cache_sequence_and_poll_parameters(headers: dict, query: dict, path_sid: str, body: bytes) -> None:
    try:
        got = ingest.ingest_publish("fuzzT", headers, query, body, now=NOW, limits=LIMITS, sequence_id=path_sid)
    except NtfyError as exc:
        assert exc.problem in ingest.CATALOG
        return
    check(got, {**query, **headers})
    if ingest._TOPIC_RE.fullmatch(path_sid) and got.envelope.event != ingest.EVENT_POLL_REQUEST:
        assert got.envelope.sequence_id == path_sid  # the path's id wins over any parameter


@SETTINGS
@given(
    topic=st.one_of(st.just("fuzzT"), st.text(max_size=10)),
    sid=sids,
    event=st.sampled_from([ingest.EVENT_CLEAR, ingest.EVENT_DELETE]),
)
def test_clear_and_delete_actions(topic: str, sid: str, event: str) -> None:
    try:
        got = ingest.ingest_action(topic, sid, event, now=NOW, limits=LIMITS)
    except NtfyError as exc:
        assert exc.problem in ingest.CATALOG
        return
    encode_envelope(got.envelope)  # an action has no message: assert_encodes' non-empty rule is not its
    encode_json(message_from_envelope(bytes(12), got.topic, got.envelope))
    assert got.envelope.event == event and got.envelope.sequence_id == sid


json_docs = st.fixed_dictionaries(
    {"topic": st.just("fuzzT")},
    optional={
        "message": st.text(max_size=40),
        "delay": st.one_of(delays, st.integers(), st.none()),
        "cache": st.one_of(caches, st.booleans(), st.none()),
        "sequence_id": st.one_of(sids, st.integers(), st.none()),
        "priority": st.one_of(st.integers(-3, 9), st.none()),
    },
).map(lambda d: json.dumps(d).encode())


@SETTINGS
@given(body=json_docs, headers=pick(CACHE_NAMES + DELAY_NAMES + POLL_NAMES, st.one_of(delays, caches)))
def test_json_publish_scheduling_fields(body: bytes, headers: dict) -> None:
    try:
        got = ingest.ingest_json(headers, {}, body, now=NOW, limits=LIMITS)
    except NtfyError as exc:
        assert exc.problem in ingest.CATALOG
        return
    check(got, headers)
