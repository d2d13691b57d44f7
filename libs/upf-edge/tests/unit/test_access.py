"""ntfy's authentication and ACL rules, pure: credentials, token shape, precedence, default access."""

from __future__ import annotations

import base64
import sqlite3

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from upf_edge.access import (
    ANONYMOUS,
    Authorizer,
    Credentials,
    Identity,
    hash_password,
    new_token,
    parse_credentials,
    parse_permission,
    pattern_matches,
    valid_pattern,
    valid_token,
)
from upf_edge.errors import NtfyError
from upf_keyspace.auth import EVERYONE, Access, AuthState, Permission, Token, User, token_digest

TOKEN = "tk_" + "abc123" * 4 + "xyz98"
NOW = 1_800_000_000.0


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def auth_param(header: str) -> str:
    return base64.urlsafe_b64encode(header.encode()).decode().rstrip("=")


def refused(header: str | None, param: str | None = None) -> tuple[int, int]:
    with pytest.raises(NtfyError) as err:
        parse_credentials(header, param)
    return err.value.http, err.value.code


def test_basic_bearer_and_query_credentials() -> None:
    assert parse_credentials(basic("phil", "s:cret"), None) == Credentials(user="phil", password="s:cret")
    assert parse_credentials(f"Bearer {TOKEN}", None) == Credentials(token=TOKEN)
    assert parse_credentials(f"bearer  {TOKEN} ", None) == Credentials(token=TOKEN)
    assert parse_credentials(basic("", TOKEN), None) == Credentials(token=TOKEN)  # empty user: a token
    # ?auth= is base64url of the whole header value, without padding, and wins over the header.
    assert parse_credentials(basic("a", "b"), auth_param(f"Bearer {TOKEN}")) == Credentials(token=TOKEN)


def test_web_push_authorization_is_anonymous_never_401() -> None:
    """Mastodon and pywebpush send VAPID here: anonymous, as ntfy does."""
    assert parse_credentials("vapid t=eyJ0eXAi.eyJhdWQi.sig,k=BNc", None).anonymous
    assert parse_credentials("WebPush eyJ0eXAi.eyJhdWQi.sig", None).anonymous
    assert parse_credentials("vapid t=" + "e" * 5000 + ",k=BNc", None).anonymous  # any length: not a login
    assert parse_credentials(None, None).anonymous and parse_credentials("", "").anonymous


@pytest.mark.parametrize(
    "header",
    [
        "Basic !!!notbase64",
        "Basic " + base64.b64encode(b"no-colon").decode(),
        "Bearer tk_short",
        "Bearer " + TOKEN.upper(),
        "Bearer " + TOKEN + "x",
        basic("", "tk_not_a_token"),
        "Basic " + "A" * 5000,
    ],
)
def test_malformed_credentials_are_401(header: str) -> None:
    assert refused(header) == (401, 40101)


def test_undecodable_auth_param_is_400_and_huge_one_401() -> None:
    assert refused(None, "@@@not-base64@@@") == (400, 40094)
    assert refused(None, base64.urlsafe_b64encode(b"\xff\xfe").decode()) == (400, 40094)  # not UTF-8
    assert refused(None, "A" * 5000) == (401, 40101)


@given(st.text(max_size=200), st.one_of(st.none(), st.text(max_size=200)))
def test_no_input_raises_anything_but_ntfy_errors(header: str, param: str | None) -> None:
    try:
        parse_credentials(header, param)
    except NtfyError as exc:
        assert exc.http in (400, 401)


def test_permission_names_and_aliases() -> None:
    assert {parse_permission(p) for p in ("rw", "read-write", "READ-WRITE")} == {Permission.READ_WRITE}
    assert {parse_permission(p) for p in ("ro", "read", "read-only")} == {Permission.READ_ONLY}
    assert {parse_permission(p) for p in ("wo", "write", "write-only")} == {Permission.WRITE_ONLY}
    assert {parse_permission(p) for p in ("deny", "none", "deny-all")} == {Permission.DENY}
    with pytest.raises(ValueError, match="permission must be one of"):
        parse_permission("sudo")


def test_patterns_have_one_wildcard_and_underscore_is_literal() -> None:
    assert pattern_matches("up*", "upABC") and pattern_matches("up*", "up")
    assert pattern_matches("*", "anything") and pattern_matches("a*b*c", "a-x-b-y-c")
    assert not pattern_matches("a*b*c", "a-c") and not pattern_matches("ab*ba", "aba")
    assert pattern_matches("a_b", "a_b") and not pattern_matches("a_b", "axb")
    assert valid_pattern("up*") and valid_pattern("a_b-C*") and not valid_pattern("a.b") and not valid_pattern("")
    assert not valid_pattern("a" * 65) and not valid_pattern("a b") and not valid_pattern("a?")


def test_new_tokens_have_ntfys_shape() -> None:
    tokens = {new_token() for _ in range(50)}
    assert len(tokens) == 50 and all(valid_token(t) for t in tokens)


def state(default_entries: list[tuple[str, str, Permission]]) -> AuthState:
    return AuthState(
        version=1,
        users={
            "phil": User(role="user", password_hash=hash_password("pw")),
            "root": User(role="admin", password_hash=hash_password("rootpw")),
        },
        tokens={
            token_digest(TOKEN): ("phil", Token(expires=0)),
            token_digest("tk_" + "e" * 29): ("phil", Token(expires=int(NOW) - 1)),
        },
        access=[(u, p, Access(permission=perm)) for u, p, perm in default_entries],
    )


def test_authenticate_passwords_tokens_and_expiry() -> None:
    authz = Authorizer(state([]))
    assert authz.authenticate(Credentials(user="phil", password="pw"), NOW) == Identity("phil", False)
    assert authz.authenticate(Credentials(user="phil", password="pw"), NOW) == Identity("phil", False)  # cached
    assert authz.authenticate(Credentials(user="root", password="rootpw"), NOW) == Identity("root", True)
    assert authz.authenticate(Credentials(token=TOKEN), NOW) == Identity("phil", False, token_digest(TOKEN))
    assert authz.authenticate(Credentials(), NOW) is ANONYMOUS
    for creds in (
        Credentials(user="phil", password="wrong"),
        Credentials(user="nobody", password="pw"),
        Credentials(token="tk_" + "e" * 29),  # expired
        Credentials(token="tk_" + "z" * 29),  # unknown
    ):
        with pytest.raises(NtfyError) as err:
            authz.authenticate(creds, NOW)
        assert (err.value.http, err.value.code) == (401, 40101)


def test_an_unknown_user_costs_a_bcrypt_check_as_a_wrong_password_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """Answering an unknown name without hashing would tell, by the time taken, which names are
    users; ntfy checks a dummy hash for them, and so does UPF."""
    import bcrypt

    authz = Authorizer(state([]))
    checks: list[bytes] = []
    real = bcrypt.checkpw

    def counted(password: bytes, hashed: bytes) -> bool:
        checks.append(password)
        return real(password, hashed)

    monkeypatch.setattr(bcrypt, "checkpw", counted)
    for creds in (Credentials(user="nobody", password="pw"), Credentials(user="phil", password="wrong")):
        with pytest.raises(NtfyError):
            authz.authenticate(creds, NOW)
    assert checks == [b"pw", b"wrong"]


def test_ntfy_precedence_own_entries_then_longer_pattern_then_write() -> None:
    authz = Authorizer(
        state(
            [
                (EVERYONE, "alerts*", Permission.READ_ONLY),
                (EVERYONE, "alerts-public", Permission.READ_WRITE),
                ("phil", "alerts*", Permission.DENY),
                ("phil", "mine*", Permission.READ_ONLY),
                ("phil", "mine*", Permission.READ_ONLY),
                ("phil", "m*", Permission.WRITE_ONLY),
            ]
        ),
        default=Permission.DENY,
    )
    phil = Identity("phil")
    assert authz.permission(phil, "alerts-public") is Permission.DENY  # the user's own entry comes first
    assert authz.permission(ANONYMOUS, "alerts-public") is Permission.READ_WRITE  # longer pattern wins
    assert authz.permission(ANONYMOUS, "alerts-x") is Permission.READ_ONLY
    assert authz.permission(phil, "mine1") is Permission.READ_ONLY  # longer of the user's patterns
    assert authz.permission(phil, "mx") is Permission.WRITE_ONLY
    assert authz.permission(ANONYMOUS, "other") is Permission.DENY  # no entry: the default
    assert authz.permission(Identity("root", True), "alerts-x") is Permission.READ_WRITE  # admins: everything


def test_write_granting_entry_wins_a_tie() -> None:
    authz = Authorizer(
        state(
            [
                (EVERYONE, "t*", Permission.READ_ONLY),
                (EVERYONE, "t*x", Permission.DENY),
                (EVERYONE, "t*", Permission.WRITE_ONLY),
            ]
        ),
        default=Permission.DENY,
    )
    assert authz.permission(ANONYMOUS, "tab") is Permission.WRITE_ONLY


def test_one_denied_topic_fails_a_multi_topic_request() -> None:
    authz = Authorizer(state([(EVERYONE, "secret", Permission.DENY)]))
    authz.check(ANONYMOUS, ("a", "b"), write=False)
    with pytest.raises(NtfyError) as err:
        authz.check(ANONYMOUS, ("a", "secret", "b"), write=False)
    assert (err.value.http, err.value.code) == (403, 40301)
    ro = Authorizer(state([]), default=Permission.READ_ONLY)
    ro.check(ANONYMOUS, ("a",), write=False)
    with pytest.raises(NtfyError):
        ro.check(ANONYMOUS, ("a",), write=True)


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_identify_remembers_successes_only(monkeypatch: pytest.MonkeyPatch) -> None:
    authz = Authorizer(state([]))
    clock = Clock(NOW)
    assert authz.identify(basic("phil", "pw"), None, clock) == Identity("phil", False)
    parsed = []
    monkeypatch.setattr("upf_edge.access.parse_credentials", lambda *a: parsed.append(a) or Credentials())
    assert authz.identify(basic("phil", "pw"), None, clock) == Identity("phil", False)  # remembered
    assert parsed == []
    monkeypatch.undo()
    for _ in range(2):  # a wrong password is checked every time, and never remembered
        with pytest.raises(NtfyError) as err:
            authz.identify(basic("phil", "wrong"), None, clock)
        assert (err.value.http, err.value.code) == (401, 40101)
    with pytest.raises(NtfyError):
        authz.identify(basic("nobody", "pw"), None, clock)
    assert list(authz._identities) == [(basic("phil", "pw"), None)]
    assert authz.identify(None, None, clock) is ANONYMOUS and authz.identify("vapid t=a,k=b", None, clock) is ANONYMOUS


def test_a_remembered_token_stops_at_its_expiry() -> None:
    token = "tk_" + "q" * 29
    expiring = AuthState(
        version=2,
        users={"phil": User(role="user", password_hash=hash_password("pw"))},
        tokens={token_digest(token): ("phil", Token(expires=int(NOW) + 10))},
    )
    authz = Authorizer(expiring)
    clock = Clock(NOW)
    header = "Bearer " + token
    assert authz.identify(header, None, clock) == Identity("phil", False, token_digest(token))
    clock.now = NOW + 9.5
    assert authz.identify(header, None, clock) == Identity("phil", False, token_digest(token))  # from the cache
    clock.now = NOW + 10
    for _ in range(2):
        with pytest.raises(NtfyError) as err:
            authz.identify(header, None, clock)
        assert (err.value.http, err.value.code) == (401, 40101)


def test_remembered_decisions_die_with_the_authorizer_on_an_acl_change() -> None:
    from upf_edge.gate import AccessGate

    gate = AccessGate(None, "deny-all")  # type: ignore[arg-type]  # never started: its state is set below
    granted = state([("phil", "up*", Permission.WRITE_ONLY)])
    gate._install(granted)
    phil = gate.identify(basic("phil", "pw"), None)
    for _ in range(2):
        gate.authorize(phil, ("up1",), write=True)
    gate._install(AuthState(version=2, users=granted.users, access=[]))  # the grant revoked
    with pytest.raises(NtfyError) as err:
        gate.authorize(phil, ("up1",), write=True)
    assert (err.value.http, err.value.code) == (403, 40301)
    gate._install(AuthState(version=3, users={}, access=[]))  # the user deleted: its login is forgotten
    with pytest.raises(NtfyError) as err:
        gate.identify(basic("phil", "pw"), None)
    assert (err.value.http, err.value.code) == (401, 40101)


def test_remembered_decisions_match_fresh_ones() -> None:
    entries = [
        (EVERYONE, "alerts*", Permission.READ_ONLY),
        ("phil", "alerts*", Permission.DENY),
        ("phil", "m*", Permission.WRITE_ONLY),
    ]
    authz = Authorizer(state(entries), default=Permission.DENY)
    topics = ["alerts1", "mine", "other", "alerts1", "mine"]
    for who in (Identity("phil"), ANONYMOUS, Identity("root", True)):
        first = [authz.permission(who, t) for t in topics]
        assert first == [Authorizer(state(entries), default=Permission.DENY).permission(who, t) for t in topics]
        assert first == [authz.permission(who, t) for t in topics]


# --- ?auth= decoded as strictly as ntfy's base64.RawURLEncoding ------------------------------------


@pytest.mark.parametrize(
    "param",
    [
        "!!!!",  # nothing of the alphabet (a lenient decoder drops it all: anonymous)
        "QmVh!cmVy",  # one stray character
        auth_param(basic("phil", "s:cret")) + "=",  # padded: RawURLEncoding has no padding
        base64.urlsafe_b64encode(basic("ben", "some pass").encode()).decode(),  # "==", as Python pads it
        "QQ=",
        base64.b64encode(b"Bearer ???>>>").decode().rstrip("="),  # "+" and "/": not the URL alphabet
        "QUJDR",  # length 1 more than a multiple of 4
        "QmVh cmVy",  # whitespace inside the value (ntfy trims only the ends)
        "__4",  # unpadded, decodes, but not UTF-8
    ],
)
def test_auth_param_that_raw_url_encoding_refuses_is_400(param: str) -> None:
    assert refused(None, param) == (400, 40094)


def test_auth_param_accepted_as_ntfy_accepts_it() -> None:
    """Unpadded base64url, its ends trimmed (readQueryParam) and CR/LF inside ignored (Go's decoder)."""
    phil = Credentials(user="phil", password="s:cret")
    encoded = auth_param(basic("phil", "s:cret"))
    assert len(encoded) % 4 != 0  # the case padding would have filled
    assert parse_credentials(None, encoded) == phil
    assert parse_credentials(None, f" {encoded}\n") == phil
    assert parse_credentials(None, encoded[:8] + "\r\n" + encoded[8:]) == phil
    assert parse_credentials(basic("a", "b"), "  ") == Credentials(user="a", password="b")  # blank: no param


def test_unauthorized_and_forbidden_bodies_carry_ntfys_link() -> None:
    """errHTTPUnauthorized and errHTTPForbidden (ntfy server/errors.go) both link the auth docs."""
    import json

    link = "https://ntfy.sh/docs/publish/#authentication"
    with pytest.raises(NtfyError) as err:
        parse_credentials("Bearer tk_short", None)
    assert json.loads(err.value.problem.body()) == {"code": 40101, "http": 401, "error": "unauthorized", "link": link}
    with pytest.raises(NtfyError) as err:
        Authorizer(state([(EVERYONE, "secret", Permission.DENY)])).check(ANONYMOUS, ("secret",), write=False)
    assert json.loads(err.value.problem.body()) == {"code": 40301, "http": 403, "error": "forbidden", "link": link}
    with pytest.raises(NtfyError) as err:
        parse_credentials(None, "!!!!")
    assert "link" not in json.loads(err.value.problem.body())  # UPF's own code: no ntfy page to link


@pytest.mark.parametrize("header", ["Bearer", "Basic", "bearer", "Bearer ", " Basic  ", "BASIC\t"])
def test_a_bare_scheme_is_anonymous_as_in_ntfy(header: str) -> None:
    """ntfy trims the value, then wants ``basic `` or ``bearer `` with its space: an unset shell variable
    (``Authorization: Bearer $TOKEN``) is an anonymous request, not a 401."""
    assert parse_credentials(header, None).anonymous
    assert parse_credentials(None, auth_param(header)).anonymous


_SQLITE = sqlite3.connect(":memory:")


def sqlite_like(pattern: str, topic: str) -> bool:
    """ntfy's match: ``? LIKE a.topic ESCAPE '\\'`` with the pattern stored by toSQLWildcard."""
    stored = pattern.replace("*", "%").replace("_", "\\_")
    return bool(_SQLITE.execute("SELECT ? LIKE ? ESCAPE '\\'", (topic, stored)).fetchone()[0])


@given(st.text("aAbB_-*", min_size=1, max_size=8), st.text("aAbB_-", min_size=1, max_size=8))
@example("a*B", "Ab")
@example("a_*", "A_b")
@example("*a*", "B")
def test_patterns_match_as_sqlites_like_does(pattern: str, topic: str) -> None:
    assert pattern_matches(pattern, topic) is sqlite_like(pattern, topic)


def test_acl_patterns_ignore_ascii_case_as_ntfy_does() -> None:
    """SQLite's LIKE ignores ASCII case: a deny on ``secret*`` covers ``SECRET-plans`` in ntfy."""
    assert pattern_matches("secret*", "SECRET-plans") and pattern_matches("Up*", "upABC")
    assert pattern_matches("a_B", "A_b") and not pattern_matches("a_b", "axb")
    authz = Authorizer(state([(EVERYONE, "secret*", Permission.DENY), ("phil", "MINE", Permission.READ_ONLY)]))
    assert authz.permission(ANONYMOUS, "SECRET-plans") is Permission.DENY
    assert authz.permission(ANONYMOUS, "Secret") is Permission.DENY
    assert authz.permission(Identity("phil"), "mine") is Permission.READ_ONLY
    assert authz.permission(ANONYMOUS, "public") is Permission.READ_WRITE


def test_pattern_length_counts_an_underscore_as_ntfy_stores_it() -> None:
    """ntfy orders by LENGTH of the stored pattern, where ``_`` is ``\\_``: ``a_*`` (``a\\_%``, 4) is
    longer than ``a*b`` (``a%b``, 3), so its deny wins over the write-granting entry."""
    authz = Authorizer(
        state([("phil", "a*b", Permission.READ_WRITE), ("phil", "a_*", Permission.DENY)]), default=Permission.DENY
    )
    assert authz.permission(Identity("phil"), "a_b") is Permission.DENY
    assert authz.permission(Identity("phil"), "axb") is Permission.READ_WRITE
