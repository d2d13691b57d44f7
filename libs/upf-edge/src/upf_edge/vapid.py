"""Web Push request semantics (RFC 8030 ``Topic``/``Urgency``, RFC 8292 VAPID) as a pure core.

No I/O: the writer decodes the request into lower-case header values and calls these functions. A
VAPID token is checked as RFC 8292 asks: an ES256 JWT signed by the P-256 key the request names,
with ``exp`` in the future and at most 24 h ahead (give or take ``CLOCK_LEEWAY``), and ``aud`` the push service's origin. The costly
part (decoding and the signature check) depends only on (key, token), so :class:`VapidVerifier`
memoizes it; the time and audience checks run on every call.
"""

from __future__ import annotations

import base64
import binascii
import re
from urllib.parse import urlsplit

import msgspec
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

__all__ = [
    "URGENCIES",
    "URGENCY_PRIORITY",
    "MAX_PUSH_TOPIC",
    "MAX_EXP_AHEAD",
    "CLOCK_LEEWAY",
    "OUTCOMES",
    "Credentials",
    "VapidVerifier",
    "is_webpush",
    "parse_credentials",
    "valid_push_topic",
    "valid_urgency",
    "origin_of",
]

URGENCIES = ("very-low", "low", "normal", "high")
URGENCY_PRIORITY = {"very-low": 1, "low": 2, "normal": 3, "high": 5}
"""The ntfy priority the app shows for a Web Push ``Urgency`` when the request gave no priority."""
MAX_PUSH_TOPIC = 32
MAX_EXP_AHEAD = 86_400
"""RFC 8292 section 2: ``exp`` no more than 24 hours after the request."""
CLOCK_LEEWAY = 300
"""Seconds an app server's clock may be off either way (RFC 7519 4.1.4's "small leeway"): Mastodon
signs every push with ``exp`` exactly 24 hours ahead by its own clock, so a clock a second ahead of
ours would fail the 24 hours without it."""

_B64URL_RE = re.compile(r"[A-Za-z0-9_-]+")
_TOKEN_RE = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+")
_MAX_TOKEN = 4096


class Credentials(msgspec.Struct, frozen=True):
    """What a VAPID request carries: the JWT and the base64url P-256 public key (unpadded)."""

    token: str
    key: str


class _Header(msgspec.Struct):
    alg: str = ""


class _Claims(msgspec.Struct):
    aud: str | None = None
    exp: int | float | None = None
    """RFC 7519 NumericDate: a number (msgspec refuses a bool here)."""


_header_decoder = msgspec.json.Decoder(_Header)
_claims_decoder = msgspec.json.Decoder(_Claims)


def is_webpush(authorization: str | None, ttl: str | None, content_encoding: str | None) -> bool:
    """A Web Push request: VAPID credentials, or RFC 8030's ``TTL`` with RFC 8188 ``aes128gcm``."""
    if authorization:
        scheme = authorization.lstrip()[:8].lower()
        if scheme.startswith(("vapid ", "webpush ")):
            return True
    return ttl is not None and content_encoding is not None and content_encoding.strip().lower() == "aes128gcm"


def valid_push_topic(text: str) -> bool:
    """RFC 8030 section 5.4: at most 32 characters of the base64url alphabet."""
    return 0 < len(text) <= MAX_PUSH_TOPIC and _B64URL_RE.fullmatch(text) is not None


def valid_urgency(text: str) -> bool:
    return text in URGENCY_PRIORITY


def _strip_key(text: str) -> str:
    return text.strip().strip('"').rstrip("=")


def parse_credentials(authorization: str | None, crypto_key: str | None) -> Credentials | None:
    """``vapid t=<JWT>, k=<key>`` (RFC 8292), or the older ``WebPush <JWT>`` with ``Crypto-Key:
    p256ecdsa=<key>``. None when the request names no VAPID scheme; a ``Credentials`` with empty
    parts when it names one but malformed (verification then says why)."""
    if not authorization:
        return None
    text = authorization.strip()
    scheme, _, rest = text.partition(" ")
    scheme = scheme.lower()
    if scheme == "vapid":
        token = key = ""
        for part in rest.split(","):
            name, eq, value = part.strip().partition("=")
            if not eq:
                continue
            name = name.strip().lower()
            if name == "t":
                token = value.strip()
            elif name == "k":
                key = _strip_key(value)
        return Credentials(token, key)
    if scheme == "webpush":
        key = ""
        for part in re.split(r"[;,]", crypto_key or ""):
            name, eq, value = part.strip().partition("=")
            if eq and name.strip().lower() == "p256ecdsa":
                key = _strip_key(value)
        return Credentials(rest.strip(), key)
    return None


def origin_of(url: str) -> str:
    """``scheme://host[:port]`` of ``url``, lower-cased, without a default port (RFC 6454); "" when
    ``url`` has none (``urlsplit`` refuses an unclosed or invalid ``[...]`` host; a port not a number)."""
    try:
        parts = urlsplit(url.strip())
    except ValueError:
        return ""
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        return ""
    if port is None or (scheme, port) in (("http", 80), ("https", 443)):
        return f"{scheme}://{host}"
    return f"{scheme}://{host}:{port}"


def _b64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class _Checked(msgspec.Struct, frozen=True):
    """The time-independent verdict on one (key, token): ``reason`` empty when the signature holds;
    ``aud`` is the origin the token names."""

    reason: str
    aud: str = ""
    exp: float = 0.0


def _check(creds: Credentials) -> _Checked:
    token, key = creds.token, creds.key
    if not token or not key or len(token) > _MAX_TOKEN or _TOKEN_RE.fullmatch(token) is None:
        return _Checked("malformed")
    if _B64URL_RE.fullmatch(key) is None:
        return _Checked("bad_key")
    head64, body64, sig64 = token.split(".")
    try:
        raw_key = _b64url(key)
        public = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), raw_key)
    except (binascii.Error, ValueError):
        return _Checked("bad_key")
    try:  # RecursionError: JSON nested deeper than msgspec follows (a 4 KB token holds ~1,500 levels)
        header = _header_decoder.decode(_b64url(head64))
        claims = _claims_decoder.decode(_b64url(body64))
        signature = _b64url(sig64)
    except (binascii.Error, ValueError, msgspec.DecodeError, RecursionError):
        return _Checked("malformed")
    if header.alg != "ES256":
        return _Checked("malformed")
    if len(signature) != 64:
        return _Checked("bad_signature")
    der = encode_dss_signature(int.from_bytes(signature[:32], "big"), int.from_bytes(signature[32:], "big"))
    try:
        public.verify(der, f"{head64}.{body64}".encode("ascii"), ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        return _Checked("bad_signature")
    if claims.exp is None:
        return _Checked("no_exp")
    if claims.aud is None:
        return _Checked("no_aud")
    try:
        exp = float(claims.exp)
    except OverflowError:  # an integer no float holds, as msgspec refuses 1e400 itself
        return _Checked("malformed")
    return _Checked("", _aud_origin(claims.aud), exp)


def _aud_origin(aud: str) -> str:
    """The origin an ``aud`` claim names; "" (no origin matches it) when it is more than an origin (a
    path or a query) or no URL ``urlsplit`` reads."""
    try:
        parts = urlsplit(aud)
    except ValueError:
        return ""
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username is not None:
        return ""
    return origin_of(aud)


class VapidVerifier:
    """Verifies VAPID credentials against this server's origin; remembers up to ``size`` signature
    checks (the same app server sends the same token for up to a day), so a publish costs a lookup."""

    __slots__ = ("origin", "size", "_cache")

    def __init__(self, public_url: str, size: int = 4096) -> None:
        self.origin = origin_of(public_url)
        self.size = size
        self._cache: dict[tuple[str, str], _Checked] = {}

    def verify(self, creds: Credentials, now: float) -> str:
        """``"ok"``, or why not: malformed, bad_key, bad_signature, no_exp, no_aud, expired,
        exp_too_far, aud_mismatch (bounded: these are the metric's outcomes)."""
        cache_key = (creds.key, creds.token)
        checked = self._cache.get(cache_key)
        if checked is None:
            checked = _check(creds)
            if len(self._cache) >= self.size:
                self._cache.pop(next(iter(self._cache)))
            self._cache[cache_key] = checked
        if checked.reason:
            return checked.reason
        if checked.exp <= now - CLOCK_LEEWAY:
            return "expired"
        if checked.exp > now + MAX_EXP_AHEAD + CLOCK_LEEWAY:
            return "exp_too_far"
        if checked.aud != self.origin or not self.origin:
            return "aud_mismatch"
        return "ok"


OUTCOMES = ("ok", "malformed", "bad_key", "bad_signature", "no_exp", "no_aud", "expired", "exp_too_far", "aud_mismatch")
