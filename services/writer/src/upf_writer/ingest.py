"""The writer's pure core: from what an app server sent to the envelope UPF stores, or to an ntfy error.

No I/O here. The HTTP layer (``routes/``) decodes the request into plain values -- a mapping of
lower-case header names to their first value, a mapping of query keys to their first value, the body
bytes, the current unix time -- calls one function of this module and stores what it returns.
Every rejection is a :class:`NtfyError` carrying one :class:`Problem` of :data:`CATALOG`, so the
set of errors a publisher can see is closed and documented in one place.

Parameters follow ntfy's ``parsePublishParams``/``readParam``: each meaning has a list of names;
every name is tried as a header first (case-insensitive, RFC 2047 encoded-words decoded), then every
name, lower-cased, as a query key; the first non-empty value wins and is trimmed the way Go's
``strings.TrimSpace`` trims.

Where UPF differs from ntfy on purpose (see ntfy-protocol.md, "Where this project differs"):
- an invalid topic in the path is 400 40009, not 404;
- a body over ``max_message_bytes`` is 413 41301, in UnifiedPush mode too (ntfy truncates);
- a binary or oversized plain body never becomes an attachment (UPF has none): binary bodies up to
  the limit are stored as base64, exactly as UnifiedPush bodies are;
- title, tags, click and icon are each capped at ``max_field_bytes`` (1024 by default; ntfy has no
  cap) and a message given as a parameter at ``max_message_bytes`` (413 41301), so an envelope stays far
  below the store's value limit and a publisher cannot make every subscriber download kilobytes of title;
- the RFC 8030 ``TTL`` header sets the message's expiry (ntfy ignores it); a malformed one is 400;
- ``Idempotency-Key``/``X-Idempotency-Key`` make a retried publish return the original message;
- a Web Push request (VAPID ``Authorization``, or ``TTL`` with ``Content-Encoding: aes128gcm``) is
  UnifiedPush mode, and its RFC 8030 ``Urgency`` (mapped to a priority) and ``Topic`` (a newer message
  with the same one replaces the stored one) are kept; ntfy ignores both;
- ``X-Attach`` (an external URL) gives the ``attachment`` object as ntfy does, but a body is never stored
  as an attachment: ``X-Filename`` without ``X-Attach`` is ignored (ntfy: an upload);
- ``X-Email``/``email`` is 400 40001 and ``X-Call``/``call`` 400 40032, as ntfy answers without SMTP
  or Twilio (UPF sends no e-mail and makes no calls).
``X-Firebase`` is accepted and ignored, as by ntfy without Firebase. ``X-Template`` is ntfy's template
mode (:func:`replace_template`, :mod:`.gotemplate`).
``X-Cache: no`` and scheduled delivery (``X-Delay``/``X-At``/``X-In``) are ntfy's: see
``_parse_cache``/``_parse_delay`` and ``futuretime``.

Sequence ids (ntfy v2.16) and poll ids are events of their own (:func:`ingest_action`, and the poll
branch of :func:`build_envelope`): they go through the store like any publish, so every pusher delivers
them in order with the messages.
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Mapping
from urllib.parse import parse_qsl, unquote, urlsplit

import msgspec

from upf_edge import NtfyError, Problem, vapid
from upf_edge.errors import NOT_FOUND, STORE_UNAVAILABLE
from upf_edge.params import PRIORITIES, go_trim, read_param
from upf_keyspace import Envelope, Settings

from . import gotemplate
from .actions import ActionsError, count_json_actions, encode_actions, parse_actions
from .futuretime import parse_future_time
from .schemas import JsonPublish, MatrixPush

__all__ = [
    "Problem",
    "CATALOG",
    "Limits",
    "Params",
    "Ingested",
    "MatrixOutcome",
    "DISALLOWED_TOPICS",
    "TRIGGERED",
    "validate_topic",
    "validate_topic_list",
    "parse_params",
    "unifiedpush_mode",
    "unifiedpush_requested",
    "build_envelope",
    "ingest_publish",
    "ingest_json",
    "decode_json",
    "ingest_decoded_json",
    "ingest_matrix",
    "ingest_action",
    "validate_sequence_id",
    "EVENT_CLEAR",
    "EVENT_DELETE",
    "EVENT_POLL_REQUEST",
    "SEQUENCE_ID_INVALID",
    "check_content_length",
    "json_body_limit",
    "read_param",
    "go_trim",
    "PRIORITY_INVALID",
    "TOPIC_INVALID",
    "TOPIC_DISALLOWED",
    "MATRIX_INVALID",
    "ICON_INVALID",
    "EMAIL_DISABLED",
    "CALLS_DISABLED",
    "MESSAGE_NOT_UTF8",
    "ATTACHMENT_URL_INVALID",
    "ACTIONS_INVALID",
    "JSON_INVALID",
    "IDEMPOTENCY_KEY_INVALID",
    "TTL_INVALID",
    "DELAY_NO_CACHE",
    "DELAY_CANNOT_PARSE",
    "DELAY_TOO_SMALL",
    "DELAY_TOO_LARGE",
    "PUSH_TOPIC_INVALID",
    "URGENCY_INVALID",
    "VAPID_INVALID",
    "VAPID_KEY_REFUSED",
    "NOT_FOUND",
    "METHOD_NOT_ALLOWED",
    "MESSAGE_TOO_LARGE",
    "MATRIX_TOO_LARGE",
    "PUBLIC_URL_MISSING",
    "JSON_TOO_LARGE",
    "TEMPLATE_TOO_LARGE",
    "TEMPLATE_NOT_JSON",
    "TEMPLATE_INVALID",
    "TEMPLATE_DISALLOWED",
    "TEMPLATE_FAILED",
    "TEMPLATE_BODY_MAX",
    "template_requested",
    "replace_template",
    "INTERNAL_ERROR",
    "STORE_UNAVAILABLE",
]


# ntfy's own codes and messages (server/errors.go), plus UPF's few additions (marked UPF).
EMAIL_DISABLED = Problem(
    40001, 400, "e-mail notifications are not enabled", "https://ntfy.sh/docs/config/#e-mail-notifications"
)
CALLS_DISABLED = Problem(40032, 400, "invalid request: calling is disabled", "https://ntfy.sh/docs/config/#phone-calls")
PRIORITY_INVALID = Problem(40007, 400, "invalid priority parameter", "https://ntfy.sh/docs/publish/#message-priority")
TOPIC_INVALID = Problem(40009, 400, "invalid request: topic invalid")
TOPIC_DISALLOWED = Problem(40010, 400, "invalid request: topic name is not allowed")
MESSAGE_NOT_UTF8 = Problem(40011, 400, "invalid request: message must be UTF-8 encoded")
ATTACHMENT_URL_INVALID = Problem(
    40013, 400, "invalid request: attachment URL is invalid", "https://ntfy.sh/docs/publish/#attachments"
)
ACTIONS_INVALID = Problem(
    40018, 400, "invalid request: actions invalid", "https://ntfy.sh/docs/publish/#action-buttons"
)
MATRIX_INVALID = Problem(
    40019, 400, "invalid request: Matrix JSON invalid", "https://ntfy.sh/docs/publish/#matrix-gateway"
)
ICON_INVALID = Problem(40021, 400, "invalid request: icon URL is invalid", "https://ntfy.sh/docs/publish/#icons")
JSON_INVALID = Problem(40024, 400, "invalid request: request body must be valid JSON")
SEQUENCE_ID_INVALID = Problem(40049, 400, "invalid request: sequence ID invalid")
IDEMPOTENCY_KEY_INVALID = Problem(40091, 400, "invalid request: idempotency key invalid")  # UPF
TTL_INVALID = Problem(40092, 400, "invalid request: TTL header invalid")  # UPF
DELAY_NO_CACHE = Problem(40002, 400, "cannot disable cache for delayed message")
_DELAY_DOCS = "https://ntfy.sh/docs/publish/#scheduled-delivery"
DELAY_CANNOT_PARSE = Problem(40004, 400, "invalid delay parameter: unable to parse delay", _DELAY_DOCS)
DELAY_TOO_SMALL = Problem(40005, 400, "invalid delay parameter: too small, please refer to the docs", _DELAY_DOCS)
DELAY_TOO_LARGE = Problem(40006, 400, "invalid delay parameter: too large, please refer to the docs", _DELAY_DOCS)
PUSH_TOPIC_INVALID = Problem(
    40097, 400, "invalid request: Topic header invalid, at most 32 base64url characters"
)  # UPF
URGENCY_INVALID = Problem(
    40098, 400, "invalid request: Urgency header invalid, one of very-low, low, normal, high"
)  # UPF
VAPID_INVALID = Problem(40191, 401, "unauthorized: VAPID token invalid")  # UPF
VAPID_KEY_REFUSED = Problem(40192, 401, "unauthorized: topic is restricted to another VAPID key")  # UPF
METHOD_NOT_ALLOWED = Problem(40501, 405, "method not allowed")  # UPF (ntfy answers 404)
MESSAGE_TOO_LARGE = Problem(
    41301, 413, "message too large", "https://ntfy.sh/docs/publish/#limitations"
)  # ntfy's "entity too large" code
MATRIX_TOO_LARGE = Problem(41302, 413, "Matrix request is larger than the max allowed length")
JSON_TOO_LARGE = Problem(41303, 413, "JSON body too large")
_TEMPLATE_DOCS = "https://ntfy.sh/docs/publish/#message-templating"
TEMPLATE_TOO_LARGE = Problem(
    40041, 400, "invalid request: message or title is too large after replacing template", _TEMPLATE_DOCS
)
TEMPLATE_NOT_JSON = Problem(
    40042, 400, "invalid request: message body must be JSON if templating is enabled", _TEMPLATE_DOCS
)
TEMPLATE_INVALID = Problem(40043, 400, "invalid request: could not parse template", _TEMPLATE_DOCS)
TEMPLATE_DISALLOWED = Problem(
    40044,
    400,
    "invalid request: template contains disallowed function calls, e.g. template, call, or define",
    _TEMPLATE_DOCS,
)
TEMPLATE_FAILED = Problem(40045, 400, "invalid request: template execution failed", _TEMPLATE_DOCS)
TEMPLATE_BODY_MAX = 32767
"""The largest body of a template publish: ntfy peeks 32 KB (its ``jsonBodyBytesLimit``) and refuses
a body that fills it (413 41303)."""
INTERNAL_ERROR = Problem(50001, 500, "internal server error")
PUBLIC_URL_MISSING = Problem(
    50003, 500, "internal server error: base-url must be be configured for this feature", "https://ntfy.sh/docs/config/"
)  # ntfy's words (its setting is base-url; UPF's is UPF_PUBLIC_URL)

CATALOG: tuple[Problem, ...] = (
    EMAIL_DISABLED,
    CALLS_DISABLED,
    PRIORITY_INVALID,
    TOPIC_INVALID,
    TOPIC_DISALLOWED,
    MESSAGE_NOT_UTF8,
    ATTACHMENT_URL_INVALID,
    ACTIONS_INVALID,
    MATRIX_INVALID,
    ICON_INVALID,
    JSON_INVALID,
    SEQUENCE_ID_INVALID,
    IDEMPOTENCY_KEY_INVALID,
    TTL_INVALID,
    DELAY_NO_CACHE,
    DELAY_CANNOT_PARSE,
    DELAY_TOO_SMALL,
    DELAY_TOO_LARGE,
    PUSH_TOPIC_INVALID,
    URGENCY_INVALID,
    VAPID_INVALID,
    VAPID_KEY_REFUSED,
    NOT_FOUND,
    METHOD_NOT_ALLOWED,
    MESSAGE_TOO_LARGE,
    MATRIX_TOO_LARGE,
    JSON_TOO_LARGE,
    TEMPLATE_TOO_LARGE,
    TEMPLATE_NOT_JSON,
    TEMPLATE_INVALID,
    TEMPLATE_DISALLOWED,
    TEMPLATE_FAILED,
    INTERNAL_ERROR,
    PUBLIC_URL_MISSING,
    STORE_UNAVAILABLE,
)


"""The one exception of the ingest core: ``upf_edge``'s ntfy error, so every front door answers it alike."""


class Limits(msgspec.Struct, frozen=True):
    """The settings the core needs; build once from ``upf_keyspace.Settings``."""

    max_message_bytes: int = 4096
    default_ttl_secs: int = 2_419_200
    public_url: str = ""
    """``UPF_PUBLIC_URL`` without its trailing slash; "" when unset (no Matrix gateway, as ntfy
    without base-url)."""
    max_field_bytes: int = 1024
    delay_min_secs: int = 10
    delay_max_secs: int = 259_200
    nocache_keep_secs: int = 120

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        return cls(
            max_message_bytes=settings.max_message_bytes,
            max_field_bytes=settings.max_field_bytes,
            default_ttl_secs=settings.default_ttl_secs,
            public_url=settings.public_url.rstrip("/"),
            delay_min_secs=settings.delay_min_secs,
            delay_max_secs=settings.delay_max_secs,
            nocache_keep_secs=settings.nocache_keep_secs,
        )


# --- topics -----------------------------------------------------------------------------------------
_TOPIC_RE = re.compile(r"[-_A-Za-z0-9]{1,64}")
DISALLOWED_TOPICS = frozenset(
    {"docs", "static", "file", "app", "metrics", "account", "settings", "signup", "login", "v1"}
)


def validate_topic(topic: str) -> str:
    """A publishable topic, or 400 40009 (bad name) / 40010 (reserved name; exact, case-sensitive)."""
    if _TOPIC_RE.fullmatch(topic) is None:
        raise NtfyError(TOPIC_INVALID)
    if topic in DISALLOWED_TOPICS:
        raise NtfyError(TOPIC_DISALLOWED)
    return topic


def validate_topic_list(topics: str) -> list[str]:
    """A comma list of topics as ``/{t1,t2}/auth`` takes; every one must match (else 40009)."""
    out = topics.split(",")
    for t in out:
        if _TOPIC_RE.fullmatch(t) is None:
            raise NtfyError(TOPIC_INVALID)
    return out


# --- parameters -------------------------------------------------------------------------------------
# Go's unicode.IsSpace (what strings.TrimSpace trims); Python's str.strip() also strips \x1c-\x1f.
_TITLE = ("x-title", "title", "t")
_MESSAGE = ("x-message", "message", "m")
_PRIORITY = ("x-priority", "priority", "prio", "p")
_TAGS = ("x-tags", "tags", "tag", "ta")
_CLICK = ("x-click", "click")
_ICON = ("x-icon", "icon")
_MARKDOWN = ("x-markdown", "markdown", "md")
_UNIFIEDPUSH = ("x-unifiedpush", "unifiedpush", "up")
_CONTENT_TYPE = ("content-type",)
_ACTIONS = ("x-actions", "actions", "action")
_ATTACH = ("x-attach", "attach", "a")
_FILENAME = ("x-filename", "filename", "file", "f")
_EMAIL = ("x-email", "x-e-mail", "email", "e-mail", "mail", "e")
_CALL = ("x-call", "call")
_TEMPLATE = ("x-template", "template", "tpl")
_IDEMPOTENCY = ("idempotency-key", "x-idempotency-key")
_SEQUENCE_ID = ("x-sequence-id", "sequence-id", "sequence_id", "sid")
_POLL_ID = ("x-poll-id", "poll-id", "poll_id")

_URL_RE = re.compile(r"^https?://")
_IDEM_RE = re.compile(r"[\x20-\x7e]{1,200}")
_TTL_RE = re.compile(r"[0-9]+")
TRIGGERED = "triggered"
ATTACHMENT_MESSAGE = "You received a file: %s"


def _read_bool(headers: Mapping[str, str], query: Mapping[str, str], names: tuple[str, ...]) -> bool:
    return read_param(headers, query, names).lower() in ("1", "yes", "true")


def unifiedpush_requested(headers: Mapping[str, str], query: Mapping[str, str]) -> bool:
    """``up``/``unifiedpush``/``x-unifiedpush`` as a header or query parameter (the GET discovery check)."""
    return _read_bool(headers, query, _UNIFIEDPUSH)


def _aes128gcm(headers: Mapping[str, str]) -> bool:
    """An RFC 8291 body (``Content-Encoding: aes128gcm``): a Web Push message, UnifiedPush mode."""
    return "content-encoding" in headers and go_trim(headers["content-encoding"]).lower() == "aes128gcm"


def unifiedpush_mode(headers: Mapping[str, str], query: Mapping[str, str]) -> bool:
    """Whether a publish is in ntfy's UnifiedPush mode, which subscriber-based limiting refuses with 507
    when the topic has no subscriber: ``up`` asked for, or an ``aes128gcm`` body (a Web Push message,
    whose endpoint carries no ``up=1``), but not a poll request (``X-Poll-ID``), as in ntfy's
    ``parsePublishParams``."""
    if read_param(headers, query, _POLL_ID):
        return False
    if _aes128gcm(headers):
        return True
    return _read_bool(headers, query, _UNIFIEDPUSH)


def _parse_priority(text: str) -> int:
    if not text:
        return 0
    found = PRIORITIES.get(text.lower())
    if found is None:
        raise NtfyError(PRIORITY_INVALID)
    return found


def _parse_ttl(headers: Mapping[str, str], default_ttl: int) -> int:
    raw = headers.get("ttl")
    if raw is None:
        return default_ttl
    text = go_trim(raw)
    if not text:  # an empty header is no header, as for every other parameter
        return default_ttl
    if _TTL_RE.fullmatch(text) is None:
        raise NtfyError(TTL_INVALID)
    if len(text) > 18:  # beyond any sane retention: don't even build the int
        return default_ttl
    return min(int(text), default_ttl)


def _parse_idempotency_key(headers: Mapping[str, str]) -> str:
    for name in _IDEMPOTENCY:
        raw = headers.get(name)
        if raw is None:
            continue
        key = go_trim(raw)
        if not key:
            continue
        if _IDEM_RE.fullmatch(key) is None:
            raise NtfyError(IDEMPOTENCY_KEY_INVALID)
        return key
    return ""


class Params(msgspec.Struct, frozen=True, kw_only=True):
    """Everything a publish said besides its topic and body."""

    unifiedpush: bool = False
    message: str = ""
    """The message given as a parameter (X-Message/m); a non-empty body overrides it (in template mode
    the body is the data this message and the title are rendered over)."""
    template: bool = False
    title: str = ""
    priority: int = 0
    tags: tuple[str, ...] = ()
    click: str = ""
    icon: str = ""
    content_type: str = ""
    ttl: int = 0
    idem: str = ""
    cache: bool = True
    """False for ``X-Cache: no``: delivered live only, never replayed."""
    due: int = 0
    """Unix secs a scheduled publish is due (``X-Delay``/``X-At``/``X-In``); 0: deliver now."""
    sequence_id: str = ""
    """ntfy's sequence id (``X-Sequence-ID``/``sid``, or the path's second segment), validated."""
    poll_id: str = ""
    """``X-Poll-ID``: the publish becomes a ``poll_request`` event, never replayed."""
    webpush: bool = False
    """A Web Push request (RFC 8030): replied 201 with ``Location`` and ``TTL``."""
    urgency: str = ""
    push_topic: str = ""
    actions: str = ""
    """ntfy's action buttons as the JSON array text subscribers get (ids generated), or ""."""
    attach_url: str = ""
    attach_name: str = ""


def _parse_webpush(headers: Mapping[str, str]) -> tuple[bool, str, str]:
    """(is Web Push, Urgency, Topic) of a request; Urgency and Topic are read only from Web Push
    requests (an ntfy client's stray header changes nothing) and refused when malformed."""
    if "ttl" not in headers and "authorization" not in headers:  # the plain publish: two lookups
        return False, "", ""
    if not vapid.is_webpush(headers.get("authorization"), headers.get("ttl"), headers.get("content-encoding")):
        return False, "", ""
    urgency = go_trim(headers.get("urgency", "")).lower()  # RFC 5234: ABNF strings ignore case
    if urgency and not vapid.valid_urgency(urgency):
        raise NtfyError(URGENCY_INVALID)
    push_topic = go_trim(headers.get("topic", ""))
    if push_topic and not vapid.valid_push_topic(push_topic):
        raise NtfyError(PUSH_TOPIC_INVALID)
    return True, urgency, push_topic


def _split_tags(text: str) -> tuple[str, ...]:
    if not text:
        return ()
    return tuple(t for t in (go_trim(s) for s in text.split(",")) if t)


def _capped(text: str, limit: int) -> str:
    """``text`` when its UTF-8 form fits ``limit`` bytes, else 413 41301 (encoded only when it might not fit)."""
    if len(text) > limit // 4 and len(text.encode("utf-8", "surrogatepass")) > limit:
        raise NtfyError(MESSAGE_TOO_LARGE)
    return text


_PARAM_NAMES = {
    "message": _MESSAGE,
    "title": _TITLE,
    "priority": _PRIORITY,
    "tags": _TAGS,
    "click": _CLICK,
    "icon": _ICON,
    "markdown": _MARKDOWN,
    "unifiedpush": _UNIFIEDPUSH,
    "content_type": _CONTENT_TYPE,
    "sequence_id": _SEQUENCE_ID,
    "poll_id": _POLL_ID,
    "actions": _ACTIONS,
    "attach": _ATTACH,
    "filename": _FILENAME,
    "email": _EMAIL,
    "call": _CALL,
    "template": _TEMPLATE,
}
_MEANING_OF = {name: meaning for meaning, names in _PARAM_NAMES.items() for name in names}
_ALL_NAMES = frozenset(_MEANING_OF)


def _present(headers: Mapping[str, str], query: Mapping[str, str]) -> dict[str, str]:
    """meaning -> value for every parameter the request carries, by ntfy's readParam rules. Only the
    meanings whose names occur are read, so a typical publish costs a set intersection or two."""
    meanings = {_MEANING_OF[n] for n in _ALL_NAMES.intersection(headers)}
    if query:
        meanings.update(_MEANING_OF[n] for n in _ALL_NAMES.intersection(query))
    out: dict[str, str] = {}
    for meaning in meanings:
        value = read_param(headers, query, _PARAM_NAMES[meaning])
        if value:
            out[meaning] = value
    return out


_CACHE = ("x-cache", "cache")
_DELAY = ("x-delay", "delay", "x-at", "at", "x-in", "in")
_SCHEDULING_NAMES = frozenset(_CACHE + _DELAY)


def _parse_cache(headers: Mapping[str, str], query: Mapping[str, str]) -> bool:
    """ntfy's ``readBoolParam(r, true, "x-cache", "cache")``: only 1/yes/true keep it cached once set."""
    value = read_param(headers, query, _CACHE).lower()
    return value in ("1", "yes", "true") if value else True


def _parse_delay(headers: Mapping[str, str], query: Mapping[str, str], cache: bool, now: int, limits: Limits) -> int:
    """The due time of a scheduled publish, or 0; ntfy's checks and codes, in ntfy's order."""
    text = read_param(headers, query, _DELAY)
    if not text:
        return 0
    if not cache:
        raise NtfyError(DELAY_NO_CACHE)
    due = parse_future_time(text, now)
    if due is None:
        raise NtfyError(DELAY_CANNOT_PARSE)
    if due < now + limits.delay_min_secs:
        raise NtfyError(DELAY_TOO_SMALL)
    if due > now + limits.delay_max_secs:
        raise NtfyError(DELAY_TOO_LARGE)
    return due


def _scheduling(headers: Mapping[str, str], query: Mapping[str, str], now: int, limits: Limits) -> tuple[bool, int]:
    """The publish's cache and due time. Read after the priority and before the actions, so a bad delay
    is reported in ntfy's order; the name check keeps the usual publish at a set intersection."""
    if not _SCHEDULING_NAMES.intersection(headers) and not (query and _SCHEDULING_NAMES.intersection(query)):
        return True, 0
    cache = _parse_cache(headers, query)
    return cache, _parse_delay(headers, query, cache, now, limits)


def _markdown_type(content_type: str) -> bool:
    return go_trim(content_type.split(";", 1)[0]).lower() == "text/markdown"


def parse_params(
    headers: Mapping[str, str],
    query: Mapping[str, str],
    limits: Limits,
    overrides: Mapping[str, str] | None = None,
    now: int = 0,
) -> Params:
    """Read every publish parameter. ``overrides`` (by header name, e.g. ``x-title``) win over the
    request, as the fields of a JSON publish do in ntfy (which sets them as headers). ``now`` (unix
    secs) is what a delay is relative to."""
    if overrides:
        headers = {**headers, **overrides}
    p = _present(headers, query)
    encrypted = _aes128gcm(headers)
    ttl = _parse_ttl(headers, limits.default_ttl_secs)
    idem = _parse_idempotency_key(headers)
    webpush, urgency, push_topic = _parse_webpush(headers)
    if not p or (len(p) == 1 and "content_type" in p and not _markdown_type(p["content_type"])):
        # No parameter, or only a Content-Type that changes nothing (what curl and most apps send):
        # the common publish skips the per-field reads below.
        cache, due = _scheduling(headers, query, now, limits)
        return Params(
            unifiedpush=encrypted or webpush,
            ttl=ttl,
            idem=idem,
            webpush=webpush,
            urgency=urgency,
            push_topic=push_topic,
            priority=vapid.URGENCY_PRIORITY[urgency] if urgency else 0,
            cache=cache,
            due=due,
        )
    attach_url, attach_name = _parse_attach(p.get("attach", ""), p.get("filename", ""), limits)
    icon = p.get("icon", "")
    if icon and _URL_RE.match(icon) is None:
        raise NtfyError(ICON_INVALID)
    if "email" in p:  # ntfy without SMTP refuses it rather than drop it; UPF sends no e-mail
        raise NtfyError(EMAIL_DISABLED)
    if "call" in p:  # ntfy without Twilio, likewise; UPF makes no calls
        raise NtfyError(CALLS_DISABLED)
    priority = _parse_priority(p.get("priority", ""))
    cache, due = _scheduling(headers, query, now, limits)
    actions = _parse_actions(p.get("actions", ""), limits)
    markdown = p.get("markdown", "").lower() in ("1", "yes", "true")
    if _markdown_type(p.get("content_type", "")):
        markdown = True
    if not priority and urgency:
        priority = vapid.URGENCY_PRIORITY[urgency]
    return Params(
        unifiedpush=encrypted or webpush or p.get("unifiedpush", "").lower() in ("1", "yes", "true"),
        template=p.get("template", "").lower() in ("1", "yes", "true"),
        message=_capped(p.get("message", "").replace("\\n", "\n"), limits.max_message_bytes),
        title=_capped(p.get("title", ""), limits.max_field_bytes),
        priority=priority,
        tags=_split_tags(_capped(p.get("tags", ""), limits.max_field_bytes)),
        click=_capped(p.get("click", ""), limits.max_field_bytes),
        icon=_capped(icon, limits.max_field_bytes),
        content_type="text/markdown" if markdown else "",
        ttl=ttl,
        idem=idem,
        sequence_id=validate_sequence_id(p["sequence_id"]) if "sequence_id" in p else "",
        poll_id=_capped(p.get("poll_id", ""), limits.max_field_bytes),
        webpush=webpush,
        urgency=urgency,
        push_topic=push_topic,
        actions=actions,
        attach_url=attach_url,
        attach_name=attach_name,
        cache=cache,
        due=due,
    )


def _parse_actions(text: str, limits: Limits) -> str:
    """ntfy's ``X-Actions`` (simple or JSON format) as the stored JSON array text; 400 40018 when ntfy
    refuses it, 413 41301 past ``max_message_bytes`` encoded (a cap ntfy does not have)."""
    if not text:
        return ""
    try:
        encoded = encode_actions(parse_actions(text))
    except ActionsError:
        raise NtfyError(ACTIONS_INVALID) from None
    return _capped(encoded, limits.max_message_bytes)


_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
_BAD_ESCAPE_RE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def attachment_name(url: str) -> str:
    """ntfy's name for an external attachment without ``X-Filename``: the last element of the URL's
    decoded path (Go's ``path.Base(url.Parse(u).Path)``), or "attachment" when there is none or Go's
    URL parser would refuse the URL (a control character, a bad percent escape)."""
    if _CONTROL_RE.search(url) is None:
        try:
            parts = urlsplit(url)
        except ValueError:  # an invalid [host] or port: the URL has no name to give (it was a 500)
            return "attachment"
        if _BAD_ESCAPE_RE.search(parts.path) is None and _BAD_ESCAPE_RE.search(parts.fragment) is None:
            base = unquote(parts.path).rstrip("/").rpartition("/")[2]
            if base and base != ".":
                return base
    return "attachment"


def _parse_attach(url: str, filename: str, limits: Limits) -> tuple[str, str]:
    """``(url, name)`` of an external attachment, or ``("", "")``: only a URL makes one (UPF stores no
    uploads, so a filename alone is ignored); a URL must be http(s) (400 40013); both are capped at
    ``max_field_bytes`` (413 41301) as the other URL fields are."""
    if not url:
        return "", ""
    if _URL_RE.match(url) is None:
        raise NtfyError(ATTACHMENT_URL_INVALID)
    return _capped(url, limits.max_field_bytes), _capped(filename or attachment_name(url), limits.max_field_bytes)


# --- body -> envelope -------------------------------------------------------------------------------
def _as_text_or_base64(body: bytes) -> tuple[str, str]:
    try:
        return body.decode("utf-8"), ""
    except UnicodeDecodeError:
        return base64.b64encode(body).decode("ascii"), "base64"


def template_requested(headers: Mapping[str, str], query: Mapping[str, str]) -> bool:
    """``X-Template``/``template``/``tpl`` set (ntfy's ``readBoolParam``): the body may then be up to
    ``TEMPLATE_BODY_MAX`` bytes."""
    return _read_bool(headers, query, _TEMPLATE)


def replace_template(template: str, body: bytes, limit: int) -> str:
    """ntfy's ``replaceTemplate``: the template refused for ``call``/``template``/``define`` (40044),
    the body decoded as Go's ``json.Unmarshal`` decodes into ``any`` (every number a float64; 40042),
    then the template parsed (40043) and run (40045) by :mod:`.gotemplate`. An output past ``limit``
    characters is 40041 (it could only be over the limit in bytes too)."""
    if gotemplate.DISALLOWED.search(template):
        raise NtfyError(TEMPLATE_DISALLOWED)
    data = _go_json(body)
    try:
        return gotemplate.render(template, data, limit)
    except gotemplate.TemplateError as e:
        raise NtfyError(TEMPLATE_INVALID if e.kind == "parse" else TEMPLATE_FAILED) from None
    except OverflowError:
        raise NtfyError(TEMPLATE_TOO_LARGE) from None
    except RecursionError:  # nesting deeper than Python follows: refused as a failed run
        raise NtfyError(TEMPLATE_FAILED) from None


def _go_json(body: bytes) -> object:
    """The body as ntfy's template mode decodes it: trimmed, invalid UTF-8 replaced (as Go's decoder
    replaces it in strings), numbers as float64 (out of its range: not JSON to Go)."""
    text = go_trim(body.decode("utf-8", "replace"))
    try:
        return _floats(msgspec.json.decode(text.encode("utf-8", "surrogatepass")))
    except (msgspec.DecodeError, RecursionError, OverflowError):
        raise NtfyError(TEMPLATE_NOT_JSON) from None


def _floats(value: object) -> object:
    if type(value) is int:
        return float(value)  # OverflowError past float64, as Go's ParseFloat fails
    if type(value) is float:
        if math.isinf(value):
            raise OverflowError
        return value
    if type(value) is dict:
        return {k: _floats(v) for k, v in value.items()}
    if type(value) is list:
        return [_floats(v) for v in value]
    return value


def build_envelope(params: Params, body: bytes, *, now: int, limits: Limits) -> Envelope:
    """The stored message. UnifiedPush mode: the body verbatim (text untrimmed, else base64), even an
    empty one overriding a message parameter (ntfy's auto-detect). Plain mode: a non-empty body
    overrides the message parameter, UTF-8 text trimmed, anything else base64. Empty -> "triggered".
    With an external attachment (plain mode) the body must be UTF-8 (400 40011, as ntfy) and an empty
    message is "You received a file: <name>". Template mode (plain, no attachment): the body, JSON of up
    to ``TEMPLATE_BODY_MAX`` bytes, is the data the message parameter and the title are rendered over."""
    templated = params.template and not params.unifiedpush and not params.attach_url and not params.poll_id
    if len(body) > (TEMPLATE_BODY_MAX if templated else limits.max_message_bytes):
        raise NtfyError(JSON_TOO_LARGE if templated else MESSAGE_TOO_LARGE)
    if params.poll_id:
        return _poll_request(params.poll_id, now=now, ttl=min(params.ttl, limits.nocache_keep_secs))
    title = params.title
    if params.unifiedpush:
        message, encoding = _as_text_or_base64(body)
    elif templated:  # ntfy's order: the message, then the title; only the message's size is ntfy's check
        message, encoding = replace_template(params.message, body, limits.max_message_bytes), ""
        if len(message.encode("utf-8", "surrogatepass")) > limits.max_message_bytes:
            raise NtfyError(TEMPLATE_TOO_LARGE)
        title = replace_template(title, body, limits.max_field_bytes)
        if len(title.encode("utf-8", "surrogatepass")) > limits.max_field_bytes:  # UPF's cap, ntfy's code
            raise NtfyError(TEMPLATE_TOO_LARGE)
    elif body:
        message, encoding = _as_text_or_base64(body)
        if not encoding:
            message = go_trim(message)
        elif params.attach_url:
            raise NtfyError(MESSAGE_NOT_UTF8)
    else:
        message, encoding = params.message, ""
    if not message and params.attach_url and not params.unifiedpush:
        message = ATTACHMENT_MESSAGE % params.attach_name
    if not message:
        message, encoding = TRIGGERED, ""
    at, expires = _times(params, now, limits)
    # By position, in Envelope's field order: 18 keywords cost a publish 0.84 us, positions 0.16.
    return Envelope(
        at,
        expires,
        message,
        encoding,
        title,
        params.priority,
        params.tags,
        params.click,
        params.icon,
        params.content_type,
        "",  # traceparent: set with published_ms when the store is called (routes.publish)
        params.idem,
        0,  # published_ms
        "",  # event: a message
        params.sequence_id,
        not params.cache,  # nocache
        "",  # origin_id: set when a scheduled message is released
        params.urgency,
        params.push_topic if params.cache else "",  # one kept for no offline subscriber replaces none
        params.actions,
        params.attach_url,
        params.attach_name,
    )


# --- sequence ids and poll requests (ntfy v2.16's update/clear/delete; X-Poll-ID) -------------------
EVENT_CLEAR = "message_clear"
EVENT_DELETE = "message_delete"
EVENT_POLL_REQUEST = "poll_request"
POLL_REQUEST_MESSAGE = "New message"
"""ntfy's body of every poll request (``newMessageBody``): the real message stays upstream."""


def validate_sequence_id(sid: str) -> str:
    """A sequence id has a topic's shape (1-64 of ``[-_A-Za-z0-9]``), else 400 40049."""
    if _TOPIC_RE.fullmatch(sid) is None:
        raise NtfyError(SEQUENCE_ID_INVALID)
    return sid


def _poll_request(poll_id: str, *, now: int, ttl: int) -> Envelope:
    """ntfy's ``newPollRequestMessage``: a fresh event (title, tags... and the body dropped), not cached
    (``nocache``: delivered to subscribers connected now, never replayed; its reply has no ``expires``).
    ``expires`` is still set, for the janitor: ``ttl`` is capped as an ``X-Cache: no`` message's is."""
    return Envelope(
        time=now,
        expires=now + ttl,
        message=POLL_REQUEST_MESSAGE,
        event=EVENT_POLL_REQUEST,
        nocache=True,
        poll_id=poll_id,
    )


def _times(params: Params, now: int, limits: Limits) -> tuple[int, int]:
    """(time, expires): a scheduled message's time is its due time and its TTL runs from then (as in
    ntfy); an ``X-Cache: no`` one is kept only ``nocache_keep_secs``, for live delivery."""
    if params.due:
        return params.due, params.due + params.ttl
    if not params.cache:
        return now, now + min(params.ttl, limits.nocache_keep_secs)
    return now, now + params.ttl


class Ingested(msgspec.Struct, frozen=True):
    """A publish ready for ``Store.publish(topic, envelope, idem=idem)``, or, when ``due`` is set,
    ``Store.schedule(topic, envelope, due)``."""

    topic: str
    envelope: Envelope
    idem: str = ""
    due: int = 0
    webpush: bool = False
    """A Web Push request (``Params.webpush``): VAPID is checked and the reply is RFC 8030's."""


def check_content_length(headers: Mapping[str, str], limit: int, problem: Problem) -> None:
    """Refuse before reading when the declared length is already over ``limit``."""
    raw = headers.get("content-length")
    if raw is None:
        return
    text = raw.strip()
    if text.isascii() and text.isdigit() and (len(text) > 18 or int(text) > limit):
        raise NtfyError(problem)


def ingest_publish(
    topic: str,
    headers: Mapping[str, str],
    query: Mapping[str, str],
    body: bytes,
    *,
    now: int,
    limits: Limits,
    sequence_id: str = "",
) -> Ingested:
    """``POST``/``PUT /{topic}``, or ``/{topic}/{sequence_id}`` (the path's id wins over a parameter's;
    it is validated as it came, before parameters are trimmed: ``/t/a%20`` is not sequence id ``a``)."""
    validate_topic(topic)
    if sequence_id:
        validate_sequence_id(sequence_id)
    params = parse_params(headers, query, limits, {"x-sequence-id": sequence_id} if sequence_id else None, now=now)
    envelope = build_envelope(params, body, now=now, limits=limits)
    return _ingested(topic, params, envelope)


def _ingested(topic: str, params: Params, envelope: Envelope) -> Ingested:
    """A poll request is never scheduled: ntfy reads and checks its delay like any publish's, then
    replaces the message with ``newPollRequestMessage``, whose time is now."""
    due = 0 if params.poll_id else params.due
    return Ingested(topic, envelope, params.idem, due=due, webpush=params.webpush)


def ingest_action(topic: str, sequence_id: str, event: str, *, now: int, limits: Limits) -> Ingested:
    """``PUT|GET /{topic}/{sid}/clear`` (``/read``) and ``DELETE /{topic}/{sid}``: ntfy's
    ``message_clear``/``message_delete`` event for ``sequence_id``. Stored and replayed like a message
    (ntfy caches them too); no lookup of the id: an unknown one is answered like a known one, as ntfy
    does (the id is the publisher's, and the message may have expired or never been cached)."""
    validate_topic(topic)
    validate_sequence_id(sequence_id)
    expires = now + limits.default_ttl_secs
    envelope = Envelope(time=now, expires=expires, message="", event=event, sequence_id=sequence_id)
    return Ingested(topic, envelope)


# --- JSON publish (POST/PUT /) ---------------------------------------------------------------------
_json_publish_decoder = msgspec.json.Decoder(JsonPublish)


def json_body_limit(limits: Limits) -> int:
    """The largest JSON publish body: ntfy peeks twice the message limit and refuses a body that fills it."""
    return 2 * limits.max_message_bytes - 1


def ingest_json(
    headers: Mapping[str, str], query: Mapping[str, str], body: bytes, *, now: int, limits: Limits
) -> Ingested:
    """``POST``/``PUT /`` with ntfy's JSON body: its fields act as headers that win over the request's,
    its message acts as the body (so it is trimmed unless the request asked for UnifiedPush mode).
    :func:`decode_json` then :func:`ingest_decoded_json`, for a caller with no ACL between them."""
    topic, m = decode_json(body, limits)
    return ingest_decoded_json(topic, m, headers, query, now=now, limits=limits)


def decode_json(body: bytes, limits: Limits) -> tuple[str, JsonPublish]:
    """A JSON publish's topic and fields, checked as far as ntfy's ``transformBodyJSON`` checks them
    before the topic's ACL: the size (413 41303), the JSON and its field types, actions' too (400 40024),
    then the topic (40009/40010). The fields' values are :func:`ingest_decoded_json`'s, after the ACL."""
    if len(body) > json_body_limit(limits):
        raise NtfyError(JSON_TOO_LARGE)
    try:
        m = _json_publish_decoder.decode(_go_fields(body))
    except (msgspec.DecodeError, RecursionError):
        # RecursionError: nested deeper than msgspec follows (~1,000 levels; Go's decoder takes 10,000).
        # Refused as invalid JSON, not a 500: no publish needs such nesting.
        raise NtfyError(JSON_INVALID) from None
    _check_json_actions(m)
    return validate_topic(m.topic or ""), m


_json_fields_decoder = msgspec.json.Decoder(dict[str, msgspec.Raw])
_json_encoder = msgspec.json.Encoder()
_std_json = json.JSONDecoder()


def _go_fold(key: str) -> str:
    """The field name Go's ``encoding/json`` matches a key to: case ignored (``str.lower`` also maps the
    Kelvin sign to k; the long s is the other non-ASCII letter Go folds to an ASCII one)."""
    return key.lower().replace("\u017f", "s")


def _go_fields(body: bytes) -> bytes:
    """The body's first JSON value as ntfy's ``json.Decoder`` reads it into its struct: bytes after
    that value ignored, keys matched to fields without case (``"Message"`` is the message), a later
    key winning over an earlier one. Rewritten as one object of lower-case keys, each value's bytes as
    sent (``actions`` is parsed later with its own case rules, and keeps its header and extra names)."""
    try:
        fields = _json_fields_decoder.decode(body)
    except msgspec.DecodeError as e:
        if "trailing characters" not in str(e):
            raise
        fields = _json_fields_decoder.decode(_first_json_value(body))
    folded: dict[str, msgspec.Raw] = {}
    for key, raw in fields.items():
        folded[_go_fold(key)] = raw
    return _json_encoder.encode(folded)


def _first_json_value(body: bytes) -> bytes:
    """The bytes of the first JSON value in ``body``; msgspec decodes only a whole body. Its end is
    found by the standard library's decoder, and msgspec then decodes (and checks) just that value."""
    try:
        text = body.decode("utf-8", "surrogateescape")  # what follows the value may be anything
        start = len(text) - len(text.lstrip(" \t\r\n"))
        _, end = _std_json.raw_decode(text, start)
    except (ValueError, RecursionError):
        raise msgspec.DecodeError("invalid JSON") from None
    return text[:end].encode("utf-8", "surrogateescape")  # the bytes as sent: msgspec checks their UTF-8


def ingest_decoded_json(
    topic: str, m: JsonPublish, headers: Mapping[str, str], query: Mapping[str, str], *, now: int, limits: Limits
) -> Ingested:
    """The rest of a JSON publish, from :func:`decode_json`'s result: every field as the header ntfy
    sets from it, read with the request's parameters as a path publish's are."""
    overrides: dict[str, str] = {}
    if m.title:
        overrides["x-title"] = m.title
    if m.priority:  # ntfy: any nonzero priority goes to ParsePriority, which takes only 1..5 (else 40007)
        overrides["x-priority"] = str(m.priority) if 1 <= m.priority <= 5 else "invalid"
    if m.tags:
        overrides["x-tags"] = ",".join(m.tags)
    if m.click:
        overrides["x-click"] = m.click
    if m.icon:
        overrides["x-icon"] = m.icon
    if m.markdown:
        overrides["x-markdown"] = "yes"
    if m.delay:
        overrides["x-delay"] = m.delay
    if m.cache:
        overrides["x-cache"] = m.cache
    if m.sequence_id:
        overrides["x-sequence-id"] = m.sequence_id
    overrides.update(_json_extras(m))
    params = parse_params(headers, query, limits, overrides, now=now)
    # ntfy makes an empty JSON message "triggered" before anything else reads it (so no attachment text)
    message = (m.message or TRIGGERED).encode("utf-8", "surrogatepass")
    envelope = build_envelope(params, message, now=now, limits=limits)
    return _ingested(topic, params, envelope)


def _check_json_actions(m: JsonPublish) -> None:
    """ntfy decodes ``actions`` into its Go type with the rest of the body, so a wrong type there is
    40024 (before the ACL), not 40018; ``null`` or no action at all leaves ``m.actions`` empty."""
    if not m.actions:
        return
    text = bytes(m.actions).decode("utf-8", "surrogatepass").strip()
    if text != "null":
        try:
            if count_json_actions(text):  # types only: the header's validation follows (40018)
                return
        except ActionsError:
            raise NtfyError(JSON_INVALID) from None
    m.actions = msgspec.Raw()


def _json_extras(m: JsonPublish) -> dict[str, str]:
    """A JSON publish's ``actions`` (as :func:`_check_json_actions` left them), ``attach``, ``filename``,
    ``email`` and ``call`` as the headers ntfy turns them into."""
    out: dict[str, str] = {}
    if m.actions:
        out["x-actions"] = bytes(m.actions).decode("utf-8", "surrogatepass").strip()
    if m.attach:
        out["x-attach"] = m.attach
    if m.filename:
        out["x-filename"] = m.filename
    if m.email:
        out["x-email"] = m.email
    if m.call:
        out["x-call"] = m.call
    return out


# --- Matrix push gateway (POST /_matrix/push/v1/notify) ---------------------------------------------
def _go_keys(obj: object) -> object:
    """Every object's keys as :func:`_go_fold` matches them (ntfy's ``json.Unmarshal`` into its Matrix
    structs ignores case at every level; the gateway reads nothing keyed by the sender's names)."""
    if type(obj) is dict:
        return {_go_fold(k): _go_keys(v) for k, v in obj.items()}
    if type(obj) is list:
        return [_go_keys(v) for v in obj]
    return obj


class MatrixOutcome(msgspec.Struct, frozen=True):
    """Either a publish (``ingested``) or a pushkey to reject (answered 200 ``{"rejected":[key]}``)."""

    pushkey: str
    ingested: Ingested | None = None
    unifiedpush: bool = False
    """The pushkey asks for ntfy's UnifiedPush mode (``?up=1``), whose publish subscriber-based
    limiting refuses with 507 while the topic has no subscriber (ntfy publishes to the pushkey's URL)."""

    @property
    def rejected(self) -> bool:
        return self.ingested is None


_PATH_END_RE = re.compile(r"[/?#]")


def ingest_matrix(body: bytes, *, now: int, limits: Limits) -> MatrixOutcome:
    """Only ``devices[0].pushkey`` is used (as ntfy does). A pushkey under ``public_url + "/"`` names the
    topic in its first path segment; the whole original body becomes the message, published with the
    pushkey's query parameters (``?up=1``: UnifiedPush mode).
    A pushkey elsewhere, or naming no valid topic, is rejected so the homeserver drops the pusher."""
    if len(body) >= limits.max_message_bytes:
        raise NtfyError(MATRIX_TOO_LARGE)
    try:
        m = msgspec.convert(_go_keys(msgspec.json.decode(body)), MatrixPush)
    except (msgspec.DecodeError, RecursionError):  # too deep for msgspec (Go takes 10,000 levels): invalid
        raise NtfyError(MATRIX_INVALID) from None
    devices = m.notification.devices if m.notification is not None else None
    device = devices[0] if devices else None
    if device is None or not device.pushkey:
        raise NtfyError(MATRIX_INVALID)
    pushkey = device.pushkey
    prefix = limits.public_url + "/"
    if not pushkey.startswith(prefix):
        return MatrixOutcome(pushkey)
    topic = _PATH_END_RE.split(pushkey[len(prefix) :], maxsplit=1)[0]
    try:
        validate_topic(topic)
    except NtfyError:
        return MatrixOutcome(pushkey)
    query: dict[str, str] = {}
    for name, value in parse_qsl(urlsplit(pushkey).query, keep_blank_values=True):
        query.setdefault(name, value)  # the first value wins, as Go's Query().Get
    # ntfy publishes the body to the pushkey's URL: its parameters (up=1, a title, a priority) are the
    # publish's, and a pushkey without up=1 publishes the body as a plain text message.
    params = parse_params({}, query, limits, now=now)
    envelope = build_envelope(params, body, now=now, limits=limits)
    return MatrixOutcome(pushkey, _ingested(topic, params, envelope), unifiedpush_mode({}, query))
