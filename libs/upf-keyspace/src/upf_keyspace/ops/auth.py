"""Users, tokens and ACL entries: one transaction each, every change bumping the auth version (but
a token's last use, which changes nobody's access).

Roles cache an :class:`~upf_keyspace.auth.AuthState` and watch the version key, so the bump in the
same transaction as the change is what makes a running fleet see it. Ordering rules (ntfy's
precedence) and password hashing live above this library; here only storage and its invariants:
a user's tokens and ACL entries go with the user, and names must exist before they are referenced.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from .. import keys
from ..auth import (
    EVERYONE,
    Access,
    AuthState,
    Permission,
    Token,
    User,
    decode_access,
    decode_token,
    decode_user,
    encode_record,
)
from ..contract import Transaction

__all__ = [
    "NoSuchUser",
    "UserExists",
    "put_user",
    "add_user",
    "get_user",
    "delete_user",
    "list_users",
    "set_access",
    "reset_access",
    "add_token",
    "list_tokens",
    "remove_token",
    "provision_tokens",
    "change_token",
    "record_token_uses",
    "MAX_TOKENS",
    "load_state",
    "version",
]


class NoSuchUser(LookupError):
    """The named user does not exist."""


class UserExists(ValueError):
    """A user of that name exists already."""


def _bump(tr: Transaction) -> None:
    tr.add(keys.auth_version_key(), keys.ONE)


async def get_user(tr: Transaction, name: str) -> User | None:
    raw = await tr.get(keys.user_key(name))
    return None if raw is None else decode_user(raw)


async def add_user(tr: Transaction, name: str, user: User) -> None:
    """Create ``name``; an existing user is an error (change it with ``put_user``)."""
    if await tr.get(keys.user_key(name)) is not None:
        raise UserExists(name)
    await put_user(tr, name, user)


async def put_user(tr: Transaction, name: str, user: User) -> None:
    """Create or replace ``name`` (a password or role change, or provisioning at start)."""
    tr.set(keys.user_key(name), encode_record(user))
    _bump(tr)


async def delete_user(tr: Transaction, name: str) -> None:
    """Remove ``name`` with its tokens and ACL entries, so no credential of it outlives it."""
    if await tr.get(keys.user_key(name)) is None:
        raise NoSuchUser(name)
    tr.clear(keys.user_key(name))
    tr.clear_range(*keys.token_range(name))
    tr.clear_range(*keys.access_range(name))
    _bump(tr)


async def list_users(tr: Transaction) -> dict[str, User]:
    rows = await tr.get_range(*keys.user_range())
    return {keys.unpack_user_key(k): decode_user(v) for k, v in rows}


async def _require_user(tr: Transaction, name: str) -> None:
    if name != EVERYONE and await tr.get(keys.user_key(name)) is None:
        raise NoSuchUser(name)


async def set_access(
    tr: Transaction, name: str, pattern: str, permission: Permission, *, provisioned: bool = False
) -> None:
    """Grant ``permission`` on topics matching ``pattern`` to ``name`` (or ``*``), replacing an entry
    for the same pattern."""
    await _require_user(tr, name)
    tr.set(keys.access_key(name, pattern), encode_record(Access(permission=permission, provisioned=provisioned)))
    _bump(tr)


async def reset_access(tr: Transaction, name: str | None = None, pattern: str | None = None) -> int:
    """Remove ACL entries: every entry (no name), a user's, or one pattern's. Returns how many."""
    if name is None:
        begin, end = keys.access_range()
    elif pattern is None:
        begin, end = keys.access_range(name)
    else:
        begin = keys.access_key(name, pattern)
        end = begin + b"\x00"
    removed = len(await tr.get_range(begin, end))
    if removed:
        tr.clear_range(begin, end)
        _bump(tr)
    return removed


MAX_TOKENS = 60
"""ntfy keeps at most this many tokens per user: creating one more prunes the oldest."""


async def add_token(tr: Transaction, name: str, digest: str, token: Token, *, prune: bool = False) -> None:
    """Store a token (by its digest) for an existing user. With ``prune`` (the token API), the user's
    oldest tokens beyond ``MAX_TOKENS`` go, as in ntfy. Without it (a token given from outside: the
    CLI, provisioning), a record of the same digest held by another user goes: a token has one owner
    (ntfy's token column is unique), else the owner it authenticates as depends on key order. The
    API's token is fresh (~150 random bits), so it skips that read of every token."""
    await _require_user(tr, name)
    if not prune:
        await _clear_other_owners(tr, name, digest)
    tr.set(keys.token_key(name, digest), encode_record(token))
    if prune:
        held = [(t.created, d) for d, t in (await list_tokens(tr, name)).items() if d != digest]
        held.sort()
        for _, old in held[: max(0, len(held) + 1 - MAX_TOKENS)]:
            tr.clear(keys.token_key(name, old))
    _bump(tr)


async def change_token(tr: Transaction, name: str, digest: str, label: str | None, expires: int | None) -> Token | None:
    """Change a token's label and/or expiry (None: keep it); None when the user has no such token."""
    key = keys.token_key(name, digest)
    raw = await tr.get(key)
    if raw is None:
        return None
    token = decode_token(raw)
    if label is not None:
        token = msgspec.structs.replace(token, label=label)
    if expires is not None:
        token = msgspec.structs.replace(token, expires=expires)
    tr.set(key, encode_record(token))
    _bump(tr)
    return token


async def list_tokens(tr: Transaction, name: str) -> dict[str, Token]:
    rows = await tr.get_range(*keys.token_range(name))
    return {keys.unpack_token_key(k)[1]: decode_token(v) for k, v in rows}


async def remove_token(tr: Transaction, name: str, digest: str) -> bool:
    key = keys.token_key(name, digest)
    if await tr.get(key) is None:
        return False
    tr.clear(key)
    _bump(tr)
    return True


async def record_token_uses(tr: Transaction, uses: Mapping[str, tuple[str, int, str]]) -> int:
    """Set each token's last use (digest -> (owner, unix seconds, origin)), as ntfy's batched token
    update does; a token removed meanwhile is skipped. No version bump: a use changes nobody's access,
    and a bump would make every process reload the auth state at each batch. Returns how many changed."""
    changed = 0
    for digest, (name, at, origin) in uses.items():
        key = keys.token_key(name, digest)
        raw = await tr.get(key)
        if raw is None:
            continue
        token = decode_token(raw)
        if at > token.last_access or (at == token.last_access and origin != token.origin):
            tr.set(key, encode_record(msgspec.structs.replace(token, last_access=at, origin=origin)))
            changed += 1
    return changed


def _unused(token: Token) -> Token:
    """``token`` without what its uses wrote (``record_token_uses``): what provisioning declares."""
    if token.last_access or token.origin:
        return msgspec.structs.replace(token, last_access=0, origin="")
    return token


async def _clear_other_owners(tr: Transaction, name: str, digest: str) -> None:
    """Clear every record of ``digest`` held by a user other than ``name``."""
    for k, _ in await tr.get_range(*keys.token_range()):
        user, held = keys.unpack_token_key(k)
        if held == digest and user != name:
            tr.clear(k)


async def provision_tokens(tr: Transaction, wanted: dict[str, tuple[str, Token]]) -> int:
    """Make the provisioned tokens equal ``wanted`` (digest -> (owner, token)) in one transaction: a
    record of a declared digest held by anyone but its declared owner goes (a token moved to another
    user), every record of a digest provisioned and no longer declared goes (whoever holds it), and
    the declared ones are written where they differ. Why here: the auth state keys tokens by digest,
    so it cannot show a digest held twice (a store provisioned before a digest had one owner). Bumps
    the version only on a change (every role applies this at start). Returns how many records changed."""
    changed = 0
    rows = [(k, *keys.unpack_token_key(k), decode_token(v)) for k, v in await tr.get_range(*keys.token_range())]
    undeclared = {digest for _, _, digest, token in rows if token.provisioned and digest not in wanted}
    have: dict[str, Token] = {}  # declared digest -> what its declared owner holds now
    for k, user, digest, token in rows:
        declared = wanted.get(digest)
        if digest in undeclared or (declared is not None and declared[0] != user):
            tr.clear(k)
            changed += 1
        elif declared is not None:
            have[digest] = token
    for digest, (owner, token) in wanted.items():
        held = have.get(digest)
        if held is None or _unused(held) != token:
            if held is not None:  # its uses stay: a restart re-declares the token, it does not renew it
                token = msgspec.structs.replace(token, last_access=held.last_access, origin=held.origin)
            await _require_user(tr, owner)
            tr.set(keys.token_key(owner, digest), encode_record(token))
            changed += 1
    if changed:
        _bump(tr)
    return changed


async def version(tr: Transaction) -> int:
    return keys.unpack_i64(await tr.get(keys.auth_version_key(), snapshot=True))


async def load_state(tr: Transaction) -> AuthState:
    """The whole auth state in one snapshot (snapshot reads: a cache load must not conflict with
    the changes it will see through the version watch anyway)."""
    ver = await version(tr)
    users = {keys.unpack_user_key(k): decode_user(v) for k, v in await tr.get_range(*keys.user_range(), snapshot=True)}
    tokens: dict[str, tuple[str, Token]] = {}
    for k, v in await tr.get_range(*keys.token_range(), snapshot=True):
        user, digest = keys.unpack_token_key(k)
        tokens[digest] = (user, decode_token(v))
    access = [
        (*keys.unpack_access_key(k), decode_access(v))
        for k, v in await tr.get_range(*keys.access_range(), snapshot=True)
    ]
    return AuthState(version=ver, users=users, tokens=tokens, access=access)
