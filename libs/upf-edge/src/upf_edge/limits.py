"""ntfy's request limit, the parts that decide: who the visitor is, who is exempt, which address a
request comes from behind a proxy, and the 429 reply. Pure; the bucket arithmetic itself is
``upf_keyspace.limits`` (the store applies it), the leasing adapter is :mod:`upf_edge.limiter`.

ntfy's model (ntfy-auth-and-limits.md, "Rate limits"): a visitor is ``user:<name>`` when
authenticated, else ``ip:<prefix>`` (the /32 of an IPv4 client, the /64 of an IPv6 one, both
settings); each has a bucket of ``burst`` requests refilled one per ``refill_secs``. Exempt clients
(loopback by default) are never counted. A forwarded header is believed only from a trusted proxy.
Beyond ntfy: a refusal says when to come back (``Retry-After``, whole seconds, never 0) and carries
the IETF draft's ``RateLimit-Policy``/``RateLimit`` headers, which ntfy users ask for (ntfy #1173).
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Sequence
from typing import NamedTuple

from upf_keyspace import Settings

from .errors import NtfyError, Problem

__all__ = [
    "LIMITS_DOCS",
    "TOO_MANY_REQUESTS",
    "TOO_MANY_SUBSCRIPTIONS",
    "TOO_MANY_TOPICS",
    "TOO_MANY_MESSAGES",
    "TOO_MANY_AUTH_FAILURES",
    "success_headers",
    "NO_SUBSCRIBER",
    "rate_topic",
    "Network",
    "LimitConfig",
    "parse_address",
    "in_networks",
    "client_address",
    "visitor_key",
    "refusal",
    "limited",
]

LIMITS_DOCS = "https://ntfy.sh/docs/publish/#limitations"
"""ntfy's link on its 429s (errors.go)."""
TOO_MANY_REQUESTS = Problem(42901, 429, "limit reached: too many requests", LIMITS_DOCS)
TOO_MANY_SUBSCRIPTIONS = Problem(42903, 429, "limit reached: too many active subscriptions", LIMITS_DOCS)
TOO_MANY_TOPICS = Problem(
    42904,
    429,
    "limit reached: the total number of topics on the server has been reached, please contact the admin",
    LIMITS_DOCS,
)
TOO_MANY_MESSAGES = Problem(42908, 429, "limit reached: daily message quota reached", LIMITS_DOCS)
TOO_MANY_AUTH_FAILURES = Problem(42909, 429, "limit reached: too many auth failures", LIMITS_DOCS)
NO_SUBSCRIBER = Problem(50701, 507, "cannot publish to UnifiedPush topic without previously active subscriber")
"""ntfy's 5xx for a UnifiedPush publish nobody subscribed to: Mastodon drops a subscription on most 4xx."""

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

MESSAGE_LEASE_SECS = 1.0
"""A daily-message lease is sized to last about this long at the visitor's recent pace, so a steady
publisher waits for one lease's commit a second at most."""
_SHORTEST_LEASE_SECS = 0.001

LEASE_FRACTION = 10
"""A process leases a tenth of the burst at a time (at least one token): few transactions per
visitor, and at most that many tokens per process sit leased but unspent (the fleet's tolerance)."""


class LimitConfig(NamedTuple):
    burst: int = 60
    refill_secs: float = 5.0
    exempt: tuple[Network, ...] = ()
    trusted: tuple[Network, ...] = ()
    header: str = "x-forwarded-for"
    """The forwarded header's name, lower-case (as the front doors' decoded headers carry it)."""
    prefix4: int = 32
    prefix6: int = 64
    auth_burst: int = 30
    auth_refill_secs: float = 60.0
    messages_daily: int = 0
    """0: ntfy's default, a day's worth of request refills (86,400 / refill_secs)."""
    subscriptions: int = 30
    subscriber_rate: bool = False
    """ntfy's visitor-subscriber-rate-limiting (see :func:`rate_topic`)."""
    total_topics: int = 15_000
    max_store_bytes: int = 0

    @classmethod
    def from_settings(cls, settings: Settings) -> LimitConfig:
        return cls(
            burst=settings.limit_request_burst,
            refill_secs=settings.limit_request_refill_secs,
            exempt=tuple(ipaddress.ip_network(n) for n in settings.limit_exempt),
            trusted=tuple(ipaddress.ip_network(n) for n in settings.proxy_trusted),
            header=settings.proxy_forwarded_header.lower(),
            prefix4=settings.visitor_prefix_bits_ipv4,
            prefix6=settings.visitor_prefix_bits_ipv6,
            auth_burst=settings.limit_auth_failure_burst,
            auth_refill_secs=settings.limit_auth_failure_refill_secs,
            messages_daily=settings.limit_messages_daily,
            subscriptions=settings.limit_subscriptions,
            subscriber_rate=settings.limit_subscriber_rate,
            total_topics=settings.limit_total_topics,
            max_store_bytes=settings.max_store_bytes,
        )

    @property
    def message_limit(self) -> int:
        """Messages per visitor per UTC day, as ntfy derives it when none is configured."""
        return self.messages_daily or max(1, int(86_400 / self.refill_secs))

    @property
    def message_lease(self) -> int:
        """Daily messages a process takes at a time from a visitor that spends them slowly: a hundredth
        of the day's (1 to 50)."""
        return max(1, min(50, self.message_limit // 100))

    @property
    def message_lease_max(self) -> int:
        """The most a process takes at a time (``message_want``): a hundredth of the day's."""
        return max(self.message_lease, self.message_limit // 100)

    def message_want(self, last_granted: int, lasted_secs: float) -> int:
        """The size of a visitor's next daily-message lease, given how many the last one granted and how
        long they lasted: ``MESSAGE_LEASE_SECS`` at that pace, from ``message_lease`` up to
        ``message_lease_max``. Why: every publish of the visitor in this process waits while a lease
        commits (up to the group commit's window under load); leases of 50 to a visitor publishing
        from 64 connections held it to ~3,400 publishes/s against ~14,000 without limits."""
        pace = last_granted / max(lasted_secs, _SHORTEST_LEASE_SECS)
        return max(self.message_lease, min(self.message_lease_max, math.ceil(pace * MESSAGE_LEASE_SECS)))

    @property
    def lease_size(self) -> int:
        return max(1, self.burst // LEASE_FRACTION)

    @property
    def window_secs(self) -> int:
        """The time an empty bucket takes to fill (the draft's policy window)."""
        return max(1, round(self.burst * self.refill_secs))


def parse_address(text: str) -> Address | None:
    """An IP from a peer name or a forwarded-header entry; None when it is not one. Accepted: ``[v6]``
    (with a port after it or not), a zone, an IPv4-mapped IPv6 form, ``v4:port`` (as some proxies
    write X-Forwarded-For), and an RFC 7239 ``Forwarded`` element's ``for=`` (``for=192.0.2.6;proto=https``,
    ``for="[2001:db8::17]:4711"``), the header ntfy documents beside X-Forwarded-For."""
    text = text.strip()
    at = text.lower().find("for=")
    if at >= 0:
        text = text[at + 4 :].partition(";")[0].strip().strip('"')
    if text.startswith("["):
        text = text[1:].partition("]")[0]
    elif text.count(":") == 1:
        text = text.partition(":")[0]
    try:
        addr = ipaddress.ip_address(text.partition("%")[0])
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


def in_networks(addr: Address, networks: Sequence[Network]) -> bool:
    return any(addr.version == n.version and addr in n for n in networks)


def client_address(peer: Address, forwarded: str | None, trusted: Sequence[Network]) -> Address:
    """The client a request comes from. The forwarded header counts only when the peer is a trusted
    proxy; then its entries are read from the last hop back, skipping trusted proxies (a chain of
    them), and the first other one is the client. Entries a client wrote itself stand further left,
    so it cannot choose its own address. An unreadable entry means the peer is all that is known."""
    if not forwarded or not trusted or not in_networks(peer, trusted):
        return peer
    hop = peer
    for entry in reversed(forwarded.split(",")):
        addr = parse_address(entry)
        if addr is None:
            return hop
        hop = addr
        if not in_networks(addr, trusted):
            return addr
    return hop


def visitor_key(user: str | None, addr: Address, prefix4: int = 32, prefix6: int = 64) -> str:
    """ntfy's visitor: the user when authenticated, else the client's network prefix."""
    if user is not None:
        return "user:" + user
    bits = prefix4 if addr.version == 4 else prefix6
    return "ip:" + str(ipaddress.ip_network((addr, bits), strict=False).network_address)


def rate_topic(topic: str) -> bool:
    """A topic subscriber-based limiting applies to: ntfy's UnifiedPush shape, ``up`` + 12 characters."""
    return len(topic) == 14 and topic.startswith("up")


def success_headers(config: LimitConfig, remaining: int) -> tuple[tuple[bytes, bytes], ...]:
    """The draft's headers on an admitted request, as the 429 carries them: ``remaining`` is what the
    visitor's bucket held after this request (as far as this process knows), ``reset`` the seconds
    until it is full again."""
    remaining = max(0, min(config.burst, remaining))
    reset = math.ceil((config.burst - remaining) * config.refill_secs)
    return (
        (b"ratelimit-policy", b"%d;w=%d" % (config.burst, config.window_secs)),
        (b"ratelimit", b"limit=%d, remaining=%d, reset=%d" % (config.burst, remaining, reset)),
    )


def limited(problem: Problem, wait: int) -> NtfyError:
    """A 429 other than the request limit's: ntfy's body and an honest ``Retry-After``."""
    return NtfyError(problem, ((b"retry-after", b"%d" % max(1, wait)),))


def refusal(config: LimitConfig, wait: int) -> NtfyError:
    """The 429 for a visitor whose next token is ``wait`` seconds away: ntfy's body, plus
    ``Retry-After`` and the draft's headers (``remaining`` is 0: this visitor has none left)."""
    wait = max(1, wait)
    return NtfyError(
        TOO_MANY_REQUESTS,
        (
            (b"retry-after", b"%d" % wait),
            (b"ratelimit-policy", b"%d;w=%d" % (config.burst, config.window_secs)),
            (b"ratelimit", b"limit=%d, remaining=0, reset=%d" % (config.burst, wait)),
        ),
    )
