"""ntfy's action buttons (``X-Actions``, ``actions=``, a JSON publish's ``actions``): parsed, validated and
encoded as the ``actions`` array a subscriber receives. Pure: no I/O.

A port of the behaviour of ntfy's ``server/actions.go`` (v2.13): the "simple" format
(``view, Open, https://x; http, Call, https://y, clear=true``) and the JSON format (a string starting
with ``[``); ids of 10 random alphanumerics; ``action`` lower-cased and ``method`` upper-cased before
validation; at most three; a label always, a URL for ``view`` and ``http``; no body on an ``http``
GET or HEAD. Every refusal is :class:`ActionsError` carrying ntfy's own wording (ntfy answers it as
400 40018, "actions invalid"). Why a port: the ntfy app shows these buttons, and app servers already
send them in both formats.
"""

from __future__ import annotations

import json
import random
import re
import string
from collections.abc import Callable
from typing import Any

import msgspec

from upf_edge.params import GO_SPACE

__all__ = ["ACTIONS_MAX", "Action", "ActionsError", "parse_actions", "encode_actions", "count_json_actions"]

ACTIONS_MAX = 3
_ID_LENGTH = 10
_ALNUM = string.ascii_letters + string.digits
_ALL = ("view", "broadcast", "http")
_WITH_URL = ("view", "http")
_BOOLS = ("true", "yes", "1", "false", "no", "0")
# Go's regexp ``^([-.\w]+)\s*=\s*``: \w and \s are ASCII-only in RE2 (\s is [\t\n\f\r ], no \v).
_KEY = re.compile(r"([-.0-9A-Za-z_]+)[\t\n\f\r ]*=[\t\n\f\r ]*")
_SPACE = " \t\r\n"
_EOF = "\0"
"""ntfy's end-of-input rune is 0, so a NUL in the input also ends a section (its width is 1)."""


class ActionsError(ValueError):
    """An actions string ntfy refuses; the message is ntfy's."""


class Action(msgspec.Struct, omit_defaults=True, kw_only=True):
    """One button, with ntfy's JSON names and order; ``clear`` is always sent, as ntfy does."""

    id: str
    action: str
    label: str
    clear: bool
    url: str = ""
    method: str = ""
    headers: dict[str, str] = {}
    body: str = ""
    intent: str = ""
    extras: dict[str, str] = {}


def _random_id() -> str:
    """Not a secret (it names a button within one message), so the cheap PRNG, as framing.random_id."""
    return "".join(random.choices(_ALNUM, k=_ID_LENGTH))


class _Draft:
    """An action while it is parsed (Go's zero values: empty strings, false, empty maps)."""

    __slots__ = ("action", "label", "clear", "url", "method", "headers", "body", "intent", "extras")

    def __init__(self) -> None:
        self.action = self.label = self.url = self.method = self.body = self.intent = ""
        self.clear = False
        self.headers: dict[str, str] = {}
        self.extras: dict[str, str] = {}


def parse_actions(text: str, new_id: Callable[[], str] = _random_id) -> list[Action]:
    """The actions of ``text`` (JSON if it starts with ``[``, else ntfy's simple format), validated."""
    text = text.strip(GO_SPACE)
    drafts = _from_json(text) if text.startswith("[") else _SimpleParser(text).parse()
    if len(drafts) > ACTIONS_MAX:
        raise ActionsError(f"only {ACTIONS_MAX} actions allowed")
    actions = []
    for d in drafts:
        kind, method = d.action.lower(), d.method.upper()
        if kind not in _ALL:
            raise ActionsError(
                f"parameter 'action' cannot be '{kind}', valid values are 'view', 'broadcast' and 'http'"
            )
        if not d.label:
            raise ActionsError("parameter 'label' is required")
        if kind in _WITH_URL and not d.url:
            raise ActionsError(f"parameter 'url' is required for action '{kind}'")
        if kind == "http" and method in ("GET", "HEAD") and d.body:
            raise ActionsError(f"parameter 'body' cannot be set if method is {method}")
        actions.append(
            Action(
                id=new_id(),
                action=kind,
                label=d.label,
                clear=d.clear,
                url=d.url,
                method=method,
                headers=dict(sorted(d.headers.items())),  # Go encodes a map with its keys sorted
                body=d.body,
                intent=d.intent,
                extras=dict(sorted(d.extras.items())),
            )
        )
    return actions


_encoder = msgspec.json.Encoder()


def encode_actions(actions: list[Action]) -> str:
    """The JSON array text stored in the envelope's ``actions`` and sent to subscribers as is."""
    return _encoder.encode(actions).decode() if actions else ""


def count_json_actions(text: str) -> int:
    """How many actions a JSON array holds, checking only what Go's decoding checks (syntax, types): a
    JSON publish's ``actions`` that fails here is a bad body (ntfy: 40024), not bad actions (40018)."""
    return len(_from_json(text))


# --- JSON format (Go's json.Unmarshal into []*action) --------------------------------------------------
_STRING_FIELDS = ("id", "action", "label", "url", "method", "body", "intent")


class _Object(list[tuple[str, Any]]):
    """A JSON object as its (key, value) pairs, told apart from a JSON array."""


def _reject_constant(name: str) -> None:
    raise ValueError(f"invalid character '{name[0]}'")  # NaN, Infinity: Python's json only


def _from_json(text: str) -> list[_Draft]:
    try:
        items = json.loads(text, object_pairs_hook=_Object, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as e:
        raise ActionsError(f"JSON error: {e}") from None
    if type(items) is not list:
        raise ActionsError("JSON error: cannot unmarshal into a list of actions")
    return [_draft_from_pairs(item) for item in items]


def _draft_from_pairs(pairs: object) -> _Draft:
    """Go's rules: keys match field names case-insensitively, the last duplicate wins, unknown keys are
    ignored, ``null`` leaves the zero value, and a value of the wrong type is an error."""
    d = _Draft()
    if pairs is None:
        return d  # an empty action (refused by the validation: it has no action)
    if type(pairs) is not _Object:
        raise ActionsError("JSON error: an action must be an object")
    for key, value in pairs:
        name = key.lower()
        if value is None:
            continue
        if name in _STRING_FIELDS:
            if not isinstance(value, str):
                raise ActionsError(f"JSON error: field '{name}' must be a string")
            if name != "id":  # the id is always generated
                setattr(d, name, value)
        elif name == "clear":
            if not isinstance(value, bool):
                raise ActionsError("JSON error: field 'clear' must be a boolean")
            d.clear = value
        elif name in ("headers", "extras"):
            if type(value) is not _Object:
                raise ActionsError(f"JSON error: field '{name}' must be an object")
            target: dict[str, str] = {}
            for k, v in value:
                if v is not None and not isinstance(v, str):
                    raise ActionsError(f"JSON error: field '{name}' must map strings to strings")
                target[k] = v or ""
            setattr(d, name, target)
    return d


# --- simple format -----------------------------------------------------------------------------------
class _SimpleParser:
    """ntfy's hand-written scanner: actions end at ``;``, sections (``key=value`` or a bare value) at
    ``,``; a value may be quoted with ``"`` or ``'`` (``\\"`` escapes the quote); bare values are
    trimmed. Positions in errors are byte offsets, as Go reports them."""

    __slots__ = ("text", "pos")

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def parse(self) -> list[_Draft]:
        drafts = []
        while self.pos < len(self.text):
            drafts.append(self._action())
        return drafts

    def _peek(self) -> tuple[str, int]:
        if self.pos >= len(self.text):
            return _EOF, 0
        return self.text[self.pos], 1

    def _byte_pos(self, pos: int) -> int:
        return len(self.text[:pos].encode("utf-8", "surrogatepass"))

    def _skip_spaces(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in _SPACE:
            self.pos += 1

    def _action(self) -> _Draft:
        d = _Draft()
        section = 0
        while True:
            key, value, last = self._section()
            _populate(d, section, key, value)
            self._skip_spaces()
            if last:
                return d
            section += 1

    def _section(self) -> tuple[str, str, bool]:
        self._skip_spaces()
        key = ""
        m = _KEY.match(self.text, self.pos)
        if m:
            key = m.group(1)
            self.pos = m.end()
        r, w = self._peek()
        if r in ",;" + _EOF:
            self.pos += w
            return key, "", r != ","
        if r in "\"'":
            value, last = self._quoted(r)
            return key, value, last
        value, last = self._bare()
        return key, value, last

    def _bare(self) -> tuple[str, bool]:
        start = self.pos
        while True:
            r, w = self._peek()
            if r in ",;" + _EOF:
                value = self.text[start : self.pos].strip(GO_SPACE)
                self.pos += w
                return value, r != ","
            self.pos += w

    def _quoted(self, quote: str) -> tuple[str, bool]:
        self.pos += 1
        start = self.pos
        prev = ""
        while True:
            r, w = self._peek()
            if r == _EOF:
                raise ActionsError(f"unexpected end of input, quote started at position {self._byte_pos(start)}")
            if r == quote and prev != "\\":
                value = self.text[start : self.pos].replace("\\" + quote, quote)
                self.pos += w
                self._skip_spaces()
                r, w = self._peek()
                if r not in ",;" + _EOF:
                    raise ActionsError(f"unexpected character '{r}' at position {self._byte_pos(self.pos)}")
                self.pos += w
                return value, r != ","
            prev = r
            self.pos += w


def _populate(d: _Draft, section: int, key: str, value: str) -> None:
    """A section's key (or, for the first three bare values, action, label and url) applied to ``d``."""
    if not key:
        if section == 0:
            key = "action"
        elif section == 1:
            key = "label"
        elif section == 2 and d.action in _WITH_URL:  # ntfy compares before lower-casing: "VIEW" has no url
            key = "url"
        else:
            raise ActionsError(f"term '{value}' unknown")
    if key.startswith("headers."):
        d.headers[key[len("headers.") :]] = value
        return
    if key.startswith("extras."):
        d.extras[key[len("extras.") :]] = value
        return
    name = key.lower()
    if name == "clear":
        if value.lower() not in _BOOLS:
            raise ActionsError(
                f"parameter 'clear' cannot be '{value}', only boolean values are allowed (true/yes/1/false/no/0)"
            )
        d.clear = value.lower() in ("true", "yes", "1")
    elif name in ("action", "label", "url", "method", "body", "intent"):
        setattr(d, name, value)
    else:
        raise ActionsError(f"key '{key}' unknown")
