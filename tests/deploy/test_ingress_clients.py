"""Who the roles think a client is, behind the shipped ingress, with compose's own settings.

Behind the ingress every request reaches a writer or pusher from the ingress's address. The roles take the
client from X-Forwarded-For only when that peer is in UPF_PROXY_TRUSTED, so compose must trust the
ingress's fixed address: otherwise every phone is one visitor and shares one request burst, one
subscription allowance and one connection cap. These tests run that path for real: a writer and a pusher
with compose.yaml's x-upf-env, behind real nginx with the shipped config, reached by "phones" that each
connect from their own address.

Compose's network is mapped onto loopback: the role settings are compose.yaml's, interpolated with
UPF_NET_PREFIX=127.0.0 (compose's own knob for the network's first three octets), and nginx connects to the
roles from the ingress's fixed address in it (``proxy_bind``, as the ingress container does from its
address on compose's network). Linux routes all of 127.0.0.0/8 to loopback, so every phone can connect
from an address of its own. One substitution: compose exempts loopback from the limits (the containers'
own health checks), and here every address is a loopback one, so the test drops those two entries and
keeps the rest of compose's UPF_LIMIT_EXEMPT (the load generator's address), unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import itertools
import os
import re
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from tests.conftest import Process
from tests.deploy.conftest import wait_for_port
from upf_keyspace.settings import Settings, load_settings

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
PREFIX = "127.0.0"
"""UPF_NET_PREFIX for these tests: compose's network mapped onto loopback."""
LOOPBACK_EXEMPT = {"127.0.0.0/8", "::1"}
BALANCER = "127.0.0.30"
"""The address an L4 balancer in front of the ingress connects from (below compose's dynamic range)."""
READY_SECS = 90.0
STEP_TIMEOUT = 20.0 * float(os.environ.get("UPF_TESTS_TIMEOUT_FACTOR", "1"))

_VARIABLE = re.compile(r"\$\{(\w+)(?::-([^${}]*))?\}")


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's ``${VAR}`` / ``${VAR:-default}`` interpolation, nested ones included (innermost first)."""
    while (match := _VARIABLE.search(text)) is not None:
        value = env.get(match.group(1)) or (match.group(2) or "")
        text = text[: match.start()] + value + text[match.end() :]
    return text


@dataclass(frozen=True)
class ComposeView:
    """What compose.yaml gives the roles and where it puts the ingress and the load generator."""

    env: dict[str, str]
    ingress: str
    loadgen: str


@functools.cache
def compose() -> ComposeView:
    """compose.yaml read with UPF_NET_PREFIX=127.0.0 (read when a test needs it: a file without the fixed
    addresses fails those tests, not the collection)."""
    raw = yaml.safe_load((REPO / "compose.yaml").read_text())
    variables = {"UPF_NET_PREFIX": PREFIX}
    env = {k: interpolate(str(v), variables) for k, v in raw["x-upf-env"].items()}
    address = {}
    for name in ("ingress", "loadgen"):
        networks = raw["services"][name].get("networks")
        assert isinstance(networks, dict), f"compose.yaml gives the {name} service no fixed address"
        address[name] = interpolate(str(networks["upf"]["ipv4_address"]), variables)
    return ComposeView(env, address["ingress"], address["loadgen"])


def role_env(port: int, store: Path, **extra: str) -> dict[str, str]:
    """compose.yaml's x-upf-env for a role on a loopback port with the embedded store (no FoundationDB,
    no collector), loopback taken out of the exemptions (see the module's docstring)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UPF_", "FDB_", "OTEL_"))}
    env.update({k: v for k, v in compose().env.items() if not k.startswith(("FDB_", "OTEL_"))})
    exempt = [item for item in compose().env.get("UPF_LIMIT_EXEMPT", "").split(",") if item]
    env["UPF_LIMIT_EXEMPT"] = ",".join(item for item in exempt if item not in LOOPBACK_EXEMPT)
    env.update(UPF_BIND=f"127.0.0.1:{port}", UPF_STORE_PATH=str(store), PYTHONUNBUFFERED="1", **extra)
    return env


@functools.cache
def limits() -> Settings:
    """The settings the roles run with here (their limits: burst, subscriptions, connection cap)."""
    return load_settings({k: v for k, v in role_env(8080, Path("upf.db")).items() if k.startswith("UPF_")})


@pytest.fixture(scope="module", autouse=True)
def loopback_addresses() -> None:
    """Phones, the ingress and the load generator each need an address of their own on loopback."""
    for address in (PREFIX + ".20", PREFIX + ".21", BALANCER, "127.0.1.1"):
        with socket.socket() as s:
            try:
                s.bind((address, 0))
            except OSError as exc:
                pytest.skip(f"cannot bind {address} ({exc}): these tests need all of 127.0.0.0/8 on loopback (Linux)")


@dataclass
class Stack:
    writer: Process
    pusher: Process


@pytest.fixture(scope="module")
def stack(uv: list[str], tmp_path_factory: pytest.TempPathFactory, free_port: Callable[[], int]) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("clients")
    store = workdir / "upf.db"
    started: list[Process] = []

    def start(script: str, **extra: str) -> Process:
        port = free_port()
        process = Process(
            script,
            [*uv, "run", "--no-sync", script],
            role_env(port, store, **extra),
            workdir / f"{script}.log",
            port,
            "/__lbheartbeat__",
            cwd=REPO,
        )
        started.append(process)
        return process.wait_ready(READY_SECS)

    try:
        writer = start("upf-writer")  # first: it creates the store file the pusher opens
        yield Stack(writer, start("upf-pusher", UPF_NODE_ID="pusher-clients"))
    finally:
        for process in started:
            process.stop()


@pytest.fixture
def ingress(stack: Stack, start_ingress):
    """The shipped ingress, connecting to the roles from its fixed compose address."""
    return start_ingress([stack.writer.port], [stack.pusher.port], http_extra=[f"proxy_bind {compose().ingress};"])


_PHONES = itertools.count()


def new_phone_address() -> str:
    """A loopback address no other test used: the store keeps every visitor's buckets for the module."""
    n = next(_PHONES)
    return f"127.0.{1 + n // 250}.{1 + n % 250}"


def phone(address: str | None = None) -> httpx.AsyncClient:
    transport = httpx.AsyncHTTPTransport(local_address=address or new_phone_address())
    return httpx.AsyncClient(transport=transport, timeout=httpx.Timeout(STEP_TIMEOUT, read=None))


def topic() -> str:
    return "up" + uuid.uuid4().hex[:12]


def test_compose_trusts_the_ingress_and_exempts_the_load_generator() -> None:
    """What the other tests rely on, read from compose.yaml (test_compose.py checks it in depth)."""
    assert compose().env["UPF_PROXY_TRUSTED"] == compose().ingress
    assert [ipaddress.ip_network(n) for n in limits().proxy_trusted] == [ipaddress.ip_network(compose().ingress)]
    exempt = set(compose().env["UPF_LIMIT_EXEMPT"].split(","))
    assert exempt - LOOPBACK_EXEMPT == {compose().loadgen}


async def exhaust_request_limit(client: httpx.AsyncClient, url: str) -> list[int]:
    """Publish until the request limit answers 429 (at most a burst and a few more)."""
    t, statuses = topic(), []
    for _ in range(limits().limit_request_burst + 5):
        statuses.append((await client.post(f"{url}/{t}", content=b"hi")).status_code)
        if statuses[-1] == 429:
            break
    return statuses


async def test_every_phone_has_its_own_request_limit(ingress) -> None:
    """One phone spending its whole request burst through the ingress leaves another phone's untouched.
    (Without trusting the ingress both are the ingress's address: the second one's first publish is 429.)"""
    async with phone() as first, phone() as second:
        statuses = await exhaust_request_limit(first, ingress.url)
        assert statuses[-1] == 429, f"no 429 after {len(statuses)} publishes: the limit does not apply"
        assert set(statuses[:-1]) == {200}, statuses
        assert len(statuses) > limits().limit_request_burst / 2, statuses
        other = await second.post(f"{ingress.url}/{topic()}", content=b"from another phone")
    assert other.status_code == 200, other.text


@contextlib.asynccontextmanager
async def subscribed(client: httpx.AsyncClient, url: str) -> AsyncIterator[httpx.Response]:
    """A held /json subscription; the response is there once the open event (or an error) arrived."""
    async with client.stream("GET", f"{url}/{topic()}/json") as response:
        if response.status_code == 200:
            lines = response.aiter_lines()  # kept until the exit: a dropped iterator closes the stream
            first = await anext(lines)
            assert '"open"' in first, first
        else:
            await response.aread()
        yield response


async def test_subscriptions_are_counted_per_phone(ingress) -> None:
    """More phones than one visitor's subscription allowance each hold a subscription at once; one phone
    alone is still held to the allowance. (Without trusting the ingress, the phone past the allowance is
    refused with 429.)"""
    allowance = limits().limit_subscriptions
    async with contextlib.AsyncExitStack() as stack:
        phones = [await stack.enter_async_context(phone()) for _ in range(allowance + 5)]
        async with asyncio.timeout(STEP_TIMEOUT):
            held = [await stack.enter_async_context(subscribed(p, ingress.url)) for p in phones]
        assert [r.status_code for r in held] == [200] * len(phones), [r.text for r in held if r.status_code != 200]

    async with contextlib.AsyncExitStack() as stack:
        one = await stack.enter_async_context(phone())
        async with asyncio.timeout(STEP_TIMEOUT):
            held = [await stack.enter_async_context(subscribed(one, ingress.url)) for _ in range(allowance + 1)]
        statuses = [r.status_code for r in held]
    assert statuses == [200] * allowance + [429], statuses


async def relay(listen_port: int, target_port: int, source: str) -> asyncio.Server:
    """A TCP relay that connects onwards from ``source``: stands in for the load generator's own address
    on compose's network (upf-loadgen cannot choose its source address)."""

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target_port, local_addr=(source, 0))
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    return await asyncio.start_server(handle, "127.0.0.1", listen_port)


async def test_the_load_generator_runs_through_the_ingress(uv: list[str], ingress, free_port) -> None:
    """The README's loadgen profile, scaled down: upf-loadgen from the load generator's compose address,
    through the ingress, with more subscribers than one visitor's subscription allowance and than one
    peer's connection cap at a pusher. (Without the exemption its setup fails with 429; without trusting
    the ingress, the pusher's connection cap stops the ingress itself.)"""
    topics = max(limits().limit_subscriptions, limits().max_connections_per_ip) + 20
    port = free_port()
    server = await relay(port, ingress.port, compose().loadgen)
    try:
        proc = await asyncio.create_subprocess_exec(
            *uv,
            *("run", "--no-sync", "upf-loadgen", "run", "--url", f"http://127.0.0.1:{port}"),
            *("--topics", str(topics), "--rate", "400", "--duration", "3", "--quiet", "--strict"),
            cwd=REPO,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            async with asyncio.timeout(180 * float(os.environ.get("UPF_TESTS_TIMEOUT_FACTOR", "1"))):
                output, _ = await proc.communicate()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    finally:
        server.close()
    report = output.decode(errors="replace")
    assert proc.returncode == 0, report
    assert f"subscriptions: {topics}/{topics} connected" in report, report
    assert "VERDICT: CLEAN" in report, report


# --- an L4 balancer in front of the ingress -----------------------------------------------------------


def haproxy_bin() -> str:
    path = shutil.which("haproxy") or ("/usr/sbin/haproxy" if os.access("/usr/sbin/haproxy", os.X_OK) else None)
    if path is None:
        pytest.skip("haproxy is not installed (apt-get install haproxy): the L4 balancer tests need the real one")
    return path


@pytest.fixture
def balancer(tmp_path: Path, free_port: Callable[[], int]) -> Iterator[Callable[[int, bool], int]]:
    """Start HAProxy in TCP mode in front of an ingress port, connecting from BALANCER, with or without
    PROXY protocol v2 (``send-proxy-v2``); returns its port."""
    haproxy = haproxy_bin()
    started: list[subprocess.Popen[bytes]] = []

    def start(ingress_port: int, proxy_protocol: bool) -> int:
        port = free_port()
        conf = tmp_path / f"haproxy-{port}.cfg"
        conf.write_text(
            "global\n    maxconn 2000\n"
            "defaults\n    mode tcp\n    timeout connect 5s\n    timeout client 1h\n    timeout server 1h\n"
            f"frontend lb\n    bind 127.0.0.1:{port}\n    default_backend ingress\n"
            f"backend ingress\n    server ingress 127.0.0.1:{ingress_port} source {BALANCER}"
            + (" send-proxy-v2\n" if proxy_protocol else "\n")
        )
        checked = subprocess.run([haproxy, "-c", "-f", str(conf)], capture_output=True, text=True, timeout=30)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        log = open(tmp_path / f"haproxy-{port}.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen([haproxy, "-db", "-f", str(conf)], stdout=log, stderr=subprocess.STDOUT)
        log.close()
        started.append(proc)
        wait_for_port(port, 10, proc)
        return port

    yield start
    for proc in started:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# What deploy/ingress/README.md tells an operator to add to the ingress behind a PROXY protocol balancer.
PROXY_PROTOCOL_SERVER = [f"set_real_ip_from {BALANCER};", "real_ip_header proxy_protocol;"]


def test_the_docs_give_the_proxy_protocol_directives(repo: Path) -> None:
    for doc in ("deploy/ingress/README.md", "README.md"):
        text = (repo / doc).read_text()
        for needle in ("send-proxy-v2", "proxy_protocol;", "set_real_ip_from", "real_ip_header proxy_protocol;"):
            assert needle in text, f"{doc} does not mention {needle}"
        assert "UPF_PROXY_TRUSTED" in text, doc


async def test_a_plain_l4_balancer_hides_the_phones(stack: Stack, start_ingress, balancer) -> None:
    """Why the docs ask for PROXY protocol: through a plain TCP balancer, nginx sees only the balancer, so
    its X-Forwarded-For names the balancer and every phone shares one request limit."""
    ingress = start_ingress([stack.writer.port], [stack.pusher.port], http_extra=[f"proxy_bind {compose().ingress};"])
    url = f"http://127.0.0.1:{balancer(ingress.port, False)}"
    async with phone() as first, phone() as second:
        assert (await exhaust_request_limit(first, url))[-1] == 429
        other = await second.post(f"{url}/{topic()}", content=b"from another phone")
    assert other.status_code == 429, "the balancer did not hide the client: this test no longer shows the problem"


async def test_proxy_protocol_carries_each_phone_through_the_balancer(stack: Stack, start_ingress, balancer) -> None:
    """HAProxy with send-proxy-v2 in front, the shipped ingress with the documented listen/real_ip lines:
    each phone is itself again at the roles, with compose's UPF_PROXY_TRUSTED naming only the ingress."""
    ingress = start_ingress(
        [stack.writer.port],
        [stack.pusher.port],
        listen_options="proxy_protocol",
        server_extra=PROXY_PROTOCOL_SERVER,
        http_extra=[f"proxy_bind {compose().ingress};"],
    )
    url = f"http://127.0.0.1:{balancer(ingress.port, True)}"
    addresses = [new_phone_address(), new_phone_address()]
    async with phone(addresses[0]) as first, phone(addresses[1]) as second:
        statuses = await exhaust_request_limit(first, url)
        assert statuses[-1] == 429 and set(statuses[:-1]) == {200}, statuses
        other = await second.post(f"{url}/{topic()}", content=b"from another phone")
    assert other.status_code == 200, other.text
    deadline = time.monotonic() + 10  # nginx logs a request after its reply: a busy host may not have yet
    while True:
        logged = {line.split()[0] for line in (ingress.workdir / "access.log").read_text().splitlines() if line}
        if logged == set(addresses) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    assert logged == set(addresses), f"nginx saw {logged} as clients"
