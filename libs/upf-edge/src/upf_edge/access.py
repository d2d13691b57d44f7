"""Who is asking, and may they read or write a topic: ntfy's authentication and ACL rules. Pure: the
state comes in as an :class:`~upf_keyspace.auth.AuthState` snapshot, no I/O happens here.

ntfy's rules (ntfy-auth-and-limits.md), kept exactly:
- Credentials come from ``?auth=`` (alias ``?authorization=``: base64url of the whole header value),
  which wins over the ``Authorization`` header. Only ``Basic`` and ``Bearer`` values (the trimmed
  value starting with the scheme and a space) are credentials; a bare ``Bearer``, ``vapid ...`` and
  ``WebPush ...`` (Web Push app servers) are anonymous, never 401.
- A bearer token is ``tk_`` + 29 of [a-z0-9]; Basic with an empty user name carries a token.
- Admins may do everything. Otherwise the entries of the user and of ``*`` whose pattern matches the
  topic (SQLite's LIKE: ASCII case ignored) are ordered (the user's own first, then the longer pattern
  as ntfy stores it, ``_`` escaped as ``\\_``, then the one granting write) and the first decides;
  with none, the default access does.
UPF's choices where ntfy is quirky: an undecodable ``?auth=`` is 400 40094 (a UPF-only code)
(ntfy answers 500), and a credential over 4 KB is refused without being parsed. "Undecodable" is
what ntfy's ``base64.RawURLEncoding`` refuses (padding, a character outside the URL alphabet, a
length of 4n+1), and a value that is not UTF-8.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import re
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

import bcrypt

from upf_keyspace.auth import EVERYONE, ROLE_ADMIN, AuthState, Permission, User, token_digest

from .errors import NtfyError, Problem

__all__ = [
    "UNAUTHORIZED",
    "FORBIDDEN",
    "BAD_AUTH_PARAM",
    "Credentials",
    "Identity",
    "ANONYMOUS",
    "parse_permission",
    "valid_pattern",
    "pattern_matches",
    "valid_token",
    "valid_user_name",
    "valid_password_hash",
    "new_token",
    "parse_credentials",
    "hash_password",
    "Authorizer",
]

_AUTH_DOCS = "https://ntfy.sh/docs/publish/#authentication"
UNAUTHORIZED = Problem(40101, 401, "unauthorized", _AUTH_DOCS)
FORBIDDEN = Problem(40301, 403, "forbidden", _AUTH_DOCS)
BAD_AUTH_PARAM = Problem(40094, 400, "invalid request: auth parameter is not base64url")

MAX_CREDENTIAL_CHARS = 4096
_TOKEN = re.compile(r"tk_[a-z0-9]{29}")
_RAW_URL_B64 = re.compile(r"[A-Za-z0-9_-]*")
_PATTERN = re.compile(r"[-_A-Za-z0-9*]{1,64}")
_USER_NAME = re.compile(r"[-_.@+A-Za-z0-9]{1,64}")
"""ntfy's ``allowedUsernameRegex`` (so never ``*``, everyone), at most 64 characters."""
_BCRYPT = re.compile(r"\$2[abxy]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}")
_PERMISSIONS = {
    "read-write": Permission.READ_WRITE,
    "rw": Permission.READ_WRITE,
    "read-only": Permission.READ_ONLY,
    "read": Permission.READ_ONLY,
    "ro": Permission.READ_ONLY,
    "write-only": Permission.WRITE_ONLY,
    "write": Permission.WRITE_ONLY,
    "wo": Permission.WRITE_ONLY,
    "deny": Permission.DENY,
    "deny-all": Permission.DENY,
    "none": Permission.DENY,
}
_BCRYPT_ROUNDS = 10  # ntfy's cost: ~50-80 ms a check here; verified logins are cached below
_MAX_CACHED = 4096
"""Entries of each of an authorizer's caches (cleared when full: an authorizer lives until the next
auth change, so a busy one must not grow without bound)."""
_MAX_CACHED_DECISIONS = 65_536


def parse_permission(text: str) -> Permission:
    """ntfy's permission names and aliases; anything else is a ValueError naming the choices."""
    try:
        return _PERMISSIONS[text.strip().lower()]
    except KeyError:
        raise ValueError(f"permission must be one of {', '.join(_PERMISSIONS)}, got {text!r}") from None


def valid_pattern(pattern: str) -> bool:
    """A topic name in which ``*`` may stand for any run of characters (ntfy's only wildcard)."""
    return _PATTERN.fullmatch(pattern) is not None


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def _fold(text: str) -> str:
    """ASCII letters lower-cased, nothing else: SQLite's LIKE folds ASCII case only."""
    return text.translate(_ASCII_LOWER)


def pattern_matches(pattern: str, topic: str) -> bool:
    """ntfy's ``topic LIKE pattern ESCAPE '\\'`` (``*`` as ``%``, ``_`` escaped, so literal): ASCII case
    is ignored, as SQLite's LIKE ignores it; topics themselves stay case-sensitive everywhere else."""
    return _matches(_fold(pattern), _fold(topic))


def _pattern_rank(pattern: str) -> int:
    """The length ntfy orders patterns by: that of the stored SQL pattern, where ``_`` is ``\\_``."""
    return len(pattern) + pattern.count("_")


def _matches(pattern: str, topic: str) -> bool:
    """Wildcard matching of an already folded pattern and topic."""
    if "*" not in pattern:
        return pattern == topic
    parts = pattern.split("*")
    if not (topic.startswith(parts[0]) and topic.endswith(parts[-1])) or len(topic) < len(parts[0]) + len(parts[-1]):
        return False
    pos = len(parts[0])
    end = len(topic) - len(parts[-1])
    for part in parts[1:-1]:
        found = topic.find(part, pos, end)
        if found < 0:
            return False
        pos = found + len(part)
    return True


def valid_token(token: str) -> bool:
    return _TOKEN.fullmatch(token) is not None


def valid_user_name(name: str) -> bool:
    return _USER_NAME.fullmatch(name) is not None


def valid_password_hash(stored: str) -> bool:
    """A whole bcrypt hash (``$2b$10$`` and 53 characters): anything less matches no password ever."""
    return _BCRYPT.fullmatch(stored) is not None


def new_token() -> str:
    """A fresh token in ntfy's format (29 random characters of [a-z0-9], ~150 bits)."""
    import secrets

    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    return "tk_" + "".join(secrets.choice(alphabet) for _ in range(29))


def hash_password(password: str) -> str:
    return bcrypt.hashpw(password.encode("utf-8"), bcrypt.gensalt(_BCRYPT_ROUNDS)).decode("ascii")


class Credentials(NamedTuple):
    """What a request presented: nothing (anonymous), a user and password, or a token."""

    user: str | None = None
    password: str | None = None
    token: str | None = None

    @property
    def anonymous(self) -> bool:
        return self.user is None and self.token is None


_NONE = Credentials()


def _decode_auth_param(param: str) -> str:
    """ntfy's ``base64.RawURLEncoding.DecodeString``: the URL alphabet only, no padding, CR and LF
    anywhere ignored, a length of 4n+1 refused (non-zero spare bits are accepted, as Go does). What
    it refuses, or what is not UTF-8, is 400 40094 (ntfy: 500)."""
    param = param.replace("\r", "").replace("\n", "")
    if _RAW_URL_B64.fullmatch(param) is None or len(param) % 4 == 1:
        raise NtfyError(BAD_AUTH_PARAM)
    try:
        return base64.urlsafe_b64decode(param + "=" * (-len(param) % 4)).decode("utf-8")
    except (binascii.Error, ValueError):
        raise NtfyError(BAD_AUTH_PARAM) from None


def parse_credentials(header: str | None, auth_param: str | None) -> Credentials:
    """The credentials of a request (``auth_param`` is ``?auth=``/``?authorization=``, which wins).
    Raises :class:`NtfyError`: 400 for an undecodable ``?auth=``, 401 for a malformed credential."""
    if auth_param is not None and auth_param != "":
        if len(auth_param) > MAX_CREDENTIAL_CHARS:
            raise NtfyError(UNAUTHORIZED)
        param = auth_param.strip()  # ntfy's readQueryParam trims; a blank value is no value
        if param:
            header = _decode_auth_param(param)
    if not header:
        return _NONE
    header = header.strip()  # ntfy trims, then wants the scheme and a space: a bare "Bearer" is anonymous
    scheme, sep, value = header.partition(" ")
    if not sep:
        return _NONE
    scheme = scheme.lower()
    if scheme != "bearer" and scheme != "basic":
        return _NONE  # vapid, WebPush and anything else: anonymous, as ntfy does (never 401), of any length
    if len(header) > MAX_CREDENTIAL_CHARS:
        raise NtfyError(UNAUTHORIZED)
    value = value.strip()
    if scheme == "bearer":
        if not valid_token(value):
            raise NtfyError(UNAUTHORIZED)
        return Credentials(token=value)
    try:  # Basic
        decoded = base64.b64decode(value, validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        raise NtfyError(UNAUTHORIZED) from None
    user, sep, password = decoded.partition(":")
    if not sep:
        raise NtfyError(UNAUTHORIZED)
    if user == "":
        if not valid_token(password):
            raise NtfyError(UNAUTHORIZED)
        return Credentials(token=password)
    return Credentials(user=user, password=password)


_SLOW_DOWN_PASSWORD = b"intentional slow-down to avoid timing attacks"  # ntfy's words


@functools.cache
def _slow_down_hash() -> bytes:
    return bcrypt.hashpw(_SLOW_DOWN_PASSWORD, bcrypt.gensalt(_BCRYPT_ROUNDS))


def _slow_down(password: str) -> None:
    """A name that is no user costs a bcrypt check as a wrong password does (ntfy checks a dummy hash
    too): otherwise the answer's time tells which user names exist."""
    try:
        bcrypt.checkpw(password.encode("utf-8", "surrogatepass"), _slow_down_hash())
    except ValueError:  # a password bcrypt refuses (over 72 bytes in newer releases): as for a user
        pass


class Identity(NamedTuple):
    """Who a request is, once authenticated: ``user`` None is anonymous."""

    user: str | None
    admin: bool = False
    token: str = ""
    """The digest of the token it logged in with ("" for a password or none): its use is recorded."""


ANONYMOUS = Identity(None)


class Authorizer:
    """Authentication and ACL over one :class:`AuthState` (swap it by making a new one: it is cheap).
    Verified passwords are remembered by a digest of (user, password, stored hash), so a client that
    sends Basic auth on every request pays bcrypt once, and a password change invalidates it.
    :meth:`identify` remembers the identity behind each credential that succeeded, and
    :meth:`permission` each decision: both caches belong to this authorizer, so any auth change (a
    new state, a new authorizer) drops them; a failure is never remembered here."""

    __slots__ = ("state", "default", "_verified", "_rules", "_identities", "_decisions")

    def __init__(
        self, state: AuthState, default: Permission = Permission.READ_WRITE, verified: set[bytes] | None = None
    ) -> None:
        self.state = state
        self.default = default
        self._verified: set[bytes] = set() if verified is None else verified
        """Digests of (user, password, stored hash) bcrypt accepted. They stay true in a later state
        (a changed hash makes another digest), so the next authorizer may take them over: re-checking
        open streams at an auth change then costs no bcrypt for passwords that did not change."""
        self._rules: dict[str | None, list[tuple[str, Permission]]] = {}
        self._identities: dict[tuple[str | None, str | None], tuple[Identity, int]] = {}
        """(Authorization, ?auth=) -> (who, the token's expiry or 0), for credentials that succeeded."""
        self._decisions: dict[tuple[str | None, str], Permission] = {}

    def identify(
        self, authorization: str | None, auth_param: str | None, clock: Callable[[], float] = time.time
    ) -> Identity:
        """:func:`parse_credentials` then :meth:`authenticate`, skipping both for a credential that
        succeeded before (a client sends the same header on every request): ~1 us instead of ~4.
        A remembered token still stops at its expiry."""
        key = (authorization, auth_param)
        hit = self._identities.get(key)
        if hit is not None:
            who, expires = hit
            if not expires or clock() < expires:
                return who
            del self._identities[key]
        creds = parse_credentials(authorization, auth_param)
        who, expires = self._authenticate(creds, clock())
        if not creds.anonymous:
            if len(self._identities) >= _MAX_CACHED:
                self._identities.clear()
            self._identities[key] = (who, expires)
        return who

    def authenticate(self, creds: Credentials, now: float) -> Identity:
        """The identity behind ``creds``; :class:`NtfyError` 401 when they are wrong or expired."""
        return self._authenticate(creds, now)[0]

    def _authenticate(self, creds: Credentials, now: float) -> tuple[Identity, int]:
        """The identity and, for a token, its expiry (0: none)."""
        if creds.anonymous:
            return ANONYMOUS, 0
        if creds.token is not None:
            digest = token_digest(creds.token)
            found = self.state.tokens.get(digest)
            if found is None:
                raise NtfyError(UNAUTHORIZED)
            name, token = found
            if token.expires and token.expires <= now:
                raise NtfyError(UNAUTHORIZED)
            user = self.state.users.get(name)
            if user is None:
                raise NtfyError(UNAUTHORIZED)
            return Identity(name, user.role == ROLE_ADMIN, digest), token.expires
        name = creds.user or ""
        user = self.state.users.get(name)
        if user is None:
            _slow_down(creds.password or "")
            raise NtfyError(UNAUTHORIZED)
        if not self._password_ok(name, user, creds.password or ""):
            raise NtfyError(UNAUTHORIZED)
        return Identity(name, user.role == ROLE_ADMIN), 0

    def _password_ok(self, name: str, user: User, password: str) -> bool:
        key = hashlib.sha256(f"{name}\0{password}\0{user.password_hash}".encode()).digest()
        if key in self._verified:
            return True
        try:
            ok = bcrypt.checkpw(password.encode("utf-8"), user.password_hash.encode("ascii"))
        except ValueError:  # a stored hash bcrypt cannot read: no password matches it
            return False
        if ok:
            if len(self._verified) > 10_000:
                self._verified.clear()
            self._verified.add(key)
        return ok

    def permission(self, who: Identity, topic: str) -> Permission:
        """ntfy's decision for ``who`` on ``topic`` (see the module docstring), remembered per (user,
        topic) until the next auth change."""
        if who.admin:
            return Permission.READ_WRITE
        key = (who.user, topic)
        decided = self._decisions.get(key)
        if decided is not None:
            return decided
        decided = self.default
        folded = _fold(topic)
        for pattern, permission in self._ordered(who.user):
            if _matches(pattern, folded):
                decided = permission
                break
        if len(self._decisions) >= _MAX_CACHED_DECISIONS:
            self._decisions.clear()
        self._decisions[key] = decided
        return decided

    def _ordered(self, user: str | None) -> list[tuple[str, Permission]]:
        """The entries that apply to ``user``, in ntfy's order, their patterns folded for matching."""
        rules = self._rules.get(user)
        if rules is None:
            ranked = []
            for owner, pattern, entry in self.state.access:
                if owner == EVERYONE or (user is not None and owner == user):
                    own = 0 if owner != EVERYONE else 1
                    rank = (own, -_pattern_rank(pattern), 0 if entry.permission.write else 1)
                    ranked.append((rank, pattern, entry.permission))
            ranked.sort(key=lambda r: r[0])
            rules = [(_fold(p), perm) for _, p, perm in ranked]
            self._rules[user] = rules
        return rules

    def check(self, who: Identity, topics: Sequence[str], *, write: bool) -> None:
        """Raise 403 when ``who`` may not read (or write) every one of ``topics``: on a multi-topic
        path, one denied topic fails the whole request, as in ntfy."""
        for topic in topics:
            perm = self.permission(who, topic)
            if not (perm.write if write else perm.read):
                raise NtfyError(FORBIDDEN)
