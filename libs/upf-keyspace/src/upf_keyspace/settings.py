"""UPF_* settings, shared by every role so that one environment file configures a whole fleet.

Validated once at start: a bad value stops the process with a message naming the variable, instead of
surfacing later as a confusing runtime error.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import uuid
from collections.abc import Mapping

import msgspec

__all__ = ["Settings", "SettingsError", "load_settings", "ROLES"]

ROLES = ("writer", "pusher", "janitor")


class SettingsError(ValueError):
    """A UPF_* variable has a value the process cannot start with."""


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    bind_host: str = "0.0.0.0"
    bind_port: int = 8080
    roles: tuple[str, ...] = ROLES
    node_id: str = ""
    shard_count: int = 64
    max_message_bytes: int = 4096
    default_ttl_secs: int = 2_419_200
    safety_poll_secs: float = 60.0
    keepalive_secs: float = 45.0
    heartbeat_secs: float = 10.0
    janitor_interval_secs: float = 30.0
    public_url: str = "http://localhost:8080"
    store_path: str = "data/upf.db"
    """The embedded store's file; ignored when fdb_cluster_file is set."""
    fdb_cluster_file: str = ""
    """Use FoundationDB (the real bindings) through this cluster file instead of the embedded store."""
    slow_subscriber_timeout_secs: float = 60.0
    """A subscriber whose socket stays above its high-water mark this long is closed (it resumes with since=)."""
    max_topics_per_subscribe: int = 128
    """Topics one subscribe may name (400 40093 beyond): each costs a registration and an affinity write."""
    max_field_bytes: int = 1024
    """UTF-8 bytes each of a publish's title, tags, click and icon may have (413 41301 beyond)."""
    auth_default_access: str = "read-write"
    """What a request no ACL entry matches may do (ntfy's auth-default-access): read-write keeps a UPF
    with no users as open as before; read-only, write-only or deny-all close it."""
    shutdown_grace_secs: float = 10.0
    """After SIGTERM: how long in-flight publishes may take and streams may end cleanly before the process
    cuts what remains and exits."""
    workers: int = 1
    """Worker processes of the all-in-one with the pusher role, on one port (SO_REUSEPORT); default: the cores."""
    limit_exempt: tuple[str, ...] = ("127.0.0.0/8", "::1/128")
    """Networks (CIDR) whose clients no request limit applies to; hosts were resolved at start."""
    limit_request_burst: int = 60
    limit_request_refill_secs: float = 5.0
    visitor_prefix_bits_ipv4: int = 32
    visitor_prefix_bits_ipv6: int = 64
    proxy_trusted: tuple[str, ...] = ()
    """Proxies (CIDR) whose forwarded header names the client; from anyone else it is ignored."""
    proxy_forwarded_header: str = "X-Forwarded-For"
    delay_min_secs: int = 10
    """The earliest a scheduled message (X-Delay/X-At/X-In) may be due, in seconds from now (ntfy: 10 s)."""
    delay_max_secs: int = 259_200
    """The latest, in seconds from now (ntfy: 3 days)."""
    release_poll_secs: float = 1.0
    """How often a pusher looks for scheduled messages that are due (it sleeps less when one is due sooner)."""
    nocache_keep_secs: int = 120
    """How long an X-Cache: no message stays in the store for live delivery (never replayed) before the
    janitor may delete it; covers a live subscriber whose bell was lost until the safety poll."""
    stats_sample_secs: int = 60
    """The janitor samples the fleet's message counter this often; /v1/stats' rate spans the last 10 samples."""
    subscriber_send_buffer_bytes: int = 65536
    """SO_SNDBUF of each subscriber socket (0: the kernel's autotuning, which grows to MBs per slow reader)."""
    max_connections_per_ip: int = 300
    """Open connections one peer address may hold (429 beyond; 0: no cap); UPF_LIMIT_EXEMPT peers are exempt."""
    vapid_verify: bool = False
    """Refuse (401) every Web Push publish whose VAPID token does not verify; off, a bad token is only
    counted (a wrong UPF_PUBLIC_URL must not cut off every app server)."""
    vapid_restrict: bool = False
    """Bind a UnifiedPush topic to the first valid VAPID key that publishes to it; other keys get 401."""
    limit_auth_failure_burst: int = 30
    """Failed logins a visitor may have before 429 42909 (ntfy's visitor-auth-failure-limit-burst)."""
    limit_auth_failure_refill_secs: float = 60.0
    limit_messages_daily: int = 0
    """Messages a visitor may publish per UTC day (42908); 0 is ntfy's default: a day of request refills."""
    limit_subscriptions: int = 30
    """Open subscriptions a visitor may hold across the fleet (42903)."""
    limit_total_topics: int = 15_000
    max_store_bytes: int = 0
    """Stored message bytes the fleet may hold; past it publishes get 507 50702 (0: no bound)."""
    """Active topics the fleet may have (ntfy's global-topic-limit); a new one past it gets 42904."""
    limit_subscriber_rate: bool = False
    """ntfy's visitor-subscriber-rate-limiting: a UnifiedPush topic's publishes are charged to its
    subscriber; a UnifiedPush publish to a topic nobody subscribed to gets 507 50701."""


DEFAULT_ACCESS = ("read-write", "read-only", "write-only", "deny-all")


def _choice(env: Mapping[str, str], name: str, default: str, choices: tuple[str, ...]) -> str:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    if raw not in choices:
        raise SettingsError(f"{name} must be one of {', '.join(choices)}, got {raw!r}")
    return raw


def _int(env: Mapping[str, str], name: str, default: int, lo: int, hi: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"{name} must be an integer, got {raw!r}") from None
    if not lo <= value <= hi:
        raise SettingsError(f"{name} must be between {lo} and {hi}, got {value}")
    return value


def _float(env: Mapping[str, str], name: str, default: float, lo: float, hi: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name} must be a number of seconds, got {raw!r}") from None
    if not lo <= value <= hi:
        raise SettingsError(f"{name} must be between {lo} and {hi}, got {value}")
    return value


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise SettingsError(f"{name} must be true or false, got {raw!r}")


DEFAULT_EXEMPT = "127.0.0.0/8,::1"
_HOSTNAME = re.compile(r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")
_HEADER_NAME = re.compile(r"[A-Za-z0-9-]{1,64}")


def _networks(env: Mapping[str, str], name: str, default: str) -> tuple[str, ...]:
    """A comma list of IPs, CIDR ranges and host names as CIDR strings (names resolved now, as ntfy
    does at start). Unset is ``default``; set and empty is nothing."""
    raw = env.get(name)
    out: list[str] = []
    for item in (default if raw is None else raw).split(","):
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
        out.extend(str(ipaddress.ip_network(info[4][0].partition("%")[0])) for info in infos)
    return tuple(dict.fromkeys(out))


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if env is None else env
    bind = env.get("UPF_BIND", "0.0.0.0:8080")
    host, sep, port_text = bind.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise SettingsError(f"UPF_BIND must be HOST:PORT, got {bind!r}")
    host = host.strip("[]") or "0.0.0.0"
    roles = tuple(r.strip() for r in env.get("UPF_ROLES", ",".join(ROLES)).split(",") if r.strip())
    unknown = [r for r in roles if r not in ROLES]
    if unknown or not roles:
        raise SettingsError(f"UPF_ROLES must be a comma list of {', '.join(ROLES)}, got {env.get('UPF_ROLES')!r}")
    node_id = env.get("UPF_NODE_ID", "") or uuid.uuid4().hex[:16]
    if len(node_id) > 64 or not all(c.isalnum() or c in "-_." for c in node_id):
        raise SettingsError(f"UPF_NODE_ID must be 1-64 of [A-Za-z0-9._-], got {node_id!r}")
    cluster_file = env.get("FDB_CLUSTER_FILE", "")
    if cluster_file and not os.path.isfile(cluster_file):
        raise SettingsError(f"FDB_CLUSTER_FILE names no file: {cluster_file!r}")
    public_url = env.get("UPF_PUBLIC_URL", "http://localhost:8080").rstrip("/")
    if not public_url.startswith(("http://", "https://")):
        raise SettingsError(f"UPF_PUBLIC_URL must start with http:// or https://, got {public_url!r}")
    forwarded = env.get("UPF_PROXY_FORWARDED_HEADER", "") or "X-Forwarded-For"
    if _HEADER_NAME.fullmatch(forwarded) is None:
        raise SettingsError(f"UPF_PROXY_FORWARDED_HEADER must be a header name, got {forwarded!r}")
    settings = Settings(
        bind_host=host,
        bind_port=int(port_text),
        roles=roles,
        node_id=node_id,
        shard_count=_int(env, "UPF_SHARD_COUNT", 64, 1, 4096),
        max_message_bytes=_int(env, "UPF_MAX_MESSAGE_BYTES", 4096, 1, 65536),
        default_ttl_secs=_int(env, "UPF_DEFAULT_TTL_SECS", 2_419_200, 1, 10 * 365 * 86400),
        safety_poll_secs=_float(env, "UPF_SAFETY_POLL_SECS", 60.0, 0.05, 86400),
        keepalive_secs=_float(env, "UPF_KEEPALIVE_SECS", 45.0, 0.05, 3600),
        heartbeat_secs=_float(env, "UPF_HEARTBEAT_SECS", 10.0, 0.05, 3600),
        janitor_interval_secs=_float(env, "UPF_JANITOR_INTERVAL_SECS", 30.0, 0.05, 86400),
        public_url=public_url,
        store_path=env.get("UPF_STORE_PATH", "data/upf.db"),
        fdb_cluster_file=cluster_file,
        slow_subscriber_timeout_secs=_float(env, "UPF_SLOW_SUBSCRIBER_TIMEOUT_SECS", 60.0, 0.05, 86400),
        max_topics_per_subscribe=_int(env, "UPF_MAX_TOPICS_PER_SUBSCRIBE", 128, 1, 4096),
        max_field_bytes=_int(env, "UPF_MAX_FIELD_BYTES", 1024, 1, 65536),
        shutdown_grace_secs=_float(env, "UPF_SHUTDOWN_GRACE_SECS", 10.0, 0.1, 3600),
        workers=_int(env, "UPF_WORKERS", os.cpu_count() or 1, 1, 256),
        auth_default_access=_choice(env, "UPF_AUTH_DEFAULT_ACCESS", "read-write", DEFAULT_ACCESS),
        limit_exempt=_networks(env, "UPF_LIMIT_EXEMPT", DEFAULT_EXEMPT),
        limit_request_burst=_int(env, "UPF_LIMIT_REQUEST_BURST", 60, 1, 1_000_000),
        limit_request_refill_secs=_float(env, "UPF_LIMIT_REQUEST_REFILL_SECS", 5.0, 0.0001, 86400),
        visitor_prefix_bits_ipv4=_int(env, "UPF_VISITOR_PREFIX_BITS_IPV4", 32, 1, 32),
        visitor_prefix_bits_ipv6=_int(env, "UPF_VISITOR_PREFIX_BITS_IPV6", 64, 1, 128),
        proxy_trusted=_networks(env, "UPF_PROXY_TRUSTED", ""),
        proxy_forwarded_header=forwarded,
        delay_min_secs=_int(env, "UPF_DELAY_MIN_SECS", 10, 0, 10 * 365 * 86400),
        delay_max_secs=_int(env, "UPF_DELAY_MAX_SECS", 259_200, 1, 10 * 365 * 86400),
        release_poll_secs=_float(env, "UPF_RELEASE_POLL_SECS", 1.0, 0.05, 3600),
        nocache_keep_secs=_int(env, "UPF_NOCACHE_KEEP_SECS", 120, 1, 86400),
        stats_sample_secs=_int(env, "UPF_STATS_SAMPLE_SECS", 60, 1, 86400),
        subscriber_send_buffer_bytes=_int(env, "UPF_SUBSCRIBER_SEND_BUFFER_BYTES", 65536, 0, 64 * 1024 * 1024),
        max_connections_per_ip=_int(env, "UPF_MAX_CONNECTIONS_PER_IP", 300, 0, 10_000_000),
        vapid_verify=_choice(env, "UPF_VAPID_VERIFY", "0", ("0", "1")) == "1",
        vapid_restrict=_choice(env, "UPF_VAPID_RESTRICT", "0", ("0", "1")) == "1",
        limit_auth_failure_burst=_int(env, "UPF_LIMIT_AUTH_FAILURE_BURST", 30, 1, 1_000_000),
        limit_auth_failure_refill_secs=_float(env, "UPF_LIMIT_AUTH_FAILURE_REFILL_SECS", 60.0, 0.0001, 86400),
        limit_messages_daily=_int(env, "UPF_LIMIT_MESSAGES_DAILY", 0, 0, 1_000_000_000),
        limit_subscriptions=_int(env, "UPF_LIMIT_SUBSCRIPTIONS", 30, 1, 1_000_000),
        limit_subscriber_rate=_bool(env, "UPF_LIMIT_SUBSCRIBER_RATE", False),
        limit_total_topics=_int(env, "UPF_LIMIT_TOTAL_TOPICS", 15_000, 1, 1_000_000_000),
        max_store_bytes=_int(env, "UPF_MAX_STORE_BYTES", 0, 0, 2**62),
    )
    if settings.delay_min_secs > settings.delay_max_secs:
        raise SettingsError(
            f"UPF_DELAY_MIN_SECS ({settings.delay_min_secs}) must not exceed UPF_DELAY_MAX_SECS ({settings.delay_max_secs})"
        )
    return settings
