"""UPF_* settings, shared by every role so that one environment file configures a whole fleet.

Validated once at start: a bad value stops the process with a message naming the variable, instead of
surfacing later as a confusing runtime error.

Each setting is declared once, as one field of :class:`Settings` (type, how it is read, default)::

    shard_count: Annotated[int, var(_int, ge=1, le=4096)] = 64

- the variable is ``UPF_`` + the field name upper-cased (``UPF_SHARD_COUNT``), or ``var(..., name=...)``;
- the converter turns the variable's text into the value or raises :class:`SettingsError` naming the
  variable: ``_int``, ``_secs`` (a float), ``_choice(*allowed)``, ``_flag`` (``0``/``1``), ``_networks``
  (CIDR list, host names resolved), ``_text``, or a function ``(variable, text) -> value`` of its own;
- ``ge``/``le`` are the bounds (msgspec ``Meta`` constraints), checked after conversion;
- unset, or set and empty, means the field's default; ``blank_is_value=True`` converts an empty value
  instead (``UPF_LIMIT_EXEMPT=`` exempts nobody), and ``unset=f`` computes the default at start
  (``UPF_WORKERS``: the cores).

:func:`load_settings` walks the fields; nothing else lists them. Checks across settings follow it.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
import socket
import typing
import uuid
from collections.abc import Callable, Mapping
from typing import Annotated, Any, NamedTuple

import msgspec

__all__ = ["Settings", "SettingsError", "load_settings", "ROLES"]

ROLES = ("writer", "pusher", "janitor")
DEFAULT_ACCESS = ("read-write", "read-only", "write-only", "deny-all")


class SettingsError(ValueError):
    """A UPF_* variable has a value the process cannot start with."""


Converter = Callable[[str, str], Any]
"""(variable name, its text) -> the setting's value; raises SettingsError naming the variable."""


def var(
    convert: Converter,
    *,
    name: str | None = None,
    ge: float | None = None,
    le: float | None = None,
    blank_is_value: bool = False,
    unset: Callable[[], Any] | None = None,
) -> msgspec.Meta:
    """How a field is read from the environment (see the module docstring)."""
    if (ge is None) != (le is None):
        raise TypeError("a setting's bounds come in pairs (ge and le)")
    return msgspec.Meta(
        ge=ge, le=le, extra={"convert": convert, "name": name, "blank_is_value": blank_is_value, "unset": unset}
    )


# --- converters -------------------------------------------------------------------------------------
def _int(name: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise SettingsError(f"{name} must be an integer, got {raw!r}") from None


def _secs(name: str, raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise SettingsError(f"{name} must be a number of seconds, got {raw!r}") from None


def _watchdog_secs(name: str, raw: str) -> float:
    """0 (off) or at least a second: below that no worker could beat in time (a collection, a large
    read), and the supervisor killed them all in a loop while the process looked up."""
    secs = _secs(name, raw)
    if 0 < secs < 1:
        raise SettingsError(f"{name} must be 0 (off) or at least 1 second, got {raw!r}")
    return secs


def _choice(*choices: str) -> Converter:
    def convert(name: str, raw: str) -> str:
        if raw not in choices:
            raise SettingsError(f"{name} must be one of {', '.join(choices)}, got {raw!r}")
        return raw

    return convert


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _log_level(name: str, raw: str) -> str:
    level = raw.strip().upper()
    if level not in LOG_LEVELS:
        raise SettingsError(f"{name} must be one of {', '.join(LOG_LEVELS)} (any case), got {raw!r}")
    return level


def _flag(name: str, raw: str) -> bool:
    _choice("0", "1")(name, raw)
    return raw == "1"


def _bool(name: str, raw: str) -> bool:
    """``true``/``false`` in the forms ntfy's YAML accepts (``1``, ``yes``, ``on``...)."""
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise SettingsError(f"{name} must be true or false, got {raw!r}")


def _text(name: str, raw: str) -> str:
    return raw


_HOSTNAME = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
)
_HEADER_NAME = re.compile(r"[A-Za-z0-9-]{1,64}")


def _networks(name: str, raw: str) -> tuple[str, ...]:
    """A comma list of IPs, CIDR ranges and host names as CIDR strings (names resolved now, as ntfy
    does at start); empty is nothing."""
    out: list[str] = []
    for item in raw.split(","):
        item = item.strip()
        if not item:
            continue
        try:
            out.append(str(ipaddress.ip_network(item, strict=False)))
            continue
        except ValueError:
            pass
        if _HOSTNAME.fullmatch(item) is None or item.replace(".", "").isdigit():
            raise SettingsError(f"{name} must be a comma list of IPs, CIDR ranges or host names, got {item!r}")
        try:
            infos = socket.getaddrinfo(item, None, proto=socket.IPPROTO_TCP)
        except OSError:
            raise SettingsError(f"{name} names a host that does not resolve: {item!r}") from None
        out.extend(str(ipaddress.ip_network(str(info[4][0]).partition("%")[0])) for info in infos)
    return tuple(dict.fromkeys(out))


def _bind(name: str, raw: str) -> tuple[str, int]:
    host, sep, port_text = raw.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise SettingsError(f"{name} must be HOST:PORT, got {raw!r}")
    return host.strip("[]") or "0.0.0.0", int(port_text)


def _bind_host(name: str, raw: str) -> str:
    return _bind(name, raw)[0]


def _bind_port(name: str, raw: str) -> int:
    return _bind(name, raw)[1]


def _roles(name: str, raw: str) -> tuple[str, ...]:
    roles = tuple(r.strip() for r in raw.split(",") if r.strip())
    if not roles or any(r not in ROLES for r in roles):
        raise SettingsError(f"{name} must be a comma list of {', '.join(ROLES)}, got {raw!r}")
    return roles


def _node_id(name: str, raw: str) -> str:
    if len(raw) > 64 or not raw.isascii() or not all(c.isalnum() or c in "-_." for c in raw):
        raise SettingsError(f"{name} must be 1-64 of [A-Za-z0-9._-], got {raw!r}")
    return raw


def _random_node_id() -> str:
    return uuid.uuid4().hex[:16]


def _host_node_id(settings: Settings) -> str:
    """The default node id of a pusher on the embedded store: the same for the same server on the same
    host (host name, bound address, store file), so a restarted one is that node again and owns its
    records at once (its subscriptions counted against visitors, its affinity); a new random id left
    them to the janitor's sweep, and a phone that reconnected after a crash was refused its
    subscriptions (42903) until then. Two such servers cannot run at once: the port is exclusive."""
    key = "\0".join(
        (socket.gethostname(), settings.bind_host, str(settings.bind_port), os.path.abspath(settings.store_path))
    )
    return "h" + hashlib.blake2b(key.encode(), digest_size=8).hexdigest()[:15]


def _cores() -> int:
    return os.cpu_count() or 1


def _cluster_file(name: str, raw: str) -> str:
    if not os.path.isfile(raw):
        raise SettingsError(f"{name} names no file: {raw!r}")
    return raw


def _public_url(name: str, raw: str) -> str:
    url = raw.rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise SettingsError(f"{name} must start with http:// or https://, got {url!r}")
    return url


def _header_name(name: str, raw: str) -> str:
    if _HEADER_NAME.fullmatch(raw) is None:
        raise SettingsError(f"{name} must be a header name, got {raw!r}")
    return raw


# --- the settings -----------------------------------------------------------------------------------
class Settings(msgspec.Struct, frozen=True, kw_only=True):
    """Every UPF_* setting: one line each (type, bounds, converter, default); see the module docstring."""

    bind_host: Annotated[str, var(_bind_host, name="UPF_BIND", blank_is_value=True)] = "0.0.0.0"
    bind_port: Annotated[int, var(_bind_port, name="UPF_BIND", blank_is_value=True)] = 8080
    roles: Annotated[tuple[str, ...], var(_roles, blank_is_value=True)] = ROLES
    node_id: Annotated[str, var(_node_id, unset=_random_node_id)] = ""
    shard_count: Annotated[int, var(_int, ge=1, le=4096)] = 64
    log_level: Annotated[str, var(_log_level)] = "INFO"
    """Checked here so that a bad UPF_LOG_LEVEL stops the start with this error, not a traceback;
    ``telemetry.configure_logging`` reads the variable itself, before the settings are loaded."""
    max_message_bytes: Annotated[int, var(_int, ge=1, le=65536)] = 4096
    default_ttl_secs: Annotated[int, var(_int, ge=1, le=10 * 365 * 86400)] = 2_419_200
    safety_poll_secs: Annotated[float, var(_secs, ge=0.05, le=86400)] = 60.0
    keepalive_secs: Annotated[float, var(_secs, ge=0.05, le=3600)] = 45.0
    heartbeat_secs: Annotated[float, var(_secs, ge=0.05, le=3600)] = 10.0
    janitor_interval_secs: Annotated[float, var(_secs, ge=0.05, le=86400)] = 30.0
    public_url: Annotated[str, var(_public_url)] = ""
    """The base URL phones and app servers reach UPF at; "" (unset): no Matrix gateway (500 50003, as
    ntfy without base-url: a homeserver then uses another gateway instead of being told to drop its
    pushers), a relative Web Push ``Location``, and no VAPID ``aud`` that verifies."""
    store_path: Annotated[str, var(_text, blank_is_value=True)] = "data/upf.db"
    """The embedded store's file; ignored when fdb_cluster_file is set."""
    fdb_cluster_file: Annotated[str, var(_cluster_file, name="FDB_CLUSTER_FILE")] = ""
    """Use FoundationDB (the real bindings) through this cluster file instead of the embedded store."""
    slow_subscriber_timeout_secs: Annotated[float, var(_secs, ge=0.05, le=86400)] = 60.0
    """A subscriber whose socket stays above its high-water mark this long is closed (it resumes with since=)."""
    max_topics_per_subscribe: Annotated[int, var(_int, ge=1, le=4096)] = 128
    """Topics one subscribe may name (400 40093 beyond): each costs a registration and an affinity write."""
    max_field_bytes: Annotated[int, var(_int, ge=1, le=65536)] = 1024
    """UTF-8 bytes each of a publish's title, tags, click and icon may have (413 41301 beyond)."""
    auth_default_access: Annotated[str, var(_choice(*DEFAULT_ACCESS))] = "read-write"
    """What a request no ACL entry matches may do (ntfy's auth-default-access): read-write keeps a UPF
    with no users as open as before; read-only, write-only or deny-all close it."""
    workers: Annotated[int, var(_int, ge=1, le=256, unset=_cores)] = 1
    """Worker processes of the all-in-one with the pusher role, on one port (SO_REUSEPORT); default: the cores."""
    worker_watchdog_secs: Annotated[float, var(_watchdog_secs, ge=0, le=3600)] = 20.0
    """With several workers: one whose event loop has been stuck this long is killed and restarted (0: never)."""
    writer_server: Annotated[str, var(_choice("upf", "granian"))] = "upf"
    """What serves the writer without a pusher beside it (``upf-writer``, ``upf`` with UPF_ROLES=writer):
    UPF's own front door (``upf_edge.frontdoor``, as the all-in-one's) or granian (one worker, ASGI)."""
    limit_exempt: Annotated[tuple[str, ...], var(_networks, blank_is_value=True)] = ("127.0.0.0/8", "::1/128")
    """Networks (CIDR) whose clients no request limit applies to; hosts were resolved at start."""
    limit_request_burst: Annotated[int, var(_int, ge=1, le=1_000_000)] = 60
    limit_request_refill_secs: Annotated[float, var(_secs, ge=0.0001, le=86400)] = 5.0
    visitor_prefix_bits_ipv4: Annotated[int, var(_int, ge=1, le=32)] = 32
    visitor_prefix_bits_ipv6: Annotated[int, var(_int, ge=1, le=128)] = 64
    proxy_trusted: Annotated[tuple[str, ...], var(_networks, blank_is_value=True)] = ()
    """Proxies (CIDR) whose forwarded header names the client; from anyone else it is ignored."""
    proxy_forwarded_header: Annotated[str, var(_header_name)] = "X-Forwarded-For"
    metrics_allow: Annotated[tuple[str, ...], var(_networks, blank_is_value=True)] = (
        "127.0.0.0/8",
        "::1/128",
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "fc00::/7",
    )
    """Networks (CIDR) that may scrape /metrics, directly (not through a proxy): loopback and private
    ranges, where a collector runs; the all-in-one listens where phones reach it."""
    delay_min_secs: Annotated[int, var(_int, ge=0, le=10 * 365 * 86400)] = 10
    """The earliest a scheduled message (X-Delay/X-At/X-In) may be due, in seconds from now (ntfy: 10 s)."""
    delay_max_secs: Annotated[int, var(_int, ge=1, le=10 * 365 * 86400)] = 259_200
    """The latest, in seconds from now (ntfy: 3 days)."""
    release_poll_secs: Annotated[float, var(_secs, ge=0.05, le=3600)] = 10.0
    """The longest a pusher's releaser sleeps between looks for due scheduled messages. It wakes at the
    earliest due time and whenever a message is scheduled (the schedule bell); this is the backstop for a
    missed bell (a writer older than the bell rings none), and at the default minimum delay (10 s) it
    still finds every message before it is due."""
    nocache_keep_secs: Annotated[int, var(_int, ge=1, le=86400)] = 120
    """How long an X-Cache: no message stays in the store for live delivery (never replayed) before the
    janitor may delete it; covers a live subscriber whose bell was lost until the safety poll."""
    stats_sample_secs: Annotated[int, var(_int, ge=1, le=86400)] = 60
    """The janitor samples the fleet's message counter this often; /v1/stats' rate spans the last 10 samples."""
    subscriber_send_buffer_bytes: Annotated[int, var(_int, ge=0, le=64 * 1024 * 1024)] = 65536
    """SO_SNDBUF of each subscriber socket (0: the kernel's autotuning, which grows to MBs per slow reader)."""
    max_connections_per_ip: Annotated[int, var(_int, ge=0, le=10_000_000)] = 300
    """Open connections one peer address may hold (429 beyond; 0: no cap); UPF_LIMIT_EXEMPT peers are exempt."""
    vapid_verify: Annotated[bool, var(_flag)] = False
    """Refuse (401) every Web Push publish whose VAPID token does not verify; off, a bad token is only
    counted (a wrong UPF_PUBLIC_URL must not cut off every app server)."""
    vapid_restrict: Annotated[bool, var(_flag)] = False
    """Bind a UnifiedPush topic to the first valid VAPID key that publishes to it; other keys get 401."""
    uvloop: Annotated[bool, var(_flag)] = True
    """The event loop is uvloop (``upf_edge.loop``, which reads it before the settings are loaded)."""
    gc_tune: Annotated[bool, var(_flag)] = True
    """Freeze startup's objects and raise gen0's threshold once serving (``upf_edge.gcpolicy``)."""
    shutdown_grace_secs: Annotated[float, var(_secs, ge=0.1, le=3600)] = 10.0
    """After SIGTERM: how long in-flight publishes may take and streams may end cleanly before the process
    cuts what remains and exits."""
    limit_auth_failure_burst: Annotated[int, var(_int, ge=1, le=1_000_000)] = 30
    """Failed logins a visitor may have before 429 42909 (ntfy's visitor-auth-failure-limit-burst)."""
    limit_auth_failure_refill_secs: Annotated[float, var(_secs, ge=0.0001, le=86400)] = 60.0
    limit_messages_daily: Annotated[int, var(_int, ge=0, le=1_000_000_000)] = 0
    """Messages a visitor may publish per UTC day (42908); 0 is ntfy's default: a day of request refills."""
    limit_subscriptions: Annotated[int, var(_int, ge=1, le=1_000_000)] = 30
    """Open subscriptions a visitor may hold across the fleet (42903)."""
    limit_total_topics: Annotated[int, var(_int, ge=1, le=1_000_000_000)] = 15_000
    """Active topics the fleet may have (ntfy's global-topic-limit); a new one past it gets 42904."""
    limit_subscriber_rate: Annotated[bool, var(_bool)] = False
    """ntfy's visitor-subscriber-rate-limiting: a UnifiedPush topic's publishes are charged to its
    subscriber; a UnifiedPush publish to a topic nobody subscribed to gets 507 50701."""
    max_store_bytes: Annotated[int, var(_int, ge=0, le=2**62)] = 0
    """Stored message bytes the fleet may hold; past it publishes get 507 50702 (0: no bound)."""


class _Field(NamedTuple):
    attr: str
    name: str
    convert: Converter
    ge: float | None
    le: float | None
    blank_is_value: bool
    unset: Callable[[], Any] | None


def _declared() -> tuple[_Field, ...]:
    """Every field's ``var`` declaration, in declaration order."""
    hints = typing.get_type_hints(Settings, include_extras=True)
    out = []
    for attr in Settings.__struct_fields__:
        meta = next((m for m in typing.get_args(hints[attr])[1:] if isinstance(m, msgspec.Meta)), None)
        if meta is None or not meta.extra or "convert" not in meta.extra:
            raise TypeError(f"Settings.{attr} is not declared with var(...): the loader cannot read it")
        extra = meta.extra
        out.append(
            _Field(
                attr,
                extra["name"] or "UPF_" + attr.upper(),
                extra["convert"],
                meta.ge,
                meta.le,
                extra["blank_is_value"],
                extra["unset"],
            )
        )
    return tuple(out)


_FIELDS: tuple[_Field, ...] | None = None


def variables() -> tuple[str, ...]:
    """Every variable the loader reads, in declaration order (``UPF_BIND`` once)."""
    return tuple(dict.fromkeys(f.name for f in _declared()))


_MAX_COMMIT_WAIT_MS = 100
_MIN_EMBEDDED_BYTES = 128 << 10
"""A quota below it could not hold a new store's own records: every write, the first included, refused."""
_MAX_EMBEDDED_BYTES = 512 << 30
"""LMDB maps twice the quota; above this the map outgrows the 1 TiB reserved without a quota."""


def embedded_max_bytes(env: Mapping[str, str] | None = None) -> int:
    """``UPF_EMBEDDED_MAX_BYTES``: the embedded store's size quota in bytes, 0 (or blank) for none.
    The embedded driver reads it where it opens the store, and ``load_settings`` checks it, so a bad
    value stops a start with its name instead of failing every process that opens the store."""
    raw = (os.environ if env is None else env).get("UPF_EMBEDDED_MAX_BYTES", "").strip() or "0"
    bounds = f"0 (no quota) or {_MIN_EMBEDDED_BYTES}-{_MAX_EMBEDDED_BYTES}"
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 20:  # "²" is a digit to isdigit, not to int
        raise SettingsError(f"UPF_EMBEDDED_MAX_BYTES must be a whole number of bytes: {bounds}")
    quota = int(raw)
    if quota and not _MIN_EMBEDDED_BYTES <= quota <= _MAX_EMBEDDED_BYTES:
        raise SettingsError(f"UPF_EMBEDDED_MAX_BYTES must be {bounds} bytes, got {quota}")
    return quota


def _embedded_ms(env: Mapping[str, str] | None, name: str, most: int) -> int | None:
    """A whole number of milliseconds from 0 to ``most`` in ``name``; None when unset or blank."""
    raw = (os.environ if env is None else env).get(name, "").strip()
    if not raw:
        return None
    if not (raw.isascii() and raw.isdigit()) or int(raw) > most:  # "²" is a digit to isdigit, not to int
        raise SettingsError(f"{name} must be a whole number of milliseconds from 0 to {most}")
    return int(raw)


def embedded_commit_wait_ms(env: Mapping[str, str] | None = None) -> int | None:
    """``UPF_EMBEDDED_COMMIT_WAIT_MS``: how long the embedded store's group commit waits for more
    transactions while they stream in (0-100 whole ms); None when unset or blank (the driver's
    default). Read and checked as ``embedded_max_bytes`` is."""
    return _embedded_ms(env, "UPF_EMBEDDED_COMMIT_WAIT_MS", _MAX_COMMIT_WAIT_MS)


_MAX_WAKE_PACE_MS = 100


def embedded_wake_pace_ms(env: Mapping[str, str] | None = None) -> int | None:
    """``UPF_EMBEDDED_WAKE_PACE_MS``: while other processes' commits wake a process faster than this
    (0-100 whole ms), it checks its watches once per this long instead of at each wake; None when
    unset or blank (the driver's default). Read and checked as ``embedded_max_bytes`` is."""
    return _embedded_ms(env, "UPF_EMBEDDED_WAKE_PACE_MS", _MAX_WAKE_PACE_MS)


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    global _FIELDS
    env = os.environ if env is None else env
    fields = _FIELDS = _FIELDS or _declared()
    values: dict[str, Any] = {}
    for f in fields:
        raw = env.get(f.name)
        if raw is None or (raw == "" and not f.blank_is_value):
            if f.unset is not None:
                values[f.attr] = f.unset()
            continue
        value = f.convert(f.name, raw)
        if f.ge is not None and f.le is not None and not f.ge <= value <= f.le:
            raise SettingsError(f"{f.name} must be between {f.ge} and {f.le}, got {value}")
        values[f.attr] = value
    settings = Settings(**values)
    if (
        not env.get("UPF_NODE_ID")
        and not settings.fdb_cluster_file
        and settings.bind_port
        and "pusher" in settings.roles
    ):
        settings = msgspec.structs.replace(settings, node_id=_host_node_id(settings))
    embedded_max_bytes(env)  # the embedded driver's own variables: checked here, read where the store opens
    embedded_commit_wait_ms(env)
    embedded_wake_pace_ms(env)
    if settings.delay_min_secs > settings.delay_max_secs:
        raise SettingsError(
            f"UPF_DELAY_MIN_SECS ({settings.delay_min_secs}) must not exceed UPF_DELAY_MAX_SECS ({settings.delay_max_secs})"
        )
    return settings
