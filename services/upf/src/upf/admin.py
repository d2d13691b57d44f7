"""``upf user|access|token|vapid``: manage users, ACL entries, tokens and VAPID-restricted topics in
the store the servers use.

Why a store and not a file: every writer and pusher of a fleet reads the same records and watches
their version, so a change made here while the servers run reaches all of them within moments,
without a restart. The commands mirror ntfy's (``ntfy user add``, ``ntfy access``, ``ntfy token``) so
a self-hoster's muscle memory works. Secrets are never printed back, except a new token, once.
``upf backup FILE`` / ``upf restore FILE``: see ``backup.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import os
import re
import sys
import time
from collections.abc import Sequence

from upf_edge.access import hash_password, new_token, parse_permission, valid_pattern, valid_token, valid_user_name
from upf_keyspace import Settings, SettingsError, Store, StoreError, StoreOpenError, load_settings, open_store
from upf_keyspace.auth import EVERYONE, ROLES, Permission, Token, User, token_digest
from upf_keyspace.ops.auth import NoSuchUser, UserExists

from .backup import BackupError

__all__ = ["COMMANDS", "run"]

COMMANDS = ("user", "access", "token", "vapid", "backup", "restore")
_TOPIC = re.compile(r"[-_A-Za-z0-9]{1,64}")
_DURATION = re.compile(r"(\d+)([smhd])")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_EXPIRES_SECS = 3650 * 86400
"""The longest ``--expires``: ten years. ntfy has no stated bound (its durations overflow silently past
~292 years); past a calendar a token's record could not be stored or its date printed."""


MAX_LABEL_CHARS = 200
"""A token label from the CLI (the token API takes what ntfy takes: its listing escapes what it shows)."""
MAX_PASSWORD_BYTES = 72
"""bcrypt reads no further: a longer password is refused rather than cut (as Go's bcrypt, ntfy's, does)."""


class UsageError(Exception):
    """Bad arguments: exit 2 with the message."""


def _name(text: str) -> str:
    if not valid_user_name(text):
        raise UsageError(f"user name must be 1-64 of [-_.@+A-Za-z0-9], got {text!r}")
    return text


def _password(prompt_for: str) -> str:
    """UPF_PASSWORD when set (scripts, provisioning), else asked twice on the terminal."""
    env = os.environ.get("UPF_PASSWORD")
    if env is not None:
        password = env
    else:
        if not sys.stdin.isatty():
            raise UsageError("no terminal to ask for the password: set UPF_PASSWORD")
        password = getpass.getpass(f"password for {prompt_for}: ")
        if getpass.getpass("confirm: ") != password:
            raise UsageError("passwords do not match")
    if not password:
        raise UsageError("the password must not be empty")
    try:
        size = len(password.encode("utf-8"))
    except UnicodeEncodeError:  # UPF_PASSWORD with bytes that are not UTF-8 (os.environ keeps them as surrogates)
        raise UsageError("the password must be UTF-8 text") from None
    if size > MAX_PASSWORD_BYTES:
        raise UsageError(f"the password must be at most {MAX_PASSWORD_BYTES} bytes (bcrypt's limit), got {size}")
    return password


def _expiry(text: str | None, now: float) -> int:
    if not text:
        return 0
    m = _DURATION.fullmatch(text.strip())
    if m is None:
        raise UsageError(f"--expires takes a duration such as 30d, 12h or 90m, got {text!r}")
    secs = int(m.group(1)) * _UNIT[m.group(2)]
    if not secs:
        raise UsageError(f"--expires must be longer than 0 (a token that expired at birth), got {text!r}")
    if secs > MAX_EXPIRES_SECS:
        raise UsageError(f"--expires is at most 3650d (ten years), got {text!r}")
    return int(now) + secs


def _expires(expires: int, now: float) -> str:
    """A token's expiry for a listing; one the token API dated past any calendar is printed as is."""
    if not expires:
        return "never expires"
    if expires <= now:
        return "expired"
    try:
        return f"expires {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(expires))}"
    except (OverflowError, OSError, ValueError):
        return f"expires at unix time {expires}"


def _last_use(token: Token) -> str:
    """When and where a token was last used (the token API's ``last_access``/``last_origin``)."""
    if not token.last_access:
        return ", not used yet"
    origin = f" from {token.origin}" if token.origin.isprintable() and token.origin else ""
    return f", last used {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(token.last_access))}{origin}"


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="upf",
        description="manage UPF's users, ACL entries and tokens; back up and restore its store",
        epilog="Without a command, upf runs the server: the roles in UPF_ROLES on UPF_BIND, with the store "
        "at UPF_STORE_PATH (or FDB_CLUSTER_FILE); every UPF_* setting is listed in the README.",
    )
    sub = ap.add_subparsers(dest="command", required=True)

    user = sub.add_parser("user", help="users").add_subparsers(dest="action", required=True)
    add = user.add_parser("add", help="add a user (password from UPF_PASSWORD, else asked)")
    add.add_argument("--role", choices=ROLES, default="user")
    add.add_argument("name")
    user.add_parser("del", help="delete a user with its tokens and ACL entries").add_argument("name")
    user.add_parser("change-pass", help="set a new password").add_argument("name")
    role = user.add_parser("change-role", help="make a user admin or user")
    role.add_argument("name")
    role.add_argument("role", choices=ROLES)
    user.add_parser("list", help="list users and their ACL entries")

    access = sub.add_parser("access", help="show, grant or reset ACL entries")
    access.add_argument("--reset", action="store_true", help="remove entries: all, a user's, or one pattern's")
    access.add_argument("user", nargs="?", help="a user name, or * for everyone")
    access.add_argument("pattern", nargs="?", help="a topic, * standing for any characters")
    access.add_argument("permission", nargs="?", help="read-write|rw, read-only|ro, write-only|wo, deny")

    token = sub.add_parser("token", help="access tokens").add_subparsers(dest="action", required=True)
    tadd = token.add_parser("add", help="create a token and print it (shown only this once)")
    tadd.add_argument("--label", default="")
    tadd.add_argument("--expires", help="a duration: 30d, 12h, 90m (default: never)")
    tadd.add_argument("name")
    token.add_parser("list", help="list a user's tokens, or everyone's").add_argument("name", nargs="?")
    trm = token.add_parser("remove", help="remove a token")
    trm.add_argument("name")
    trm.add_argument("token")

    vapid = sub.add_parser("vapid", help="VAPID-restricted topics (UPF_VAPID_RESTRICT=1)").add_subparsers(
        dest="action", required=True
    )
    vapid.add_parser("list", help="list restricted topics and their keys, or one topic's").add_argument(
        "topic", nargs="?"
    )
    vapid.add_parser("reset", help="unbind a topic: the next valid VAPID key to publish binds it").add_argument("topic")
    _backup_parsers(sub)
    return ap


def _backup_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub.add_parser(
        "backup", help="write the store's messages, users and ACL to FILE (safe while serving)"
    ).add_argument("file")
    sub.add_parser(
        "restore", help="load FILE (from upf backup) into an empty store; new ids sort after it"
    ).add_argument("file")


async def _backup(store: Store, args: argparse.Namespace) -> str:
    from .backup import backup

    n = await backup(store, args.file)
    return f"backed up {n} keys to {args.file}"


async def _restore(settings: Settings, args: argparse.Namespace) -> str:
    """Restore, then (store closed) lift its stamp floor above every restored id."""
    from upf_janitor.janitor import dead_after
    from upf_keyspace.msgid import encode_id

    from .backup import finish_restore, restore

    store = await open_store(settings, restoring=True)
    try:
        n, top, floor = await restore(store, args.file, live_after=dead_after(settings), checked=args.checked)
    finally:
        await store.close()
    last = f"; the newest restored id is {encode_id(top)}" if top else ""
    if not settings.fdb_cluster_file:
        from upf_keyspace.drivers.embedded import raise_stamp_floor

        raise_stamp_floor(settings.store_path, floor)  # with the store closed; then the store is whole
    store = await open_store(settings, restoring=True)
    try:
        await finish_restore(store)
    finally:
        await store.close()
    if settings.fdb_cluster_file:
        return (
            f"restored {n} keys from {args.file}{last}; FoundationDB: new ids sort after them only once the "
            f"cluster's version exceeds {floor} (see README, Backups)"
        )
    return f"restored {n} keys from {args.file}{last}"


async def _user(store: Store, args: argparse.Namespace) -> str:
    if args.action == "list":
        users = await store.list_users()
        state = await store.auth_state()
        lines = []
        for name, user in sorted(users.items()):
            lines.append(f"user {name} ({user.role})")
            lines += [f"- {a.permission.value} access to topic {p}" for u, p, a in state.access if u == name]
        lines.append("user * (anonymous)")
        lines += [f"- {a.permission.value} access to topic {p}" for u, p, a in state.access if u == EVERYONE]
        return "\n".join(lines)
    name = _name(args.name)
    if args.action == "add":
        await store.add_user(
            name, User(role=args.role, password_hash=hash_password(args.password), created=int(time.time()))
        )
        return f"user {name} added with role {args.role}"
    if args.action == "del":
        await store.delete_user(name)
        return f"user {name} removed"
    found = await store.get_user(name)
    if found is None:
        raise NoSuchUser(name)
    user = found
    if args.action == "change-pass":
        await store.put_user(
            name, User(role=user.role, password_hash=hash_password(args.password), created=user.created)
        )
        return f"changed password for user {name}"
    await store.put_user(name, User(role=args.role, password_hash=user.password_hash, created=user.created))
    return f"changed role for user {name} to {args.role}"


def _access_args(args: argparse.Namespace) -> tuple[str | None, Permission | None]:
    """``upf access``'s user and permission, checked (``_prepare``, before the store is opened)."""
    user = None if args.user is None else (EVERYONE if args.user == EVERYONE else _name(args.user))
    if args.pattern is not None and not valid_pattern(args.pattern):
        raise UsageError(f"topic pattern must be 1-64 of [-_A-Za-z0-9*], got {args.pattern!r}")
    if args.reset:
        if args.permission is not None:
            raise UsageError("--reset takes at most a user and a pattern")
        return user, None
    if args.permission is None:
        if args.pattern is not None:
            raise UsageError("give a permission: upf access USER PATTERN PERMISSION")
        return user, None
    try:
        return user, parse_permission(args.permission)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


async def _access(store: Store, args: argparse.Namespace) -> str:
    user, permission = args.user, args.permission
    if args.reset:
        removed = await store.reset_access(user, args.pattern)
        return f"removed {removed} access entr{'y' if removed == 1 else 'ies'}"
    if permission is None:
        state = await store.auth_state()
        entries = [(u, p, a) for u, p, a in state.access if user is None or u == user]
        return "\n".join(f"{u} {a.permission.value} {p}" for u, p, a in entries) or "no access entries"
    await store.set_access(user or EVERYONE, args.pattern, permission)
    return f"granted {permission.value} access to topic {args.pattern} for {'everyone' if user == EVERYONE else user}"


async def _token(store: Store, args: argparse.Namespace) -> str:
    now = time.time()
    if args.action == "add":
        name = _name(args.name)
        if len(args.label) > MAX_LABEL_CHARS or not args.label.isprintable():
            raise UsageError(f"a token label is at most {MAX_LABEL_CHARS} printable characters (no line breaks)")
        token = new_token()
        record = Token(label=args.label, expires=_expiry(args.expires, now), created=int(now), hint=token[:7])
        await store.add_token(name, token_digest(token), record)
        return token
    if args.action == "remove":
        name = _name(args.name)
        if not valid_token(args.token):
            raise UsageError("a token is tk_ followed by 29 of [a-z0-9]")
        if not await store.remove_token(name, token_digest(args.token)):
            raise LookupError("no such token for that user")
        return f"token removed for user {name}"
    if args.name and await store.get_user(_name(args.name)) is None:
        raise NoSuchUser(args.name)
    names = [args.name] if args.name else sorted(await store.list_users())
    lines = []
    for name in names:
        for record in (await store.list_tokens(name)).values():
            label = record.label or "(no label)"
            if not label.isprintable():  # a line break from the token API must not forge a line of the listing
                label = label.encode("unicode_escape").decode("ascii")
            lines.append(f"{name}: {record.hint}... {label}, {_expires(record.expires, now)}{_last_use(record)}")
    return "\n".join(lines) or "no tokens"


def _topic(text: str) -> str:
    if not _TOPIC.fullmatch(text):
        raise UsageError(f"a topic is 1-64 of [-_A-Za-z0-9], got {text!r}")
    return text


async def _vapid(store: Store, args: argparse.Namespace) -> str:
    """Bindings are printed with the key (a public key, no secret): ``topic: key``."""
    if args.action == "reset":
        topic = _topic(args.topic)
        if not await store.vapid_reset(topic):
            raise LookupError(f"topic {topic} is not restricted")
        return f"topic {topic} unbound: the next valid VAPID key to publish to it binds it"
    if args.topic is not None:
        topic = _topic(args.topic)
        key = await store.vapid_binding(topic)
        if key is None:
            raise LookupError(f"topic {topic} is not restricted")
        return f"{topic}: {key}"
    return "\n".join(f"{topic}: {key}" for topic, key in await store.vapid_bindings()) or "no restricted topics"


def _creates(args: argparse.Namespace) -> bool:
    """The commands that may make a new store: users and ACL entries may be set up before the server
    first runs (README), and ``restore`` goes into a new store. Any other command on a store file that
    does not exist is a mistyped UPF_STORE_PATH: opening it would create an empty store and report on it."""
    if args.command == "restore":
        return True
    if args.command == "user":
        return bool(args.action == "add")
    return args.command == "access" and not args.reset and args.permission is not None


def _prepare(args: argparse.Namespace, settings: Settings) -> None:
    """Everything a command can refuse before the store is opened (opening a path that does not exist
    creates a store there): names, patterns, durations, the backup file, and the password, asked here,
    outside the event loop, so Ctrl-C and Ctrl-D at its prompt end the command at once."""
    new_store = not settings.fdb_cluster_file and not os.path.exists(settings.store_path)
    if new_store and not _creates(args):
        raise UsageError(f"no store at {settings.store_path} (UPF_STORE_PATH): check the path")
    if args.command == "user" and args.action in ("add", "change-pass"):
        args.password = _password(_name(args.name))
    elif args.command == "access":
        args.user, args.permission = _access_args(args)
        if new_store and args.user not in (None, EVERYONE) and args.permission is not None:
            raise NoSuchUser(args.user)  # a new store has no users yet
    elif args.command == "restore":
        from .backup import check_backup

        args.checked = check_backup(args.file)  # BackupError or OSError: exit 1, as restore's refusals


async def _run(args: argparse.Namespace, settings: Settings) -> str:
    if args.command == "restore":
        return await _restore(settings, args)
    store = await open_store(settings)
    try:
        handler = {"user": _user, "access": _access, "token": _token, "vapid": _vapid, "backup": _backup}[args.command]
        return await handler(store, args)
    finally:
        await store.close()


def run(argv: Sequence[str]) -> int:
    """Run one management command; 0 done, 1 refused (no such user, exists), 2 bad arguments."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        settings = load_settings()
        try:
            _prepare(args, settings)
        except (KeyboardInterrupt, EOFError):  # at the password prompt, before the store was opened
            print("\nupf: cancelled; nothing was written", file=sys.stderr)
            return 130
        print(asyncio.run(_run(args, settings)))
        return 0
    except KeyboardInterrupt:  # what was committed before it stays (a restore: see README, Backups)
        print("\nupf: interrupted", file=sys.stderr)
        return 130
    except (UsageError, SettingsError, StoreOpenError) as exc:
        print(f"upf: {exc}", file=sys.stderr)
        return 2
    except NoSuchUser as exc:
        print(f"upf: user {exc.args[0]} does not exist", file=sys.stderr)
        return 1
    except UserExists as exc:
        print(f"upf: user {exc.args[0]} exists already", file=sys.stderr)
        return 1
    except LookupError as exc:
        print(f"upf: {exc}", file=sys.stderr)
        return 1
    except (BackupError, OSError) as exc:
        print(f"upf: {exc}", file=sys.stderr)
        return 1
    except StoreError as exc:  # a full disk, a store that timed out: one line, as every refusal
        print(f"upf: {exc}", file=sys.stderr)
        return 1
