"""Users, tokens and ACL entries in the keyspace: storage invariants and the version a fleet watches."""

from __future__ import annotations

import asyncio

import pytest

from upf_keyspace import keys
from upf_keyspace.auth import EVERYONE, Permission, Token, User, encode_record, token_digest
from upf_keyspace.ops.auth import NoSuchUser, UserExists


@pytest.fixture
async def store(new_store):
    return await new_store(shard_count=4)


embedded_only = pytest.mark.parametrize("new_store", ["embedded"], indirect=True)
"""What the embedded driver keeps in its file (``new_store``'s embedded store is ``upf.db``)."""


ALICE = User(role="user", password_hash="$2b$12$hash-of-alice", created=1)


async def test_empty_store_has_no_auth_configured(store):
    """With nothing configured every role keeps today's open behaviour."""
    state = await store.auth_state()
    assert not state.configured and state.version == 0 and state.users == {} and state.access == []


async def test_users_tokens_and_access_round_trip_in_one_snapshot(store):
    await store.add_user("alice", ALICE)
    digest = token_digest("tk_" + "a" * 29)
    await store.add_token("alice", digest, Token(label="phone", expires=0, created=5, hint="tk_aaa"))
    await store.set_access("alice", "up*", Permission.READ_WRITE)
    await store.set_access(EVERYONE, "announce", Permission.READ_ONLY)
    state = await store.auth_state()
    assert state.configured and state.version == 4
    assert state.users == {"alice": ALICE}
    assert state.tokens[digest][0] == "alice" and state.tokens[digest][1].label == "phone"
    assert [(u, p, a.permission) for u, p, a in state.access] == [
        (EVERYONE, "announce", Permission.READ_ONLY),
        ("alice", "up*", Permission.READ_WRITE),
    ]


@embedded_only
async def test_the_store_never_holds_a_token_or_password_in_clear(store, tmp_path):
    """Only the token's SHA-256 digest is a key; the plain token appears nowhere in the file."""
    token = "tk_" + "s3cr3t" * 4 + "abcde"
    await store.add_user("bob", User(role="user", password_hash="$2b$12$only-a-hash"))
    await store.add_token("bob", token_digest(token), Token(hint=token[:6]))
    await store.close()
    raw = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("upf.db") and p.is_file())
    assert token.encode() not in raw and token_digest(token).encode() in raw


async def test_a_deleted_user_takes_its_tokens_and_acl_entries_along(store):
    await store.add_user("carol", ALICE)
    await store.add_token("carol", "d1", Token())
    await store.set_access("carol", "x*", Permission.WRITE_ONLY)
    await store.delete_user("carol")
    state = await store.auth_state()
    assert state.users == {} and state.tokens == {} and state.access == []
    with pytest.raises(NoSuchUser):
        await store.delete_user("carol")


async def test_names_must_exist_and_be_unique(store):
    with pytest.raises(NoSuchUser):
        await store.set_access("nobody", "t", Permission.READ_ONLY)
    with pytest.raises(NoSuchUser):
        await store.add_token("nobody", "d", Token())
    await store.add_user("dave", ALICE)
    with pytest.raises(UserExists):
        await store.add_user("dave", ALICE)
    await store.put_user("dave", User(role="admin", password_hash="x"))
    assert (await store.get_user("dave")).role == "admin"  # type: ignore[union-attr]


async def test_reset_access_by_pattern_user_or_all(store):
    await store.add_user("erin", ALICE)
    for pattern in ("a", "b*"):
        await store.set_access("erin", pattern, Permission.READ_ONLY)
    await store.set_access(EVERYONE, "c", Permission.DENY)
    assert await store.reset_access("erin", "a") == 1
    assert await store.reset_access("erin", "missing") == 0
    assert await store.reset_access("erin") == 1
    assert await store.reset_access() == 1
    assert (await store.auth_state()).access == []


async def test_remove_token_only_when_it_exists(store):
    await store.add_user("frank", ALICE)
    await store.add_token("frank", "d", Token(label="x"))
    assert list(await store.list_tokens("frank")) == ["d"]
    assert await store.remove_token("frank", "d") is True
    assert await store.remove_token("frank", "d") is False


async def test_a_change_fires_the_auth_watch_of_another_store_handle(store, new_store):
    """Two handles on one store stand for two roles: a CLI change wakes a running role's watch."""
    other = await new_store(shard_count=4)
    try:
        version, watch = await other.watch_auth()
        assert version == 0
        await store.add_user("gina", ALICE)
        await asyncio.wait_for(asyncio.ensure_future(_wait(watch)), 5)
        assert (await other.auth_state()).version == 1
    finally:
        await other.close()


async def _wait(watch) -> None:  # type: ignore[no-untyped-def]
    await watch


def test_auth_keys_round_trip_and_stay_under_their_prefixes():
    assert keys.unpack_user_key(keys.user_key("a:b")) == "a:b"
    assert keys.unpack_token_key(keys.token_key("u", "ff00")) == ("u", "ff00")
    assert keys.unpack_access_key(keys.access_key("*", "up*")) == ("*", "up*")
    begin, end = keys.access_range()
    assert begin < keys.access_key("*", "x") < end and not begin < keys.user_key("x") < end
    ubegin, uend = keys.token_range("u")
    assert ubegin < keys.token_key("u", "d") < uend and not ubegin < keys.token_key("uu", "d") < uend


async def test_a_token_added_for_one_user_is_taken_from_any_other(store):
    """A digest has one owner (ntfy's token column is unique): else which user a token authenticates
    as would depend on the order of the keys."""
    for name in ("alice", "bob"):
        await store.add_user(name, ALICE)
    digest = token_digest("tk_" + "m" * 29)
    await store.add_token("bob", digest, Token(label="first"))
    await store.add_token("alice", digest, Token(label="moved"))
    assert await store.list_tokens("bob") == {}
    assert (await store.auth_state()).tokens[digest] == ("alice", Token(label="moved"))


async def test_provision_tokens_moves_removes_and_keeps_cli_tokens(store):
    """One transaction: a declared digest held by anyone but its owner goes, every record of a
    provisioned digest no longer declared goes, CLI tokens stay, and nothing changed bumps nothing."""
    from upf_keyspace.ops.auth import provision_tokens

    for name in ("alice", "bob"):
        await store.add_user(name, ALICE)
    moved, dropped, cli = (token_digest("tk_" + c * 29) for c in "xyz")
    await store.add_token("bob", cli, Token(label="cli"))

    async def legacy(tr):  # type: ignore[no-untyped-def]  # records of a store from before one owner per digest
        for name in ("alice", "bob"):
            tr.set(keys.token_key(name, moved), encode_record(Token(provisioned=True)))
            tr.set(keys.token_key(name, dropped), encode_record(Token(provisioned=True)))

    await store.db.transact(legacy)
    wanted = {moved: ("alice", Token(label="ci", provisioned=True))}
    assert await store.db.transact(provision_tokens, wanted) == 4  # 3 records cleared, 1 rewritten
    assert await store.list_tokens("alice") == {moved: Token(label="ci", provisioned=True)}
    assert await store.list_tokens("bob") == {cli: Token(label="cli")}
    version = (await store.auth_state()).version
    assert await store.db.transact(provision_tokens, wanted) == 0
    assert (await store.auth_state()).version == version


async def test_a_tokens_uses_are_recorded_without_a_version_bump(store):
    """A use changes nobody's access: no bump (every process would reload the auth state at each
    batch), an older use never overwrites a newer one, a token removed meanwhile stays removed, and a
    provisioned token's uses survive the next start's provisioning, which then changes nothing."""
    from upf_keyspace.ops.auth import provision_tokens

    await store.add_user("alice", ALICE)
    kept, gone = token_digest("tk_" + "u" * 29), token_digest("tk_" + "v" * 29)
    await store.add_token("alice", kept, Token(label="l", created=5, origin="10.0.0.1"))
    version = (await store.auth_state()).version
    uses = {kept: ("alice", 100, "203.0.113.7"), gone: ("alice", 100, "203.0.113.8")}
    assert await store.record_token_uses(uses) == 1
    assert await store.list_tokens("alice") == {
        kept: Token(label="l", created=5, origin="203.0.113.7", last_access=100)
    }
    assert await store.record_token_uses({kept: ("alice", 99, "198.51.100.1")}) == 0  # older: kept
    assert await store.record_token_uses({kept: ("bob", 200, "198.51.100.1")}) == 0  # not bob's
    assert (await store.auth_state()).version == version

    declared = token_digest("tk_" + "w" * 29)
    wanted = {declared: ("alice", Token(label="ci", provisioned=True))}
    await store.db.transact(provision_tokens, wanted)
    await store.record_token_uses({declared: ("alice", 300, "192.0.2.1")})
    version = (await store.auth_state()).version
    assert await store.db.transact(provision_tokens, wanted) == 0 and (await store.auth_state()).version == version
    relabelled = {declared: ("alice", Token(label="ci2", provisioned=True))}
    assert await store.db.transact(provision_tokens, relabelled) == 1
    assert (await store.list_tokens("alice"))[declared] == Token(
        label="ci2", provisioned=True, last_access=300, origin="192.0.2.1"
    )
