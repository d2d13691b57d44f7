"""The wire message built from an envelope: fields passed by position land in the fields they name."""

from __future__ import annotations

import json

import msgspec

from upf_keyspace import Envelope, Message, message_from_envelope
from upf_keyspace.msgid import encode_id
from upf_keyspace.wire import Attachment, encode_json

STAMP = bytes(range(12))


def test_every_envelope_field_lands_in_the_message_field_of_its_name() -> None:
    """Each field set to a value no other field has, so a swap of two fields of one type shows."""
    env = Envelope(
        time=1_700_000_001,
        expires=1_700_000_002,
        message="the message",
        encoding="base64",
        title="the title",
        priority=4,
        tags=("a", "b"),
        click="https://click.example",
        icon="https://icon.example",
        content_type="text/markdown",
        event="message_clear",
        sequence_id="the-sequence",
        origin_id="the-origin",
        actions='[{"action":"view","label":"l","url":"https://u.example"}]',
        attach_url="https://attach.example/f",
        attach_name="f.txt",
        poll_id="the-poll",
    )
    msg = message_from_envelope(STAMP, "the-topic", env)
    assert msgspec.structs.asdict(msg) == {
        "id": "the-origin",
        "sequence_id": "the-sequence",
        "time": 1_700_000_001,
        "expires": 1_700_000_002,
        "event": "message_clear",
        "topic": "the-topic",
        "title": "the title",
        "message": "the message",
        "priority": 4,
        "tags": ("a", "b"),
        "click": "https://click.example",
        "icon": "https://icon.example",
        "poll_id": "the-poll",
        "actions": msgspec.Raw(env.actions.encode()),
        "attachment": Attachment("f.txt", "https://attach.example/f"),
        "content_type": "text/markdown",
        "encoding": "base64",
    }
    assert list(json.loads(encode_json(msg))) == list(msgspec.structs.asdict(msg))  # ntfy's order, all sent


def test_a_plain_message_sends_what_ntfy_always_sends_and_omits_the_empty_rest() -> None:
    env = Envelope(time=1_700_000_001, expires=1_700_000_002, message="hi")
    msg = message_from_envelope(STAMP, "t", env)
    assert msg == Message(
        id=encode_id(STAMP), time=1_700_000_001, expires=1_700_000_002, event="message", topic="t", message="hi"
    )
    assert json.loads(encode_json(msg)) == {
        "id": encode_id(STAMP),
        "time": 1_700_000_001,
        "expires": 1_700_000_002,
        "event": "message",
        "topic": "t",
        "message": "hi",
    }
    nocache = message_from_envelope(STAMP, "t", Envelope(time=1, expires=2, message="", nocache=True))
    assert json.loads(encode_json(nocache)) == {"id": encode_id(STAMP), "time": 1, "event": "message", "topic": "t"}
