"""Frames of ntfy v2.16's sequence-id events and of poll requests, on every transport, from the stored
envelope (``message_from_envelope``) to the bytes: ``event``, ``sequence_id`` and ``poll_id`` as ntfy's
JSON carries them, sse's ``event:`` line for every event that is not a message."""

from __future__ import annotations

import json

import pytest

from upf_keyspace import Envelope, message_from_envelope
from upf_pusher import framing

STAMP = bytes(range(12))


def frame(env: Envelope):
    return message_from_envelope(STAMP, "t1", env)


UPDATE = Envelope(time=1700000000, expires=1700003600, message="90%", sequence_id="dl-1")
DELETE = Envelope(time=1700000001, expires=1700003601, message="", event="message_delete", sequence_id="dl-1")
CLEAR = Envelope(time=1700000002, expires=1700003602, message="", event="message_clear", sequence_id="dl-1")
POLL = Envelope(
    time=1700000003, expires=1700003603, message="New message", event="poll_request", nocache=True, poll_id="p1"
)


@pytest.mark.parametrize("transport", ["json", "ws"])
def test_json_objects(transport: str) -> None:
    out = [json.loads(framing.encode(transport, frame(e))) for e in (UPDATE, DELETE, CLEAR, POLL)]
    assert [list(o) for o in out] == [
        ["id", "sequence_id", "time", "expires", "event", "topic", "message"],
        ["id", "sequence_id", "time", "expires", "event", "topic"],
        ["id", "sequence_id", "time", "expires", "event", "topic"],
        ["id", "time", "event", "topic", "message", "poll_id"],  # not cached: no expires
    ]
    assert [(o["event"], o.get("sequence_id"), o.get("poll_id")) for o in out] == [
        ("message", "dl-1", None),
        ("message_delete", "dl-1", None),
        ("message_clear", "dl-1", None),
        ("poll_request", None, "p1"),
    ]


def test_sse_names_every_event_but_message() -> None:
    assert framing.encode_sse(frame(UPDATE)).startswith(b'data: {"id":"AAECAwQFBgcICQoL","sequence_id":"dl-1",')
    for env, name in ((DELETE, b"message_delete"), (CLEAR, b"message_clear"), (POLL, b"poll_request")):
        out = framing.encode_sse(frame(env))
        assert out.startswith(b"event: " + name + b"\ndata: {") and out.endswith(b"}\n\n")
        assert json.loads(out.split(b"data: ", 1)[1])["event"] == name.decode()


def test_raw_has_an_empty_line_for_the_events() -> None:
    """/raw carries message text only: the events are empty lines, as ntfy writes them."""
    assert [framing.encode_raw(frame(e)) for e in (UPDATE, DELETE, CLEAR, POLL)] == [b"90%\n", b"\n", b"\n", b"\n"]
