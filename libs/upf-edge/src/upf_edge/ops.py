"""The ops endpoints every role serves, built once, as an ``upf_edge`` handler: ``/v1/health`` (ntfy's),
``/__lbheartbeat__`` (process alive), ``/__heartbeat__`` (the store answers), ``/__version__`` and the
Prometheus scrape endpoint ``/metrics``.

Why one copy: each role had its own, and they had drifted (``{}`` vs ``{}\\n``, two different failed
heartbeats). A role builds :class:`OpsRoutes` with its name, version, a store probe and a metrics
renderer (callables, so this library needs neither the store nor the telemetry code) and puts it in
front of its other routes. Other methods on these paths are 405, as a framework's router answers.

``/metrics`` answers only scrapers (:class:`MetricsAccess`, ``UPF_METRICS_ALLOW``): its counters say
when a server's users get notifications and fail to log in, and the all-in-one listens where phones
reach it. Others get ntfy's 404, as the ingress answers them.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

import msgspec

from upf_keyspace.errors import STORAGE, StorageHealth

from .errors import NOT_FOUND, STORE_UNAVAILABLE, Problem
from .handler import NO_BODY, Reply
from .limits import Network, in_networks, parse_address

if TYPE_CHECKING:
    from upf_keyspace import Settings

__all__ = [
    "MetricsAccess",
    "OpsRoutes",
    "PATHS",
    "HEALTH_BODY",
    "LBHEARTBEAT_BODY",
    "HEARTBEAT_OK_BODY",
    "HEALTH_STORAGE_FULL_BODY",
    "HEARTBEAT_STORAGE_FULL_BODY",
    "HEARTBEAT_TIMEOUT_SECS",
    "STORE_UNAVAILABLE",
    "version_body",
]

log = logging.getLogger("upf_edge.ops")

HEALTH_BODY = b'{"healthy":true}\n'
LBHEARTBEAT_BODY = b"{}\n"
HEARTBEAT_OK_BODY = b'{"status":"ok","store":"ok"}\n'
HEALTH_STORAGE_FULL_BODY = b'{"healthy":false,"storage":"full"}\n'
HEARTBEAT_STORAGE_FULL_BODY = b'{"status":"degraded","store":"ok","storage":"full"}\n'
HEARTBEAT_TIMEOUT_SECS = 2.0
METHOD_NOT_ALLOWED = Problem(40501, 405, "method not allowed")
PATHS = frozenset({"/v1/health", "/__lbheartbeat__", "/__heartbeat__", "/__version__", "/metrics"})

_ALLOW = ((b"allow", b"GET, HEAD"),)


class MetricsAccess(NamedTuple):
    """Who may scrape ``/metrics``: a peer in ``networks`` (UPF_METRICS_ALLOW) whose request carries no
    ``forwarded`` header (a scraper connects directly; a request through a reverse proxy, which adds
    one, is a client's, whatever the proxy's own address). A peer with no address (a Unix socket) is
    local. None in :class:`OpsRoutes`: everyone (tests)."""

    networks: tuple[Network, ...]
    forwarded: bytes

    @classmethod
    def of(cls, settings: Settings) -> MetricsAccess:
        networks = tuple(ipaddress.ip_network(n) for n in settings.metrics_allow)
        return cls(networks, settings.proxy_forwarded_header.lower().encode("latin-1"))

    def allows(self, client: str, headers: Sequence[tuple[bytes, bytes]]) -> bool:
        if any(k == self.forwarded for k, _ in headers):
            return False
        addr = parse_address(client)
        return addr is None or in_networks(addr, self.networks)


class _Version(msgspec.Struct, frozen=True):
    name: str
    version: str


def version_body(name: str, version: str) -> bytes:
    """``/__version__``: ``{"name":"upf-writer","version":"0.1.0"}`` and a newline."""
    return msgspec.json.encode(_Version(name, version)) + b"\n"


class OpsRoutes:
    """The ops endpoints of one role. ``probe`` reads the store (raising, or returning False, when it
    cannot); ``metrics`` renders the process's metrics as ``metrics_content_type`` text. While the
    store refuses writes for lack of space (``storage``, the process's, set by the store driver) both
    health endpoints answer 503 saying so: reads still work, so the read probe alone would say ok."""

    __slots__ = ("_version", "_probe", "_metrics", "_metrics_type", "_timeout", "_storage", "_scrapers")

    def __init__(
        self,
        name: str,
        version: str,
        probe: Callable[[], Awaitable[object]],
        metrics: Callable[[], bytes],
        metrics_content_type: str,
        heartbeat_timeout: float = HEARTBEAT_TIMEOUT_SECS,
        storage: StorageHealth = STORAGE,
        scrapers: MetricsAccess | None = None,
    ) -> None:
        self._version = version_body(name, version)
        self._probe = probe
        self._metrics = metrics
        self._metrics_type = metrics_content_type.encode("ascii")
        self._timeout = heartbeat_timeout
        self._storage = storage
        self._scrapers = scrapers

    def wants(self, method: str, path: str) -> bool:
        return path in PATHS

    def body_limit(self, method: str, topic: str, headers: Sequence[tuple[bytes, bytes]], query: bytes) -> int:
        return NO_BODY

    async def admit(
        self, method: str, topic: str, headers: Sequence[tuple[bytes, bytes]], query: bytes, client: str
    ) -> Reply | None:
        return None  # reads no body: never asked

    async def __call__(
        self,
        method: str,
        topic: str,
        headers: Sequence[tuple[bytes, bytes]],
        query: bytes,
        body: bytes | None,
        client: str,
    ) -> Reply:
        if method != "GET" and method != "HEAD":
            return Reply(405, METHOD_NOT_ALLOWED.body(), _ALLOW)
        if topic == "v1/health":
            if self._storage.degraded():
                return Reply(503, HEALTH_STORAGE_FULL_BODY)
            return Reply(200, HEALTH_BODY)
        if topic == "__lbheartbeat__":
            return Reply(200, LBHEARTBEAT_BODY)
        if topic == "__version__":
            return Reply(200, self._version)
        if topic == "metrics":
            # "metrics" is one of ntfy's disallowed topic names, so this route shadows no topic.
            if self._scrapers is not None and not self._scrapers.allows(client, headers):
                return Reply(404, NOT_FOUND.body())
            return Reply(200, self._metrics(), content_type=self._metrics_type)
        return await self._heartbeat()

    async def _heartbeat(self) -> Reply:
        try:
            ok = await asyncio.wait_for(self._probe(), self._timeout)
        except Exception as exc:
            log.warning("heartbeat failed: store read failed", extra={"error_type": type(exc).__name__})
            ok = False
        if ok is False:
            return Reply(503, STORE_UNAVAILABLE.body())
        if self._storage.degraded():
            return Reply(503, HEARTBEAT_STORAGE_FULL_BODY)
        return Reply(200, HEARTBEAT_OK_BODY)
