"""ntfy's action buttons, external attachments and e-mail in every publish form (headers, query
parameters, JSON publish), as the pure ingest core stores them or refuses them (ntfy's codes)."""

from __future__ import annotations

import json

import pytest

from upf_edge import NtfyError
from upf_keyspace import message_from_envelope
from upf_keyspace.wire import encode_json
from upf_writer import ingest
from upf_writer.ingest import Limits

NOW = 1_784_214_948
LIMITS = Limits(max_message_bytes=4096, default_ttl_secs=2_419_200, public_url="https://push.example")


def publish(body: bytes = b"", headers: dict[str, str] | None = None, query: dict[str, str] | None = None):
    return ingest.ingest_publish("t1", headers or {}, query or {}, body, now=NOW, limits=LIMITS)


def publish_json(doc: object, headers: dict[str, str] | None = None):
    raw = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    return ingest.ingest_json(headers or {}, {}, raw, now=NOW, limits=LIMITS)


def rejected(problem: ingest.Problem, fn, *args, **kwargs) -> None:
    with pytest.raises(NtfyError) as info:
        fn(*args, **kwargs)
    assert info.value.problem == problem


def wire(ingested) -> dict:
    """The message a subscriber receives for it (the same struct the writer's reply and the pusher use)."""
    return json.loads(encode_json(message_from_envelope(bytes(12), ingested.topic, ingested.envelope)))


# --- actions ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("headers", "query"),
    [({"x-actions": "view, Open, https://o"}, {}), ({"actions": "view, Open, https://o"}, {}),
     ({}, {"actions": "view, Open, https://o"}), ({}, {"action": "view, Open, https://o"}),
     ({"x-actions": '[{"action":"view","label":"Open","url":"https://o"}]'}, {})],
)  # fmt: skip
def test_actions_by_every_name_and_format(headers: dict[str, str], query: dict[str, str]) -> None:
    got = publish(b"hi", headers, query)
    (stored,) = json.loads(got.envelope.actions)
    assert (stored["action"], stored["label"], stored["clear"], stored["url"]) == ("view", "Open", False, "https://o")
    msg = wire(got)
    assert msg["actions"] == [stored] and list(msg).index("actions") == list(msg).index("message") + 1


def test_no_actions_means_no_field() -> None:
    got = publish(b"hi")
    assert got.envelope.actions == "" and "actions" not in wire(got) and "attachment" not in wire(got)


@pytest.mark.parametrize("text", ["junk", "view, Open", "http, a, https://x, method=GET, body=b", ";;;;", "[nope]"])
def test_bad_actions_are_40018(text: str) -> None:
    rejected(ingest.ACTIONS_INVALID, publish, b"hi", {"x-actions": text})


def test_priority_is_checked_before_actions_as_ntfy_does() -> None:
    rejected(ingest.PRIORITY_INVALID, publish, b"hi", {"x-actions": "junk", "x-priority": "9"})


def test_actions_past_the_message_limit_are_413() -> None:
    """UPF's cap (ntfy has none): the encoded actions fit in max_message_bytes."""
    big = "; ".join(f"http, L, https://x, body={'b' * 1500}" for _ in range(3))
    rejected(ingest.MESSAGE_TOO_LARGE, publish, b"hi", {"x-actions": big})


def test_json_publish_actions() -> None:
    got = publish_json({"topic": "t1", "message": "m", "actions": [
        {"action": "http", "label": "Call", "url": "https://h", "method": "put", "headers": {"b": "2", "a": "1"}}]})  # fmt: skip
    (a,) = wire(got)["actions"]
    assert (a["method"], a["headers"], len(a["id"])) == ("PUT", {"a": "1", "b": "2"}, 10)
    assert publish_json({"topic": "t1", "actions": []}).envelope.actions == ""
    assert publish_json({"topic": "t1", "actions": None}).envelope.actions == ""


@pytest.mark.parametrize(
    ("actions", "problem"),
    [({"action": "view"}, ingest.JSON_INVALID), ([{"action": 1}], ingest.JSON_INVALID), ("view, a, https://x", ingest.JSON_INVALID),
     ([{"action": "view", "label": "x"}], ingest.ACTIONS_INVALID), ([{}], ingest.ACTIONS_INVALID), ([None], ingest.ACTIONS_INVALID)],
)  # fmt: skip
def test_json_publish_bad_actions(actions: object, problem: ingest.Problem) -> None:
    """A type Go cannot decode into ntfy's publishMessage is a bad body (40024); a decodable but invalid
    action is 40018, as ntfy answers after turning the field into an X-Actions header."""
    rejected(problem, publish_json, {"topic": "t1", "actions": actions})


def test_json_actions_win_over_the_request_header() -> None:
    got = publish_json({"topic": "t1", "actions": [{"action": "view", "label": "J", "url": "https://j"}]},
                       {"x-actions": "view, H, https://h"})  # fmt: skip
    assert wire(got)["actions"][0]["label"] == "J"


# --- attachments (external URLs only) ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("url", "name"),
    [("https://example.com/f.jpg", "f.jpg"), ("https://example.com/a/b/", "b"), ("https://example.com", "attachment"),
     ("https://example.com/", "attachment"), ("http://x/a%20b.png?q=1#frag", "a b.png"), ("https://x/%zz", "attachment"),
     ("https://x/dir/.", "attachment"), ("https://x/p\x01", "attachment"),
     ("http://[not-an-address]/x.png", "attachment"), ("http://[::1/x", "attachment"), ("http://h:99999/x", "x")],
)  # fmt: skip
def test_attachment_name_from_the_url(url: str, name: str) -> None:
    """Go's path.Base of the parsed URL's path; "attachment" when that is empty or the URL does not parse."""
    assert ingest.attachment_name(url) == name


def test_attach_by_header_query_and_json_with_filename() -> None:
    for got in (publish(b"look", {"x-attach": "https://e/f.jpg"}), publish(b"look", {}, {"a": "https://e/f.jpg"}),
                publish_json({"topic": "t1", "message": "look", "attach": "https://e/f.jpg"})):  # fmt: skip
        assert wire(got)["attachment"] == {"name": "f.jpg", "url": "https://e/f.jpg"}
        assert list(wire(got))[-1] == "attachment" and got.envelope.message == "look"
    got = publish_json({"topic": "t1", "attach": "https://e/f.jpg", "filename": "n.jpg"})
    assert (got.envelope.attach_url, got.envelope.attach_name) == ("https://e/f.jpg", "n.jpg")
    assert publish(b"x", {"x-attach": "https://e/f", "filename": "given"}).envelope.attach_name == "given"


def test_attach_with_no_body_says_you_received_a_file() -> None:
    """ntfy's default message for an attachment; in UnifiedPush mode the body rules stay UnifiedPush's."""
    assert publish(b"", {"x-attach": "https://e/f.jpg"}).envelope.message == "You received a file: f.jpg"
    assert publish(b"  ", {"x-attach": "https://e/f.jpg"}).envelope.message == "You received a file: f.jpg"
    assert publish(b"", {"x-attach": "https://e/f.jpg", "x-message": "m"}).envelope.message == "m"
    assert publish(b"", {"x-attach": "https://e/f.jpg"}, {"up": "1"}).envelope.message == "triggered"
    # a JSON publish's empty message is "triggered" before ntfy looks at the attachment
    assert publish_json({"topic": "t1", "attach": "https://e/f.jpg"}).envelope.message == "triggered"


def test_filename_without_attach_is_ignored() -> None:
    """UPF stores no uploads: a filename alone makes no attachment, the body stays the message."""
    got = publish(b"text", {"x-filename": "a.txt"})
    assert (got.envelope.attach_url, got.envelope.message) == ("", "text") and "attachment" not in wire(got)


@pytest.mark.parametrize("url", ["ftp://x/f", "example.com/f.jpg", "javascript:alert(1)"])
def test_attach_url_must_be_http_40013(url: str) -> None:
    rejected(ingest.ATTACHMENT_URL_INVALID, publish, b"x", {"x-attach": url})


def test_attach_with_a_binary_body_is_40011() -> None:
    """ntfy: with an external attachment the body is the message, so it must be UTF-8."""
    rejected(ingest.MESSAGE_NOT_UTF8, publish, b"\xff\xfe", {"x-attach": "https://e/f"})
    assert publish(b"\xff\xfe", {"x-attach": "https://e/f"}, {"up": "1"}).envelope.encoding == "base64"


def test_attach_fields_are_capped() -> None:
    rejected(ingest.MESSAGE_TOO_LARGE, publish, b"x", {"x-attach": "https://e/" + "a" * 1100})
    rejected(ingest.MESSAGE_TOO_LARGE, publish, b"x", {"x-attach": "https://e/f", "x-filename": "n" * 1100})


def test_attach_is_checked_before_icon() -> None:
    rejected(ingest.ATTACHMENT_URL_INVALID, publish, b"x", {"x-attach": "nope", "x-icon": "nope"})


# --- e-mail ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["x-email", "x-e-mail", "email", "e-mail", "mail", "e"])
def test_email_is_40001_by_every_name(name: str) -> None:
    """No e-mail: ntfy without SMTP refuses it (rather than silently not sending it)."""
    rejected(ingest.EMAIL_DISABLED, publish, b"x", {name: "a@example.com"})
    rejected(ingest.EMAIL_DISABLED, publish, b"x", {}, {name.removeprefix("x-"): "a@example.com"})


def test_email_in_json_publish_and_empty_email() -> None:
    rejected(ingest.EMAIL_DISABLED, publish_json, {"topic": "t1", "email": "a@example.com"})
    assert publish(b"x", {"x-email": "  "}).envelope.message == "x"  # empty after trimming: not set
