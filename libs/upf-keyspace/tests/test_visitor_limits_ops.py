"""The other limits of ntfy's visitor, fleet-wide: failed logins (ntfy: burst 30, one back per minute,
a login allowed while more than one token is left), daily message counts (per UTC day) and open
subscriptions counted per (visitor, node) and swept with a dead node; and the token API's store ops."""

from __future__ import annotations

import asyncio

import pytest

from upf_keyspace import keys
from upf_keyspace.auth import Token, User
from upf_keyspace.limits import Bucket, day_of, fail, secs_to_next_day, take_count
from upf_keyspace.ops.auth import MAX_TOKENS


def test_a_visitor_may_fail_29_logins_then_is_blocked_until_its_bucket_holds_more_than_one():
    """ntfy's AuthAllowed is ``tokens > 1``: burst 30 allows 29 failures; the 30th attempt is refused."""
    bucket = None
    for i in range(29):
        bucket, failure = fail(bucket, 1000.0, 30, 60.0)
        assert failure.counted and bool(failure.blocked) == (i == 28), i
    assert bucket is not None and bucket.tokens == pytest.approx(1.0)
    again, refused = fail(bucket, 1000.0, 30, 60.0)
    assert again is None and not refused.counted and refused.blocked == 1  # just past one more token's refill
    _, later = fail(bucket, 1000.0 + refused.blocked, 30, 60.0)
    assert later.counted  # honest: after the announced wait a login is allowed (and this failure blocks again)


def test_a_blocked_visitor_waits_the_whole_refill_from_an_empty_bucket():
    _, failure = fail(Bucket(0.2, 500.0), 500.0, 30, 60.0)
    assert not failure.counted and failure.blocked == 49  # (1 - 0.2) * 60 = 48, then just past it
    _, failure = fail(Bucket(2.0, 500.0), 500.0, 30, 60.0)
    assert failure.counted and failure.blocked == 1


def test_daily_counts_are_per_utc_day_and_capped():
    assert day_of(86_400 * 3 + 5) == 3 and day_of(86_400 * 3 - 1) == 2
    assert secs_to_next_day(86_400 * 3 - 0.5) == 1 and secs_to_next_day(86_400 * 3) == 86_400
    assert take_count(0, 5, 17_280) == 5 and take_count(17_278, 5, 17_280) == 2 and take_count(17_280, 5, 17_280) == 0
    assert take_count(20, 1, 10) == 0  # a lowered limit never grants a negative


def test_the_new_keys_are_their_own_and_round_trip():
    assert keys.unpack_daily_key(keys.daily_key(7, "ip:192.0.2.1")) == (7, "ip:192.0.2.1")
    begin, end = keys.daily_range(8)
    assert begin < keys.daily_key(7, "user:z") < end <= keys.daily_key(8, "ip:a")
    assert keys.unpack_subscription_key(keys.subscription_key("ip:a", "n1")) == ("ip:a", "n1")
    assert keys.unpack_node_subscription_key(keys.node_subscription_key("n1", "ip:a")) == ("n1", "ip:a")
    rs, rsn, rl, rf = (
        keys.subscription_range("ip:a"),
        keys.node_subscription_range(),
        keys.bucket_range(),
        keys.auth_bucket_range(),
    )
    k = keys.node_subscription_key("n1", "ip:a")
    assert not rs[0] <= k < rs[1] and rsn[0] <= k < rsn[1]
    assert not rl[0] <= keys.auth_bucket_key("ip:a") < rl[1] and rf[0] <= keys.auth_bucket_key("ip:a") < rf[1]


async def test_failed_logins_from_two_processes_share_one_bucket(two_stores):
    a, b = two_stores
    results = await asyncio.gather(*(s.auth_failure("ip:192.0.2.9", 100.0, 5, 60.0) for s in (a, b) * 5))
    assert sum(r.counted for r in results) == 4  # burst 5: four failures, then blocked fleet-wide
    assert all(r.blocked for r in results if not r.counted)
    before = await a.db.transact(lambda tr: tr.get(keys.auth_bucket_key("ip:192.0.2.9")))
    assert not (await b.auth_failure("ip:192.0.2.9", 100.0, 5, 60.0)).counted
    assert await a.db.transact(lambda tr: tr.get(keys.auth_bucket_key("ip:192.0.2.9"))) == before  # no write
    assert (await a.sweep_auth_buckets(100_000.0, 5, 60.0)) == (1, None)  # refilled: cleared


async def test_daily_message_leases_never_exceed_the_limit_and_old_days_are_swept(two_stores):
    a, b = two_stores
    grants = await asyncio.gather(*(s.lease_messages("user:phil", 10, 7, 100) for s in (a, b) * 10))
    assert sum(grants) == 100 and await a.lease_messages("user:phil", 10, 7, 100) == 0
    assert await b.lease_messages("user:phil", 11, 7, 100) == 7  # a new day, a new count
    await a.sweep_days(11)
    rows = await a.db.transact(lambda tr: tr.get_range(*keys.daily_range()))
    assert [keys.unpack_daily_key(k) for k, _ in rows] == [(11, "user:phil")]


async def test_open_subscriptions_are_counted_across_nodes_up_to_the_limit(two_stores):
    a, b = two_stores
    opened = await asyncio.gather(*(s.open_subscription("ip:192.0.2.1", n, 5) for s, n in ((a, "n1"), (b, "n2")) * 4))
    assert sorted(o for o in opened if o is not None) == [1, 2, 3, 4, 5] and opened.count(None) == 3
    await a.close_subscription("ip:192.0.2.1", "n1")
    assert await b.open_subscription("ip:192.0.2.1", "n2", 5) == 5
    assert await b.open_subscription("ip:192.0.2.2", "n2", 5) == 1  # another visitor


async def test_a_dead_nodes_counts_are_swept_and_a_live_ones_kept(two_stores):
    a, _ = two_stores
    await a.heartbeat("alive", 1000)
    await a.heartbeat("dead", 900)
    for node in ("alive", "dead", "gone"):  # "gone": no heartbeat record at all
        for visitor in ("ip:192.0.2.1", "ip:192.0.2.2"):
            await a.open_subscription(visitor, node, 30)
    assert await a.stale_subscription_nodes(1000, 30) == ["dead", "gone"]
    assert await a.reset_node_subscriptions("alive", 500, 1000, 30) is None  # alive: kept
    assert await a.reset_node_subscriptions("dead", 500, 1000, 30) == 2
    assert await a.reset_node_subscriptions("gone", 1, 1000, 30) == 1  # in batches
    assert await a.reset_node_subscriptions("gone", 500, 1000, 30) == 1
    assert await a.stale_subscription_nodes(1000, 30) == []
    for visitor in ("ip:192.0.2.1", "ip:192.0.2.2"):
        rows = await a.db.transact(lambda tr, v=visitor: tr.get_range(*keys.subscription_range(v)))
        assert [keys.unpack_subscription_key(k)[1] for k, _ in rows] == ["alive"]
    await a.close_subscription("ip:192.0.2.1", "dead")  # a close after the sweep stays a no-op
    assert await a.open_subscription("ip:192.0.2.1", "alive", 2) == 2


async def test_token_changes_and_ntfys_cap_of_60_tokens(two_stores):
    a, _ = two_stores
    await a.add_user("phil", User(role="user", password_hash="x"))
    for i in range(MAX_TOKENS + 2):
        await a.create_token("phil", f"d{i:03d}", Token(label=f"t{i}", created=1000 + i))
    held = await a.list_tokens("phil")
    assert len(held) == MAX_TOKENS and "d000" not in held and "d001" not in held and "d061" in held
    changed = await a.change_token("phil", "d061", "phone", None)
    assert changed is not None and (changed.label, changed.created) == ("phone", 1061)
    changed = await a.change_token("phil", "d061", None, 5)
    assert changed is not None and (changed.label, changed.expires) == ("phone", 5)
    assert await a.change_token("phil", "nope", "x", None) is None
    assert await a.change_token("nobody", "d061", "x", None) is None


async def test_a_rate_visitor_holds_a_day_after_its_subscribe_or_while_a_node_holds_the_topic(two_stores):
    a, b = two_stores
    assert await a.rate_visitor("upRateTopic001", 1000.0) is None
    await a.set_rate_visitors(["upRateTopic001", "upRateTopic002"], "ip:192.0.2.1", 1000.0)
    await b.set_rate_visitors(["upRateTopic002"], "user:phil", 1001.0)  # the last subscriber wins
    assert await b.rate_visitor("upRateTopic001", 1000.0 + 86_400) == "ip:192.0.2.1"
    assert await b.rate_visitor("upRateTopic002", 1000.0) == "user:phil"
    assert await a.rate_visitor("upRateTopic001", 1001.0 + 86_400) is None  # a day on, nobody holds it
    await a.hold(["upRateTopic002"], "n1")
    assert await a.rate_visitor("upRateTopic002", 1002.0 + 86_400) == "user:phil"  # held: still its
    assert await a.sweep_rate_visitors(1002.0 + 86_400) == (1, None)  # only the unheld one goes
    assert await a.rate_visitor("upRateTopic002", 1002.0 + 86_400) == "user:phil"


async def test_active_topics_are_counted_once_capped_and_expunged_after_16_hours_unless_held(two_stores):
    a, b = two_stores
    assert await a.touch_topics(["t1", "t2"], 1000, 3)
    assert await b.touch_topics(["t2", "t3"], 1000, 3)  # t2 again: counted once
    assert await a.topic_count() == 3
    assert not await b.touch_topics(["t1", "t4"], 1001, 3)  # a new one past the cap: nothing written
    assert await a.topic_count() == 3
    assert await b.touch_topics(["t1"], 5000, 3)  # a known one is fine (and its last use moves)
    await a.hold(["t2"], "n1")
    assert await a.sweep_topics(1000 + 16 * 3600 + 1) == (1, None)  # t3 only: t1 used since, t2 held
    assert await a.topic_count() == 2 and await b.touch_topics(["t4"], 60_000, 3)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("UPF_LIMIT_AUTH_FAILURE_BURST", "0"),
        ("UPF_LIMIT_AUTH_FAILURE_REFILL_SECS", "-1"),
        ("UPF_LIMIT_MESSAGES_DAILY", "-5"),
        ("UPF_LIMIT_MESSAGES_DAILY", "many"),
        ("UPF_LIMIT_SUBSCRIPTIONS", "0"),
        ("UPF_LIMIT_TOTAL_TOPICS", "1.5"),
        ("UPF_LIMIT_SUBSCRIBER_RATE", "maybe"),
    ],
)
def test_bad_limit_settings_stop_the_process_naming_the_variable(name, value):
    from upf_keyspace.settings import SettingsError, load_settings

    with pytest.raises(SettingsError, match=name):
        load_settings({name: value})


def test_limit_settings_defaults_are_ntfys():
    from upf_keyspace.settings import load_settings

    s = load_settings({})
    assert (s.limit_auth_failure_burst, s.limit_auth_failure_refill_secs, s.limit_messages_daily) == (30, 60.0, 0)
    assert (s.limit_subscriptions, s.limit_total_topics, s.limit_subscriber_rate) == (30, 15_000, False)
    assert load_settings({"UPF_LIMIT_SUBSCRIBER_RATE": "on"}).limit_subscriber_rate
