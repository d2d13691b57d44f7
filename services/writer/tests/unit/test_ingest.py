"""The pure ingest core: every parameter and alias, UnifiedPush detection, body rules, limits, JSON
publish and the Matrix gateway, without any I/O."""

from __future__ import annotations

import base64
import json

import msgspec
import pytest

from upf_edge import NtfyError
from upf_writer import ingest
from upf_writer.ingest import Limits

NOW = 1_784_214_948
LIMITS = Limits(max_message_bytes=4096, default_ttl_secs=2_419_200, public_url="https://push.example")


def publish(
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    query: dict[str, str] | None = None,
    topic: str = "mytopic",
):
    return ingest.ingest_publish(topic, headers or {}, query or {}, body, now=NOW, limits=LIMITS)


def rejected(problem: ingest.Problem, fn, *args, **kwargs) -> None:
    with pytest.raises(NtfyError) as info:
        fn(*args, **kwargs)
    assert info.value.problem == problem


# --- topics ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("topic", ["a", "upAbCdEfGhIjKl", "A-_z09", "x" * 64, "Docs", "v2"])
def test_valid_topics_are_accepted(topic: str) -> None:
    """Topics match ^[-_A-Za-z0-9]{1,64}$; the reserved list is exact and case-sensitive."""
    assert publish(b"hi", topic=topic).topic == topic


@pytest.mark.parametrize("topic", ["", "x" * 65, "a.b", "a b", "a/b", "ä", "a,b", "%41"])
def test_invalid_topics_are_400_40009(topic: str) -> None:
    """A topic outside the regex is 400 40009 (ntfy answers 404 for a path; UPF differs on purpose)."""
    rejected(ingest.TOPIC_INVALID, publish, b"hi", topic=topic)


@pytest.mark.parametrize("topic", sorted(ingest.DISALLOWED_TOPICS))
def test_disallowed_topics_are_400_40010(topic: str) -> None:
    """ntfy's reserved names cannot be published to."""
    rejected(ingest.TOPIC_DISALLOWED, publish, b"hi", topic=topic)


def test_topic_list_for_auth() -> None:
    """/{t1,t2}/auth validates every topic of the comma list."""
    assert ingest.validate_topic_list("a,b") == ["a", "b"]
    rejected(ingest.TOPIC_INVALID, ingest.validate_topic_list, "a,,b")
    rejected(ingest.TOPIC_INVALID, ingest.validate_topic_list, "a,b.c")


# --- body rules --------------------------------------------------------------------------------------
def test_plain_text_is_trimmed() -> None:
    """Plain mode trims UTF-8 text the way Go's strings.TrimSpace does."""
    env = publish(b"  \t hello world \n\xc2\xa0").envelope
    assert (env.message, env.encoding) == ("hello world", "")


def test_trim_is_go_trim_not_python_strip() -> None:
    """\\x1c-\\x1f are whitespace to Python's strip() but not to Go: kept."""
    assert publish(b"\x1chi\x1f").envelope.message == "\x1chi\x1f"


@pytest.mark.parametrize("body", [b"", b"   \n\t "])
def test_empty_plain_body_is_triggered(body: bytes) -> None:
    """An empty (or all-space) plain body becomes "triggered"."""
    env = publish(body).envelope
    assert (env.message, env.encoding) == ("triggered", "")


def test_binary_plain_body_is_base64() -> None:
    """UPF has no attachments: a binary plain body is stored as standard base64, untrimmed."""
    body = b" \xff\xfe\x00 binary "
    env = publish(body).envelope
    assert env.encoding == "base64"
    assert base64.b64decode(env.message) == body


@pytest.mark.parametrize(
    "headers,query",
    [
        ({}, {"up": "1"}),
        ({}, {"unifiedpush": "1"}),
        ({}, {"x-unifiedpush": "yes"}),
        ({"x-unifiedpush": "1"}, {}),
        ({"unifiedpush": "true"}, {}),
        ({"up": "TRUE"}, {}),
        ({"content-encoding": "aes128gcm"}, {}),
        ({"content-encoding": " AES128GCM "}, {}),
    ],
)
def test_unifiedpush_mode_variants(headers: dict[str, str], query: dict[str, str]) -> None:
    """Every way of asking for UnifiedPush mode keeps the text body verbatim (untrimmed)."""
    env = publish(b"  raw text \n", headers, query).envelope
    assert (env.message, env.encoding) == ("  raw text \n", "")


@pytest.mark.parametrize(
    "headers,query",
    [
        ({}, {"up": "0"}),
        ({}, {"up": "no"}),
        ({"x-unifiedpush": "0"}, {"up": "1"}),
        ({"content-encoding": "aesgcm"}, {}),
        ({}, {"UP": "1"}),
    ],
)
def test_not_unifiedpush_mode(headers: dict[str, str], query: dict[str, str]) -> None:
    """Only 1/yes/true turn it on; a header wins over the query; aesgcm (old draft) does not; query
    keys are matched lower-case only, as ntfy does."""
    assert publish(b"  raw text \n", headers, query).envelope.message == "raw text"


def test_unifiedpush_binary_is_base64() -> None:
    """An aes128gcm body is binary: stored as standard base64 with padding."""
    body = bytes(range(256)) * 3 + b"\x00"
    env = publish(body, {"content-encoding": "aes128gcm"}).envelope
    assert env.encoding == "base64"
    assert env.message == base64.standard_b64encode(body).decode()


def test_unifiedpush_empty_body_is_triggered_even_with_message_param() -> None:
    """In UnifiedPush mode the body always wins (ntfy's auto-detect), so an empty one is "triggered"."""
    env = publish(b"", {"x-message": "ignored"}, {"up": "1"}).envelope
    assert env.message == "triggered"


def test_message_param_used_when_body_empty() -> None:
    """X-Message/Message/m give the message when the body is empty; a literal \\n is a newline."""
    assert publish(b"", {"x-message": "a\\nb"}).envelope.message == "a\nb"
    assert publish(b"", {"message": "hdr"}).envelope.message == "hdr"
    assert publish(b"", {}, {"m": "q"}).envelope.message == "q"
    assert publish(b"", {}, {"message": "q2"}).envelope.message == "q2"
    assert publish(b"body", {"x-message": "param"}).envelope.message == "body"


def test_size_limit_is_inclusive() -> None:
    """4096 bytes is accepted, 4097 is 413 41301 -- in UnifiedPush mode too (ntfy truncates)."""
    assert len(publish(b"a" * 4096).envelope.message) == 4096
    rejected(ingest.MESSAGE_TOO_LARGE, publish, b"a" * 4097)
    rejected(ingest.MESSAGE_TOO_LARGE, publish, b"\xff" * 4097, {"content-encoding": "aes128gcm"})


def test_parameters_are_capped() -> None:
    """Title, tags, click and icon are each capped at the field limit (1024 bytes), a message parameter
    at the message limit; the bound counts UTF-8 bytes, not characters."""
    for name in ("x-title", "x-tags", "x-click"):
        rejected(ingest.MESSAGE_TOO_LARGE, publish, b"", {name: "é" * 513})
        rejected(ingest.MESSAGE_TOO_LARGE, publish, b"", {}, {name[2:]: "a" * 1025})
        publish(b"", {name: "é" * 512})
    rejected(ingest.MESSAGE_TOO_LARGE, publish, b"", {"x-icon": "https://" + "a" * 1017})
    assert publish(b"", {"x-icon": "https://" + "a" * 1016}).envelope.icon
    rejected(ingest.MESSAGE_TOO_LARGE, publish, b"", {"x-message": "é" * 2049})
    publish(b"", {"x-message": "é" * 2048})


def test_field_limit_follows_its_setting_in_json_publishes_too() -> None:
    """``max_field_bytes`` comes from UPF_MAX_FIELD_BYTES; a JSON publish's fields are held to it."""
    from upf_keyspace import load_settings

    limits = Limits.from_settings(load_settings({"UPF_MAX_FIELD_BYTES": "10"}))
    assert limits.max_field_bytes == 10
    ingest.ingest_publish("t", {"x-title": "a" * 10}, {}, b"", now=0, limits=limits)
    rejected(ingest.MESSAGE_TOO_LARGE, ingest.ingest_publish, "t", {"x-title": "a" * 11}, {}, b"", now=0, limits=limits)
    doc = json.dumps({"topic": "t", "message": "m", "tags": ["abcdef", "ghijk"]}).encode()
    rejected(ingest.MESSAGE_TOO_LARGE, ingest.ingest_json, {}, {}, doc, now=0, limits=limits)


# --- parameters --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "headers,query",
    [
        ({"x-title": "T"}, {}), ({"title": "T"}, {}), ({"t": "T"}, {}),
        ({}, {"x-title": "T"}), ({}, {"title": "T"}), ({}, {"t": "T"}),
        ({"title": "  T  "}, {"title": "other"}),
        ({"title": "=?UTF-8?B?VA==?="}, {}),
        ({"x-title": ""}, {"t": "T"}),
    ],
)  # fmt: skip
def test_title_names(headers: dict[str, str], query: dict[str, str]) -> None:
    """X-Title/Title/t as header or lower-case query; headers first, trimmed, RFC 2047 decoded."""
    assert publish(b"x", headers, query).envelope.title == "T"


def test_rfc2047_variants() -> None:
    """Encoded words in utf-8/iso-8859-1/us-ascii, B and Q, adjacent words joined; others kept raw."""
    assert publish(b"x", {"title": "=?utf-8?q?caf=C3=A9_au_lait?="}).envelope.title == "café au lait"
    assert publish(b"x", {"title": "=?ISO-8859-1?Q?caf=E9?="}).envelope.title == "café"
    assert publish(b"x", {"title": "=?UTF-8?B?YQ==?= =?UTF-8?B?Yg==?= c"}).envelope.title == "ab c"
    assert publish(b"x", {"title": "=?koi8-r?B?YQ==?="}).envelope.title == "=?koi8-r?B?YQ==?="
    assert publish(b"x", {"title": "=?UTF-8?B?!!!?="}).envelope.title == "=?UTF-8?B?!!!?="


@pytest.mark.parametrize(
    "value,expected",
    [("1", 1), ("min", 1), ("2", 2), ("low", 2), ("3", 3), ("default", 3), ("4", 4), ("HIGH", 4),
     ("5", 5), ("max", 5), ("urgent", 5), (" 4 ", 4)],
)  # fmt: skip
def test_priority_values(value: str, expected: int) -> None:
    """ntfy's ParsePriority: 1-5 and the names, case-insensitive."""
    assert publish(b"x", {"x-priority": value}).envelope.priority == expected


@pytest.mark.parametrize("name", ["x-priority", "priority", "prio", "p"])
def test_priority_names(name: str) -> None:
    assert publish(b"x", {name: "high"}).envelope.priority == 4
    assert publish(b"x", {}, {name: "2"}).envelope.priority == 2


@pytest.mark.parametrize("value", ["0", "6", "-1", "3.0", "highest", "u=3"])
def test_invalid_priority_is_400_40007(value: str) -> None:
    rejected(ingest.PRIORITY_INVALID, publish, b"x", {"x-priority": value})
    rejected(ingest.PRIORITY_INVALID, publish, b"x", {}, {"priority": value})


@pytest.mark.parametrize("value", ["u=3, i", "u=3", "i", "u=0,i", "i, u=7", "u=1, i=?1"])
def test_rfc9218_priority_header_is_ignored(value: str) -> None:
    """An RFC 9218 ``Priority`` header (added by proxies) is ignored; other names still count."""
    assert publish(b"x", {"priority": value}).envelope.priority == 0
    assert publish(b"x", {"priority": value}, {"p": "5"}).envelope.priority == 5


def test_unset_priority_is_zero() -> None:
    """Unset priority is 0 (omitted on the wire), not 3."""
    assert publish(b"x").envelope.priority == 0


@pytest.mark.parametrize("name", ["x-tags", "tags", "tag", "ta"])
def test_tags_names(name: str) -> None:
    """Comma-separated, each trimmed, empty ones dropped."""
    assert publish(b"x", {name: " a, b ,,c "}).envelope.tags == ("a", "b", "c")
    assert publish(b"x", {}, {name: "warning,skull"}).envelope.tags == ("warning", "skull")


def test_click_icon_markdown() -> None:
    """Click is not validated; icon must be http(s) (else 40021); markdown via param or Content-Type."""
    env = publish(b"x", {"x-click": "myapp://x", "icon": "https://i.example/a.png", "md": "yes"}).envelope
    assert (env.click, env.icon, env.content_type) == ("myapp://x", "https://i.example/a.png", "text/markdown")
    assert publish(b"x", {}, {"click": "https://c", "markdown": "true"}).envelope.content_type == "text/markdown"
    assert publish(b"x", {"content-type": "text/markdown; charset=utf-8"}).envelope.content_type == "text/markdown"
    assert publish(b"x", {"content-type": "text/plain"}).envelope.content_type == ""
    assert publish(b"x", {"x-markdown": "0"}).envelope.content_type == ""
    rejected(ingest.ICON_INVALID, publish, b"x", {"x-icon": "ftp://i"})


def test_app_put_query_form() -> None:
    """The ntfy app's own publish: PUT /t?priority=3&tags=a,b&title=x with a text body."""
    env = publish(
        b"hello\n", {}, {"priority": "3", "tags": "a,b", "title": "x", "delay": "", "markdown": "false"}
    ).envelope
    assert (env.message, env.priority, env.tags, env.title) == ("hello", 3, ("a", "b"), "x")


def test_unsupported_parameters_are_ignored() -> None:
    """filename (without attach: UPF stores no uploads), firebase: accepted and ignored (delay and
    cache: test_scheduling.py; sequence and poll ids: test_sequence.py; actions, attach, email:
    test_ingest_ntfy_extras.py)."""
    headers = {"x-filename": "a.jpg", "x-firebase": "no"}  # fmt: skip
    assert publish(b"hello", headers).envelope.message == "hello"


@pytest.mark.parametrize(
    ("headers", "query"), [({"x-call": "yes"}, {}), ({"call": "+12223334444"}, {}), ({}, {"call": "1"})]
)
def test_a_call_is_40032_as_ntfy_without_twilio(headers: dict[str, str], query: dict[str, str]) -> None:
    """A phone call asked for is refused, not dropped: the publisher learns nobody will be called. An
    empty value asks for none."""
    rejected(ingest.CALLS_DISABLED, publish, b"hi", headers, query)
    assert publish(b"hi", {"x-call": " "}).envelope.message == "hi"


@pytest.mark.parametrize("auth", ["vapid t=eyJ.x.y,k=BDd3", "WebPush eyJ.x.y", "Basic dTpw", "Bearer tk_abc"])
def test_authorization_is_ignored(auth: str) -> None:
    """There is no auth yet: any Authorization header is accepted and ignored."""
    assert publish(b"hi", {"authorization": auth}).envelope.message == "hi"


# --- time, TTL, idempotency --------------------------------------------------------------------------
def test_default_expiry() -> None:
    env = publish(b"x").envelope
    assert (env.time, env.expires) == (NOW, NOW + LIMITS.default_ttl_secs)


@pytest.mark.parametrize(
    "ttl,expires",
    [
        ("0", NOW),
        ("60", NOW + 60),
        (" 86400 ", NOW + 86400),
        ("99999999", NOW + 2_419_200),
        ("9" * 40, NOW + 2_419_200),
    ],
)
def test_ttl_header(ttl: str, expires: int) -> None:
    """RFC 8030 TTL: expires = time + min(TTL, default); TTL 0 expires at once (next janitor pass)."""
    assert publish(b"x", {"ttl": ttl}).envelope.expires == expires


@pytest.mark.parametrize("ttl", ["-1", "1.5", "abc", "0x10", "１"])
def test_invalid_ttl_is_400(ttl: str) -> None:
    rejected(ingest.TTL_INVALID, publish, b"x", {"ttl": ttl})


@pytest.mark.parametrize("ttl", ["", " "])
def test_empty_ttl_is_no_ttl(ttl: str) -> None:
    """An empty header is no header, as every other parameter (ntfy ignores TTL altogether)."""
    assert publish(b"x", {"ttl": ttl}).envelope.expires == NOW + LIMITS.default_ttl_secs


def test_idempotency_key() -> None:
    """Idempotency-Key (or X-Idempotency-Key): <= 200 printable ASCII; anything else is 400 40091."""
    assert publish(b"x", {"idempotency-key": " abc-123 "}).idem == "abc-123"
    assert publish(b"x", {"x-idempotency-key": "k" * 200}).idem == "k" * 200
    assert publish(b"x", {"idempotency-key": "a b~!"}).envelope.idem == "a b~!"
    assert publish(b"x", {"idempotency-key": ""}).idem == ""
    for bad in ("k" * 201, "é", "a\x01b", "a\x7fb"):
        rejected(ingest.IDEMPOTENCY_KEY_INVALID, publish, b"x", {"idempotency-key": bad})


def test_content_length_precheck() -> None:
    ingest.check_content_length({"content-length": "4096"}, 4096, ingest.MESSAGE_TOO_LARGE)
    ingest.check_content_length({}, 4096, ingest.MESSAGE_TOO_LARGE)
    ingest.check_content_length({"content-length": "junk"}, 4096, ingest.MESSAGE_TOO_LARGE)
    for big in ("4097", "9" * 30):
        rejected(
            ingest.MESSAGE_TOO_LARGE,
            ingest.check_content_length,
            {"content-length": big},
            4096,
            ingest.MESSAGE_TOO_LARGE,
        )


# --- JSON publish ------------------------------------------------------------------------------------
def publish_json(doc: object, headers: dict[str, str] | None = None, query: dict[str, str] | None = None):
    raw = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    return ingest.ingest_json(headers or {}, query or {}, raw, now=NOW, limits=LIMITS)


def test_json_publish_fields() -> None:
    """ntfy's JSON publish: topic, message (trimmed), title, priority, tags, click, icon, markdown."""
    got = publish_json({"topic": "t1", "message": " hi ", "title": "T", "priority": 4, "tags": ["a", "b"],
                        "click": "https://c", "icon": "https://i", "markdown": True, "actions": [], "delay": "1h"})  # fmt: skip
    env = got.envelope
    assert got.topic == "t1"
    assert (env.message, env.title, env.priority, env.tags, env.click, env.icon, env.content_type) == (
        "hi", "T", 4, ("a", "b"), "https://c", "https://i", "text/markdown")  # fmt: skip


def test_json_publish_defaults_and_nulls() -> None:
    """Missing or null fields are unset; an empty message is "triggered"; priority 0 is unset."""
    env = publish_json({"topic": "t1", "title": None, "priority": 0, "message": None}).envelope
    assert (env.message, env.title, env.priority) == ("triggered", "", 0)


def test_json_fields_win_over_request_params() -> None:
    """JSON fields act as headers that override the request's; absent ones fall back to it."""
    env = publish_json({"topic": "t1", "title": "json"}, {"title": "hdr", "x-tags": "h"}).envelope
    assert (env.title, env.tags) == ("json", ("h",))


@pytest.mark.parametrize(
    "doc",
    [{}, {"topic": ""}, {"topic": "a.b"}, {"topic": None}, {"message": "no topic"}],
)
def test_json_publish_needs_a_valid_topic(doc: dict) -> None:
    rejected(ingest.TOPIC_INVALID, publish_json, doc)


def test_json_publish_reserved_topic() -> None:
    rejected(ingest.TOPIC_DISALLOWED, publish_json, {"topic": "docs"})


@pytest.mark.parametrize(
    "raw",
    [b"", b"{", b"[]", b"null", b'"x"', b'{"topic": 5}', b'{"topic":"t","priority":"high"}',
     b'{"topic":"t","priority":1.5}', b'{"topic":"t","tags":"a,b"}', b'{"topic":"t","markdown":"yes"}',
     b'{"topic":"t","message":"\\ud800"}', b'{"topic":"t","message":"\xff"}'],
)  # fmt: skip
def test_invalid_json_is_400_40024(raw: bytes) -> None:
    rejected(ingest.JSON_INVALID, publish_json, raw)


def test_json_priority_over_5_is_40007() -> None:
    rejected(ingest.PRIORITY_INVALID, publish_json, {"topic": "t", "priority": 6})


def test_json_decode_stops_at_the_topic() -> None:
    """decode_json is what ntfy's transformBodyJSON checks before the ACL: JSON and field types (actions'
    too, so before the topic), then the topic; the fields' values wait for ingest_decoded_json."""
    rejected(ingest.JSON_INVALID, ingest.decode_json, b'{"topic":"a.b","actions":"junk"}', LIMITS)
    rejected(ingest.TOPIC_INVALID, ingest.decode_json, b'{"topic":"a.b","priority":9}', LIMITS)
    topic, doc = ingest.decode_json(b'{"topic":"t","priority":9,"delay":"banana","actions":[]}', LIMITS)
    assert topic == "t" and not doc.actions
    rejected(ingest.PRIORITY_INVALID, ingest.ingest_decoded_json, topic, doc, {}, {}, now=NOW, limits=LIMITS)


@pytest.mark.parametrize("priority", [-1, -3, -(1 << 63)])
def test_json_negative_priority_is_40007(priority: int) -> None:
    """ntfy's transformBodyJSON passes any nonzero priority to ParsePriority, which knows only 1..5."""
    rejected(ingest.PRIORITY_INVALID, publish_json, {"topic": "t", "priority": priority})


DEEP = b"[" * 1000 + b"]" * 1000


@pytest.mark.parametrize(
    "raw",
    [b'{"topic":"t","x":' + DEEP + b"}", b'{"topic":"t","actions":' + DEEP + b"}",
     b'{"topic":"t","actions":[{"action":"view","label":"l","url":"https://u","extras":'
     + b'{"a":' * 1000 + b"1" + b"}" * 1000 + b"}]}"],
)  # fmt: skip
def test_deeply_nested_json_is_40024_not_a_crash(raw: bytes) -> None:
    """Nesting deeper than msgspec follows is refused as invalid JSON (ntfy's Go decoder takes 10,000
    levels; UPF refuses earlier), never a RecursionError's 500."""
    rejected(ingest.JSON_INVALID, publish_json, raw)


def test_json_limits() -> None:
    """The JSON body may be 2x the message limit (else 413 41303); the message itself 1x (41301)."""
    rejected(ingest.JSON_TOO_LARGE, publish_json, b" " * 8193)
    rejected(ingest.MESSAGE_TOO_LARGE, publish_json, {"topic": "t", "message": "a" * 4097})
    assert len(publish_json({"topic": "t", "message": "a" * 4096}).envelope.message) == 4096


def test_json_limit_is_reached_at_the_limit() -> None:
    """ntfy peeks that many bytes and refuses when it got them all: a body of exactly 2x is 41303."""
    rejected(ingest.JSON_TOO_LARGE, publish_json, b" " * 8192)
    assert publish_json(b'{"topic":"t"}' + b" " * (8191 - 13)).envelope.message == "triggered"


def test_json_keys_match_fields_without_case_the_later_winning() -> None:
    """Go's decoder matches a key to a field ignoring case (.NET and others write "Message"), and a later
    key overwrites an earlier one; the action's own names keep their case (an HTTP header's)."""
    got = publish_json(b'{"Topic":"t","MESSAGE":"hi","title":"a","Title":"b","Priority":4,"TAGS":["x"],'
                       b'"Actions":[{"Action":"http","Label":"l","URL":"https://u","Headers":{"X-Key":"v"}}]}')  # fmt: skip
    assert got.topic == "t"
    env = got.envelope
    assert (env.message, env.title, env.priority, list(env.tags)) == ("hi", "b", 4, ["x"])
    assert json.loads(env.actions)[0]["headers"] == {"X-Key": "v"}
    assert publish_json(b'{"topic":"a","TOPIC":"b"}').topic == "b"
    assert publish_json(b'{"topic":"t","me\xc5\xbfsage":"long s"}').envelope.message == "long s"


@pytest.mark.parametrize("tail", [b" trailing", b"}", b'{"topic":"u","message":"second"}', b"\n\xff"])
def test_json_after_the_first_value_is_ignored(tail: bytes) -> None:
    """ntfy's json.Decoder reads the first value and leaves the rest of the body unread."""
    got = publish_json(b' {"topic":"t","message":"first"}' + tail)
    assert (got.topic, got.envelope.message) == ("t", "first")


@pytest.mark.parametrize("raw", [b'{"topic":"t","message":NaN} x', b'{"topic":"t",} x', b'{"topic":"t"'])
def test_json_first_value_still_checked(raw: bytes) -> None:
    rejected(ingest.JSON_INVALID, publish_json, raw)


def test_json_publish_honours_request_up_mode() -> None:
    """With ?up=1 on the request, the JSON message is kept untrimmed."""
    assert publish_json({"topic": "t", "message": " x "}, query={"up": "1"}).envelope.message == " x "


# --- Matrix ------------------------------------------------------------------------------------------
def matrix(doc: object):
    raw = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    return ingest.ingest_matrix(raw, now=NOW, limits=LIMITS)


def matrix_doc(pushkey: object) -> dict:
    return {"notification": {"event_id": "$x", "room_id": "!r", "counts": {"unread": 1},
                             "devices": [{"app_id": "im.app", "pushkey": pushkey, "data": {}}]}}  # fmt: skip


def test_matrix_maps_pushkey_to_topic_and_keeps_body() -> None:
    """The first path segment under public_url is the topic; the whole body is the message, verbatim."""
    raw = (json.dumps(matrix_doc("https://push.example/upAbCdEfGhIjKl?up=1")) + "  ").encode()
    out = ingest.ingest_matrix(raw, now=NOW, limits=LIMITS)
    assert not out.rejected and out.ingested is not None
    assert out.ingested.topic == "upAbCdEfGhIjKl"
    assert out.ingested.envelope.message == raw.decode()
    assert out.ingested.envelope.encoding == ""
    assert out.ingested.envelope.expires == NOW + LIMITS.default_ttl_secs


def test_matrix_publishes_with_the_pushkeys_parameters() -> None:
    """ntfy publishes the body to the pushkey's URL, so its query is the publish's parameters; without
    up=1 the body is a plain message (trimmed); keys match without case at every level, as Go's."""
    raw = json.dumps(matrix_doc("https://push.example/upAbC?up=1&title=T&p=5")).encode()
    out = ingest.ingest_matrix(raw, now=NOW, limits=LIMITS)
    assert out.ingested is not None and out.unifiedpush
    assert (out.ingested.envelope.title, out.ingested.envelope.priority) == ("T", 5)
    plain = ingest.ingest_matrix(
        b" " + json.dumps(matrix_doc("https://push.example/upAbC")).encode(), now=NOW, limits=LIMITS
    )
    assert plain.ingested is not None and not plain.unifiedpush
    assert plain.ingested.envelope.message == json.dumps(matrix_doc("https://push.example/upAbC"))
    shouting = {"Notification": {"DEVICES": [{"PushKey": "https://push.example/upAbC?up=1"}]}}
    assert matrix(shouting).ingested.topic == "upAbC"
    rejected(ingest.PRIORITY_INVALID, matrix, matrix_doc("https://push.example/upAbC?up=1&p=9"))


def test_matrix_only_first_device_counts() -> None:
    doc = matrix_doc("https://push.example/first")
    doc["notification"]["devices"].append({"pushkey": "https://elsewhere/second"})
    assert matrix(doc).ingested.topic == "first"


@pytest.mark.parametrize(
    "pushkey",
    ["https://other.example/upX?up=1", "https://push.example", "https://push.examplex/t", "http://push.example/t",
     "https://push.example/", "https://push.example/a.b", "https://push.example/docs", "https://push.example/?up=1"],
)  # fmt: skip
def test_matrix_foreign_or_useless_pushkey_is_rejected(pushkey: str) -> None:
    """A pushkey not under public_url + "/", or naming no publishable topic, is answered as rejected."""
    out = matrix(matrix_doc(pushkey))
    assert out.rejected and out.pushkey == pushkey


def test_matrix_topic_ends_at_slash_query_or_fragment() -> None:
    for suffix in ("/more/path", "?up=1", "#frag"):
        assert matrix(matrix_doc("https://push.example/t1" + suffix)).ingested.topic == "t1"


@pytest.mark.parametrize(
    "doc",
    [b"", b"{", b"[]", {}, {"notification": None}, {"notification": {}}, {"notification": {"devices": []}},
     {"notification": {"devices": [None]}}, {"notification": {"devices": [{}]}}, matrix_doc(""), matrix_doc(None),
     matrix_doc(5), b'{"notification":{"devices":[{"pushkey":"https://push.example/t\xff"}]}}'],
)  # fmt: skip
def test_matrix_invalid_is_400_40019(doc: object) -> None:
    rejected(ingest.MATRIX_INVALID, matrix, doc)


def test_deeply_nested_matrix_is_40019_not_a_crash() -> None:
    """As a JSON publish's: too deep for msgspec is the Matrix path's invalid JSON, never a 500."""
    rejected(ingest.MATRIX_INVALID, matrix, b'{"x":' + b"[" * 1500 + b"]" * 1500 + b"}")


def test_matrix_size_limit() -> None:
    """ntfy: a Matrix body of 4096 bytes or more is 413 41302."""
    doc = json.dumps(matrix_doc("https://push.example/t1")).encode()
    rejected(ingest.MATRIX_TOO_LARGE, matrix, doc + b" " * (4096 - len(doc)))
    assert matrix(doc + b" " * (4095 - len(doc))).ingested is not None


# --- catalog -----------------------------------------------------------------------------------------
def test_catalog_is_consistent() -> None:
    """Codes are unique and agree with their HTTP status, as ntfy's do (code // 100 == http)."""
    codes = [p.code for p in ingest.CATALOG]
    assert len(codes) == len(set(codes))
    assert all(p.code // 100 == p.http for p in ingest.CATALOG)


def test_every_publish_field_lands_in_the_envelope_field_of_its_name() -> None:
    """The envelope is built by position: each field set to a value no other field of its type has,
    so a swap shows."""
    params = ingest.Params(
        title="the title",
        priority=4,
        tags=("a", "b"),
        click="https://click.example",
        icon="https://icon.example",
        content_type="text/markdown",
        ttl=600,
        idem="the-idem",
        cache=False,
        sequence_id="the-sequence",
        urgency="high",
        push_topic="the-push-topic",
        actions='[{"action":"view","label":"l","url":"https://u.example"}]',
        attach_url="https://attach.example/f",
        attach_name="f.txt",
    )
    env = ingest.build_envelope(params, b"the body", now=NOW, limits=LIMITS)
    assert msgspec.structs.asdict(env) == {
        "time": NOW,
        "expires": NOW + LIMITS.nocache_keep_secs,  # X-Cache: no keeps it for live delivery only
        "message": "the body",
        "encoding": "",
        "title": "the title",
        "priority": 4,
        "tags": ("a", "b"),
        "click": "https://click.example",
        "icon": "https://icon.example",
        "content_type": "text/markdown",
        "traceparent": "",
        "idem": "the-idem",
        "published_ms": 0,
        "event": "",
        "sequence_id": "the-sequence",
        "nocache": True,
        "origin_id": "",
        "urgency": "high",
        "push_topic": "",  # X-Cache: no replaces nothing (with the cache on: below)
        "actions": params.actions,
        "attach_url": "https://attach.example/f",
        "attach_name": "f.txt",
        "poll_id": "",
    }
    cached = ingest.build_envelope(msgspec.structs.replace(params, cache=True), b"x", now=NOW, limits=LIMITS)
    assert cached.push_topic == "the-push-topic"
