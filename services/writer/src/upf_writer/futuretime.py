"""When a scheduled publish (``X-Delay``/``X-At``/``X-In``) is due: ntfy's ``util.ParseFutureTime``. Pure.

ntfy tries, in order: a unix time (an integer not in the past), Go's ``time.ParseDuration`` ("30s",
"1h30m", "1.5h"), its own "<n> <unit>" form ("2 days", "10 min", "1d"), then natural language through
the ``when`` library. UPF implements that order exactly for the first three and a documented subset of
the natural forms, in UTC (ntfy uses the server's local zone): "10am", "5:30pm", "17:30", "noon",
"midnight" (the next such time), "tomorrow" (now + 1 day), "tomorrow 10am" / "tomorrow, at 17:30",
"today 10pm", and "in 2 hours" / "within 30 minutes" / "in an hour" (seconds to weeks).
"""

from __future__ import annotations

import datetime as dt
import math
import re

from upf_edge.params import GO_SPACE

__all__ = ["parse_future_time", "go_parse_duration"]

_INT64_MAX = (1 << 63) - 1
# Go's regexp \d and \s, and strconv, are ASCII-only: Python's Unicode \d would read "١٠m" as ten
# minutes (and int() would take it), so every digit here is [0-9] and every space Go's [\t\n\f\r ].
_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_GO_PART = re.compile(r"([0-9]*)(?:\.([0-9]*))?([^0-9.]*)")
_NTFY_DURATION = re.compile(r"([0-9]+)[\t\n\f\r ]*(d|days?|h|hours?|m|mins?|minutes?|s|secs?|seconds?)", re.IGNORECASE)
_NTFY_UNIT = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_GO_INT = re.compile(r"[+-]?[0-9]+")


def go_parse_duration(text: str) -> float | None:
    """Seconds, as Go's ``time.ParseDuration`` reads ``text`` (None where Go returns an error)."""
    s = text
    neg = False
    if s[:1] in ("+", "-"):
        neg = s[0] == "-"
        s = s[1:]
    if s == "0":
        return 0.0
    if not s:
        return None
    total_ns = 0.0
    while s:
        m = _GO_PART.match(s)
        assert m is not None  # every part of the pattern may be empty
        whole, frac, unit = m.group(1), m.group(2), m.group(3)
        if not whole and not frac:
            return None  # no digits: Go's "invalid duration"
        if unit not in _GO_UNITS:
            return None  # missing or unknown unit
        value = float(whole or "0") + (float("0." + frac) if frac else 0.0)
        total_ns += value * _GO_UNITS[unit] * 1e9
        if total_ns > _INT64_MAX:
            return None  # Go's "invalid duration" (overflow)
        s = s[m.end() :]
    return (-total_ns if neg else total_ns) / 1e9


def _ntfy_duration(text: str) -> int | None:
    m = _NTFY_DURATION.fullmatch(text)
    if m is None or len(m.group(1)) > 18:
        return None
    unit = _NTFY_UNIT.get(m.group(2)[0].lower())  # None: (?i) folded "ſ" to s, and ntfy's switch on
    return None if unit is None else int(m.group(1)) * unit  # the first byte knows no such unit


# --- the natural subset -------------------------------------------------------------------------------
_WORDS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
          "eight": 8, "nine": 9, "ten": 10}  # fmt: skip
_DEADLINE = re.compile(
    r"(?:in|within)\s+([0-9]{1,9}|a|an|one|two|three|four|five|six|seven|eight|nine|ten)\s*"
    r"(seconds?|secs?|minutes?|mins?|hours?|days?|weeks?)",
    re.ASCII,
)
_DEADLINE_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_CLOCK = r"(?:(noon|midnight)|([0-9]{1,2}):([0-9]{2})\s*(am|pm|a\.m\.|p\.m\.)?|([0-9]{1,2})\s*(am|pm|a\.m\.|p\.m\.))"
_NATURAL = re.compile(rf"(?:(today|tomorrow)(?:\s*,)?\s*)?(?:(?:at\s+)?{_CLOCK})?", re.ASCII)
_SPACES = re.compile(r"\s+", re.ASCII)


def _clock(m: re.Match[str]) -> tuple[int, int] | None:
    """(hour, minute) of the clock part, or None when there is none; raises ValueError when invalid."""
    word, h1, mi, ampm1, h2, ampm2 = m.group(2, 3, 4, 5, 6, 7)
    if word:
        return (12, 0) if word == "noon" else (0, 0)
    if h1 is not None:
        hour, minute, ampm = int(h1), int(mi), ampm1
    elif h2 is not None:
        hour, minute, ampm = int(h2), 0, ampm2
    else:
        return None
    if minute > 59:
        raise ValueError("minute")
    if ampm:
        if not 1 <= hour <= 12:
            raise ValueError("hour")
        hour = hour % 12 + (12 if ampm.startswith("p") else 0)
    elif hour > 23:
        raise ValueError("hour")
    return hour, minute


def _natural(text: str, now: int) -> int | None:
    s = _SPACES.sub(" ", text.lower())
    m = _DEADLINE.fullmatch(s)
    if m is not None:
        n = _WORDS.get(m.group(1)) or int(m.group(1))
        return now + n * _DEADLINE_UNIT[m.group(2)[0]]
    m = _NATURAL.fullmatch(s)
    if m is None or not s:
        return None
    try:
        clock = _clock(m)
    except ValueError:
        return None
    day = m.group(1)
    base = dt.datetime.fromtimestamp(now, dt.UTC)
    if clock is None:
        return now + 86400 if day == "tomorrow" else None
    at = base.replace(hour=clock[0], minute=clock[1], second=0, microsecond=0)
    if day == "tomorrow":
        at += dt.timedelta(days=1)
    elif at.timestamp() <= now:
        at += dt.timedelta(days=1)  # ntfy: a time of day already past means tomorrow's
    return int(at.timestamp())


def parse_future_time(text: str, now: int) -> int | None:
    """The unix time ``text`` names, relative to ``now``; None when ntfy could not parse it either."""
    s = text.strip(GO_SPACE)
    if _GO_INT.fullmatch(s) and s[0] != "-":  # strconv.Atoi's form; a negative time is in the past
        digits = s.lstrip("+0")
        if len(digits) <= 19:  # more overflows Go's int64 (and past 4,300 digits Python's int() raises)
            value = int(digits or "0")
            if value <= _INT64_MAX and value >= now:
                return value
    secs = go_parse_duration(s)
    if secs is not None:
        return math.floor(now + secs)
    whole = _ntfy_duration(s)
    if whole is not None:
        return now + whole
    return _natural(s, now)
