"""The Web Push core: which requests are Web Push, Topic and Urgency syntax, VAPID credentials parsed
from both header forms, and JWT verification (signature, exp window, aud) with its bad inputs."""

from __future__ import annotations

import base64
import json

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from hypothesis import given
from hypothesis import strategies as st

from upf_edge.vapid import (
    CLOCK_LEEWAY,
    MAX_EXP_AHEAD,
    OUTCOMES,
    Credentials,
    VapidVerifier,
    is_webpush,
    origin_of,
    parse_credentials,
    valid_push_topic,
    valid_urgency,
)

NOW = 1_800_000_000
ORIGIN = "https://push.example.com"


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def keypair() -> tuple[ec.EllipticCurvePrivateKey, str]:
    private = ec.generate_private_key(ec.SECP256R1())
    raw = private.public_key().public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)
    return private, b64url(raw)


def jwt(private: ec.EllipticCurvePrivateKey, claims: dict, header: dict | None = None) -> str:
    head = b64url(json.dumps(header or {"typ": "JWT", "alg": "ES256"}).encode())
    body = b64url(json.dumps(claims).encode())
    der = private.sign(f"{head}.{body}".encode(), ec.ECDSA(hashes.SHA256()))
    r, s = decode_dss_signature(der)
    return f"{head}.{body}.{b64url(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"


@pytest.fixture(scope="module")
def signer():
    return keypair()


def good(signer, **claims) -> Credentials:
    private, key = signer
    c = {"aud": ORIGIN, "exp": NOW + 3600, "sub": "mailto:ops@example.com"}
    c.update(claims)
    return Credentials(jwt(private, {k: v for k, v in c.items() if v is not None}), key)


def test_a_valid_token_verifies_from_both_header_forms(signer):
    creds = good(signer)
    v = VapidVerifier(ORIGIN + "/")
    assert v.verify(creds, NOW) == "ok"
    assert parse_credentials(f"vapid t={creds.token}, k={creds.key}", None) == creds
    assert parse_credentials(f"Vapid k={creds.key},t={creds.token}", None) == creds
    assert parse_credentials(f"WebPush {creds.token}", f"dh=BAAA;p256ecdsa={creds.key}") == creds
    assert parse_credentials(f"webpush {creds.token}", f'p256ecdsa="{creds.key}="') == creds


def test_exp_window_and_audience(signer):
    v = VapidVerifier(ORIGIN)
    assert v.verify(good(signer, exp=NOW - CLOCK_LEEWAY - 1), NOW) == "expired"
    assert v.verify(good(signer, exp=NOW - CLOCK_LEEWAY), NOW) == "expired"
    assert v.verify(good(signer, exp=NOW - CLOCK_LEEWAY + 1), NOW) == "ok"  # a clock behind ours
    assert (
        v.verify(good(signer, exp=NOW + MAX_EXP_AHEAD + CLOCK_LEEWAY), NOW) == "ok"
    )  # Mastodon's 24 h, its clock ahead
    assert v.verify(good(signer, exp=NOW + MAX_EXP_AHEAD + CLOCK_LEEWAY + 1), NOW) == "exp_too_far"
    assert v.verify(good(signer, aud="https://other.example.com"), NOW) == "aud_mismatch"
    assert v.verify(good(signer, aud="http://push.example.com"), NOW) == "aud_mismatch"
    assert v.verify(good(signer, aud=ORIGIN + "/some/path"), NOW) == "aud_mismatch"
    assert v.verify(good(signer, aud="HTTPS://Push.Example.com:443"), NOW) == "ok"
    assert v.verify(good(signer, aud=None), NOW) == "no_aud"
    assert v.verify(good(signer, exp=None), NOW) == "no_exp"


def test_signature_must_be_by_the_named_key(signer):
    v = VapidVerifier(ORIGIN)
    creds = good(signer)
    _, other = keypair()
    assert v.verify(Credentials(creds.token, other), NOW) == "bad_signature"
    head, body, sig = creds.token.split(".")
    forged = b64url(json.dumps({"aud": ORIGIN, "exp": NOW + 7200}).encode())
    assert v.verify(Credentials(f"{head}.{forged}.{sig}", creds.key), NOW) == "bad_signature"
    assert v.verify(Credentials(f"{head}.{body}.{sig[:-4]}", creds.key), NOW) == "bad_signature"


@pytest.mark.parametrize(
    "token",
    ["", "a.b", "a.b.c.d", "eyJ0.eyJ1.c2ln", "!!.??.**", "e30.e30.c2ln", "x" * 5000],
)
def test_malformed_tokens(signer, token):
    assert VapidVerifier(ORIGIN).verify(Credentials(token, signer[1]), NOW) == "malformed"


def test_wrong_algorithm_and_bad_keys(signer):
    private, key = signer
    v = VapidVerifier(ORIGIN)
    hs = jwt(private, {"aud": ORIGIN, "exp": NOW + 60}, {"alg": "HS256"})
    assert v.verify(Credentials(hs, key), NOW) == "malformed"
    token = good(signer).token
    assert v.verify(Credentials(token, "BPub"), NOW) == "bad_key"
    assert v.verify(Credentials(token, "not base64!"), NOW) == "bad_key"
    assert v.verify(Credentials(token, ""), NOW) == "malformed"
    compressed = private.public_key().public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.CompressedPoint
    )
    assert v.verify(Credentials(token, b64url(compressed)), NOW) == "ok"  # the same point, compressed
    claims_not_json = token.split(".")[0] + "." + b64url(b"not json") + "." + token.split(".")[2]
    assert v.verify(Credentials(claims_not_json, key), NOW) == "malformed"
    aud_not_str = jwt(private, {"aud": 5, "exp": NOW + 60})
    assert v.verify(Credentials(aud_not_str, key), NOW) == "malformed"


def test_cache_keeps_time_checks_live_and_is_bounded(signer):
    """A cached signature check still expires with ``exp``; the cache never grows past its size."""
    v = VapidVerifier(ORIGIN, size=2)
    creds = good(signer, exp=NOW + 10)
    assert v.verify(creds, NOW) == "ok"
    assert v.verify(creds, NOW + 10 + CLOCK_LEEWAY) == "expired"
    for i in range(5):
        v.verify(good(signer, exp=NOW + 100 + i), NOW)
    assert len(v._cache) == 2


def test_wrong_public_url_refuses_every_audience(signer):
    assert VapidVerifier("https://push.example.com:99999").verify(good(signer), NOW) == "aud_mismatch"


def test_which_requests_are_web_push():
    assert is_webpush("vapid t=a,k=b", None, None)
    assert is_webpush("WebPush abc", None, None)
    assert is_webpush(None, "60", " AES128GCM ")
    assert not is_webpush(None, None, "aes128gcm")  # ntfy's UnifiedPush mode, answered as ntfy does
    assert not is_webpush("Bearer tk_x", "60", None)
    assert not is_webpush("Basic dTpw", None, "aes128gcm")
    assert parse_credentials("Bearer tk_abc", None) is None
    assert parse_credentials(None, "p256ecdsa=x") is None
    assert parse_credentials("vapid garbage", None) == Credentials("", "")


def test_topic_and_urgency_syntax():
    assert valid_push_topic("a" * 32) and valid_push_topic("Ab-_09")
    assert not valid_push_topic("a" * 33)
    assert not valid_push_topic("has space") and not valid_push_topic("plus+") and not valid_push_topic("pad=")
    assert not valid_push_topic("")
    assert [u for u in ("very-low", "low", "normal", "high", "urgent", "") if valid_urgency(u)] == [
        "very-low",
        "low",
        "normal",
        "high",
    ]


def test_origin_of():
    assert origin_of("http://localhost:8080/") == "http://localhost:8080"
    assert origin_of("HTTPS://EXAMPLE.com:443/x?y") == "https://example.com"
    assert origin_of("http://[::1]:80") == "http://[::1]"


@given(st.text(max_size=200), st.text(max_size=100))
def test_verification_never_raises(token, key):
    outcome = VapidVerifier(ORIGIN).verify(Credentials(token, key), NOW)
    assert outcome in OUTCOMES and outcome != "ok"


@given(st.text(max_size=200), st.one_of(st.none(), st.text(max_size=100)))
def test_header_parsing_never_raises(authorization, crypto_key):
    creds = parse_credentials(authorization, crypto_key)
    assert creds is None or isinstance(creds, Credentials)


# --- malformed claims from a correctly signed token: an outcome, never an exception ----------------


def signed(private: ec.EllipticCurvePrivateKey, header: bytes, claims: bytes) -> str:
    """A token over raw JSON text (what ``json.dumps`` cannot or will not write)."""
    head, body = b64url(header), b64url(claims)
    r, s = decode_dss_signature(private.sign(f"{head}.{body}".encode(), ec.ECDSA(hashes.SHA256())))
    return f"{head}.{body}.{b64url(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"


HEADER = b'{"typ":"JWT","alg":"ES256"}'


@pytest.mark.parametrize("aud", ["http://[::1", "http://[zz]", "https://[push.example.com]", "http://[::1]:x"])
def test_an_audience_urlsplit_refuses_is_a_mismatch(signer, aud):
    assert VapidVerifier(ORIGIN).verify(good(signer, aud=aud), NOW) == "aud_mismatch"


@pytest.mark.parametrize("exp", [10**399, -(10**399)])
def test_an_exp_no_float_holds_is_malformed(signer, exp):
    """A 400-digit NumericDate, as msgspec already refuses ``1e400``."""
    assert VapidVerifier(ORIGIN).verify(good(signer, exp=exp), NOW) == "malformed"


@pytest.mark.parametrize("part", ["header", "claims"])
def test_deeply_nested_json_is_malformed(signer, part):
    private, key = signer
    deep = b'"x":' + b"[" * 1100 + b"]" * 1100
    claims = b'{"aud":"%s","exp":%d,%s}' % (ORIGIN.encode(), NOW + 3600, deep if part == "claims" else b'"y":1')
    header = HEADER[:-1] + b"," + deep + b"}" if part == "header" else HEADER
    token = signed(private, header, claims)
    assert len(token) <= 4096
    assert VapidVerifier(ORIGIN).verify(Credentials(token, key), NOW) == "malformed"


def test_a_public_url_urlsplit_refuses_refuses_every_audience(signer):
    assert origin_of("http://[::1") == "" and origin_of("http://[zz]") == ""
    assert VapidVerifier("http://[::1").verify(good(signer), NOW) == "aud_mismatch"
