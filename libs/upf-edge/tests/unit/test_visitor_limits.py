"""The limiter's other limits over an in-memory store: failed logins (42909: charged only on a 401,
checked only when credentials are presented, a block remembered locally), the daily message quota
(42908: leased, honest Retry-After to the next UTC midnight), open subscriptions (42903) and the
RateLimit headers of an admitted request."""

from __future__ import annotations

import asyncio
import base64
import ipaddress

import pytest

from upf_edge import limiter as limiter_module
from upf_edge.access import UNAUTHORIZED, hash_password
from upf_edge.errors import STORE_UNAVAILABLE, NtfyError
from upf_edge.gate import AccessGate
from upf_edge.limiter import RequestLimiter, presents_credentials
from upf_edge.limits import (
    NO_SUBSCRIBER,
    TOO_MANY_AUTH_FAILURES,
    TOO_MANY_MESSAGES,
    TOO_MANY_SUBSCRIPTIONS,
    TOO_MANY_TOPICS,
    LimitConfig,
    success_headers,
)
from upf_keyspace import StoreError, errors
from upf_keyspace.auth import AuthState, User
from upf_keyspace.limits import Bucket, Failure, Lease, fail, take, take_count


class FakeStore:
    """The store's limit transactions on dicts; counts the calls."""

    def __init__(self) -> None:
        self.buckets: dict[str, Bucket] = {}
        self.failures: dict[str, Bucket] = {}
        self.days: dict[tuple[str, int], int] = {}
        self.subs: dict[tuple[str, str], int] = {}
        self.calls = 0

    async def lease_tokens(self, visitor: str, want: int, now: float, burst: int, refill_secs: float) -> Lease:
        bucket, lease = take(self.buckets.get(visitor), want, now, burst, refill_secs)
        if lease.granted:
            self.buckets[visitor] = bucket
        return lease

    async def auth_failure(self, visitor: str, now: float, burst: int, refill_secs: float) -> Failure:
        self.calls += 1
        bucket, failure = fail(self.failures.get(visitor), now, burst, refill_secs)
        if bucket is not None:
            self.failures[visitor] = bucket
        return failure

    async def lease_messages(self, visitor: str, day: int, want: int, limit: int) -> int:
        self.calls += 1
        granted = take_count(self.days.get((visitor, day), 0), want, limit)
        self.days[(visitor, day)] = self.days.get((visitor, day), 0) + granted
        return granted

    async def open_subscription(self, visitor: str, node: str, limit: int) -> int | None:
        total = sum(n for (v, _), n in self.subs.items() if v == visitor)
        if total >= limit:
            return None
        self.subs[(visitor, node)] = self.subs.get((visitor, node), 0) + 1
        return total + 1

    async def close_subscription(self, visitor: str, node: str) -> None:
        self.subs[(visitor, node)] -= 1


class Clock:
    def __init__(self, now: float = 86_400 * 100 + 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def limiter(**kw: object) -> tuple[RequestLimiter, FakeStore, Clock]:
    store, clock = FakeStore(), Clock()
    return RequestLimiter(store, LimitConfig(**kw), clock), store, clock  # type: ignore[arg-type]


def gate_with_phil() -> AccessGate:
    gate = AccessGate(None)  # type: ignore[arg-type]  # never started: its state is set below
    gate._install(AuthState(version=1, users={"phil": User(role="user", password_hash=hash_password("pw"))}))
    return gate


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_only_basic_bearer_and_auth_param_are_login_attempts():
    assert presents_credentials("Basic eDp5", None) and presents_credentials("  bearer tk_x", None)
    assert presents_credentials(None, "QmFzaWM")
    for header in (None, "", "vapid t=a,k=b", "WebPush abc", "Basicx"):
        assert not presents_credentials(header, None)


async def test_failures_are_charged_then_42909_for_any_login_until_the_wait_is_over():
    lim, store, clock = limiter(auth_burst=4, auth_refill_secs=60.0)
    gate = gate_with_phil()
    for _ in range(3):
        with pytest.raises(NtfyError) as info:
            await lim.identify(gate, basic("phil", "nope"), None, "192.0.2.1", None)
        assert info.value.problem == UNAUTHORIZED
    assert store.calls == 3
    for header in (basic("phil", "nope"), basic("phil", "pw")):  # the right password too
        with pytest.raises(NtfyError) as info:
            await lim.identify(gate, header, None, "192.0.2.1", None)
        assert info.value.problem == TOO_MANY_AUTH_FAILURES and dict(info.value.headers)[b"retry-after"] == b"1"
    assert store.calls == 3  # a known block costs no transaction
    assert (await lim.identify(gate, None, None, "192.0.2.1", None)).user is None  # anonymous: no login
    assert (await lim.identify(gate, basic("phil", "pw"), None, "192.0.2.2", None)).user == "phil"  # another visitor
    clock.now += 1
    assert (await lim.identify(gate, basic("phil", "pw"), None, "192.0.2.1", None)).user == "phil"  # a success is free
    assert store.calls == 3


async def test_another_processs_block_turns_the_next_failure_into_42909():
    lim, store, clock = limiter(auth_burst=2)
    store.failures["ip:192.0.2.1"] = Bucket(0.5, clock.now)
    with pytest.raises(NtfyError) as info:
        await lim.identify(gate_with_phil(), basic("phil", "nope"), None, "192.0.2.1", None)
    assert info.value.problem == TOO_MANY_AUTH_FAILURES and int(dict(info.value.headers)[b"retry-after"]) == 31


async def test_an_open_gate_is_never_charged():
    lim, store, _ = limiter(exempt=(ipaddress.ip_network("127.0.0.0/8"),))
    open_gate = AccessGate(None, "read-write")  # type: ignore[arg-type]
    open_gate._install(AuthState())
    assert (await lim.identify(open_gate, basic("phil", "nope"), None, "192.0.2.1", None)).user is None
    assert (await lim.identify(open_gate, basic("phil", "nope"), None, "127.0.0.1", None)).user is None
    assert store.calls == 0


async def test_exempt_peers_are_limited_on_failed_logins_as_in_ntfy():
    """ntfy checks AuthAllowed for every visitor: UPF_LIMIT_EXEMPT covers requests and messages, not
    password guessing from an exempt address (loopback behind a same-host proxy, say)."""
    lim, store, _ = limiter(exempt=(ipaddress.ip_network("127.0.0.0/8"),), auth_burst=3)
    gate = gate_with_phil()
    assert lim.visitor(None, "127.0.0.1", None) is None  # still exempt from the request limit
    codes = []
    for i in range(4):
        with pytest.raises(NtfyError) as info:
            await lim.identify(gate, basic("phil", f"guess{i}"), None, "127.0.0.1", None)
        codes.append(info.value.problem.code)
    assert codes == [40101, 40101, 42909, 42909] and set(store.failures) == {"ip:127.0.0.1"}
    with pytest.raises(NtfyError) as info:  # blocked: even the right password
        await lim.identify(gate, basic("phil", "pw"), None, "127.0.0.1", None)
    assert info.value.problem == TOO_MANY_AUTH_FAILURES
    assert (await lim.identify(gate, None, None, "127.0.0.1", None)).user is None  # no login: anonymous
    assert (await lim.identify(gate, basic("phil", "pw"), None, "127.0.0.2", None)).user == "phil"
    assert (await lim.identify(gate, basic("phil", "pw"), None, "/run/upf.sock", None)).user == "phil"  # no IP


def test_a_bare_scheme_is_no_login_attempt():
    """ntfy trims the header before it looks for ``basic `` or ``bearer ``."""
    for header in ("Bearer", "Basic ", " bearer  ", "Basic\t"):
        assert not presents_credentials(header, None)


async def test_the_daily_quota_is_leased_and_refused_until_the_next_utc_midnight():
    lim, store, clock = limiter(messages_daily=250)  # leases of 2
    for _ in range(250):
        await lim.message("ip:192.0.2.1")
    assert store.calls == 125
    clock.now += 600
    with pytest.raises(NtfyError) as info:
        await lim.message("ip:192.0.2.1")
    assert info.value.problem == TOO_MANY_MESSAGES
    assert int(dict(info.value.headers)[b"retry-after"]) == 86_400 - 1600
    with pytest.raises(NtfyError):
        await lim.message("ip:192.0.2.1")
    assert store.calls == 126  # the refusal is remembered
    await lim.message(None)  # exempt
    clock.now += 86_400 - 1600  # midnight: a new day's quota
    await lim.message("ip:192.0.2.1")


class SlowStore(FakeStore):
    """A store whose message lease suspends, as a real transaction does."""

    async def lease_messages(self, visitor: str, day: int, want: int, limit: int) -> int:
        await asyncio.sleep(0)
        return await super().lease_messages(visitor, day, want, limit)


async def test_concurrent_publishes_share_one_message_lease():
    store, clock = SlowStore(), Clock()
    lim = RequestLimiter(store, LimitConfig(messages_daily=5000), clock)  # type: ignore[arg-type]  # leases of 50
    await asyncio.gather(*(lim.message("ip:192.0.2.1") for _ in range(64)))
    assert store.calls == 2  # one lease, then one for the 14 it did not cover
    assert sum(store.days.values()) == 113  # the fleet's count: 50, then 50 more and 13 for the waiting, 49 unspent


async def test_concurrent_publishes_get_the_daily_quota_exactly():
    store, clock = SlowStore(), Clock()
    lim = RequestLimiter(store, LimitConfig(messages_daily=250), clock)  # type: ignore[arg-type]  # leases of 2
    results = await asyncio.gather(*(lim.message("ip:192.0.2.1") for _ in range(300)), return_exceptions=True)
    refused = [r for r in results if isinstance(r, NtfyError)]
    assert len(results) - len(refused) == 250
    assert all(r.problem == TOO_MANY_MESSAGES for r in refused) and len(refused) == 50


class TimedStore(FakeStore):
    """A store that records each message lease's ask and whose lease takes ``commit_secs`` of the clock."""

    def __init__(self, clock: Clock, commit_secs: float = 0.0) -> None:
        super().__init__()
        self.clock = clock
        self.commit_secs = commit_secs
        self.wants: list[int] = []

    async def lease_messages(self, visitor: str, day: int, want: int, limit: int) -> int:
        self.wants.append(want)
        self.clock.now += self.commit_secs
        return await super().lease_messages(visitor, day, want, limit)


async def spend(lim: RequestLimiter, clock: Clock, count: int, secs: float) -> None:
    """``count`` publishes of one visitor, then ``secs`` of the clock (binary fractions: exact sums)."""
    for _ in range(count):
        await lim.message("ip:192.0.2.1")
    clock.now += secs


async def test_a_fast_visitors_message_lease_lasts_about_a_second_at_its_pace():
    clock = Clock()
    store = TimedStore(clock, commit_secs=1 / 64)  # each lease commits in ~16 ms
    lim = RequestLimiter(store, LimitConfig(messages_daily=1_000_000), clock)  # type: ignore[arg-type]  # 50 to 10,000
    await spend(lim, clock, 50, 1 / 64)  # the first lease: 50, gone 1/64 s after it landed
    await spend(lim, clock, 3200, 8)  # timed from the grant, not the ask: 3,200/s, not 1,600/s
    await spend(lim, clock, 400, 1024)  # those 3,200 lasted 8 s: 400/s
    await spend(lim, clock, 1, 0)  # 400 over 1,024 s is slow: back to 50
    assert store.wants == [50, 3200, 400, 50]


async def test_a_message_lease_is_at_most_a_hundredth_of_the_daily_quota():
    clock = Clock()
    store = TimedStore(clock)
    lim = RequestLimiter(store, LimitConfig(messages_daily=100_000), clock)  # type: ignore[arg-type]
    await spend(lim, clock, 1051, 0.0)  # every lease spent at once
    assert store.wants == [50, 1000, 1000]
    assert LimitConfig().message_want(50, 0.0) == 172  # ntfy's default quota, 17,280 a day
    assert LimitConfig(messages_daily=5).message_want(1, 0.0) == 1


async def test_growing_message_leases_of_two_processes_give_the_daily_quota_exactly():
    store, clock = SlowStore(), Clock()
    config = LimitConfig(messages_daily=20_000)  # leases of 50 to 200
    a, b = (RequestLimiter(store, config, clock) for _ in range(2))  # type: ignore[arg-type]
    results = await asyncio.gather(
        *(lim.message("ip:192.0.2.1") for _ in range(12_000) for lim in (a, b)), return_exceptions=True
    )
    refused = [r for r in results if isinstance(r, NtfyError)]
    assert all(r.problem == TOO_MANY_MESSAGES for r in refused)
    assert sum(store.days.values()) == 20_000  # the fleet never leases past the quota
    admitted = len(results) - len(refused)  # short of it by what the other process holds unspent
    assert 20_000 - config.message_lease_max <= admitted <= 20_000
    assert store.calls < 200  # leases grew past 50 (400 calls at 50 each)


class FailingStore(SlowStore):
    """A store whose message leases fail until ``fail`` is cleared."""

    fail = True

    async def lease_messages(self, visitor: str, day: int, want: int, limit: int) -> int:
        if self.fail:
            await asyncio.sleep(0)
            raise OSError("store down")
        return await super().lease_messages(visitor, day, want, limit)


async def test_a_failed_message_lease_is_a_503_for_its_waiters_too_and_the_next_publish_asks_again():
    store, clock = FailingStore(), Clock()
    lim = RequestLimiter(store, LimitConfig(messages_daily=1_000_000), clock)  # type: ignore[arg-type]
    results = await asyncio.gather(*(lim.message("ip:192.0.2.1") for _ in range(5)), return_exceptions=True)
    assert all(isinstance(r, NtfyError) and r.problem == STORE_UNAVAILABLE for r in results)
    assert not lim._message_pending and not lim._message_waiting  # nothing left in flight or counted
    store.fail = False
    await lim.message("ip:192.0.2.1")
    assert sum(store.days.values()) == 50  # a fresh lease of the base size: failures set no pace


def test_ntfys_default_daily_quota_is_a_day_of_request_refills():
    assert LimitConfig().message_limit == 17_280 and LimitConfig().message_lease == 50
    assert LimitConfig(messages_daily=5).message_limit == 5 and LimitConfig(messages_daily=5).message_lease == 1


async def test_subscriptions_are_counted_and_uncounted():
    lim, store, _ = limiter(subscriptions=2)
    await lim.open_subscription("ip:192.0.2.1", "n1")
    await lim.open_subscription("ip:192.0.2.1", "n2")
    with pytest.raises(NtfyError) as info:
        await lim.open_subscription("ip:192.0.2.1", "n1")
    assert info.value.problem == TOO_MANY_SUBSCRIPTIONS and info.value.http == 429
    lim.close_subscription("ip:192.0.2.1", "n1")
    await asyncio.sleep(0)
    await lim.open_subscription("ip:192.0.2.1", "n1")
    await lim.open_subscription(None, "n1")  # exempt: not counted
    assert sum(store.subs.values()) == 2


async def test_a_failed_uncount_is_retried_until_the_store_takes_it(monkeypatch: pytest.MonkeyPatch):
    """A store that fails for a moment does not leave the visitor one subscription short of its limit."""
    monkeypatch.setattr(limiter_module, "UNCOUNT_RETRY_SECS", (0.01, 0.01, 0.01))
    lim, store, _ = limiter(subscriptions=1)
    await lim.open_subscription("ip:192.0.2.1", "n1")
    real, failures = store.close_subscription, [2]

    async def flaky(visitor: str, node: str) -> None:
        if failures[0]:
            failures[0] -= 1
            raise StoreError(errors.NOT_COMMITTED)
        await real(visitor, node)

    store.close_subscription = flaky  # type: ignore[method-assign]
    lim.close_subscription("ip:192.0.2.1", "n1")
    await asyncio.sleep(0.2)
    assert failures == [0] and sum(store.subs.values()) == 0
    await lim.open_subscription("ip:192.0.2.1", "n1")  # the slot is free again


async def test_an_uncount_the_store_never_takes_is_abandoned_after_its_retries(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(limiter_module, "UNCOUNT_RETRY_SECS", (0.01, 0.01))
    lim, store, _ = limiter(subscriptions=1)
    await lim.open_subscription("ip:192.0.2.1", "n1")
    calls = [0]

    async def broken(visitor: str, node: str) -> None:
        calls[0] += 1
        raise StoreError(errors.NOT_COMMITTED)

    store.close_subscription = broken  # type: ignore[method-assign]
    lim.close_subscription("ip:192.0.2.1", "n1")
    await asyncio.sleep(0.2)
    assert calls == [3] and not lim._tasks  # the first try and two retries, then no task left


async def test_an_admitted_request_carries_what_its_bucket_holds():
    lim, _, _ = limiter(burst=20, refill_secs=5.0)
    assert lim.headers(None) == ()
    await lim.check("ip:192.0.2.1")  # leases 2: one spent, one held, 18 left in the bucket
    assert dict(lim.headers("ip:192.0.2.1")) == {
        b"ratelimit-policy": b"20;w=100",
        b"ratelimit": b"limit=20, remaining=19, reset=5",
    }
    await lim.check("ip:192.0.2.1")
    assert dict(lim.headers("ip:192.0.2.1"))[b"ratelimit"] == b"limit=20, remaining=18, reset=10"
    assert dict(success_headers(LimitConfig(burst=60), 99))[b"ratelimit"] == b"limit=60, remaining=60, reset=0"


class RateStore(FakeStore):
    def __init__(self) -> None:
        super().__init__()
        self.rates: dict[str, str] = {}
        self.reads = self.writes = 0

    async def set_rate_visitors(self, topics: list[str], visitor: str, now: float) -> None:
        self.writes += 1
        self.rates.update(dict.fromkeys(topics, visitor))

    async def rate_visitor(self, topic: str, now: float) -> str | None:
        self.reads += 1
        return self.rates.get(topic)


async def test_a_unifiedpush_topics_publishes_are_charged_to_its_subscriber():
    store, clock = RateStore(), Clock()
    lim = RequestLimiter(store, LimitConfig(subscriber_rate=True), clock)  # type: ignore[arg-type]
    with pytest.raises(NtfyError) as info:
        await lim.require_subscriber("upRateTopic001", True)
    assert info.value.problem == NO_SUBSCRIBER and info.value.http == 507
    await lim.require_subscriber("upRateTopic001", False)  # not a UnifiedPush publish
    await lim.require_subscriber("upRateTopic01", True)  # not UnifiedPush's shape (13 characters)
    assert lim.wants_rates(["x", "upRateTopic001"]) and not lim.wants_rates(["upShort"])
    clock.now += 10  # past the cached absence
    await lim.set_rate_visitors(["upRateTopic001", "news"], "ip:192.0.2.1")
    assert store.rates == {"upRateTopic001": "ip:192.0.2.1"}
    await lim.set_rate_visitors(["upRateTopic001"], "ip:192.0.2.1")
    assert store.writes == 1  # the same subscriber again: no rewrite
    assert await lim.publisher("ip:203.0.113.9", "upRateTopic001") == "ip:192.0.2.1"
    assert await lim.publisher("ip:203.0.113.9", "news") == "ip:203.0.113.9"
    assert await lim.publisher(None, "upRateTopic001") is None  # an exempt publisher stays exempt
    await lim.require_subscriber("upRateTopic001", True)
    reads = store.reads
    for _ in range(10):
        await lim.publisher("ip:203.0.113.9", "upRateTopic001")
    assert store.reads == reads  # cached


async def test_with_the_mode_off_nothing_changes_and_nothing_is_read():
    store, clock = RateStore(), Clock()
    lim = RequestLimiter(store, LimitConfig(), clock)  # type: ignore[arg-type]
    await lim.require_subscriber("upRateTopic001", True)
    assert await lim.publisher("ip:203.0.113.9", "upRateTopic001") == "ip:203.0.113.9"
    assert not lim.wants_rates(["upRateTopic001"]) and store.reads == 0


class TopicStore(FakeStore):
    def __init__(self) -> None:
        super().__init__()
        self.active: set[str] = set()

    async def touch_topics(self, topics: list[str], now: int, limit: int) -> bool:
        self.calls += 1
        new = set(topics) - self.active
        if new and len(self.active) + len(new) > limit:
            return False
        self.active |= new
        return True


async def test_new_topics_past_the_fleets_cap_get_42904_and_known_ones_cost_nothing():
    store, clock = TopicStore(), Clock()
    lim = RequestLimiter(store, LimitConfig(total_topics=2), clock)  # type: ignore[arg-type]
    await lim.touch_topics(["a", "b"], "ip:192.0.2.1")
    with pytest.raises(NtfyError) as info:
        await lim.touch_topics(["c"], "ip:192.0.2.1")
    assert info.value.problem == TOO_MANY_TOPICS and info.value.http == 429
    calls = store.calls
    await lim.touch_topics(["a"], "ip:192.0.2.2")
    await lim.touch_topics(["c"], None)  # exempt: not counted, not refused
    assert store.calls == calls
    clock.now += 3601  # known topics are marked active again once an hour
    await lim.touch_topics(["a"], "ip:192.0.2.2")
    assert store.calls == calls + 1


class BoundStore(TopicStore):
    def __init__(self) -> None:
        super().__init__()
        self.stored = 0

    async def stored_bytes(self) -> int:
        self.calls += 1
        return self.stored


async def test_a_publish_settles_locally_only_when_no_check_could_refuse_or_ask_the_store():
    store, clock = BoundStore(), Clock()
    lim = RequestLimiter(store, LimitConfig(messages_daily=250, max_store_bytes=1000), clock)  # type: ignore[arg-type]
    v = "ip:192.0.2.1"
    assert not lim.publish_local(None, "a")  # the storage bound was never read
    await lim.admit_publish(None, "a", True)
    assert lim.publish_local(None, "a") and store.calls == 1  # exempt: only the bound is checked
    assert not lim.publish_local(v, "a")  # no message leased yet
    await lim.admit_publish(v, "a", True)  # leases 2 messages, spends 1, marks "a"
    assert (store.calls, lim._messages[v][0]) == (3, 1)
    assert not lim.publish_local(v, "b")  # a topic not marked active: nothing spent
    assert lim._messages[v][0] == 1
    assert lim.publish_local(v, "a") and lim._messages[v][0] == 0 and store.calls == 3
    assert not lim.publish_local(v, "a")  # the lease is used up
    clock.now += 2  # the bound's reading is stale: the store is asked again
    assert not lim.publish_local(None, "a")
    store.stored = 1000
    with pytest.raises(NtfyError) as info:
        await lim.admit_publish(None, "a", True)
    assert info.value.http == 507
    assert not lim.publish_local(None, "a")  # at the bound: refused by admit_publish, never here
    on = RequestLimiter(store, LimitConfig(subscriber_rate=True), clock)  # type: ignore[arg-type]
    assert not on.publish_local(None, "a")  # the subscriber mode may ask the store


def test_a_known_peers_visitor_comes_from_the_cache_and_matches_a_fresh_one():
    cached, _, _ = limiter(prefix6=48)
    for peer in ("192.0.2.7", "2001:db8:1:2::5", "::ffff:198.51.100.1"):
        for user in (None, "phil", None, "phil"):  # the second round is served from the cache
            fresh, _, _ = limiter(prefix6=48)
            assert cached.visitor(user, peer, None) == fresh.visitor(user, peer, None)
    assert cached.visitor(None, "2001:db8:1:3::9", None) == "ip:2001:db8:1::"
    assert cached.visitor(None, "not-an-ip", None) is None
