"""What auth and the limits cost a publish at the edge, in one process (issue 10's "keep the publish
path fast"). Not part of bench/run.py: a tool for the cuts, each timed against a copy of the code it
replaced, kept here, on the same state in the same run.

    python3 -m uv run python bench/edge_cost.py            # the micro comparisons
    python3 -m uv run python bench/edge_cost.py --front    # + WriterFront.publish, on vs off

- ``message``: 64 concurrent publishes of one visitor against a store whose lease suspends (as a
  transaction does): store transactions per 1,000 publishes and microseconds per publish, the old
  ``RequestLimiter.message`` (a lease per publish that found the local lease empty) vs the new one.
- ``identify``: one Basic credential presented again and again: ``parse_credentials`` then
  ``authenticate`` (old) vs ``Authorizer.identify`` (remembers a credential that succeeded).
- ``permission``: one user's write to 1,000 topics under a deny-all default and one pattern: the
  old walk over the ordered rules vs the remembered decision.
- ``--front``: the writer's publish path in process with a real embedded store, under the authlimits
  phase's "off" and "on" settings (bench/phases/authlimits.py), 64 at a time: server CPU per publish
  and the ratio. Each shape runs in its own subprocess (settings are read from the environment).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from upf_edge.access import Authorizer, Identity, hash_password, parse_credentials, pattern_matches
from upf_edge.errors import NtfyError
from upf_edge.limiter import RequestLimiter
from upf_edge.limits import TOO_MANY_MESSAGES, LimitConfig, limited
from upf_keyspace.auth import Access, AuthState, Permission, User
from upf_keyspace.limits import day_of, secs_to_next_day, take_count

HERE = Path(__file__).resolve().parent
CONCURRENCY = 64


class MemoryStore:
    """The daily-message transaction on a dict, suspending once as a real one does; counts calls."""

    def __init__(self) -> None:
        self.days: dict[tuple[str, int], int] = {}
        self.calls = 0

    async def lease_messages(self, visitor: str, day: int, want: int, limit: int) -> int:
        self.calls += 1
        await asyncio.sleep(0)
        granted = take_count(self.days.get((visitor, day), 0), want, limit)
        self.days[(visitor, day)] = self.days.get((visitor, day), 0) + granted
        return granted


async def old_message(self: RequestLimiter, visitor: str | None) -> None:
    """RequestLimiter.message before the cut (5c53126), kept to be timed against."""
    if visitor is None:
        return
    now = self.clock()
    day = day_of(now)
    entry = self._messages.get(visitor)
    if entry is not None and entry[1] == day and entry[0] > 0:
        entry[0] -= 1
        return
    until = self._no_messages.get(visitor)
    if until is not None:
        if now < until:
            raise limited(TOO_MANY_MESSAGES, math.ceil(until - now))
        del self._no_messages[visitor]
    config = self.config
    granted = await self.store.lease_messages(visitor, day, config.message_lease, config.message_limit)
    if not granted:
        wait = secs_to_next_day(now)
        self._no_messages[visitor] = now + wait
        raise limited(TOO_MANY_MESSAGES, wait)
    self._messages[visitor] = [granted - 1, day]


async def time_message(old: bool, publishes: int) -> tuple[float, float, int]:
    """(store calls per 1,000 publishes, us per publish, publishes admitted)."""
    store = MemoryStore()
    lim = RequestLimiter(store, LimitConfig(burst=1_000_000, refill_secs=0.0001, messages_daily=1_000_000_000))  # type: ignore[arg-type]  # only lease_messages is used
    call = (lambda v: old_message(lim, v)) if old else lim.message
    admitted = 0
    start = time.perf_counter()
    for _ in range(publishes // CONCURRENCY):
        results = await asyncio.gather(*(call("user:bench") for _ in range(CONCURRENCY)), return_exceptions=True)
        admitted += sum(1 for r in results if not isinstance(r, NtfyError))
    took = time.perf_counter() - start
    return store.calls * 1000 / publishes, took / publishes * 1e6, admitted


def old_permission(authz: Authorizer, who: Identity, topic: str) -> Permission:
    """Authorizer.permission before the cut (5c53126): the walk over the ordered rules every time."""
    if who.admin:
        return Permission.READ_WRITE
    for pattern, permission in authz._ordered(who.user):
        if pattern_matches(pattern, topic):
            return permission
    return authz.default


def per_call_us(fn, n: int) -> float:  # type: ignore[no-untyped-def]  # any zero-argument callable
    best = math.inf
    for _ in range(5):  # the best of 5: the machine is shared
        start = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - start) / n * 1e6)
    return best


def micro() -> None:
    state = AuthState(
        version=1,
        users={"bench": User(role="user", password_hash=hash_password("pw"))},
        access=[("bench", "upAUTH*", Access(permission=Permission.WRITE_ONLY))],
    )
    authz = Authorizer(state, Permission.DENY)
    header = "Basic " + base64.b64encode(b"bench:pw").decode()
    authz.identify(header, None)  # bcrypt once, for both
    now = time.time()
    old_id = per_call_us(lambda: authz.authenticate(parse_credentials(header, None), now), 20_000)
    new_id = per_call_us(lambda: authz.identify(header, None), 20_000)
    who = Identity("bench")
    topics = [f"upAUTH{i}" for i in range(1000)]
    for t in topics:
        assert old_permission(authz, who, t) is authz.permission(who, t) is Permission.WRITE_ONLY
    it = iter(range(10**9))
    old_perm = per_call_us(lambda: old_permission(authz, who, topics[next(it) % 1000]), 20_000)
    new_perm = per_call_us(lambda: authz.permission(who, topics[next(it) % 1000]), 20_000)
    print(f"identify (Basic, remembered)   old {old_id:6.2f} us   new {new_id:6.2f} us")
    print(f"permission (1,000 topics)      old {old_perm:6.2f} us   new {new_perm:6.2f} us")
    for old in (True, False):
        calls, us, admitted = asyncio.run(time_message(old, 6400))
        name = "old" if old else "new"
        print(
            f"message, {CONCURRENCY} concurrent, {name}:  {calls:6.1f} store calls/1,000 publishes, {us:6.2f} us/publish, {admitted} of 6400 admitted"
        )


FRONT = r"""
import asyncio, base64, os, sys, time
sys.path[:0] = [sys.argv[3], sys.argv[4]]
mode, n = sys.argv[1], int(sys.argv[2])
from inproc import open_front
auth = [(b"authorization", b"Basic " + base64.b64encode(b"benchpub:pw"))] if mode == "on" else []
headers = [(b"content-type", b"text/plain"), (b"host", b"x"), *auth]
async def main():
    front, close = await open_front()
    async def one(i):
        r = await front.publish(f"upAUTH{i % 1000}", headers, b"", b"x" * 100, "127.0.0.1")
        assert r.status == 200, r
    async def run(count):
        for i in range(0, count, 64):
            await asyncio.gather(*(one(i + j) for j in range(64)))
    await run(2048)  # warm: every topic counted, leases taken
    c0 = time.process_time()
    await run(n)
    print((time.process_time() - c0) / n * 1e6)
    await close()
asyncio.run(main())
"""


def front(publishes: int, rounds: int) -> None:
    sys.path.insert(0, str(HERE / "phases"))
    from authlimits import on_env  # type: ignore[import-not-found]  # bench/phases is not a package

    password_hash = hash_password("pw")
    figures: dict[str, list[float]] = {"off": [], "on": []}
    for n in range(rounds):
        for mode in ("off", "on") if n % 2 == 0 else ("on", "off"):
            with tempfile.TemporaryDirectory() as d:
                env = {**os.environ, "UPF_STORE_PATH": f"{d}/store.db"}
                if mode == "on":
                    env.update(on_env(password_hash))
                out = subprocess.run(
                    [sys.executable, "-c", FRONT, mode, str(publishes), str(HERE / "phases"), str(HERE)],
                    env=env,
                    capture_output=True,
                    text=True,
                    check=True,
                )
                figures[mode].append(float(out.stdout.strip()))
    for mode, us in figures.items():
        print(f"WriterFront.publish {mode:3s}: CPU us/publish {' '.join(f'{u:.0f}' for u in us)}")
    ratios = [on / off for off, on in zip(figures["off"], figures["on"], strict=True)]
    print(f"on/off per round: {' '.join(f'{r:.2f}' for r in ratios)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--front", action="store_true", help="also time WriterFront.publish on vs off")
    ap.add_argument("--publishes", type=int, default=6400)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    micro()
    if args.front:
        front(args.publishes, args.rounds)


if __name__ == "__main__":
    main()
