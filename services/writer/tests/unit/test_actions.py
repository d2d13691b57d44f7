"""ntfy's action buttons, both formats: what ntfy's parser accepts and how it refuses (pure parsing).

The cases follow ntfy's own (server/actions_test.go, v2.13) as behaviour: the same inputs, the same
results and the same error wording (JSON syntax errors aside: Python's decoder words them its own way).
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from upf_writer.actions import Action, ActionsError, count_json_actions, encode_actions, parse_actions


def one(text: str) -> Action:
    actions = parse_actions(text)
    assert len(actions) == 1
    return actions[0]


def test_empty_json_array_is_no_actions() -> None:
    assert parse_actions("[]") == [] and encode_actions([]) == ""


def test_simple_format_with_keys_and_positional_sections() -> None:
    """action, label and url may be given by position; actions are separated by ';'."""
    a, b = parse_actions("action=http, label=Open door, url=https://door.lan/open; view, Show portal, https://door.lan")
    assert (a.action, a.label, a.url) == ("http", "Open door", "https://door.lan/open")
    assert (b.action, b.label, b.url) == ("view", "Show portal", "https://door.lan")


def test_json_format() -> None:
    a, b = parse_actions(
        '[{"action":"http","label":"Open door","url":"https://door.lan/open"},'
        ' {"action":"view","label":"Show portal","url":"https://door.lan"}]'
    )
    assert (a.action, a.label, a.url, b.action, b.url) == ("http", "Open door", "https://door.lan/open", "view",
                                                           "https://door.lan")  # fmt: skip


def test_other_parameters_extras_intent_and_headers() -> None:
    a = one("action=http, label=Open door, url=https://door.lan/open, body=this is a body, method=put")
    assert (a.method, a.body) == ("PUT", "this is a body")  # the method is upper-cased
    a = one("action=broadcast, label=Do a thing, extras.command=some command, extras.some_param=a parameter")
    assert a.extras == {"command": "some command", "some_param": "a parameter"} and a.url == ""
    assert (
        one("action=broadcast, label=Do a thing, intent=io.heckel.ntfy.TEST_INTENT").intent
        == "io.heckel.ntfy.TEST_INTENT"
    )
    a = one("action=http, label=Send, url=http://example.com, method=GET, headers.Content-Type=application/json, "
            "headers.Authorization=Basic sdasffsf")  # fmt: skip
    assert a.headers == {"Content-Type": "application/json", "Authorization": "Basic sdasffsf"}


@pytest.mark.parametrize(
    ("text", "label", "extra"),
    [
        (r'action=http, "Look ma, \"quotes\"; and semicolons", url=http://example.com', 'Look ma, "quotes"; and semicolons', {}),
        (r"""action=http, '"quotes" and \'single quotes\'', url=http://example.com""", "\"quotes\" and 'single quotes'", {}),
        ("""action=http, Post it, url=http://example.com, body='{"temperature": 65}'""", "Post it",
         {"body": '{"temperature": 65}'}),
        ('label="Out of order!" , action="http", url=http://example.com', "Out of order!", {}),
        ("""action = http, label = 'this is a label', url = "http://google.com\"""", "this is a label", {}),
        ("""action = http, 'Кохайтеся а не воюйте, 💙🫤', url = "http://google.com\"""", "Кохайтеся а не воюйте, 💙🫤", {}),
    ],
)  # fmt: skip
def test_quoting_spacing_order_and_non_ascii(text: str, label: str, extra: dict[str, str]) -> None:
    a = one(text)
    assert a.action == "http" and a.label == label
    for k, v in extra.items():
        assert getattr(a, k) == v


def test_awkward_spacing_and_clear() -> None:
    a, b = parse_actions(
        "http , 'Make love, not war 💙🫤' , https://ntfy.sh ; view, \" yo \", https://x.org, clear=true"
    )
    assert (a.label, a.url, a.clear) == ("Make love, not war 💙🫤", "https://ntfy.sh", False)
    assert (b.label, b.url, b.clear) == (" yo ", "https://x.org", True)  # quoted: not trimmed


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('label="Out of order!" x, action="http", url=http://example.com', "unexpected character 'x' at position 22"),
        ('label="", action="http", url=http://example.com', "parameter 'label' is required"),
        ('label=, action="http", url=http://example.com', "parameter 'label' is required"),
        ('label="xx", action="http", url=http://example.com, what is this anyway', "term 'what is this anyway' unknown"),
        ("fdsfdsf", "parameter 'action' cannot be 'fdsfdsf', valid values are 'view', 'broadcast' and 'http'"),
        ("""aaa=a, "bbb, 'ccc, ddd, eee \"""", "key 'aaa' unknown"),
        ('action=http, label="omg the end quote is missing', "unexpected end of input, quote started at position 20"),
        (";;;;", "only 3 actions allowed"),
        (",,,,,,;;", "term '' unknown"),
        ("""''";,;\"""", "unexpected character '\"' at position 2"),
        ("action=http, label=a label, body=somebody", "parameter 'url' is required for action 'http'"),
        ("action=http, label=a label, url=http://ntfy.sh, method=HEAD, body=somebody",
         "parameter 'body' cannot be set if method is HEAD"),
        ('[ { "some": "object" } ]', "parameter 'action' cannot be '', valid values are 'view', 'broadcast' and 'http'"),
        ("http, label, http://x.org, clear=x",
         "parameter 'clear' cannot be 'x', only boolean values are allowed (true/yes/1/false/no/0)"),
        ("VIEW, label, http://x.org", "term 'http://x.org' unknown"),  # ntfy picks the url key before lower-casing
        ("view, a, http://a; view, b, http://b; view, c, http://c; view, d, http://d", "only 3 actions allowed"),
        ("é, 'Ж', url=x, clear=1, \"unterminated", "unexpected end of input, quote started at position 27"),  # bytes, not chars (25)
    ],
)  # fmt: skip
def test_refusals_with_ntfy_wording(text: str, error: str) -> None:
    with pytest.raises(ActionsError) as e:
        parse_actions(text)
    assert str(e.value) == error


@pytest.mark.parametrize(
    "text",
    [
        "[ invalid json ]",
        '[{"action":"view","label":"l","url":"u"}] trailing',
        '[{"action":1,"label":"l"}]',
        '[{"action":"view","label":"l","url":"u","clear":"true"}]',
        '[{"action":"http","label":"l","url":"u","headers":["a"]}]',
        '[{"action":"http","label":"l","url":"u","headers":{"a":1}}]',
        '[{"action":"view","label":"l","url":"u","x":NaN}]',
        '[["action","view"]]',
        "[" * 100000,
    ],
)
def test_json_that_go_cannot_decode_is_a_json_error(text: str) -> None:
    """Syntax errors, wrong types and Python-only JSON (NaN) are refused, never an exception escaping."""
    with pytest.raises(ActionsError) as e:
        parse_actions(text)
    assert str(e.value).startswith("JSON error")
    with pytest.raises(ActionsError):
        count_json_actions(text)


def test_json_keys_are_case_insensitive_last_wins_unknown_ignored_and_ids_generated() -> None:
    """As Go's encoding/json decodes into ntfy's struct: the id given is replaced, nulls are zero values."""
    a = one('[{"ACTION":"View","Label":"a","label":"b","URL":"https://x","id":"mine","other":{"deep":[1]},'
            '"clear":null,"method":null}]')  # fmt: skip
    assert (a.action, a.label, a.url, a.clear, a.method) == ("view", "b", "https://x", False, "")
    assert a.id != "mine" and len(a.id) == 10 and a.id.isalnum()
    assert count_json_actions('[{"action":"x"}, null]') == 2


def test_encoded_form_is_ntfys() -> None:
    """Field order id, action, label, clear (always), then only what is set; maps with sorted keys."""
    text = encode_actions(parse_actions("http, Call, https://h, method=post, headers.b=2, headers.a=1, clear=yes"))
    (obj,) = json.loads(text)
    assert list(obj) == ["id", "action", "label", "clear", "url", "method", "headers"]
    assert (obj["clear"], obj["method"], list(obj["headers"])) == (True, "POST", ["a", "b"])
    assert list(json.loads(encode_actions(parse_actions("view, Open, https://o")))[0]) == ["id", "action", "label",
                                                                                            "clear", "url"]  # fmt: skip


def test_nul_ends_a_section_as_ntfys_end_of_input_rune() -> None:
    """ntfy's scanner uses rune 0 as its end marker, so a NUL (possible via %00 in a query) ends the action."""
    a, b = parse_actions("view, Open, https://o\0view, Two, https://t")
    assert (a.url, b.label) == ("https://o", "Two")


# --- fuzz: ntfy's refusal or a valid array, never another exception --------------------------------------
_PIECES = ["view", "http", "broadcast", ",", ";", "=", "'", '"', "\\", " ", "label", "url", "clear", "true", "headers.",
           "extras.", "method", "body", "intent", "[", "]", "{", "}", ":", "null", "\0", "é", "https://x"]  # fmt: skip
_texts = st.one_of(st.text(max_size=200), st.lists(st.sampled_from(_PIECES), max_size=40).map("".join))


@settings(max_examples=400, deadline=None)
@given(_texts)
def test_fuzz_any_text_is_refused_or_valid_actions(text: str) -> None:
    try:
        actions = parse_actions(text)
    except ActionsError:
        return
    assert len(actions) <= 3
    for a in json.loads(encode_actions(actions) or "[]"):
        assert a["action"] in ("view", "broadcast", "http") and a["label"] and isinstance(a["clear"], bool)
