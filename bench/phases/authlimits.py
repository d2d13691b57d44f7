"""authlimits: the all-in-one's publish cost with auth and abuse limits applied to the load vs the
defaults (issue 10: "the publish cost with auth and limits on vs off, in the same run").

Two all-in-one servers run side by side, pinned to the server CPU, both warmed up; the same
publish-only driver (bench/pubdrive.py: same connections, same topics, same bodies) drives them in
alternating windows, the order reversed every pair, so each ratio compares the same minutes.

- off: the defaults. Loopback is exempt from every limit and no user exists, so auth is open.
- on:  ``UPF_LIMIT_EXEMPT=`` (nobody exempt), a request burst and a daily message cap high enough
  never to refuse, so every publish takes the limiter's path (request lease, daily messages, total
  topics); one provisioned user, ``UPF_AUTH_DEFAULT_ACCESS=deny-all`` and an ACL entry granting that
  user write on the bench's topics; the driver sends the user's credentials on every publish.

Before the windows the servers are checked to behave as configured (anonymous 403 and an admitted
publish with RateLimit headers on "on"; 200 without them on "off"), so the figure is never the price
of a configuration that silently did not apply.
"""

from __future__ import annotations

import base64
import secrets
import urllib.error
import urllib.request
from pathlib import Path

from harness import BODY, SERVER_CPUS, Shape, log, pubdrive
from report import med
from schema import AuthLimits, AuthLimitsPair, Config, Drive

PREFIX = "upAUTH"
USER = "benchpub"


def on_env(password_hash: str, token: str | None = None) -> dict[str, str]:
    """The "on" server's settings: limits applied to loopback but never refusing, auth deny-all but
    for the bench user's write access to the bench's topics."""
    env = {
        "UPF_LIMIT_EXEMPT": "",
        "UPF_LIMIT_REQUEST_BURST": "1000000",
        "UPF_LIMIT_REQUEST_REFILL_SECS": "0.0001",
        "UPF_LIMIT_MESSAGES_DAILY": "1000000000",
        "UPF_AUTH_USERS": f"{USER}:{password_hash}:user",
        "UPF_AUTH_DEFAULT_ACCESS": "deny-all",
        "UPF_AUTH_ACCESS": f"{USER}:{PREFIX}*:write-only",
    }
    if token:
        env["UPF_AUTH_TOKENS"] = f"{USER}:{token}:bench"
    return env


def _post(url: str, authorization: str | None) -> tuple[int, bool]:
    """(status, whether the answer carries RateLimit headers) of one publish."""
    req = urllib.request.Request(url, data=b"x" * BODY, method="POST", headers={"Content-Type": "text/plain"})
    if authorization:
        req.add_header("Authorization", authorization)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.headers.get("RateLimit") is not None
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("RateLimit") is not None


def check(off_url: str, on_url: str, authorization: str) -> dict[str, str]:
    """Refuse to measure unless "on" authenticates, authorizes and limits, and "off" does none of it."""
    topic = f"{PREFIX}check"
    got = {
        "off anonymous": _post(f"{off_url}/{topic}", None),
        "on anonymous": _post(f"{on_url}/{topic}", None),
        "on with credentials": _post(f"{on_url}/{topic}", authorization),
        "on with credentials, topic outside the ACL": _post(f"{on_url}/upOTHERcheck", authorization),
    }
    want = {
        "off anonymous": (200, False),
        "on anonymous": (403, False),
        "on with credentials": (200, True),
        "on with credentials, topic outside the ACL": (403, False),
    }
    out = {k: f"{s}{' with RateLimit headers' if rl else ''}" for k, (s, rl) in got.items()}
    # 403s are judged on the status only: whether a refusal carries RateLimit headers is not the point
    bad = [k for k in want if got[k][0] != want[k][0] or (want[k][0] == 200 and got[k][1] != want[k][1])]
    if bad:
        raise RuntimeError(f"authlimits: the servers do not behave as configured: {out}")
    return out


def phase_authlimits(cfg: Config, work: Path, scheme: str = "basic") -> AuthLimits:
    from upf_edge.access import hash_password, new_token

    password = secrets.token_urlsafe(18)
    token = new_token() if scheme == "bearer" else None
    if token:
        authorization = f"Bearer {token}"
    else:
        authorization = "Basic " + base64.b64encode(f"{USER}:{password}".encode()).decode("ascii")
    env = on_env(hash_password(password), token)
    shapes: dict[str, Shape] = {}
    pairs: list[AuthLimitsPair] = []
    try:
        shapes["off"] = Shape("allinone", work, SERVER_CPUS)
        shapes["on"] = Shape("allinone", work, SERVER_CPUS, **env)
        checks = check(shapes["off"].writer, shapes["on"].writer, authorization)

        def window(which: str, secs: float) -> Drive:
            s = shapes[which]
            return pubdrive(
                s.writer,
                [p.pid for p in s.roles.values()],
                secs=secs,
                conns=cfg.ingest_conns,
                topics=cfg.ingest_topics,
                prefix=PREFIX,
                authorization=authorization if which == "on" else None,
            )

        for which in ("off", "on"):  # a warm-up window each: imports, caches, the first topics' rows
            window(which, 1.0)
        for n in range(cfg.al_pairs):
            order = ["off", "on"] if n % 2 == 0 else ["on", "off"]
            row = {which: window(which, cfg.al_secs) for which in order}
            for s in shapes.values():
                s.check_alive()
            pairs.append(AuthLimitsPair(order=order, off=row["off"], on=row["on"]))
            log(
                f"  authlimits pair {n + 1}: off {row['off'].ok_per_s:.0f}/s {row['off'].cpu_us_per_publish} us/publish, "
                f"on {row['on'].ok_per_s:.0f}/s {row['on'].cpu_us_per_publish} us/publish "
                f"(non-200: off {row['off'].non_200 or 0}, on {row['on'].non_200 or 0}; "
                f"others {row['off'].others_cpu_pct_of_machine}%/{row['on'].others_cpu_pct_of_machine}%)"
            )
    finally:
        for s in shapes.values():
            s.stop()
    return summarize_pairs(cfg, scheme, env, checks, pairs)


def summarize_pairs(
    cfg: Config, scheme: str, env: dict[str, str], checks: dict[str, str], pairs: list[AuthLimitsPair]
) -> AuthLimits:
    """Medians over the pairs and the on/off ratios of the medians (pure: the unit tests build pairs)."""
    off_cpu = med([p.off.cpu_us_per_publish for p in pairs])
    on_cpu = med([p.on.cpu_us_per_publish for p in pairs])
    off_ok = med([p.off.ok_per_s for p in pairs])
    on_ok = med([p.on.ok_per_s for p in pairs])
    ok = lambda x: x == x  # noqa: E731  # med gives NaN when no window was priced
    secret = {"UPF_AUTH_USERS": f"{USER}:<bcrypt hash>:user", "UPF_AUTH_TOKENS": f"{USER}:<token>:bench"}
    shown = {k: secret.get(k, v) for k, v in env.items()}
    return AuthLimits(
        secs=cfg.al_secs,
        conns=cfg.ingest_conns,
        topics=cfg.ingest_topics,
        scheme=scheme,
        on_env=shown,
        checks=checks,
        pairs=pairs,
        off_cpu_us_per_publish=off_cpu if ok(off_cpu) else None,
        on_cpu_us_per_publish=on_cpu if ok(on_cpu) else None,
        off_ok_per_s=off_ok if ok(off_ok) else None,
        on_ok_per_s=on_ok if ok(on_ok) else None,
        ratio_cpu_on_over_off=round(on_cpu / off_cpu, 3) if ok(on_cpu) and ok(off_cpu) and off_cpu else None,
        ratio_ok_per_s_on_over_off=round(on_ok / off_ok, 3) if ok(on_ok) and ok(off_ok) and off_ok else None,
    )
