"""What a subscribe request asks for: the topics in the path, ``since=``, ``poll=`` and the filters
(``id``, ``message``, ``title``, ``priority``, ``tags``). Pure: no I/O.

ntfy's rules (ntfy-protocol.md section 4), with UPF's differences: an id is our 16-char base64url
stamp (a global position, valid for every topic of the connection); a 12-char ntfy-style id, or any
other 12-alphanumeric string, means "all" (ntfy's answer for an unknown id); durations accept days.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping

from upf_edge.errors import NtfyError, Problem
from upf_edge.params import PRIORITIES, go_trim, read_param
from upf_keyspace import SINCE_ALL, SINCE_NONE, Since, decode_id

from .filters import Filter

__all__ = [
    "TRANSPORTS",
    "SINCE_INVALID",
    "PRIORITY_INVALID",
    "TOO_MANY_TOPICS",
    "TOPIC_INVALID",
    "Subscribe",
    "match_subscribe_path",
    "parse_topics",
    "parse_since",
    "parse_bool",
    "parse_filter",
    "parse_subscribe",
]

TRANSPORTS = ("ws", "json", "sse", "raw")
_TOPIC = re.compile(r"[-_A-Za-z0-9]{1,64}")
_ROUTE = re.compile(r"/([^/]+)/(ws|json|sse|raw)")
_NTFY_ID = re.compile(r"[A-Za-z0-9]{12}")
_UNIX = re.compile(r"[+-]?[0-9]+")
"""Go's strconv.ParseInt: a sign is allowed, so ``since=-5`` is a (past) unix time, i.e. everything."""
DISALLOWED_TOPICS = frozenset(
    {"docs", "static", "file", "app", "metrics", "account", "settings", "signup", "login", "v1"}
)
"""ntfy's default disallowed topics (the writer refuses to publish to them, 40010); a subscribe names
one: 40009, since ntfy's topicsFromPath turns every topic error into that code."""
_DURATION = re.compile(r"(?:(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h|d))+")
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h|d)")
_UNIT_SECS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600, "d": 86400}


SINCE_INVALID = Problem(
    40008, 400, "invalid since parameter", "https://ntfy.sh/docs/subscribe/api/#fetch-cached-messages"
)
PRIORITY_INVALID = Problem(40007, 400, "invalid priority parameter", "https://ntfy.sh/docs/publish/#message-priority")
"""A ``priority=`` filter item that is no priority (ntfy's errHTTPBadRequestPriorityInvalid)."""
TOPIC_INVALID = Problem(40009, 400, "invalid request: topic invalid")
TOO_MANY_TOPICS = Problem(40093, 400, "invalid request: too many topics")
"""UPF's code (ntfy has no per-subscribe cap): the first code after the writer's 40091/40092."""


class Subscribe:
    """A validated subscribe request."""

    __slots__ = ("topics", "topics_raw", "transport", "since", "poll", "filter")

    def __init__(
        self,
        topics: tuple[str, ...],
        topics_raw: str,
        transport: str,
        since: Since,
        poll: bool,
        filter: Filter | None = None,
    ) -> None:
        self.topics = topics
        self.topics_raw = topics_raw
        self.transport = transport
        self.since = since
        self.poll = poll
        self.filter = filter
        """None when the request names no filter (the usual case: its session then carries none)."""

    def __repr__(self) -> str:
        flt = "" if self.filter is None else f", {self.filter!r}"
        return f"Subscribe({self.topics_raw!r}, {self.transport!r}, {self.since!r}, poll={self.poll}{flt})"


def match_subscribe_path(path: str) -> tuple[str, str] | None:
    """``(topics_raw, transport)`` when ``path`` is a subscribe route (``/{topics}/ws|json|sse|raw``)."""
    m = _ROUTE.fullmatch(path)
    return (m.group(1), m.group(2)) if m else None


def parse_topics(raw: str, max_topics: int = 128) -> tuple[str, ...]:
    """The comma-joined topic list of the path, deduplicated in order; any invalid or disallowed name is
    40009, more than ``max_topics`` names (counted before deduplication, so before any work per name) 40093."""
    if raw.count(",") >= max_topics:
        raise NtfyError(TOO_MANY_TOPICS)
    topics: dict[str, None] = {}
    for t in raw.split(","):
        if not _TOPIC.fullmatch(t) or t in DISALLOWED_TOPICS:
            raise NtfyError(TOPIC_INVALID)
        topics[t] = None
    return tuple(topics)


_MAX_SINCE_CHARS = 64
"""Longer than any valid form: a longer value is refused before any number is parsed (Python's
4,300-digit int limit and float overflow would otherwise raise out of the handler)."""
_INT64_MAX = (1 << 63) - 1


def _duration_secs(text: str) -> float | None:
    sign = -1 if text[:1] == "-" else 1  # Go's ParseDuration takes a sign: "-1h" is an hour ahead
    text = text[1:] if text[:1] in ("-", "+") else text
    if not _DURATION.fullmatch(text):
        return None
    secs = sum(float(n) * _UNIT_SECS[u] for n, u in _DURATION_PART.findall(text))
    # ntfy parses durations as Go's int64 nanoseconds: past that it is a parse error, so 40008.
    return sign * secs if secs * 1e9 <= _INT64_MAX else None


def parse_since(value: str, *, poll: bool, now: float) -> Since:
    """ntfy's ``since=`` forms, in ntfy's order of checks; anything else raises 40008."""
    value = value.strip()
    if value == "":
        return SINCE_ALL if poll else SINCE_NONE
    if value == "all":
        return SINCE_ALL
    if value == "none":
        return SINCE_NONE
    if value == "latest":  # the newest message a subscriber is sent: one not yet past its expiry
        return Since("latest", time=math.ceil(now))
    if len(value) > _MAX_SINCE_CHARS:
        raise NtfyError(SINCE_INVALID)
    stamp = decode_id(value)
    if stamp is not None:
        return Since("stamp", stamp=stamp)
    if _NTFY_ID.fullmatch(value):
        return SINCE_ALL  # an id that is not ours (ntfy's, or expired): ntfy answers with everything
    if _UNIX.fullmatch(value):
        unix = int(value)
        if not -_INT64_MAX - 1 <= unix <= _INT64_MAX:  # ntfy's ParseInt fails, and it is no duration either
            raise NtfyError(SINCE_INVALID)
        if unix == 1:  # ntfy's "none" is the marker of unix time 1 (sinceNoMessages), so 1 means none there
            return SINCE_NONE
        return Since("time", time=unix)
    secs = _duration_secs(value)
    if secs is None:
        raise NtfyError(SINCE_INVALID)
    return Since("time", time=int(now - secs))


def parse_bool(value: str) -> bool:
    return value.strip().lower() in ("1", "yes", "true")


# --- filters ----------------------------------------------------------------------------------------
_ID = ("x-id", "id")
_MESSAGE = ("x-message", "message", "m")
_TITLE = ("x-title", "title", "t")
_TAGS = ("x-tags", "tags", "tag", "ta")
_PRIORITY = ("x-priority", "priority", "prio", "p")
_FILTER_NAMES = frozenset(_ID + _MESSAGE + _TITLE + _TAGS + _PRIORITY)


def _as_utf8(value: str) -> str:
    """A header value's octets as UTF-8: the request head is decoded as latin-1, ntfy reads UTF-8."""
    return value if value.isascii() else value.encode("latin-1", "replace").decode("utf-8", "replace")


def parse_filter(headers: Mapping[str, str], query: Mapping[str, str]) -> Filter | None:
    """ntfy's parseQueryFilters: None when no filter is asked for; a priority that is none of ntfy's
    names or numbers is 40007. Lists split on commas with blank items dropped, items not trimmed
    (ntfy's SplitNoEmpty); priorities are trimmed and lower-cased (ParsePriority)."""
    if _FILTER_NAMES.isdisjoint(headers) and _FILTER_NAMES.isdisjoint(query):
        return None  # the usual subscribe: not one of the names, as a header or a query key
    headers = {n: _as_utf8(headers[n]) for n in _FILTER_NAMES if n in headers}
    priorities: set[int] = set()
    for item in read_param(headers, query, _PRIORITY).split(","):
        if item:
            name = go_trim(item).lower()
            p = PRIORITIES.get(name) if name else 0  # ntfy's ParsePriority: a blank item is 0, no message's
            if p is None:
                raise NtfyError(PRIORITY_INVALID)
            priorities.add(p)
    flt = Filter(
        id=read_param(headers, query, _ID),
        message=read_param(headers, query, _MESSAGE),
        title=read_param(headers, query, _TITLE),
        priorities=tuple(sorted(priorities)),
        tags=tuple(t for t in read_param(headers, query, _TAGS).split(",") if t),
    )
    return None if flt == _NO_FILTER else flt


_NO_FILTER = Filter()


def parse_subscribe(
    topics_raw: str,
    transport: str,
    headers: Mapping[str, str],
    query: Mapping[str, str],
    now: Callable[[], float] | float,
    max_topics: int = 128,
) -> Subscribe:
    """Validate a subscribe request. ``headers`` has lower-case names; ``query`` holds first values."""
    topics = parse_topics(topics_raw, max_topics)
    poll = parse_bool(read_param(headers, query, ("x-poll", "poll", "po")))
    since_text = read_param(headers, query, ("x-since", "since", "si"))
    t = now() if callable(now) else now
    since = parse_since(since_text, poll=poll, now=t)
    return Subscribe(topics, topics_raw, transport, since, poll, parse_filter(headers, query))
