"""Users, ACL entries and tokens declared in the environment, applied at start (ntfy's ``auth-users``,
``auth-access`` and ``auth-tokens``).

Why: a deployment described by files (compose, a Helm chart) should not need a ``upf user add`` run by
hand. Declared records are marked provisioned; each start makes the store match the declaration:
records declared are written, provisioned records no longer declared are removed, and records made
with the CLI are left alone. A declared token has one owner: moving it to another user takes it from
the first. Every role of a fleet that has a declaration applies it (so those must carry the same
one); a role with none changes nothing (``AccessGate.start``), so the records never depend on which
role of a split deployment started last.

Formats (comma-separated entries, as ntfy's lists):
- ``UPF_AUTH_USERS``: ``name:bcrypt-hash:role`` (a hash, never a password: ``upf`` prints none)
- ``UPF_AUTH_ACCESS``: ``name-or-*:pattern:permission``
- ``UPF_AUTH_TOKENS``: ``name:tk_...[:label]``
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import msgspec

from upf_keyspace import SettingsError, Store
from upf_keyspace.auth import EVERYONE, ROLES, Access, Permission, Token, User, token_digest
from upf_keyspace.ops import auth as auth_ops

from .access import parse_permission, valid_password_hash, valid_pattern, valid_token, valid_user_name

__all__ = ["Provisioning", "load_provisioning", "apply_provisioning"]


class Provisioning(msgspec.Struct, frozen=True):
    users: dict[str, User] = {}
    access: dict[tuple[str, str], Permission] = {}
    tokens: dict[str, tuple[str, Token]] = {}
    """digest -> (user, token)."""

    @property
    def empty(self) -> bool:
        return not (self.users or self.access or self.tokens)


def _entries(env: Mapping[str, str], name: str) -> list[str]:
    return [e.strip() for e in env.get(name, "").split(",") if e.strip()]


def load_provisioning(env: Mapping[str, str] | None = None) -> Provisioning:
    """Parse the three variables; a malformed entry is a SettingsError naming the variable (never
    echoing a hash or token)."""
    env = os.environ if env is None else env
    users: dict[str, User] = {}
    for i, entry in enumerate(_entries(env, "UPF_AUTH_USERS"), 1):
        name, _, rest = entry.partition(":")
        hash_, _, role = rest.rpartition(":")
        if not valid_user_name(name) or not valid_password_hash(hash_) or role not in ROLES:
            raise SettingsError(
                f"UPF_AUTH_USERS entry {i} must be name:bcrypt-hash:role (a name of 1-64 of [-_.@+A-Za-z0-9], "
                f"a whole bcrypt hash, role {' or '.join(ROLES)})"
            )
        users[name] = User(role=role, password_hash=hash_, provisioned=True)
    access: dict[tuple[str, str], Permission] = {}
    for i, entry in enumerate(_entries(env, "UPF_AUTH_ACCESS"), 1):
        parts = entry.split(":")
        if len(parts) != 3 or not valid_pattern(parts[1]):
            raise SettingsError(f"UPF_AUTH_ACCESS entry {i} must be user:pattern:permission")
        try:
            permission = parse_permission(parts[2])
        except ValueError as exc:
            raise SettingsError(f"UPF_AUTH_ACCESS entry {i}: {exc}") from None
        if parts[0] != EVERYONE and parts[0] not in users:
            raise SettingsError(f"UPF_AUTH_ACCESS entry {i} names a user UPF_AUTH_USERS does not declare")
        access[(parts[0], parts[1])] = permission
    tokens: dict[str, tuple[str, Token]] = {}
    for i, entry in enumerate(_entries(env, "UPF_AUTH_TOKENS"), 1):
        name, _, rest = entry.partition(":")
        token, _, label = rest.partition(":")
        if name not in users or not valid_token(token):
            raise SettingsError(f"UPF_AUTH_TOKENS entry {i} must be a declared user:tk_... token[:label]")
        tokens[token_digest(token)] = (name, Token(label=label, hint=token[:7], provisioned=True))
    return Provisioning(users=users, access=access, tokens=tokens)


async def apply_provisioning(store: Store, wanted: Provisioning) -> None:
    """Make the store's provisioned records equal ``wanted`` (CLI-made records are untouched). An empty
    ``wanted`` would remove them all: the gate does not apply one (a role with no declaration)."""
    state = await store.auth_state()
    for name, user in state.users.items():
        if user.provisioned and name not in wanted.users:
            await store.delete_user(name)
    for name, user in wanted.users.items():
        current = state.users.get(name)
        if current is None or current.password_hash != user.password_hash or current.role != user.role:
            await store.put_user(name, user)
    for owner, pattern, entry in state.access:
        if entry.provisioned and (owner, pattern) not in wanted.access:
            await store.reset_access(owner, pattern)
    have = {(o, p): e for o, p, e in state.access}
    for (owner, pattern), permission in wanted.access.items():
        if have.get((owner, pattern)) != Access(permission=permission, provisioned=True):
            await store.set_access(owner, pattern, permission, provisioned=True)
    if wanted.tokens or any(token.provisioned for _, token in state.tokens.values()):
        # one transaction over every token record: the state shows one owner per digest, and a digest
        # moved from one user to another must lose every other record, declared or not
        await store.db.transact(auth_ops.provision_tokens, wanted.tokens)
