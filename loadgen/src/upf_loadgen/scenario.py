"""A run's whole configuration as one value, so a run can be repeated, split across worker
processes (it is sent to them as msgpack) and recorded verbatim in the JSON report.
"""

from __future__ import annotations

import secrets
import string

import msgspec

__all__ = ["Scenario", "TRANSPORTS", "new_run_id", "topic_name", "split_topics", "publish_schedule"]

TRANSPORTS = ("ws", "json", "sse")
_ALNUM = string.ascii_letters + string.digits
_B36 = string.digits + string.ascii_lowercase


class Scenario(msgspec.Struct, kw_only=True):
    writer: str = "http://127.0.0.1:8080"
    pusher: str = "http://127.0.0.1:8081"
    transport: str = "ws"
    topics: int = 1000
    subs_per_topic: int = 1
    rate: float = 2000.0
    duration: float = 30.0
    message_size: int = 0
    binary: bool = False
    procs: int = 1
    drain_timeout: float = 30.0
    connect_timeout: float = 30.0
    publish_timeout: float = 10.0
    pool_size: int = 256
    connect_concurrency: int = 100
    reconnects: int = 3
    run_id: str = ""
    allow_remote: bool = False
    live: bool = True
    strict: bool = False

    def validate(self) -> None:
        if self.transport not in TRANSPORTS:
            raise ValueError("transport must be ws, json or sse")
        if self.topics < 1 or self.subs_per_topic < 1 or self.procs < 1 or self.pool_size < 1:
            raise ValueError("topics, subs-per-topic, procs and pool size must be at least 1")
        if self.rate <= 0 or self.duration <= 0:
            raise ValueError("rate and duration must be positive")
        if self.message_size < 0 or self.drain_timeout < 0:
            raise ValueError("message size and drain timeout must not be negative")
        if self.procs > self.topics:
            raise ValueError("procs must not exceed topics")


def new_run_id() -> str:
    return "".join(secrets.choice(_ALNUM) for _ in range(6))


def topic_name(run_id: str, index: int) -> str:
    """``up`` + 6-char run id + 6 base36 digits: 14 chars like a real UnifiedPush topic, fresh per run
    so a subscriber never sees another run's messages."""
    digits = []
    n = index
    for _ in range(6):
        n, r = divmod(n, 36)
        digits.append(_B36[r])
    if n:
        raise ValueError("too many topics")
    return "up" + run_id + "".join(reversed(digits))


def split_topics(topics: int, procs: int) -> list[list[int]]:
    """Round-robin so every worker gets an even share of the publish schedule's phases."""
    return [list(range(w, topics, procs)) for w in range(procs)]


def publish_schedule(index: int, topics: int, rate: float, duration: float) -> tuple[float, float, int]:
    """(phase, period, count) of topic ``index``: topic i publishes at phase + k*period, with phases
    interleaved so the union over all topics is an even ``rate`` per second."""
    period = topics / rate
    phase = (index / rate) % period
    if phase >= duration:
        return phase, period, 0
    count = int((duration - phase) / period)
    if phase + count * period < duration:
        count += 1
    return phase, period, count
