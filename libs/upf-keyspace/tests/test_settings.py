"""UPF_* settings are validated once, with a message that names the variable."""

from __future__ import annotations

import os
import re

import pytest

from upf_keyspace import SettingsError, load_settings


def test_defaults_match_the_design():
    s = load_settings({})
    assert (s.bind_host, s.bind_port) == ("0.0.0.0", 8080)
    assert s.roles == ("writer", "pusher", "janitor")
    assert (s.shard_count, s.max_message_bytes, s.default_ttl_secs) == (64, 4096, 2_419_200)
    assert (s.safety_poll_secs, s.keepalive_secs, s.heartbeat_secs, s.janitor_interval_secs) == (60, 45, 10, 30)
    assert s.node_id and s.store_path == "data/upf.db" and s.fdb_cluster_file == ""
    assert s.workers == (os.cpu_count() or 1)
    assert s.shutdown_grace_secs == 10
    assert s.auth_default_access == "read-write"  # no users, no ACL: as open as before auth existed


def test_a_pusher_on_the_embedded_store_is_the_same_node_when_started_again(tmp_path):
    """Its default id follows the host, the bound address and the store file: a restart after a crash
    owns the old node's records at once. A different port or store is another node; FoundationDB,
    port 0 or a role without the pusher keep a random id; UPF_NODE_ID wins."""
    store = str(tmp_path / "upf.db")
    base = {"UPF_STORE_PATH": store, "UPF_BIND": "127.0.0.1:18080"}
    first = load_settings(base).node_id
    assert load_settings(base).node_id == first and re.fullmatch(r"h[0-9a-f]{15}", first)
    assert load_settings({**base, "UPF_BIND": "127.0.0.1:18081"}).node_id != first
    assert load_settings({**base, "UPF_STORE_PATH": store + "2"}).node_id != first
    for other in ({"UPF_BIND": "127.0.0.1:0"}, {"UPF_ROLES": "writer,janitor"}):
        assert load_settings({**base, **other}).node_id != load_settings({**base, **other}).node_id
    cluster = tmp_path / "fdb.cluster"
    cluster.write_text("x:y@127.0.0.1:4500\n")
    fdb = {**base, "FDB_CLUSTER_FILE": str(cluster)}
    assert load_settings(fdb).node_id != load_settings(fdb).node_id
    assert load_settings({**base, "UPF_NODE_ID": "mine"}).node_id == "mine"


def test_values_are_read():
    s = load_settings(
        {
            "UPF_BIND": "127.0.0.1:9000",
            "UPF_ROLES": "pusher, janitor",
            "UPF_NODE_ID": "p-1",
            "UPF_SHARD_COUNT": "8",
            "UPF_KEEPALIVE_SECS": "2.5",
            "UPF_PUBLIC_URL": "https://x.example/",
            "UPF_WORKERS": "3",
            "UPF_AUTH_DEFAULT_ACCESS": "deny-all",
            "UPF_SHUTDOWN_GRACE_SECS": "2.5",
        }
    )
    assert (s.bind_host, s.bind_port, s.roles, s.node_id) == ("127.0.0.1", 9000, ("pusher", "janitor"), "p-1")
    assert (s.shard_count, s.keepalive_secs, s.public_url, s.workers) == (8, 2.5, "https://x.example", 3)
    assert s.auth_default_access == "deny-all"
    assert s.shutdown_grace_secs == 2.5


@pytest.mark.parametrize(
    "name, value",
    [
        ("UPF_BIND", "8080"),
        ("UPF_BIND", "host:99999"),
        ("UPF_ROLES", "writer,cook"),
        ("UPF_ROLES", ","),
        ("UPF_NODE_ID", "has space"),
        ("UPF_NODE_ID", "n\u00f6de"),  # the message says ASCII: so does the check
        ("UPF_SHARD_COUNT", "0"),
        ("UPF_SHARD_COUNT", "many"),
        ("UPF_MAX_MESSAGE_BYTES", "-1"),
        ("UPF_KEEPALIVE_SECS", "soon"),
        ("UPF_SAFETY_POLL_SECS", "0"),
        ("UPF_PUBLIC_URL", "ftp://x"),
        ("UPF_WORKERS", "0"),
        ("UPF_WORKERS", "two"),
        ("UPF_SHUTDOWN_GRACE_SECS", "0"),
        ("UPF_SHUTDOWN_GRACE_SECS", "forever"),
        ("UPF_AUTH_DEFAULT_ACCESS", "rw-ish"),
        ("FDB_CLUSTER_FILE", "/nonexistent/fdb.cluster"),
        ("UPF_LIMIT_EXEMPT", "10.0.0.300"),
        ("UPF_LIMIT_EXEMPT", "10.0.0.0/33"),
        ("UPF_LIMIT_EXEMPT", "not a host"),
        ("UPF_LIMIT_EXEMPT", "no-such-host.invalid"),
        ("UPF_LIMIT_REQUEST_BURST", "0"),
        ("UPF_LIMIT_REQUEST_BURST", "lots"),
        ("UPF_LIMIT_REQUEST_REFILL_SECS", "0"),
        ("UPF_LIMIT_REQUEST_REFILL_SECS", "-5"),
        ("UPF_VISITOR_PREFIX_BITS_IPV4", "33"),
        ("UPF_VISITOR_PREFIX_BITS_IPV6", "0"),
        ("UPF_PROXY_TRUSTED", "proxy!"),
        ("UPF_PROXY_FORWARDED_HEADER", "X Forwarded"),
        ("UPF_VAPID_VERIFY", "yes"),
        ("UPF_VAPID_RESTRICT", "2"),
        ("UPF_WORKER_WATCHDOG_SECS", "0.5"),  # no worker beats that often: all killed in a loop
        ("UPF_WORKER_WATCHDOG_SECS", "-1"),
    ],
)
def test_bad_values_name_the_variable(name, value):
    with pytest.raises(SettingsError) as info:
        load_settings({name: value})
    assert name in str(info.value)


def test_input_bounds_default_read_and_validated():
    """UPF_MAX_TOPICS_PER_SUBSCRIBE (128) and UPF_MAX_FIELD_BYTES (1024): read, and refused out of range."""
    s = load_settings({})
    assert (s.max_topics_per_subscribe, s.max_field_bytes) == (128, 1024)
    s = load_settings({"UPF_MAX_TOPICS_PER_SUBSCRIBE": "3", "UPF_MAX_FIELD_BYTES": "200"})
    assert (s.max_topics_per_subscribe, s.max_field_bytes) == (3, 200)
    for name, value in (
        ("UPF_MAX_TOPICS_PER_SUBSCRIBE", "0"),
        ("UPF_MAX_FIELD_BYTES", "0"),
        ("UPF_MAX_FIELD_BYTES", "x"),
    ):
        with pytest.raises(SettingsError, match=name):
            load_settings({name: value})


def test_request_limit_settings():
    """ntfy's defaults; loopback exempt unless told otherwise; set and empty exempts nothing; IPs,
    ranges and host names all become networks."""
    s = load_settings({})
    assert (s.limit_request_burst, s.limit_request_refill_secs) == (60, 5.0)
    assert s.limit_exempt == ("127.0.0.0/8", "::1/128") and s.proxy_trusted == ()
    assert s.proxy_forwarded_header == "X-Forwarded-For"
    assert (s.visitor_prefix_bits_ipv4, s.visitor_prefix_bits_ipv6) == (32, 64)
    s = load_settings(
        {
            "UPF_LIMIT_EXEMPT": "",
            "UPF_PROXY_TRUSTED": "10.1.2.3, fd00::/8,localhost",
            "UPF_LIMIT_REQUEST_BURST": "5",
            "UPF_LIMIT_REQUEST_REFILL_SECS": "0.5",
            "UPF_PROXY_FORWARDED_HEADER": "X-Real-IP",
        }
    )
    assert s.limit_exempt == () and (s.limit_request_burst, s.limit_request_refill_secs) == (5, 0.5)
    assert s.proxy_trusted[:2] == ("10.1.2.3/32", "fd00::/8") and "127.0.0.1/32" in s.proxy_trusted
    assert s.proxy_forwarded_header == "X-Real-IP"


def test_vapid_settings_default_permissive_and_read():
    assert not load_settings({}).vapid_verify and not load_settings({}).vapid_restrict
    on = load_settings({"UPF_VAPID_VERIFY": "1", "UPF_VAPID_RESTRICT": "1"})
    assert on.vapid_verify and on.vapid_restrict


def test_each_setting_is_declared_once_and_documented():
    """Every Settings field says how it is read (settings.var), numbers with their bounds; each variable
    is a row of the README's settings table. Only UPF_BIND feeds two fields (host and port)."""
    from pathlib import Path

    from upf_keyspace.settings import Settings, _declared, _int, _secs

    fields = _declared()
    assert [f.attr for f in fields] == list(Settings.__struct_fields__)
    names = [f.name for f in fields]
    assert [n for n in names if names.count(n) > 1] == ["UPF_BIND", "UPF_BIND"]
    assert all(f.ge is not None and f.le is not None for f in fields if f.convert in (_int, _secs))
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    rows = set(re.findall(r"^\| `([A-Z0-9_]+)` \|", readme, re.M))
    assert [n for n in names if n not in rows] == []


@pytest.mark.parametrize(
    "name, value", [("UPF_SHARD_COUNT", "4097"), ("UPF_SAFETY_POLL_SECS", "nan"), ("UPF_BIND", "")]
)
def test_bounds_and_blank_values_keep_their_messages(name, value):
    """The messages the loader gave before settings were declared once, word for word."""
    expected = {
        "UPF_SHARD_COUNT": "UPF_SHARD_COUNT must be between 1 and 4096, got 4097",
        "UPF_SAFETY_POLL_SECS": "UPF_SAFETY_POLL_SECS must be between 0.05 and 86400, got nan",
        "UPF_BIND": "UPF_BIND must be HOST:PORT, got ''",
    }[name]
    with pytest.raises(SettingsError) as info:
        load_settings({name: value})
    assert str(info.value) == expected


@pytest.mark.parametrize(
    "name, value",
    [
        ("UPF_EMBEDDED_MAX_BYTES", "lots"),
        ("UPF_EMBEDDED_MAX_BYTES", "-5"),
        ("UPF_EMBEDDED_MAX_BYTES", "4096"),  # could not hold a new store's own records
        ("UPF_EMBEDDED_MAX_BYTES", "99999999999999999999"),  # its map would overflow
        ("UPF_EMBEDDED_MAX_BYTES", "100000000000000"),  # its map would outgrow the address space
        ("UPF_EMBEDDED_COMMIT_WAIT_MS", "1.5"),
        ("UPF_EMBEDDED_COMMIT_WAIT_MS", "101"),
        ("UPF_EMBEDDED_COMMIT_WAIT_MS", "soon"),
        ("UPF_EMBEDDED_COMMIT_WAIT_MS", "\u00b2"),  # a digit to str.isdigit, not to int
        ("UPF_EMBEDDED_WAKE_PACE_MS", "101"),
        ("UPF_EMBEDDED_WAKE_PACE_MS", "-1"),
        ("UPF_EMBEDDED_WAKE_PACE_MS", "2.5"),
        ("UPF_EMBEDDED_WAKE_PACE_MS", "\u00b2"),
        ("UPF_EMBEDDED_MAX_BYTES", "\u00b2"),
    ],
)
def test_the_embedded_drivers_own_variables_stop_a_start_with_their_names(name, value):
    """Read where the store opens, but checked with the settings: a bad one stops the start (upf exits
    2 naming it) instead of failing every process that opens the store."""
    with pytest.raises(SettingsError, match=name):
        load_settings({name: value})


def test_the_embedded_drivers_own_variables_read_as_documented():
    from upf_keyspace.settings import embedded_commit_wait_ms, embedded_max_bytes, embedded_wake_pace_ms

    assert embedded_max_bytes({}) == 0 and embedded_max_bytes({"UPF_EMBEDDED_MAX_BYTES": " 131072 "}) == 131072
    assert embedded_commit_wait_ms({}) is None and embedded_commit_wait_ms({"UPF_EMBEDDED_COMMIT_WAIT_MS": ""}) is None
    assert embedded_commit_wait_ms({"UPF_EMBEDDED_COMMIT_WAIT_MS": "0"}) == 0
    assert embedded_commit_wait_ms({"UPF_EMBEDDED_COMMIT_WAIT_MS": "100"}) == 100
    assert embedded_wake_pace_ms({}) is None and embedded_wake_pace_ms({"UPF_EMBEDDED_WAKE_PACE_MS": " "}) is None
    assert embedded_wake_pace_ms({"UPF_EMBEDDED_WAKE_PACE_MS": "0"}) == 0
    assert embedded_wake_pace_ms({"UPF_EMBEDDED_WAKE_PACE_MS": " 100 "}) == 100


def test_a_bad_log_level_is_a_settings_error_not_a_traceback():
    """UPF_LOG_LEVEL was read by logging alone: 'verbose' crashed every role with a ValueError."""
    assert load_settings({"UPF_LOG_LEVEL": " debug "}).log_level == "DEBUG"
    with pytest.raises(SettingsError, match="UPF_LOG_LEVEL must be one of"):
        load_settings({"UPF_LOG_LEVEL": "verbose"})
