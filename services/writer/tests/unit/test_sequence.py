"""Sequence ids (ntfy v2.16's update, clear and delete) and poll requests in the pure ingest core, the
wire message they become, and which paths the writer's front takes for them."""

from __future__ import annotations

from types import SimpleNamespace

import msgspec
import pytest

from upf_edge import NtfyError
from upf_keyspace import message_from_envelope
from upf_writer import ingest
from upf_writer.front import WriterFront
from upf_writer.ingest import Limits

NOW = 1_784_214_948
LIMITS = Limits(max_message_bytes=4096, default_ttl_secs=3600, public_url="https://push.example")
STAMP = bytes(range(12))


def publish(body: bytes = b"", headers: dict[str, str] | None = None, query: dict[str, str] | None = None, **kw):
    return ingest.ingest_publish("mytopic", headers or {}, query or {}, body, now=NOW, limits=LIMITS, **kw)


def wire(ingested: ingest.Ingested) -> dict:
    return msgspec.json.decode(msgspec.json.encode(message_from_envelope(STAMP, ingested.topic, ingested.envelope)))


@pytest.mark.parametrize(
    ("headers", "query"),
    [
        ({"x-sequence-id": "dl-42"}, {}),
        ({"sequence-id": "dl-42"}, {}),
        ({"sid": "dl-42"}, {}),
        ({}, {"sequence_id": "dl-42"}),
        ({}, {"sid": "dl-42"}),
        ({}, {"x-sequence-id": "dl-42"}),
        ({"x-sequence-id": " dl-42 "}, {"sid": "other"}),  # a header wins, trimmed as Go trims
    ],
)
def test_sequence_id_from_every_name(headers: dict[str, str], query: dict[str, str]) -> None:
    got = publish(b"50%", headers, query)
    assert got.envelope.sequence_id == "dl-42"
    msg = wire(got)
    assert (msg["sequence_id"], msg["event"], msg["message"]) == ("dl-42", "message", "50%")
    assert list(msg)[:3] == ["id", "sequence_id", "time"]


def test_path_sequence_id_wins_over_a_parameter() -> None:
    """As ntfy reads it: the path first, and then the parameters are not even looked at."""
    assert publish(b"x", {"x-sequence-id": "hdr"}, sequence_id="path").envelope.sequence_id == "path"
    assert publish(b"x", {"sid": "a.b"}, {"sid": "c.d"}, sequence_id="path").envelope.sequence_id == "path"


def test_no_sequence_id_no_field() -> None:
    """Without one the field is omitted (a client takes the message id as the sequence)."""
    msg = wire(publish(b"plain"))
    assert "sequence_id" not in msg and msg["event"] == "message" and msg["expires"] == NOW + 3600


def test_json_publish_sequence_id() -> None:
    body = b'{"topic":"mytopic","message":"v2","sequence_id":"dl-42"}'
    got = ingest.ingest_json({}, {}, body, now=NOW, limits=LIMITS)
    assert (got.topic, got.envelope.sequence_id, got.envelope.message) == ("mytopic", "dl-42", "v2")
    with pytest.raises(NtfyError) as info:
        ingest.ingest_json({}, {}, b'{"topic":"mytopic","sequence_id":"a.b"}', now=NOW, limits=LIMITS)
    assert info.value.problem == ingest.SEQUENCE_ID_INVALID


@pytest.mark.parametrize("sid", ["x" * 65, "a.b", "a b", "a/b", "ä", "a,b", "%41", "a:b"])
def test_invalid_sequence_ids_are_400_40049(sid: str) -> None:
    for call in (
        lambda: publish(b"x", {"x-sequence-id": sid}),
        lambda: publish(b"x", {}, {"sid": sid}),
        lambda: publish(b"x", sequence_id=sid),
        lambda: ingest.ingest_action("mytopic", sid, ingest.EVENT_DELETE, now=NOW, limits=LIMITS),
    ):
        with pytest.raises(NtfyError) as info:
            call()
        assert info.value.problem == ingest.SEQUENCE_ID_INVALID
        assert (info.value.http, info.value.code) == (400, 40049)


@pytest.mark.parametrize("sid", ["a", "x" * 64, "A-_z09", "ws", "json", "clear"])
def test_valid_sequence_ids(sid: str) -> None:
    assert publish(b"x", sequence_id=sid).envelope.sequence_id == sid


@pytest.mark.parametrize("event", [ingest.EVENT_CLEAR, ingest.EVENT_DELETE])
def test_action_event_on_the_wire(event: str) -> None:
    got = ingest.ingest_action("mytopic", "dl-42", event, now=NOW, limits=LIMITS)
    assert got.idem == "" and not got.envelope.nocache
    msg = wire(got)
    assert msg == {
        "id": msg["id"],
        "sequence_id": "dl-42",
        "time": NOW,
        "expires": NOW + 3600,
        "event": event,
        "topic": "mytopic",
    }


def test_action_on_an_invalid_topic_is_40009() -> None:
    with pytest.raises(NtfyError) as info:
        ingest.ingest_action("a.b", "s", ingest.EVENT_CLEAR, now=NOW, limits=LIMITS)
    assert info.value.problem == ingest.TOPIC_INVALID


@pytest.mark.parametrize(
    ("headers", "query"),
    [
        ({"x-poll-id": "abc123"}, {}),
        ({"poll-id": "abc123"}, {}),
        ({}, {"poll-id": "abc123"}),
        ({}, {"poll_id": "abc123"}),
    ],
)
def test_poll_request(headers: dict[str, str], query: dict[str, str]) -> None:
    """ntfy's newPollRequestMessage: body, title and the rest dropped; not cached (no expires)."""
    got = publish(b"the real secret", {**headers, "x-title": "t", "x-priority": "5", "x-sequence-id": "s"}, query)
    env = got.envelope
    assert (env.event, env.poll_id, env.message, env.nocache) == ("poll_request", "abc123", "New message", True)
    assert env.expires == NOW + LIMITS.nocache_keep_secs  # as an X-Cache: no message, for the janitor; not on the wire
    msg = wire(got)
    assert msg == {
        "id": msg["id"],
        "time": NOW,
        "event": "poll_request",
        "topic": "mytopic",
        "message": "New message",
        "poll_id": "abc123",
    }


@pytest.mark.parametrize(
    ("headers", "query"),
    [({"x-poll-id": "p1", "x-delay": "1h"}, {}), ({}, {"poll_id": "p1", "delay": "1h"}),
     ({"x-poll-id": "p1"}, {"in": "30m"})],
)  # fmt: skip
def test_poll_request_is_sent_at_once_despite_a_delay(headers: dict[str, str], query: dict[str, str]) -> None:
    """ntfy reads (and validates) the delay, then replaces the message with newPollRequestMessage, whose
    time is now: the poll request is published at once, not scheduled."""
    got = publish(b"x", headers, query)
    assert got.due == 0 and (got.envelope.event, got.envelope.time) == ("poll_request", NOW)


def test_poll_request_from_a_json_publish_is_sent_at_once() -> None:
    got = ingest.ingest_json({"x-poll-id": "p1"}, {}, b'{"topic":"t","delay":"1h"}', now=NOW, limits=LIMITS)
    assert got.due == 0 and got.envelope.event == "poll_request"


@pytest.mark.parametrize(
    ("headers", "problem"),
    [({"x-delay": "banana"}, ingest.DELAY_CANNOT_PARSE), ({"x-delay": "1s"}, ingest.DELAY_TOO_SMALL),
     ({"x-delay": "1h", "x-cache": "no"}, ingest.DELAY_NO_CACHE)],
)  # fmt: skip
def test_poll_request_still_validates_its_delay(headers: dict[str, str], problem: ingest.Problem) -> None:
    """ntfy's parsePublishParams checks the delay before it looks at the poll id."""
    with pytest.raises(NtfyError) as info:
        publish(b"x", {"x-poll-id": "p1", **headers})
    assert info.value.problem == problem


def test_poll_request_in_unifiedpush_mode_is_still_a_poll_request() -> None:
    env = publish(b"\xff\x00", {"x-poll-id": "p1"}, {"up": "1"}).envelope
    assert (env.event, env.message, env.encoding) == ("poll_request", "New message", "")


def test_poll_id_over_the_field_cap_is_413() -> None:
    with pytest.raises(NtfyError) as info:
        publish(b"x", {"x-poll-id": "p" * 1025})
    assert info.value.problem == ingest.MESSAGE_TOO_LARGE


# --- routing ----------------------------------------------------------------------------------------
@pytest.fixture
def front() -> WriterFront:
    from upf_keyspace import Settings
    from upf_keyspace import telemetry as tm

    ctx = SimpleNamespace(
        limits=LIMITS, telemetry=SimpleNamespace(tracing=False, registry=tm.Registry()), settings=Settings()
    )
    return WriterFront(ctx, frozenset({"/metrics", "/__version__"}))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("PUT", "/t/s"), ("POST", "/t/s"), ("DELETE", "/t/s"),
        ("PUT", "/t/ws"), ("POST", "/t/json"), ("DELETE", "/t/sse"), ("PUT", "/t/auth"),
        ("PUT", "/t/s/clear"), ("GET", "/t/s/clear"), ("PUT", "/t/s/read"), ("GET", "/t/s/read"),
        ("GET", "/t/json/clear"),
        ("PUT", "/t/a.b"), ("DELETE", "/t/" + "x" * 65),  # taken, then refused with 40049
    ],
)  # fmt: skip
def test_front_takes_sequence_routes(front: WriterFront, method: str, path: str) -> None:
    assert front.wants(method, path)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/t/ws"), ("GET", "/t/json"), ("GET", "/t/sse"), ("GET", "/t/raw"), ("GET", "/t/auth"),
        ("GET", "/t/s"), ("HEAD", "/t/s"), ("PATCH", "/t/s"),
        ("DELETE", "/t/s/clear"), ("POST", "/t/s/clear"), ("GET", "/t/s/other"), ("GET", "/t//clear"),
        ("PUT", "/t/"), ("PUT", "//s"), ("PUT", "/t/s/x/clear"), ("PUT", "/t/s/clear/"),
        ("DELETE", "/v1/account"), ("POST", "/v1/account/token"), ("PUT", "/docs/x"), ("POST", "/metrics/x"),
        ("POST", "/_matrix/push/v1/notify"),
    ],
)  # fmt: skip
def test_front_leaves_other_paths(front: WriterFront, method: str, path: str) -> None:
    assert not front.wants(method, path)


def test_body_limits(front: WriterFront) -> None:
    assert front.body_limit("PUT", "t/s", [], b"") == 4096
    assert front.body_limit("PUT", "t/s/clear", [], b"") < 0 and front.body_limit("DELETE", "t/s", [], b"") < 0


@pytest.mark.parametrize("sid", [" ", "a ", " a", "a\t"])
def test_a_path_sequence_id_is_not_trimmed_into_a_valid_one(sid: str) -> None:
    """Parameters are trimmed as ntfy trims headers; a path segment is taken as it came."""
    with pytest.raises(NtfyError) as err:
        ingest.ingest_publish("t", {}, {}, b"x", now=NOW, limits=LIMITS, sequence_id=sid)
    assert err.value.problem is ingest.SEQUENCE_ID_INVALID
