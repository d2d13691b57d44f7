"""``upf user|access|token`` as a user runs them: real processes on a store file, also while a server
holds it, with what each prints and exits; the store then holds hashes, never secrets."""

from __future__ import annotations

import asyncio
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from upf_keyspace import Settings, open_store
from upf_keyspace.auth import EVERYONE, Permission, token_digest


def upf(store: Path, *args: str, password: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UPF_", "FDB_", "OTEL_"))}
    env.update(UPF_STORE_PATH=str(store), UPF_LOG_LEVEL="WARNING")
    if password is not None:
        env["UPF_PASSWORD"] = password
    return subprocess.run(
        [sys.executable, "-m", "upf", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def state(store: Path):  # type: ignore[no-untyped-def]
    async def load():  # type: ignore[no-untyped-def]
        s = await open_store(Settings(store_path=str(store)))
        try:
            return await s.auth_state()
        finally:
            await s.close()

    return asyncio.run(load())


def test_users_roles_and_passwords(tmp_path: Path) -> None:
    store = tmp_path / "upf.db"
    r = upf(store, "user", "add", "phil", password="correct horse")
    assert (r.returncode, r.stdout.strip()) == (0, "user phil added with role user"), r.stderr
    assert upf(store, "user", "add", "--role=admin", "ben", password="pw2").returncode == 0
    again = upf(store, "user", "add", "phil", password="x")
    assert again.returncode == 1 and "exists already" in again.stderr
    assert upf(store, "user", "change-role", "phil", "admin").stdout.strip() == "changed role for user phil to admin"
    assert upf(store, "user", "change-pass", "phil", password="battery staple").returncode == 0
    s = state(store)
    assert {n: u.role for n, u in s.users.items()} == {"phil": "admin", "ben": "admin"}
    assert s.users["phil"].password_hash.startswith("$2b$") and "battery" not in s.users["phil"].password_hash
    listing = upf(store, "user", "list").stdout
    assert "user ben (admin)" in listing and "user phil (admin)" in listing and "user * (anonymous)" in listing
    assert upf(store, "user", "del", "ben").stdout.strip() == "user ben removed"
    gone = upf(store, "user", "del", "ben")
    assert gone.returncode == 1 and "does not exist" in gone.stderr


def test_access_entries_grant_list_and_reset(tmp_path: Path) -> None:
    store = tmp_path / "upf.db"
    upf(store, "user", "add", "phil", password="pw")
    assert upf(store, "access", "phil", "up*", "rw").stdout.strip() == "granted read-write access to topic up* for phil"
    assert (
        upf(store, "access", "*", "announce", "read").stdout.strip()
        == "granted read-only access to topic announce for everyone"
    )
    assert upf(store, "access", "phil").stdout.strip() == "phil read-write up*"
    s = state(store)
    assert [(u, p, a.permission) for u, p, a in s.access] == [
        (EVERYONE, "announce", Permission.READ_ONLY),
        ("phil", "up*", Permission.READ_WRITE),
    ]
    assert upf(store, "access", "--reset", "phil").stdout.strip() == "removed 1 access entry"
    assert upf(store, "access", "--reset").stdout.strip() == "removed 1 access entry"
    assert upf(store, "access").stdout.strip() == "no access entries"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("access", "phil", "a.b", "rw"), "topic pattern must be"),
        (("access", "phil", "t", "sudo"), "permission must be one of"),
        (("access", "phil", "t"), "give a permission"),
        (("user", "add", "bad name"), "user name must be"),
        (("token", "add", "--expires", "soon", "phil"), "--expires takes a duration"),
        (("token", "remove", "phil", "tk_short"), "a token is tk_"),
        (("user", "add", "nopass"), "set UPF_PASSWORD"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    store = tmp_path / "upf.db"
    upf(store, "user", "add", "phil", password="pw")
    r = upf(store, *args)
    assert r.returncode == 2 and message in r.stderr, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr


def test_unknown_user_and_unknown_command(tmp_path: Path) -> None:
    store = tmp_path / "upf.db"
    r = upf(store, "access", "ghost", "t", "rw")
    assert r.returncode == 1 and "user ghost does not exist" in r.stderr
    r = upf(store, "frobnicate")
    assert r.returncode == 2 and "unknown command 'frobnicate'" in r.stderr


def test_tokens_are_printed_once_and_stored_hashed(tmp_path: Path) -> None:
    store = tmp_path / "upf.db"
    upf(store, "user", "add", "phil", password="pw")
    r = upf(store, "token", "add", "--label", "phone", "--expires", "30d", "phil")
    token = r.stdout.strip()
    assert r.returncode == 0 and token.startswith("tk_") and len(token) == 32
    s = state(store)
    assert token_digest(token) in s.tokens and s.tokens[token_digest(token)][1].expires > time.time() + 29 * 86400
    listing = upf(store, "token", "list").stdout
    assert f"phil: {token[:7]}... phone, expires" in listing and token not in listing
    for f in tmp_path.iterdir():
        if f.is_file():
            assert token.encode() not in f.read_bytes()
    assert upf(store, "token", "remove", "phil", token).stdout.strip() == "token removed for user phil"
    assert upf(store, "token", "remove", "phil", token).returncode == 1
    assert upf(store, "token", "list", "phil").stdout.strip() == "no tokens"


def test_commands_work_while_a_server_holds_the_store(tmp_path: Path) -> None:
    """The CLI and a running all-in-one share the store file (no lock-out, no restart)."""
    store = tmp_path / "upf.db"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UPF_", "FDB_", "OTEL_"))}
    env.update(UPF_STORE_PATH=str(store), UPF_BIND=f"127.0.0.1:{port}", UPF_WORKERS="1", UPF_LOG_LEVEL="WARNING")
    server = subprocess.Popen(
        [sys.executable, "-m", "upf"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        assert server.stdout is not None and "upf:" in server.stdout.readline()
        assert upf(store, "user", "add", "live", password="pw").returncode == 0
        assert upf(store, "access", "live", "x*", "ro").returncode == 0
        assert server.poll() is None
        assert "live" in state(store).users
    finally:
        server.terminate()
        server.wait(15)


def test_vapid_bindings_listed_and_reset(tmp_path: Path) -> None:
    """``upf vapid list|reset``: bindings the servers made are shown (topic: key) and removable."""
    store = tmp_path / "upf.db"
    assert upf(store, "vapid", "list").returncode == 2 and not store.exists()  # no store there: refused, none made

    async def bind() -> None:
        s = await open_store(Settings(store_path=str(store)))
        try:
            assert await s.vapid_admit("upA", "BKeyA", bind=True)
            assert await s.vapid_admit("upB", "BKeyB", bind=True)
        finally:
            await s.close()

    asyncio.run(bind())
    assert upf(store, "vapid", "list").stdout.strip().splitlines() == ["upA: BKeyA", "upB: BKeyB"]
    assert upf(store, "vapid", "list", "upB").stdout.strip() == "upB: BKeyB"
    r = upf(store, "vapid", "reset", "upA")
    assert r.returncode == 0 and "upA unbound" in r.stdout
    again = upf(store, "vapid", "reset", "upA")
    assert again.returncode == 1 and "not restricted" in again.stderr
    assert upf(store, "vapid", "list", "upA").returncode == 1
    bad = upf(store, "vapid", "reset", "no/topic")
    assert bad.returncode == 2 and "a topic is 1-64" in bad.stderr and "Traceback" not in bad.stderr
    assert upf(store, "vapid", "list").stdout.strip() == "upB: BKeyB"


# --- the commands at their edges: an expiry past any calendar, and a store path that names no store
# (a typo must not become a new, empty store that a backup or a listing reports on) ------------------


@pytest.mark.parametrize("expires", ["99999999999999999999d", "100000000000000000s", "3651d"])
def test_an_expiry_past_the_cap_is_a_usage_error_and_listing_still_works(tmp_path: Path, expires: str) -> None:
    """Past ten years is refused (exit 2, one line), not an OverflowError, nor a record whose date no
    listing can print: ``token list`` keeps working for everyone."""
    store = tmp_path / "upf.db"
    assert upf(store, "user", "add", "phil", password="pw").returncode == 0
    r = upf(store, "token", "add", "--expires", expires, "phil")
    assert (r.returncode, r.stdout) == (2, ""), (r.returncode, r.stdout, r.stderr)
    assert "--expires" in r.stderr and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    ok = upf(store, "token", "add", "--expires", "3650d", "phil")
    assert ok.returncode == 0 and ok.stdout.startswith("tk_"), ok.stderr
    listing = upf(store, "token", "list")
    assert listing.returncode == 0 and "phil: tk_" in listing.stdout, listing.stderr


def test_a_token_from_the_api_dated_past_any_calendar_is_still_listed(tmp_path: Path) -> None:
    """The token API takes any 64-bit ``expires`` (as ntfy): the listing prints it rather than failing."""
    import asyncio

    from upf_keyspace import Settings, open_store
    from upf_keyspace.auth import Token

    store = tmp_path / "upf.db"
    assert upf(store, "user", "add", "phil", password="pw").returncode == 0

    async def add() -> None:
        s = await open_store(Settings(store_path=str(store)))
        try:
            await s.add_token("phil", "d" * 64, Token(label="far", expires=(1 << 63) - 1, created=1, hint="tk_far0"))
        finally:
            await s.close()

    asyncio.run(add())
    listing = upf(store, "token", "list")
    assert listing.returncode == 0 and "phil: tk_far0... far, expires" in listing.stdout, listing.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("backup", "out.upfb"),
        ("user", "list"),
        ("access",),
        ("access", "--reset"),
        ("token", "list"),
        ("token", "add", "phil"),
        ("vapid", "list"),
        ("user", "del", "phil"),
    ],
)
def test_a_store_path_that_names_no_store_is_refused_not_created(tmp_path: Path, args: tuple[str, ...]) -> None:
    """Exit 2 with one line naming the path; nothing is created (no empty store, no backup file)."""
    store = tmp_path / "typo" / "upf.db"
    r = upf(store, *[str(tmp_path / a) if a.endswith(".upfb") else a for a in args])
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert r.stdout == "" and str(store) in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "typo").exists() and not (tmp_path / "out.upfb").exists()


def test_a_new_store_is_still_made_by_adding_users_and_access_or_by_restore(tmp_path: Path) -> None:
    """Users and ACL entries may be made before the server first runs (README, Securing a public server),
    and ``restore`` goes into a new store: those create it."""
    first = tmp_path / "first.db"
    assert upf(first, "user", "add", "phil", password="pw").returncode == 0
    assert upf(first, "user", "list").returncode == 0
    second = tmp_path / "second.db"
    grant = upf(second, "access", "*", "news", "ro")
    assert grant.returncode == 0 and "granted read-only" in grant.stdout, grant.stderr
    assert upf(first, "backup", str(tmp_path / "b.upfb")).returncode == 0
    third = tmp_path / "new" / "third.db"
    restored = upf(third, "restore", str(tmp_path / "b.upfb"))
    assert restored.returncode == 0 and "restored" in restored.stdout, restored.stderr
    assert "user phil (user)" in upf(third, "user", "list").stdout


@pytest.mark.parametrize(
    ("args", "password", "code", "message"),
    [
        (("user", "add", "phil"), "p" * 73, 2, "at most 72 bytes"),  # bcrypt reads no further
        (
            ("user", "add", "phil"),
            "\udcff",
            2,
            "must be UTF-8 text",
        ),  # a byte that is not UTF-8, as os.environ keeps it
        (("user", "add", "bad name"), "pw", 2, "user name must be"),
        (("access", "ghost", "up*", "rw"), None, 1, "user ghost does not exist"),  # a new store has no users
        (("access", "*", "a.b", "rw"), None, 2, "topic pattern must be"),
        (("access", "*", "up*", "sudo"), None, 2, "permission must be one of"),
        (("restore", "/no/such/backup.upfb"), None, 1, "No such file"),
    ],
)
def test_a_refused_command_creates_no_store_at_a_new_path(
    tmp_path: Path, args: tuple[str, ...], password: str | None, code: int, message: str
) -> None:
    """The commands that may make a store check everything first: one refused leaves no empty store
    (nor its lock and mark files) behind at what may be a mistyped UPF_STORE_PATH."""
    store = tmp_path / "new" / "upf.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UPF_", "FDB_", "OTEL_"))}
    env.update(UPF_STORE_PATH=str(store), UPF_LOG_LEVEL="WARNING")
    if password is not None:
        env["UPF_PASSWORD"] = password
    r = subprocess.run(
        [sys.executable, "-m", "upf", *args],
        env={k: v.encode("utf-8", "surrogateescape") for k, v in env.items()},  # type: ignore[misc]
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == code and message in r.stderr, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and not (tmp_path / "new").exists()


def test_a_token_that_would_expire_at_birth_and_help(tmp_path: Path) -> None:
    store = tmp_path / "upf.db"
    upf(store, "user", "add", "phil", password="pw")
    r = upf(store, "token", "add", "--expires", "0d", "phil")
    assert r.returncode == 2 and "longer than 0" in r.stderr
    for flag in ("--help", "-h"):
        r = upf(store, flag)
        assert r.returncode == 0 and "Without a command, upf runs the server" in r.stdout, r.stderr


@pytest.mark.parametrize("key", [b"\x03", b"\x04"], ids=["ctrl-c", "ctrl-d"])
def test_ctrl_c_or_ctrl_d_at_the_password_prompt_cancels_at_once(tmp_path: Path, key: bytes) -> None:
    """The password is asked before the event loop starts: the first Ctrl-C ends the command (exit
    130, one line), as does Ctrl-D; nothing is written."""
    import pty

    store = tmp_path / "upf.db"
    upf(store, "user", "add", "phil", password="pw")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UPF_", "FDB_", "OTEL_"))}
    env.update(UPF_STORE_PATH=str(store), UPF_LOG_LEVEL="WARNING")
    pid, fd = pty.fork()
    if pid == 0:  # the child: the command, on the terminal, with Ctrl-C's default (a job a script
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # started in the background inherits it ignored)
        os.execve(sys.executable, [sys.executable, "-m", "upf", "user", "change-pass", "phil"], env)
    out = b""

    def read_until(done: Callable[[bytes], bool]) -> None:
        nonlocal out
        deadline = time.monotonic() + 30
        while not done(out) and time.monotonic() < deadline:
            if select.select([fd], [], [], 0.5)[0]:
                try:
                    chunk = os.read(fd, 1024)
                except OSError:  # the child closed the terminal
                    return
                if not chunk:
                    return
                out += chunk

    read_until(lambda seen: b"password for phil" in seen)
    os.write(fd, key)
    read_until(lambda seen: False)  # to the end of its output
    deadline = time.monotonic() + 10
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:  # still asking: the key did nothing
        os.kill(pid, signal.SIGKILL)
        done = os.waitpid(pid, 0)
    status = done[1]
    os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 130, out
    assert b"upf: cancelled" in out and b"Traceback" not in out


def test_token_labels_and_listings_stay_one_line_per_token(tmp_path: Path) -> None:
    store = tmp_path / "upf.db"
    upf(store, "user", "add", "phil", password="pw")
    r = upf(store, "token", "add", "--label", "line one\nphil: tk_forged... fake", "phil")
    assert r.returncode == 2 and "printable" in r.stderr
    assert upf(store, "token", "add", "--label", "Téléphone 🎉", "phil").returncode == 0
    listing = upf(store, "token", "list", "phil").stdout.strip().splitlines()
    assert len(listing) == 1 and "Téléphone 🎉" in listing[0]
    r = upf(store, "token", "list", "nobody")
    assert r.returncode == 1 and "user nobody does not exist" in r.stderr
