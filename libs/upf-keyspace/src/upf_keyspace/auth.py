"""The stored form of users, access tokens and ACL entries, and the snapshot roles cache.

Why here: every writer and pusher of a fleet must agree on who may do what, so these records live in
the keyspace (prefixes AU, AT, AA, AV in keys.py) and nowhere else. Roles never read them per request:
they load an :class:`AuthState` snapshot, watch the auth version key (bumped by every change) and
reload when it moves, so a change made by ``upf user ...`` reaches running servers within moments.

Secrets are stored only as hashes: a password as its bcrypt (or argon2id) string, made above this
library; a token as the SHA-256 digest of the token, so a leaked store holds no usable credential.
Tokens are random (ntfy's ``tk_`` + 29 characters), so an unsalted fast digest is enough for them.

Evolution: fields are only ever added, with defaults (msgspec ignores unknown fields on decode).
"""

from __future__ import annotations

import enum
import hashlib

import msgspec

__all__ = [
    "ROLE_ADMIN",
    "ROLE_USER",
    "ROLES",
    "EVERYONE",
    "Permission",
    "User",
    "Token",
    "Access",
    "AuthState",
    "token_digest",
    "encode_record",
    "decode_user",
    "decode_token",
    "decode_access",
]

ROLE_ADMIN = "admin"
ROLE_USER = "user"
ROLES = (ROLE_ADMIN, ROLE_USER)
EVERYONE = "*"
"""The user name of ACL entries that apply to everyone, anonymous included (ntfy's ``*``)."""


class Permission(str, enum.Enum):
    """ntfy's four permissions, stored by their canonical names."""

    READ_WRITE = "read-write"
    READ_ONLY = "read-only"
    WRITE_ONLY = "write-only"
    DENY = "deny-all"

    @property
    def read(self) -> bool:
        return self in (Permission.READ_WRITE, Permission.READ_ONLY)

    @property
    def write(self) -> bool:
        return self in (Permission.READ_WRITE, Permission.WRITE_ONLY)


class User(msgspec.Struct, frozen=True, kw_only=True):
    role: str
    password_hash: str
    created: int = 0
    provisioned: bool = False
    """Declared in the start-up configuration (re-applied at every start) rather than by the CLI."""


class Token(msgspec.Struct, frozen=True, kw_only=True):
    label: str = ""
    expires: int = 0
    """Unix seconds; 0 never expires."""
    created: int = 0
    hint: str = ""
    """The token's first characters, so a listing can tell tokens apart without holding them."""
    provisioned: bool = False
    origin: str = ""
    """The address it was last used from, else created from through the token API (ntfy's last_origin)."""
    last_access: int = 0
    """Unix seconds of its last use as a process recorded it (``ops.auth.record_token_uses``); 0: none
    since it was made (ntfy's last_access, which starts at its creation)."""


class Access(msgspec.Struct, frozen=True, kw_only=True):
    permission: Permission
    provisioned: bool = False


class AuthState(msgspec.Struct, frozen=True, kw_only=True):
    """Everything a role needs to authenticate and authorise, read in one snapshot."""

    version: int = 0
    users: dict[str, User] = {}
    tokens: dict[str, tuple[str, Token]] = {}
    """digest -> (user, token)."""
    access: list[tuple[str, str, Access]] = []
    """(user or ``*``, pattern, entry), in key order."""

    @property
    def configured(self) -> bool:
        """Whether any user or ACL entry exists (with none, every request is anonymous and allowed
        by the default access alone)."""
        return bool(self.users or self.access)


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


_ENCODER = msgspec.msgpack.Encoder()
_USER = msgspec.msgpack.Decoder(User)
_TOKEN = msgspec.msgpack.Decoder(Token)
_ACCESS = msgspec.msgpack.Decoder(Access)


def encode_record(record: User | Token | Access) -> bytes:
    return _ENCODER.encode(record)


def decode_user(raw: bytes) -> User:
    return _USER.decode(raw)


def decode_token(raw: bytes) -> Token:
    return _TOKEN.decode(raw)


def decode_access(raw: bytes) -> Access:
    return _ACCESS.decode(raw)
