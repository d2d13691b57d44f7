"""``upf`` management commands at their edges: a token expiry past any calendar, and a store path that
names no store (a typo must not become a new, empty store that a backup or a listing reports on)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


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
