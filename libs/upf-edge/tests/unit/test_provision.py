"""Declared users, ACL entries and tokens (UPF_AUTH_USERS/ACCESS/TOKENS): parsing, and a store made to
match them at every start while CLI-made records stay."""

from __future__ import annotations

import pytest

from upf_edge.access import Authorizer, Identity, hash_password
from upf_edge.gate import AccessGate
from upf_edge.provision import apply_provisioning, load_provisioning
from upf_keyspace import Settings, SettingsError, keys, open_store
from upf_keyspace.auth import EVERYONE, Permission, User, encode_record, token_digest

HASH = hash_password("pw")
TOKEN = "tk_" + "p" * 29


@pytest.fixture
async def store(tmp_path):
    s = await open_store(Settings(store_path=str(tmp_path / "upf.db"), shard_count=4))
    yield s
    await s.close()


def env(users: str = "", access: str = "", tokens: str = "") -> dict[str, str]:
    return {"UPF_AUTH_USERS": users, "UPF_AUTH_ACCESS": access, "UPF_AUTH_TOKENS": tokens}


def test_parses_ntfys_list_formats() -> None:
    p = load_provisioning(env(f"phil:{HASH}:admin, ben:{HASH}:user", "ben:up*:rw,*:announce:ro", f"ben:{TOKEN}:CI job"))
    assert {n: u.role for n, u in p.users.items()} == {"phil": "admin", "ben": "user"}
    assert p.access == {("ben", "up*"): Permission.READ_WRITE, (EVERYONE, "announce"): Permission.READ_ONLY}
    assert p.tokens[token_digest(TOKEN)][0] == "ben" and p.tokens[token_digest(TOKEN)][1].label == "CI job"
    assert load_provisioning({}).empty


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("UPF_AUTH_USERS", "phil:plaintext:admin"),
        ("UPF_AUTH_USERS", f"phil:{HASH}:root"),
        ("UPF_AUTH_USERS", f"*:{HASH}:admin"),  # everyone is no user: it would log in as an admin named *
        ("UPF_AUTH_USERS", f"bad name:{HASH}:user"),  # a name the CLI could never remove
        ("UPF_AUTH_USERS", "phil:$2bogus:user"),  # a hash no password matches
        ("UPF_AUTH_USERS", f"phil:{HASH[:-1]}:user"),
        ("UPF_AUTH_ACCESS", "*:a.b:rw"),
        ("UPF_AUTH_ACCESS", "*:t:sudo"),
        ("UPF_AUTH_ACCESS", "ghost:t:rw"),
        ("UPF_AUTH_TOKENS", f"ghost:{TOKEN}"),
        ("UPF_AUTH_TOKENS", "phil:tk_short"),
    ],
)
def test_malformed_entries_name_the_variable_and_echo_no_secret(name: str, value: str) -> None:
    base = env(f"phil:{HASH}:admin")
    base[name] = value
    with pytest.raises(SettingsError) as err:
        load_provisioning(base)
    assert name in str(err.value) and HASH not in str(err.value) and "tk_" not in str(err.value).replace("tk_...", "")


async def test_apply_matches_the_declaration_and_keeps_cli_records(store) -> None:
    await store.add_user("cli-user", User(role="user", password_hash=HASH))
    await store.set_access("cli-user", "mine", Permission.READ_ONLY)
    first = load_provisioning(env(f"phil:{HASH}:admin,ben:{HASH}:user", "ben:up*:rw,*:announce:ro", f"ben:{TOKEN}"))
    await apply_provisioning(store, first)
    await apply_provisioning(store, first)  # idempotent: a second start changes nothing
    state = await store.auth_state()
    assert set(state.users) == {"cli-user", "phil", "ben"}
    assert {(u, p) for u, p, _ in state.access} == {("cli-user", "mine"), ("ben", "up*"), (EVERYONE, "announce")}
    assert token_digest(TOKEN) in state.tokens
    version = state.version
    await apply_provisioning(store, first)
    assert (await store.auth_state()).version == version

    # The next start declares less: the undeclared provisioned records go, the CLI's stay.
    await apply_provisioning(store, load_provisioning(env(f"phil:{HASH}:user")))
    state = await store.auth_state()
    assert set(state.users) == {"cli-user", "phil"} and state.users["phil"].role == "user"
    assert {(u, p) for u, p, _ in state.access} == {("cli-user", "mine")}
    assert state.tokens == {}


async def test_a_token_moved_to_another_user_leaves_the_first(store) -> None:
    """A token has one owner (ntfy's token column is unique): declared for alice after bob, it is
    alice's alone, whatever the key order; undeclared then, it is gone for both."""
    users = f"alice:{HASH}:user,bob:{HASH}:admin"
    await apply_provisioning(store, load_provisioning(env(users, tokens=f"bob:{TOKEN}")))
    for _ in range(2):  # the next starts give it to alice
        await apply_provisioning(store, load_provisioning(env(users, tokens=f"alice:{TOKEN}")))
    assert await store.list_tokens("bob") == {} and set(await store.list_tokens("alice")) == {token_digest(TOKEN)}
    assert Authorizer(await store.auth_state()).identify(f"Bearer {TOKEN}", None) == Identity(
        "alice", token=token_digest(TOKEN)
    )
    await apply_provisioning(store, load_provisioning(env(users)))
    assert await store.list_tokens("alice") == {} and await store.list_tokens("bob") == {}


async def test_every_record_of_an_undeclared_or_moved_token_goes(store) -> None:
    """A store provisioned before a digest had one owner may hold it twice; the state shows one of
    them, so the others must still go when the token moves or is no longer declared."""
    users = f"alice:{HASH}:user,bob:{HASH}:admin,carol:{HASH}:user"
    await apply_provisioning(store, load_provisioning(env(users)))
    digest, record = load_provisioning(env(users, tokens=f"alice:{TOKEN}")).tokens.popitem()

    async def held_twice(tr) -> None:  # type: ignore[no-untyped-def]
        for name in ("alice", "bob"):
            tr.set(keys.token_key(name, digest), encode_record(record[1]))

    await store.db.transact(held_twice)
    await apply_provisioning(store, load_provisioning(env(users, tokens=f"carol:{TOKEN}")))
    assert [set(await store.list_tokens(n)) for n in ("alice", "bob", "carol")] == [set(), set(), {digest}]
    await store.db.transact(held_twice)
    await apply_provisioning(store, load_provisioning(env(users)))
    assert (await store.auth_state()).tokens == {}


async def test_a_role_started_without_a_declaration_leaves_the_declared_records(store, monkeypatch) -> None:
    """Every writer and pusher applies its declaration at start; one started without any (a role not
    given the variables) changes nothing, so the records do not depend on which role started last.
    Emptied declarations are removed with the CLI."""
    first = env(f"root:{HASH}:admin", "*:secret*:rw", f"root:{TOKEN}")
    await apply_provisioning(store, load_provisioning(first))
    version = (await store.auth_state()).version
    for name in first:
        monkeypatch.delenv(name, raising=False)
    gate = AccessGate(store)
    await gate.start()
    await gate.stop()
    state = await store.auth_state()
    assert set(state.users) == {"root"} and [(o, p) for o, p, _ in state.access] == [(EVERYONE, "secret*")]
    assert state.version == version
