"""The access gate over a real embedded store: open when nothing is configured, and following changes
made through another store handle (another process's CLI) without a restart."""

from __future__ import annotations

import asyncio
import base64
import time

import bcrypt
import pytest

from upf_edge.access import ANONYMOUS, FORBIDDEN, UNAUTHORIZED, Identity, hash_password, new_token
from upf_edge.errors import NtfyError
from upf_edge.gate import AccessGate, auth_param
from upf_edge.limiter import presents_credentials
from upf_keyspace import Settings, open_store
from upf_keyspace.auth import EVERYONE, Permission, Token, User, token_digest


@pytest.fixture
async def stores(tmp_path):
    a = await open_store(Settings(store_path=str(tmp_path / "upf.db"), shard_count=4))
    b = await open_store(Settings(store_path=str(tmp_path / "upf.db"), shard_count=4))
    yield a, b
    await a.close()
    await b.close()


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


async def eventually(check, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        try:
            check()
            return
        except (AssertionError, NtfyError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.02)


def status(gate: AccessGate, auth: str | None, topics: list[str], write: bool) -> int:
    try:
        gate.check(auth, None, topics, write=write)
        return 200
    except NtfyError as exc:
        return exc.http


async def test_nothing_configured_is_open_and_ignores_credentials(stores):
    gate = AccessGate(stores[0])
    await gate.start()
    try:
        assert gate.check("Basic garbage!!", "@@", ["t"], write=True) is ANONYMOUS
    finally:
        await gate.stop()


async def test_changes_from_another_handle_reach_a_running_gate(stores):
    server, cli = stores
    gate = AccessGate(server)
    await gate.start()
    try:
        await cli.add_user("phil", User(role="user", password_hash=hash_password("pw")))
        await cli.set_access(EVERYONE, "private*", Permission.DENY)

        def denied() -> None:
            assert status(gate, None, ["private1"], False) == 403

        await eventually(denied)
        assert status(gate, None, ["public"], True) == 200  # default read-write still applies elsewhere
        assert status(gate, basic("phil", "nope"), ["public"], True) == 401
        await cli.set_access("phil", "private*", Permission.READ_ONLY)
        await eventually(lambda: gate.check(basic("phil", "pw"), None, ["private1"], write=False))
        assert gate.check(basic("phil", "pw"), None, ["private1"], write=False) == Identity("phil", False)
        assert status(gate, basic("phil", "pw"), ["private1"], True) == 403
    finally:
        await gate.stop()


async def test_deny_all_default_closes_an_unconfigured_server(stores):
    gate = AccessGate(stores[0], "deny-all")
    await gate.start()
    try:
        assert status(gate, None, ["t"], False) == 403 and status(gate, None, ["t"], True) == 403
    finally:
        await gate.stop()


async def test_roles_of_one_process_share_one_gate_per_store(stores):
    """The writer and the pusher of an all-in-one get the same gate (one watch), stopped with the last."""
    a = await AccessGate.acquire(stores[0])
    b = await AccessGate.acquire(stores[0])
    other = await AccessGate.acquire(stores[1])
    assert a is b and a is not other
    await a.release()
    assert a._task is not None and not a._task.done()  # still in use by the other role
    await b.release()
    assert a._task is None
    await other.release()
    fresh = await AccessGate.acquire(stores[0])
    assert fresh is not a  # a fresh one after the last release
    await fresh.release()


def test_auth_param_is_read_as_ntfys_read_query_param() -> None:
    """``?authorization=`` first, then ``?auth=``, the first not empty, trimmed: a blank one is no
    parameter (the header counts, and it is not a login attempt to charge)."""
    assert auth_param({"auth": "QQ", "authorization": "Qg"}) == "Qg"
    assert auth_param({"auth": "QQ", "authorization": ""}) == "QQ"
    assert auth_param({"auth": " QQ \t"}) == "QQ"
    assert auth_param({"auth": "  "}) == "" and not presents_credentials(None, auth_param({"auth": "  "}))
    assert auth_param({}) is None


async def test_an_auth_change_tells_listeners_and_allows_judges_what_streams_logged_in_with(stores, monkeypatch):
    """A pusher re-checks its open streams after each change (``allows``): with the credential each
    logged in with, bcrypt run again only for a password whose stored hash changed, and once per
    credential however many streams share it."""
    server, cli = stores
    await cli.add_user("phil", User(role="user", password_hash=hash_password("pw")))
    await cli.set_access("phil", "up*", Permission.READ_ONLY)
    await cli.set_access(EVERYONE, "public", Permission.READ_ONLY)
    gate = AccessGate(server, "deny-all")
    changes: list[bool] = []
    gate.listen(changes.append)
    await gate.start()
    try:
        assert changes == []  # the first load is no change
        phil = (basic("phil", "pw"), None)
        assert gate.check(*phil, ["up1"], write=False) == Identity("phil", False)  # bcrypt once, here
        checks: list[bytes] = []
        real = bcrypt.checkpw
        monkeypatch.setattr(bcrypt, "checkpw", lambda pw, h: checks.append(pw) or real(pw, h))

        await cli.set_access(EVERYONE, "news", Permission.READ_ONLY)
        await eventually(lambda: assert_(len(changes) == 1))
        seen: dict = {}
        assert changes == [False]  # a new state: every stream is looked at, anonymous ones too
        assert gate.refusal(phil, ["up1", "up2"], seen) is None and gate.refusal(None, ["public"], seen) is None
        assert gate.refusal(None, ["up1"], seen) == gate.refusal(phil, ["up1", "other"], seen) == FORBIDDEN
        assert checks == []  # the password's digest carried over to the new state's authorizer

        await cli.put_user("phil", User(role="user", password_hash=hash_password("new")))
        await eventually(lambda: assert_(len(changes) == 2))
        seen = {}
        assert all(gate.refusal(phil, ["up1"], seen) == UNAUTHORIZED for _ in range(5))
        assert checks == [b"pw"]  # one failed bcrypt for five streams
        assert gate.refusal((basic("phil", "new"), None), ["up1"], seen) is None

        gate.unlisten(print)  # not a listener: ignored
        await cli.delete_user("phil")
        await eventually(lambda: assert_(len(changes) == 3))
        assert gate.refusal((basic("phil", "new"), None), ["up1"], {}) == UNAUTHORIZED
    finally:
        await gate.stop()


def assert_(condition: bool) -> None:
    assert condition


async def test_a_token_expiry_is_an_auth_change_for_the_streams_it_opened(stores):
    """Nothing is written when a token expires: the gate wakes at the state's next expiry and tells
    its listeners, so a pusher ends the streams that token opened."""
    server, cli = stores
    await cli.add_user("phil", User(role="user", password_hash=hash_password("pw")))
    await cli.set_access("phil", "up*", Permission.READ_ONLY)
    token = new_token()
    await cli.add_token("phil", token_digest(token), Token(expires=int(time.time()) + 1))
    gate = AccessGate(server, "deny-all")
    changes: list[bool] = []
    gate.listen(changes.append)
    await gate.start()
    try:
        bearer = (f"Bearer {token}", None)
        assert gate.refusal(bearer, ["up1"], {}) is None and changes == []
        await eventually(lambda: assert_(len(changes) == 1), timeout=3.0)
        assert changes == [True]  # only streams that logged in with a credential need a look
        assert gate.refusal(bearer, ["up1"], {}) == UNAUTHORIZED
        assert gate._expiry is None  # no other token expires: no timer left
    finally:
        await gate.stop()
