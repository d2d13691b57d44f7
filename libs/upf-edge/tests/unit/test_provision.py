"""Declared users, ACL entries and tokens (UPF_AUTH_USERS/ACCESS/TOKENS): parsing, and a store made to
match them at every start while CLI-made records stay."""

from __future__ import annotations

import pytest

from upf_edge.access import hash_password
from upf_edge.provision import apply_provisioning, load_provisioning
from upf_keyspace import Settings, SettingsError, open_store
from upf_keyspace.auth import EVERYONE, Permission, User, token_digest

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
