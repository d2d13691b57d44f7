"""Payload encoding: what a subscriber decodes must be exactly what the publisher sent."""

from __future__ import annotations

import base64

import pytest

from upf_loadgen.wire import Message, PayloadError, body_bytes, decode_message, decode_payload, encode_payload


@pytest.mark.parametrize("binary", [False, True])
@pytest.mark.parametrize("size", [0, 10, 64, 4096])
def test_payload_round_trip(binary: bool, size: int) -> None:
    body = encode_payload(12345, 987654321012, size, binary)
    assert len(body) == max(size, len(encode_payload(12345, 987654321012, 0, binary)))
    p = decode_payload(body, size, binary)
    assert (p.seq, p.sent_ns) == (12345, 987654321012)


def test_binary_body_is_not_utf8_so_the_server_must_base64_it() -> None:
    body = encode_payload(1, 2, 100, True)
    with pytest.raises(UnicodeDecodeError):
        body.decode("utf-8")


def test_text_body_survives_ntfy_trimming() -> None:
    body = encode_payload(7, 8, 50, False)
    assert body == body.strip()


def test_base64_frame_is_decoded() -> None:
    body = encode_payload(3, 4, 40, True)
    raw = (
        b'{"id":"x","time":1,"event":"message","topic":"t","message":"'
        + base64.b64encode(body)
        + b'","encoding":"base64"}\n'
    )
    msg = decode_message(raw)
    assert decode_payload(body_bytes(msg), 40, True).seq == 3


def test_corrupted_body_is_rejected() -> None:
    body = bytearray(encode_payload(3, 4, 60, False))
    body[-1] ^= 1
    with pytest.raises(PayloadError):
        decode_payload(bytes(body), 60, False)


def test_body_delivered_under_another_size_is_rejected() -> None:
    with pytest.raises(PayloadError):
        decode_payload(encode_payload(3, 4, 60, False), 61, False)


def test_bad_base64_is_a_payload_error() -> None:
    with pytest.raises(PayloadError):
        body_bytes(Message(event="message", message="***", encoding="base64"))


def test_unknown_fields_in_frames_are_ignored() -> None:
    msg = decode_message(b'{"id":"a","time":1,"event":"open","topic":"t","sequence_id":"a","actions":[]}')
    assert msg.event == "open"
