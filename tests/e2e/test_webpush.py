"""UPF as a Web Push service (RFC 8030/8291/8292), black box: real app-server libraries (pywebpush from
PyPI, the web-push package from npm) send encrypted notifications with VAPID to a real all-in-one
process; the test is the user agent (its own P-256 key and auth secret, the UPF topic URL as the
endpoint), subscribes like the ntfy app and decrypts what it receives. Also: ``Topic`` replacement for
an offline subscriber, VAPID-restricted topics, and bad tokens with verification on and off."""

from __future__ import annotations

import asyncio
import base64
import datetime
import hashlib
import ipaddress
import json
import os
import re
import secrets
import shutil
import ssl
import subprocess
import sys
import time
from pathlib import Path

import http_ece
import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.x509.oid import NameOID
from pywebpush import Vapid, Vapid01, WebPushException, webpush  # py_vapid's signers, as pywebpush uses them

from tests.clients.ntfy import error_body, poll, subscribe
from tests.conftest import free_port

SENDER = Path(__file__).resolve().parents[1] / "webpush"
pytestmark = pytest.mark.slow


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def raw_public(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)


def up_topic() -> str:
    return "up" + secrets.token_hex(6)


class UserAgent:
    """The browser/distributor side of RFC 8291: a P-256 key pair and an auth secret per subscription."""

    def __init__(self) -> None:
        self.private = ec.generate_private_key(ec.SECP256R1())
        self.auth = secrets.token_bytes(16)

    def subscription(self, endpoint: str) -> dict:
        return {"endpoint": endpoint, "keys": {"p256dh": b64url(raw_public(self.private)), "auth": b64url(self.auth)}}

    def decrypt(self, message: str, encoding: str) -> bytes:
        assert encoding == "base64", "an aes128gcm body is binary: UPF delivers it as base64"
        return http_ece.decrypt(
            base64.b64decode(message), private_key=self.private, auth_secret=self.auth, version="aes128gcm"
        )


class AppServer:
    """A VAPID key pair as an app server holds it, in the forms both libraries take."""

    def __init__(self) -> None:
        self.private = ec.generate_private_key(ec.SECP256R1())
        self.public = b64url(raw_public(self.private))
        self.private_raw = b64url(self.private.private_numbers().private_value.to_bytes(32, "big"))

    def vapid(self, legacy: bool = False) -> Vapid01:
        """py_vapid's signer: ``Vapid`` (02) sends ``vapid t=,k=`` (RFC 8292), Vapid01 ``WebPush`` + ``Crypto-Key``."""
        return (Vapid01 if legacy else Vapid)(private_key=self.private)

    def token(self, claims: dict, alg: str = "ES256") -> str:
        """A JWT signed by hand, for the tokens no library would produce (expired, wrong aud...)."""
        head = b64url(json.dumps({"typ": "JWT", "alg": alg}).encode())
        body = b64url(json.dumps(claims).encode())
        r, s = decode_dss_signature(self.private.sign(f"{head}.{body}".encode(), ec.ECDSA(hashes.SHA256())))
        return f"{head}.{body}.{b64url(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"

    def header(self, claims: dict) -> dict[str, str]:
        return {"Authorization": f"vapid t={self.token(claims)}, k={self.public}"}


def send_pywebpush(
    ua: UserAgent, endpoint: str, app: AppServer, plaintext: bytes, *, legacy: bool = False, **headers: str
):  # type: ignore[no-untyped-def]
    """pywebpush's one-call API; returns its requests.Response (raises WebPushException past 202)."""
    return webpush(
        ua.subscription(endpoint),
        data=plaintext,
        vapid_private_key=app.vapid(legacy),
        vapid_claims={"sub": "mailto:ops@example.com"},
        ttl=120,
        headers=dict(headers),
        timeout=10,
    )


def start(fleet, *, public_url: str | None = None, port: int | None = None, **settings: str):  # type: ignore[no-untyped-def]
    port = port or free_port()
    return fleet.start(
        "upf",
        node=f"webpush{len(fleet.roles)}",
        UPF_BIND=f"127.0.0.1:{port}",
        UPF_PUBLIC_URL=public_url or f"http://127.0.0.1:{port}",
        UPF_WORKERS="1",
        **settings,
    )


def encrypted_headers(**extra: str) -> dict[str, str]:
    return {"Content-Encoding": "aes128gcm", "TTL": "60", **extra}


# --- pywebpush --------------------------------------------------------------------------------------
@pytest.mark.parametrize("legacy", [False, True], ids=["vapid-scheme", "webpush-scheme"])
async def test_pywebpush_end_to_end(fleet, legacy: bool) -> None:
    """pywebpush sends with VAPID (verification on); the app-server library accepts UPF's 201; the
    subscriber receives the ciphertext as base64 and decrypts it; Urgency high shows as priority 5."""
    upf = start(fleet, UPF_VAPID_VERIFY="1")
    topic, ua, app = up_topic(), UserAgent(), AppServer()
    plaintext = '{"title":"héllo","body":"from pywebpush"}'.encode()
    async with subscribe(upf.base, topic, "ws") as stream:
        r = await asyncio.to_thread(
            send_pywebpush, ua, f"{upf.base}/{topic}", app, plaintext, legacy=legacy, Urgency="high"
        )
        frame = await stream.next_message(10)
    assert r.status_code == 201 and r.headers["TTL"] == "120"
    assert r.headers["Location"] == f"{upf.base}/{topic}/m/{frame.id}" and r.json()["id"] == frame.id
    assert frame.priority == 5
    assert ua.decrypt(frame.message, frame.encoding) == plaintext


async def test_topic_replacement_leaves_one_message_for_an_offline_subscriber(fleet) -> None:
    """Two notifications with the same Topic while nobody listens: a poll finds only the newer one
    (replaced in the queue, not appended); another Topic and a plain message stay."""
    upf = start(fleet)
    topic, ua, app = up_topic(), UserAgent(), AppServer()
    endpoint = f"{upf.base}/{topic}"
    first = await asyncio.to_thread(send_pywebpush, ua, endpoint, app, b"draft 1", Topic="chat-42")
    other = await asyncio.to_thread(send_pywebpush, ua, endpoint, app, b"other", Topic="news")
    second = await asyncio.to_thread(send_pywebpush, ua, endpoint, app, b"draft 2", Topic="chat-42", Urgency="low")
    assert first.status_code == other.status_code == second.status_code == 201
    frames = await poll(upf.base, topic)
    assert [f.id for f in frames] == [other.json()["id"], second.json()["id"]]
    assert [ua.decrypt(f.message, f.encoding) for f in frames] == [b"other", b"draft 2"]
    assert frames[1].priority == 2
    async with subscribe(upf.base, topic, "json", "since=all") as stream:  # a reconnecting subscriber too
        got = [await stream.next_message(10) for _ in range(2)]
        assert await stream.no_message_within(0.5)
    assert [f.id for f in got] == [f.id for f in frames]


async def test_a_message_past_its_ttl_reaches_no_one_who_was_not_connected(fleet) -> None:
    """RFC 8030 5.2: TTL 0 goes to a subscriber connected when it arrives, and to no one later; a TTL
    that has run out is not replayed to a poll or a reconnecting stream, though the janitor (every
    30 s by default) has not deleted it yet. A longer TTL's message is still there."""
    upf = start(fleet)
    topic = up_topic()
    endpoint = f"{upf.base}/{topic}"
    async with httpx.AsyncClient(timeout=10) as c:
        async with subscribe(upf.base, topic, "ws") as live:
            now_only = await c.post(endpoint, content=b"now only", headers=encrypted_headers(TTL="0"))
            assert now_only.status_code == 201 and now_only.headers["TTL"] == "0"
            assert (await live.next_message(10)).id == now_only.json()["id"]
        short = await c.post(endpoint, content=b"short", headers=encrypted_headers(TTL="1"))
        kept = await c.post(endpoint, content=b"kept", headers=encrypted_headers(TTL="60"))
        assert short.status_code == kept.status_code == 201
        await asyncio.sleep(2.2)
    assert [f.id for f in await poll(upf.base, topic)] == [kept.json()["id"]]
    async with subscribe(upf.base, topic, "json", "since=all") as stream:
        assert (await stream.next_message(10)).id == kept.json()["id"]
        assert await stream.no_message_within(0.5)


# --- the web-push npm package -------------------------------------------------------------------------
@pytest.fixture(scope="session")
def web_push_modules() -> Path:
    """``npm ci`` of tests/webpush into a cache directory keyed by the lock file, once per machine."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are needed to run the web-push npm package; neither is optional in CI")
    manifest = (SENDER / "package.json").read_bytes()
    lock = (SENDER / "package-lock.json").read_bytes()
    digest = hashlib.sha256(manifest + b"\0" + lock).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "upf-webpush"
    root = cache / digest
    if not (root / "node_modules" / "web-push" / "package.json").is_file():
        staging = cache / f"{digest}.{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        (staging / "package.json").write_bytes(manifest)
        (staging / "package-lock.json").write_bytes(lock)
        r = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts"],
            cwd=staging,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert r.returncode == 0, f"npm ci failed: {r.stderr[-3000:]}"
        try:
            staging.rename(root)
        except OSError:  # another run installed it meanwhile
            shutil.rmtree(staging, ignore_errors=True)
    return root / "node_modules"


def self_signed(tmp: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 (its own CA) and its key."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "upf test ingress")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp / "ingress.crt", tmp / "ingress.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


async def tls_ingress(upstream: list[int], cert: Path, key: Path) -> asyncio.Server:
    """A TLS-terminating TCP proxy in front of UPF, as a deployment's ingress: web-push only speaks https.
    It listens on a port of its own choosing before UPF starts (a port picked and bound later can be
    taken in between); ``upstream`` holds UPF's port once it is known."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream[0])

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, half_close: bool) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
                if half_close:
                    dst.write_eof()
                else:
                    dst.close()
            except (ConnectionError, ssl.SSLError, OSError):
                dst.close()

        await asyncio.gather(pipe(reader, up_writer, True), pipe(up_reader, writer, False))
        up_writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ctx)


async def send_node(modules: Path, cert: Path, request: dict) -> tuple[int, dict]:
    env = {**os.environ, "NODE_PATH": str(modules), "NODE_EXTRA_CA_CERTS": str(cert)}
    proc = await asyncio.create_subprocess_exec(
        shutil.which("node") or "node", str(SENDER / "send.js"),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(json.dumps(request).encode()), 60)
    assert out, f"node printed nothing: {err.decode(errors='replace')[-2000:]}"
    return proc.returncode or 0, json.loads(out)


async def test_web_push_npm_end_to_end(fleet, tmp_path, web_push_modules) -> None:
    """web-push (npm) sends over https (through a TLS ingress; UPF_PUBLIC_URL is the https origin, so
    its VAPID aud verifies); it accepts UPF's 201; the subscriber decrypts the payload."""
    cert, key = self_signed(tmp_path)
    upstream: list[int] = []
    server = await tls_ingress(upstream, cert, key)
    ingress_port = server.sockets[0].getsockname()[1]
    upf = start(fleet, public_url=f"https://127.0.0.1:{ingress_port}", UPF_VAPID_VERIFY="1")
    upstream.append(upf.port)
    topic, ua, app = up_topic(), UserAgent(), AppServer()
    plaintext = b"\x00binary \xff payload from web-push " + secrets.token_bytes(64)
    request = {
        "subscription": ua.subscription(f"https://127.0.0.1:{ingress_port}/{topic}"),
        "payloadBase64": base64.b64encode(plaintext).decode(),
        "subject": "mailto:ops@example.com",
        "vapidPublicKey": app.public,
        "vapidPrivateKey": app.private_raw,
        "ttl": 300,
        "urgency": "very-low",
        "topic": "inbox",
    }
    try:
        async with subscribe(upf.base, topic, "ws") as stream:
            rc, reply = await send_node(web_push_modules, cert, request)
            assert rc == 0, reply
            frame = await stream.next_message(10)
        # the same Topic again, while the subscriber is away: the first is replaced
        rc, again = await send_node(
            web_push_modules, cert, {**request, "payloadBase64": base64.b64encode(b"v2").decode()}
        )
        assert rc == 0, again
    finally:
        server.close()
        await server.wait_closed()
    assert reply["statusCode"] == 201 and reply["headers"]["ttl"] == "300"
    assert reply["headers"]["location"] == f"https://127.0.0.1:{ingress_port}/{topic}/m/{frame.id}"
    assert frame.priority == 1
    assert ua.decrypt(frame.message, frame.encoding) == plaintext
    frames = await poll(upf.base, topic)
    assert [ua.decrypt(f.message, f.encoding) for f in frames] == [b"v2"]


# --- VAPID-restricted topics -------------------------------------------------------------------------
def cli(fleet, *args: str) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UPF_", "FDB_"))}
    env.update(UPF_STORE_PATH=fleet.store, UPF_LOG_LEVEL="WARNING")
    return subprocess.run([sys.executable, "-m", "upf", *args], env=env, capture_output=True, text=True, timeout=60)


def refused(exc: pytest.ExceptionInfo[WebPushException]) -> tuple[int, int]:
    response = exc.value.response
    return response.status_code, response.json()["code"]


async def test_restricted_topic_refuses_a_second_key(fleet) -> None:
    """UPF_VAPID_RESTRICT=1 (verification itself left off): the first valid key binds the topic; a
    second key, no key, a plain ntfy publish and a bad token of the bound key are 401 and store
    nothing; ``upf vapid list`` shows the binding and ``upf vapid reset`` lets the next key bind."""
    upf = start(fleet, UPF_VAPID_RESTRICT="1")
    topic, ua, first, second = up_topic(), UserAgent(), AppServer(), AppServer()
    endpoint = f"{upf.base}/{topic}"
    ok = await asyncio.to_thread(send_pywebpush, ua, endpoint, first, b"from the first")
    assert ok.status_code == 201
    with pytest.raises(WebPushException) as info:
        await asyncio.to_thread(send_pywebpush, ua, endpoint, second, b"from the second")
    assert refused(info) == (401, 40192)
    with pytest.raises(WebPushException) as info:
        await asyncio.to_thread(send_pywebpush, ua, endpoint, second, b"legacy form", legacy=True)
    assert refused(info) == (401, 40192)
    async with httpx.AsyncClient(timeout=10) as c:
        no_key = await c.post(endpoint, content=b"x", headers=encrypted_headers())
        plain = await c.post(endpoint, content=b"plain ntfy publish")
        expired = await c.post(
            endpoint, content=b"x", headers=first.header({"aud": upf.base, "exp": int(time.time()) - 600})
        )
    assert (no_key.status_code, error_body(no_key)["code"]) == (401, 40192)
    assert (plain.status_code, error_body(plain)["code"]) == (401, 40192)
    assert (expired.status_code, error_body(expired)["code"]) == (401, 40191)
    again = await asyncio.to_thread(send_pywebpush, ua, endpoint, first, b"first again", legacy=True)
    assert again.status_code == 201
    assert [ua.decrypt(f.message, f.encoding) for f in await poll(upf.base, topic)] == [
        b"from the first",
        b"first again",
    ]

    listed = cli(fleet, "vapid", "list")
    assert listed.returncode == 0 and f"{topic}: {first.public}" in listed.stdout.splitlines()
    assert cli(fleet, "vapid", "reset", topic).returncode == 0
    assert cli(fleet, "vapid", "list", topic).returncode == 1
    rebound = await asyncio.to_thread(send_pywebpush, ua, endpoint, second, b"second after reset")
    assert rebound.status_code == 201
    assert cli(fleet, "vapid", "list", topic).stdout.strip() == f"{topic}: {second.public}"
    with pytest.raises(WebPushException) as info:
        await asyncio.to_thread(send_pywebpush, ua, endpoint, first, b"first, now refused")
    assert refused(info) == (401, 40192)


# --- bad tokens and bad headers ------------------------------------------------------------------------
def bad_tokens(app: AppServer, aud: str) -> dict[str, dict[str, str]]:
    now = int(time.time())
    other = AppServer()
    return {
        "malformed": {"Authorization": f"vapid t=not.a.jwt, k={app.public}"},
        "expired": app.header({"aud": aud, "exp": now - 600, "sub": "mailto:a@example.com"}),  # past the leeway
        "exp_too_far": app.header({"aud": aud, "exp": now + 25 * 3600}),
        "aud_mismatch": app.header({"aud": "https://push.example.com", "exp": now + 600}),
        "bad_signature": {"Authorization": f"vapid t={app.token({'aud': aud, 'exp': now + 600})}, k={other.public}"},
    }


def metric(text: str, outcome: str) -> float:
    m = re.search(rf'^upf_writer_vapid_checks_total{{outcome="{outcome}"}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


async def test_bad_tokens_are_401_when_verification_is_on(fleet) -> None:
    upf = start(fleet, UPF_VAPID_VERIFY="1")
    topic, app = up_topic(), AppServer()
    async with httpx.AsyncClient(timeout=10) as c:
        for reason, headers in bad_tokens(app, upf.base).items():
            r = await c.post(f"{upf.base}/{topic}", content=b"\x01\x02", headers=encrypted_headers(**headers))
            assert (r.status_code, error_body(r)["code"]) == (401, 40191), reason
        legacy = await c.post(
            f"{upf.base}/{topic}",
            content=b"x",
            headers={
                "Authorization": f"WebPush {app.token({'aud': upf.base, 'exp': 1})}",
                "Crypto-Key": f"p256ecdsa={app.public}",
            },
        )
        assert (legacy.status_code, error_body(legacy)["code"]) == (401, 40191)
    assert await poll(upf.base, topic) == []


async def test_bad_tokens_are_accepted_and_counted_when_verification_is_off(fleet) -> None:
    """The default stays permissive (as ntfy): every publish is stored, each outcome counted."""
    upf = start(fleet)
    topic, app = up_topic(), AppServer()
    tokens = bad_tokens(app, upf.base)
    async with httpx.AsyncClient(timeout=10) as c:
        for reason, headers in tokens.items():
            r = await c.post(f"{upf.base}/{topic}", content=b"\x01\x02", headers=encrypted_headers(**headers))
            assert r.status_code == 201, (reason, r.text)
        good = await c.post(
            f"{upf.base}/{topic}",
            content=b"ok",
            headers=encrypted_headers(**app.header({"aud": upf.base, "exp": int(time.time()) + 600})),
        )
        assert good.status_code == 201
        text = (await c.get(f"{upf.base}/metrics")).text
    assert len(await poll(upf.base, topic)) == len(tokens) + 1
    assert {reason: metric(text, reason) for reason in [*tokens, "ok"]} == {reason: 1.0 for reason in [*tokens, "ok"]}


async def test_bad_topic_and_urgency_are_400_and_store_nothing(fleet) -> None:
    upf = start(fleet)
    topic = up_topic()
    cases = [
        ({"Topic": "t" * 33}, 40097),
        ({"Topic": "not base64url!"}, 40097),
        ({"Topic": "pad=="}, 40097),
        ({"Urgency": "urgent"}, 40098),
        ({"Urgency": "very low"}, 40098),
    ]
    async with httpx.AsyncClient(timeout=10) as c:
        for extra, code in cases:
            r = await c.post(f"{upf.base}/{topic}", content=b"\x01", headers=encrypted_headers(**extra))
            assert (r.status_code, error_body(r)["code"]) == (400, code), extra
        # an ntfy publish (no Web Push headers) with a stray Topic is ntfy's: 200, header ignored
        plain = await c.post(f"{upf.base}/{topic}", content=b"ntfy", headers={"Topic": "t" * 40})
        assert plain.status_code == 200
    assert [f.message for f in await poll(upf.base, topic)] == ["ntfy"]
