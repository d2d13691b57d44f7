"""X-Cache: no and scheduled delivery in the pure ingest core, and ntfy's ParseFutureTime forms."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from upf_edge import NtfyError
from upf_writer import ingest
from upf_writer.futuretime import go_parse_duration, parse_future_time
from upf_writer.ingest import Limits

NOW = 1_784_214_948  # 2026-07-16 15:15:48 UTC
LIMITS = Limits(default_ttl_secs=2_419_200, delay_min_secs=10, delay_max_secs=259_200, nocache_keep_secs=120)


def publish(headers=None, query=None, body=b"hi"):
    return ingest.ingest_publish("mytopic", headers or {}, query or {}, body, now=NOW, limits=LIMITS)


def rejected(problem, fn, *args, **kwargs) -> None:
    with pytest.raises(NtfyError) as info:
        fn(*args, **kwargs)
    assert info.value.problem == problem


# --- X-Cache -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "headers,query", [({"x-cache": "no"}, {}), ({"cache": "NO"}, {}), ({}, {"cache": "no"}), ({}, {"cache": "0"}),
                      ({"x-cache": "false"}, {}), ({"x-cache": "whatever"}, {})],
)  # fmt: skip
def test_cache_no_in_every_form(headers, query) -> None:
    """ntfy's readBoolParam(default true): any set value but 1/yes/true turns the cache off."""
    ing = publish(headers, query)
    assert ing.envelope.nocache and ing.due == 0
    assert ing.envelope.expires == NOW + LIMITS.nocache_keep_secs  # kept briefly, for live delivery only


@pytest.mark.parametrize("value", ["yes", "1", "true", "TRUE", " "])
def test_cache_yes_or_blank_is_the_default(value) -> None:
    env = publish({"x-cache": value}).envelope
    assert not env.nocache and env.expires == NOW + LIMITS.default_ttl_secs


def test_cache_no_from_json() -> None:
    body = json.dumps({"topic": "t1", "message": "m", "cache": "no"}).encode()
    assert ingest.ingest_json({}, {}, body, now=NOW, limits=LIMITS).envelope.nocache


def test_cache_json_bool_is_invalid_json() -> None:
    """ntfy's field is a string; a JSON bool fails its decoder (40024)."""
    body = json.dumps({"topic": "t1", "cache": False}).encode()
    rejected(ingest.JSON_INVALID, ingest.ingest_json, {}, {}, body, now=NOW, limits=LIMITS)


# --- delay ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["x-delay", "delay", "x-at", "at", "x-in", "in"])
def test_delay_header_names(name) -> None:
    ing = publish({name: "30m"})
    assert ing.due == NOW + 1800
    assert (ing.envelope.time, ing.envelope.expires) == (NOW + 1800, NOW + 1800 + LIMITS.default_ttl_secs)


@pytest.mark.parametrize("name", ["delay", "at", "in"])
def test_delay_query_names(name) -> None:
    assert publish(query={name: "1h"}).due == NOW + 3600


def test_delay_from_json() -> None:
    body = json.dumps({"topic": "t1", "message": "m", "delay": "2h"}).encode()
    assert ingest.ingest_json({}, {}, body, now=NOW, limits=LIMITS).due == NOW + 7200


def test_delay_unix_time() -> None:
    assert publish({"x-at": str(NOW + 600)}).due == NOW + 600


@pytest.mark.parametrize(
    "value,problem",
    [
        ("5s", ingest.DELAY_TOO_SMALL),
        ("9s", ingest.DELAY_TOO_SMALL),
        ("0", ingest.DELAY_TOO_SMALL),
        ("-5m", ingest.DELAY_TOO_SMALL),
        (str(NOW + 5), ingest.DELAY_TOO_SMALL),
        ("4d", ingest.DELAY_TOO_LARGE),
        ("259201s", ingest.DELAY_TOO_LARGE),
        (str(NOW + 400_000), ingest.DELAY_TOO_LARGE),
        ("banana", ingest.DELAY_CANNOT_PARSE),
        ("10 parsecs", ingest.DELAY_CANNOT_PARSE),
        (str(NOW - 100), ingest.DELAY_CANNOT_PARSE),  # a past unix time and no duration: unparsable
        ("1e3s", ingest.DELAY_CANNOT_PARSE),
        ("9" * 40, ingest.DELAY_CANNOT_PARSE),
        ("99999999999999999999h", ingest.DELAY_CANNOT_PARSE),
    ],
)
def test_bad_delays_get_ntfys_codes(value, problem) -> None:
    rejected(problem, publish, {"x-delay": value})


@pytest.mark.parametrize("value", ["1" * 4301, "+" + "9" * 5000, "1" * 5000 + "s", "1" * 5000 + " days"])
def test_overlong_numbers_are_unparsable_not_a_crash(value) -> None:
    """Past Python's 4,300-digit int limit too: ntfy's strconv.Atoi fails on anything over int64, so 40004."""
    rejected(ingest.DELAY_CANNOT_PARSE, publish, {"x-delay": value})
    rejected(ingest.DELAY_CANNOT_PARSE, publish, query={"delay": value})
    body = json.dumps({"topic": "t1", "delay": value}).encode()
    rejected(ingest.DELAY_CANNOT_PARSE, ingest.ingest_json, {}, {}, body, now=NOW, limits=LIMITS)


@pytest.mark.parametrize(
    "value",
    ["\u0661\u0660m", "\u0661\u0660 minutes", "\u0663" + "\u0660" * 10, "\uff11\uff10m", "1.\u0665h",
     "in \u0661\u0660 minutes", "\u0661\u0660am", "10:\u0663\u0660", "10\u017f"],
)  # fmt: skip
def test_only_ascii_digits_are_digits(value) -> None:
    """Go's regexp ``\\d`` and strconv know only 0-9: Arabic-Indic or fullwidth digits are 40004 (not, as
    Python's Unicode ``\\d`` read them, ten minutes); so is a unit Go's case folding matches but ntfy's
    switch on its first byte does not know (``10\u017f``, a long s)."""
    assert parse_future_time(value, NOW) is None
    rejected(ingest.DELAY_CANNOT_PARSE, publish, {"x-delay": value})


def test_only_gos_spaces_are_trimmed() -> None:
    """ntfy's strings.TrimSpace keeps \\x1c-\\x1f, which Python's str.strip() would drop."""
    assert parse_future_time("\u3000 10m\u2028", NOW) == NOW + 600
    assert parse_future_time("10m\x1c", NOW) is None
    rejected(ingest.DELAY_CANNOT_PARSE, publish, {"x-delay": "\x1f10m"})


def test_bounds_are_inclusive() -> None:
    assert publish({"x-delay": "10s"}).due == NOW + 10
    assert publish({"x-delay": "3d"}).due == NOW + 259_200


def test_a_bad_delay_is_reported_before_bad_actions_as_ntfy_reads_them() -> None:
    """ntfy's parsePublishParams reads the delay after the priority and before the actions."""
    rejected(ingest.DELAY_CANNOT_PARSE, publish, {"x-delay": "banana", "x-actions": "junk"})
    rejected(ingest.PRIORITY_INVALID, publish, {"x-delay": "banana", "x-priority": "9"})


def test_delay_with_cache_no_is_40002() -> None:
    rejected(ingest.DELAY_NO_CACHE, publish, {"x-delay": "1h", "x-cache": "no"})


def test_settings_move_the_bounds() -> None:
    narrow = Limits(delay_min_secs=1, delay_max_secs=60)
    ing = ingest.ingest_publish("t", {"x-delay": "2s"}, {}, b"x", now=NOW, limits=narrow)
    assert ing.due == NOW + 2
    with pytest.raises(NtfyError) as info:
        ingest.ingest_publish("t", {"x-delay": "2m"}, {}, b"x", now=NOW, limits=narrow)
    assert info.value.problem == ingest.DELAY_TOO_LARGE


# --- ParseFutureTime -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text,secs",
    [("0", 0), ("30s", 30), ("1h30m", 5400), ("1.5h", 5400), (".5h", 1800), ("1.h", 3600), ("300ms", 0.3),
     ("+2m", 120), ("-1m", -60), ("1h1m1s", 3661)],
)  # fmt: skip
def test_go_durations(text, secs) -> None:
    assert go_parse_duration(text) == pytest.approx(secs)


@pytest.mark.parametrize("text", ["", "1", "h", "1x", "1H", "1d", ".h", "1 h", "--1s", "3000000h"])
def test_go_duration_errors(text) -> None:
    assert go_parse_duration(text) is None


def at(hour: int, minute: int = 0, days: int = 0) -> int:
    base = dt.datetime.fromtimestamp(NOW, dt.UTC).replace(hour=hour, minute=minute, second=0)
    return int((base + dt.timedelta(days=days)).timestamp())


@pytest.mark.parametrize(
    "text,expected",
    [
        ("30s", NOW + 30), ("2 days", NOW + 172_800), ("10 min", NOW + 600), ("1D", NOW + 86_400),
        ("5 Hours", NOW + 18_000), ("  45 seconds ", NOW + 45),
        ("tomorrow", NOW + 86_400), ("in 2 hours", NOW + 7200), ("within 30 minutes", NOW + 1800),
        ("in an hour", NOW + 3600), ("in 1 week", NOW + 604_800),
        ("10am", at(10, days=1)), ("5pm", at(17)), ("5:30 PM", at(17, 30)), ("17:30", at(17, 30)),
        ("noon", at(12, days=1)), ("midnight", at(0, days=1)), ("tomorrow 10am", at(10, days=1)),
        ("Tomorrow, at 9:15am", at(9, 15, days=1)), ("today 10pm", at(22)),
    ],
)  # fmt: skip
def test_future_time_forms(text, expected) -> None:
    assert parse_future_time(text, NOW) == expected


@pytest.mark.parametrize("text", ["banana", "25:00", "13pm", "10:75", "yesterday", "in two fortnights", "at"])
def test_future_time_unparsable(text) -> None:
    assert parse_future_time(text, NOW) is None


def test_a_bad_priority_or_icon_is_reported_before_a_bad_delay() -> None:
    """ntfy's parsePublishParams reads the icon and the priority before the delay."""
    rejected(ingest.PRIORITY_INVALID, publish, {"x-priority": "9", "x-delay": "banana"})
    rejected(ingest.ICON_INVALID, publish, {"x-icon": "ftp://x", "x-delay": "1s"})
