"""The request limit's pure core (visitor, exemptions, the client behind a proxy, the 429) and the
leasing limiter over a fake store: leases only when local tokens run out, exempt visitors never ask."""

from __future__ import annotations

import asyncio
import ipaddress

import pytest

from upf_edge.errors import STORE_UNAVAILABLE, NtfyError
from upf_edge.http11 import header_list
from upf_edge.limiter import IDLE_SECS, RequestLimiter
from upf_edge.limits import (
    TOO_MANY_REQUESTS,
    LimitConfig,
    client_address,
    in_networks,
    parse_address,
    refusal,
    visitor_key,
)
from upf_keyspace import load_settings
from upf_keyspace.limits import Bucket, Lease, take

ip = ipaddress.ip_address
net = ipaddress.ip_network


def test_addresses_are_read_leniently_and_mapped_v4_is_v4():
    assert parse_address(" 192.0.2.1 ") == ip("192.0.2.1")
    assert parse_address("[2001:db8::1]") == ip("2001:db8::1")
    assert parse_address("fe80::1%eth0") == ip("fe80::1")
    assert parse_address("::ffff:192.0.2.9") == ip("192.0.2.9")
    assert parse_address("unknown") is None and parse_address("") is None


def test_visitor_is_the_user_else_the_network_prefix():
    assert visitor_key("phil", ip("192.0.2.1")) == "user:phil"
    assert visitor_key(None, ip("192.0.2.1")) == "ip:192.0.2.1"
    assert visitor_key(None, ip("192.0.2.77"), prefix4=24) == "ip:192.0.2.0"
    a, b = ip("2001:db8:1:2:aaaa::1"), ip("2001:db8:1:2:bbbb::2")  # one /64: one visitor
    assert visitor_key(None, a) == visitor_key(None, b) == "ip:2001:db8:1:2::"
    assert visitor_key(None, ip("2001:db8:1:3::1")) != visitor_key(None, a)


def test_networks_match_by_family():
    loop = (net("127.0.0.0/8"), net("::1/128"))
    assert in_networks(ip("127.5.5.5"), loop) and in_networks(ip("::1"), loop)
    assert not in_networks(ip("128.0.0.1"), loop) and not in_networks(ip("::2"), loop)
    assert not in_networks(ip("10.0.0.1"), ())


TRUSTED = (net("10.0.0.0/24"),)


def test_a_forwarded_header_counts_only_from_a_trusted_proxy():
    client = ip("203.0.113.5")
    assert client_address(ip("198.51.100.1"), "1.2.3.4", TRUSTED) == ip("198.51.100.1")  # untrusted peer
    assert client_address(ip("10.0.0.2"), "203.0.113.5", ()) == ip("10.0.0.2")  # nothing trusted
    assert client_address(ip("10.0.0.2"), None, TRUSTED) == ip("10.0.0.2")
    assert client_address(ip("10.0.0.2"), "203.0.113.5", TRUSTED) == client
    # a client's own forged entries stand to the left of what the proxy appended
    assert client_address(ip("10.0.0.2"), "1.1.1.1, 203.0.113.5", TRUSTED) == client
    # a chain of trusted proxies is walked back to the first untrusted hop
    assert client_address(ip("10.0.0.2"), "1.1.1.1, 203.0.113.5, 10.0.0.9", TRUSTED) == client
    assert client_address(ip("10.0.0.2"), "10.0.0.8, 10.0.0.9", TRUSTED) == ip("10.0.0.8")
    assert client_address(ip("10.0.0.2"), "garbage", TRUSTED) == ip("10.0.0.2")


def test_rfc_7239_forwarded_and_v4_with_a_port_are_read():
    """ntfy documents the ``Forwarded`` header beside X-Forwarded-For; its ``for=`` was unreadable, so a
    trusted proxy's own address stood for every client (all exempt when it is on loopback)."""
    assert parse_address("for=192.0.2.60;proto=http;by=203.0.113.43") == ip("192.0.2.60")
    assert parse_address('For="[2001:db8:cafe::17]:4711"') == ip("2001:db8:cafe::17")
    assert parse_address("192.0.2.7:51234") == ip("192.0.2.7")
    assert parse_address("for=unknown") is None and parse_address('for="_hidden"') is None
    forwarded = "for=1.1.1.1, for=203.0.113.5;proto=https"
    assert client_address(ip("10.0.0.2"), forwarded, TRUSTED) == ip("203.0.113.5")


def test_a_forwarded_header_on_several_lines_is_read_as_one_list():
    """HAProxy's ``option forwardfor`` appends a line after the client's own: reading only the first
    line took the client's word for its address (before the fix, 45 wrong passwords from forged
    addresses never met the failed-login limit)."""
    raw = [(b"x-forwarded-for", b"1.1.1.1"), (b"host", b"x"), (b"x-forwarded-for", b"203.0.113.5")]
    assert header_list(raw, "x-forwarded-for") == "1.1.1.1, 203.0.113.5"
    assert header_list(raw, "forwarded") is None
    assert client_address(ip("10.0.0.2"), header_list(raw, "x-forwarded-for"), TRUSTED) == ip("203.0.113.5")


def test_the_refusal_is_ntfys_body_with_an_honest_wait_and_the_drafts_headers():
    err = refusal(LimitConfig(burst=60, refill_secs=5.0), 0)
    assert err.problem == TOO_MANY_REQUESTS and err.problem.body() == (
        b'{"code":42901,"http":429,"error":"limit reached: too many requests",'
        b'"link":"https://ntfy.sh/docs/publish/#limitations"}\n'
    )
    assert dict(err.headers) == {
        b"retry-after": b"1",  # never 0 for a refusal
        b"ratelimit-policy": b"60;w=300",
        b"ratelimit": b"limit=60, remaining=0, reset=1",
    }


def test_config_from_settings():
    c = LimitConfig.from_settings(load_settings({"UPF_PROXY_TRUSTED": "10.0.0.0/24", "UPF_LIMIT_REQUEST_BURST": "5"}))
    assert c.exempt == (net("127.0.0.0/8"), net("::1/128")) and c.trusted == TRUSTED
    assert (c.burst, c.refill_secs, c.header, c.lease_size) == (5, 5.0, "x-forwarded-for", 1)
    assert LimitConfig(burst=60).lease_size == 6


class FakeStore:
    """The store's lease, on one in-memory bucket per visitor; counts the transactions."""

    def __init__(self) -> None:
        self.buckets: dict[str, Bucket] = {}
        self.calls = 0
        self.fail = False

    async def lease_tokens(self, visitor: str, want: int, now: float, burst: int, refill_secs: float) -> Lease:
        self.calls += 1
        if self.fail:
            raise OSError("store down")
        bucket, lease = take(self.buckets.get(visitor), want, now, burst, refill_secs)
        if lease.granted:
            self.buckets[visitor] = bucket
        return lease


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def limiter(burst: int = 60, **kw: object) -> tuple[RequestLimiter, FakeStore, Clock]:
    store, clock = FakeStore(), Clock()
    config = LimitConfig(burst=burst, refill_secs=5.0, exempt=(net("127.0.0.0/8"),), **kw)  # type: ignore[arg-type]
    return RequestLimiter(store, config, clock), store, clock  # type: ignore[arg-type]


async def test_a_burst_is_served_from_leases_then_refused_until_a_token_refills():
    lim, store, clock = limiter(burst=60)
    v = lim.visitor(None, "192.0.2.1", None)
    assert v == "ip:192.0.2.1"
    for _ in range(60):
        await lim.check(v)
    assert store.calls == 10  # one transaction per lease of 6, not one per request
    with pytest.raises(NtfyError) as info:
        await lim.check(v)
    assert info.value.problem == TOO_MANY_REQUESTS and dict(info.value.headers)[b"retry-after"] == b"5"
    clock.now += 5
    await lim.check(v)


async def test_exempt_clients_never_touch_the_store():
    lim, store, _ = limiter(burst=1)
    for _ in range(100):
        assert lim.visitor("phil", "127.0.0.1", None) is None
        await lim.check(None)
    assert store.calls == 0


async def test_a_trusted_proxys_clients_are_separate_visitors_and_loopback_behind_it_is_not_exempt_by_peer():
    lim, _, _ = limiter(trusted=(net("127.0.0.1/32"),))
    assert lim.visitor(None, "127.0.0.1", "203.0.113.5") == "ip:203.0.113.5"
    assert lim.visitor(None, "127.0.0.1", "203.0.113.6") == "ip:203.0.113.6"
    assert lim.visitor(None, "127.0.0.1", None) is None  # the proxy itself (its health checks)
    assert lim.visitor(None, "192.0.2.1", "127.0.0.1") == "ip:192.0.2.1"  # untrusted: header ignored


async def test_idle_visitors_local_tokens_are_dropped():
    lim, store, clock = limiter(burst=60)
    await lim.check("ip:192.0.2.1")  # leases 6, keeps 5
    clock.now += IDLE_SECS + 1
    await lim.check("ip:192.0.2.2")  # a lease sweeps the idle ones
    assert "ip:192.0.2.1" not in lim._local and store.calls == 2


async def test_a_store_that_does_not_answer_is_a_503():
    lim, store, _ = limiter()
    store.fail = True
    with pytest.raises(NtfyError) as info:
        await lim.check("ip:192.0.2.1")
    assert info.value.problem == STORE_UNAVAILABLE


class SlowStore(FakeStore):
    """A lease that takes a moment, so concurrent requests overlap it."""

    async def lease_tokens(self, visitor: str, want: int, now: float, burst: int, refill_secs: float) -> Lease:
        await asyncio.sleep(0.01)
        return await super().lease_tokens(visitor, want, now, burst, refill_secs)


async def test_concurrent_requests_of_one_visitor_share_one_lease():
    """32 requests at once with 60 tokens: all admitted through few leases, none refused because
    the others' leases emptied the bucket into this process; a lease covers the requests waiting on
    the one before it, so the store is asked twice, not once per 6 requests."""
    store, clock = SlowStore(), Clock()
    lim = RequestLimiter(store, LimitConfig(burst=60, refill_secs=5.0), clock)  # type: ignore[arg-type]
    await asyncio.gather(*(lim.check("ip:192.0.2.1") for _ in range(32)))
    assert store.calls == 2  # 6, then 6 + the 25 still waiting
    assert lim._local["ip:192.0.2.1"][0] == 5  # no more left unspent than one plain lease
    await asyncio.gather(*(lim.check("ip:192.0.2.1") for _ in range(28)))
    assert store.buckets["ip:192.0.2.1"].tokens == pytest.approx(0.0)
    with pytest.raises(NtfyError):
        await lim.check("ip:192.0.2.1")


async def test_a_refused_visitor_does_not_ask_the_store_again_before_its_retry_after():
    lim, store, clock = limiter(burst=1)
    await lim.check("ip:192.0.2.1")
    for _ in range(50):
        with pytest.raises(NtfyError) as info:
            await lim.check("ip:192.0.2.1")
    assert store.calls == 2 and dict(info.value.headers)[b"retry-after"] == b"5"
    clock.now += 3
    with pytest.raises(NtfyError) as info:
        await lim.check("ip:192.0.2.1")
    assert store.calls == 2 and dict(info.value.headers)[b"retry-after"] == b"2"
    clock.now += 2
    await lim.check("ip:192.0.2.1")
    assert store.calls == 3
