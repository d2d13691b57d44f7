"""Web Push in the ingest core: which requests are Web Push, Urgency (kept, mapped to a priority unless
one was given) and Topic (kept for replacement), and their bad inputs; ntfy requests are unaffected."""

from __future__ import annotations

import base64

import pytest

from upf_edge import NtfyError
from upf_writer import ingest
from upf_writer.ingest import Limits

NOW = 1_784_214_948
LIMITS = Limits(max_message_bytes=4096, default_ttl_secs=2_419_200, public_url="https://push.example")
VAPID = {"authorization": "vapid t=eyJ0.eyJ1.c2ln, k=BPub"}
ECE = {"content-encoding": "aes128gcm", "ttl": "60"}
BIN = bytes(range(256))


def publish(headers: dict[str, str], body: bytes = BIN, query: dict[str, str] | None = None):
    return ingest.ingest_publish("upTOPIC01", headers, query or {}, body, now=NOW, limits=LIMITS)


@pytest.mark.parametrize(
    ("headers", "webpush"),
    [
        (VAPID, True),
        ({"authorization": "WebPush eyJ0.eyJ1.c2ln", "crypto-key": "p256ecdsa=BPub"}, True),
        (ECE, True),
        ({"content-encoding": "aes128gcm"}, False),  # ntfy's UnifiedPush mode, no TTL: ntfy's answer
        ({"ttl": "60"}, False),
        ({"authorization": "Bearer tk_x"}, False),
        ({}, False),
    ],
)
def test_web_push_requests(headers: dict[str, str], webpush: bool) -> None:
    got = publish(headers)
    assert got.webpush is webpush
    if webpush:  # always UnifiedPush mode: the body verbatim
        assert got.envelope.encoding == "base64" and base64.b64decode(got.envelope.message) == BIN


@pytest.mark.parametrize(
    ("urgency", "priority"), [("very-low", 1), ("low", 2), ("normal", 3), ("high", 5), ("HIGH", 5)]
)
def test_urgency_kept_and_shown_as_priority(urgency: str, priority: int) -> None:
    env = publish({**ECE, "urgency": urgency}).envelope
    assert (env.urgency, env.priority) == (urgency.lower(), priority)


def test_explicit_priority_wins_over_urgency() -> None:
    env = publish({**VAPID, "urgency": "very-low", "x-priority": "4"}).envelope
    assert (env.urgency, env.priority) == ("very-low", 4)
    env = publish({**VAPID, "urgency": "high"}, query={"p": "min"}).envelope
    assert (env.urgency, env.priority) == ("high", 1)


def test_topic_kept() -> None:
    assert publish({**VAPID, "topic": "news-Feed_1"}).envelope.push_topic == "news-Feed_1"
    assert publish({**VAPID, "topic": "a" * 32}).envelope.push_topic == "a" * 32


def test_a_message_not_kept_replaces_nothing() -> None:
    """X-Cache: no (delivered to connected subscribers only) or a poll request: the stored message its
    Topic names stays for the offline subscribers, who would otherwise get neither."""
    assert publish({**VAPID, "topic": "t1", "x-cache": "no"}).envelope.push_topic == ""
    assert publish({**VAPID, "topic": "t1", "x-poll-id": "p1"}).envelope.push_topic == ""


def test_ntfy_requests_ignore_urgency_and_topic() -> None:
    """An ntfy client's stray header changes nothing (ntfy ignores both)."""
    got = publish({"topic": "not base64url!", "urgency": "whenever"}, b"hello")
    assert (got.webpush, got.envelope.push_topic, got.envelope.urgency, got.envelope.priority) == (False, "", "", 0)


@pytest.mark.parametrize("value", ["a" * 33, "has space", "plus+sign", "pad==", "ä", "a/b"])
def test_bad_topic_is_400_40097(value: str) -> None:
    with pytest.raises(NtfyError) as info:
        publish({**ECE, "topic": value})
    assert info.value.problem == ingest.PUSH_TOPIC_INVALID and info.value.problem.code == 40097


@pytest.mark.parametrize("value", ["urgent", "very low", "5", "normal,high", "verylow"])
def test_bad_urgency_is_400_40098(value: str) -> None:
    with pytest.raises(NtfyError) as info:
        publish({**VAPID, "urgency": value})
    assert info.value.problem == ingest.URGENCY_INVALID and info.value.problem.code == 40098


def test_json_publish_with_vapid_is_web_push() -> None:
    got = ingest.ingest_json({**VAPID, "urgency": "low"}, {}, b'{"topic":"upT","message":"m"}', now=NOW, limits=LIMITS)
    assert got.webpush and got.envelope.priority == 2
