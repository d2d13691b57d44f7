"""A publish-only HTTP/1.1 driver: closed-loop keep-alive POSTs, as fast as the target answers.

loadgen's publishers need a subscriber side; a ceiling for the ingest path alone needs a driver that
only publishes. This one is used for BOTH the bare granian app and UPF's writer, so their ratio is
fair: the same requests (``POST /{topic}``, ``text/plain``, a fixed-size body), the same number of
keep-alive connections, the same client code. Each connection sends its next request as soon as the
previous response is complete (no pipelining). Topics are taken round-robin from ``--topics``
distinct names.

With ``--rate R`` it paces instead: every millisecond it sends what is due at R requests/s, each on
a connection that is not waiting for an answer (none is pipelined; a rate the server cannot answer
shows as an ``ok_per_s`` below R). Why: a server's CPU per request at a moderate rate, where each
request may wake its threads alone, is not its CPU per request when saturated (the ``pubdeliver``
phase prices UPF at 2,000/s).

The client is a bare ``asyncio.Protocol`` (no stream objects, no header dicts) so that the driver's
own CPU stays small next to the server's. It still reports its own CPU: when it is near 100% of a
core, the driver, not the server, may be the limit, and the server's CPU per request (measured by
the caller from /proc) is the figure to compare.

    python bench/pubdrive.py --url http://127.0.0.1:8080 --connections 64 --duration 5 --topics 1000
    python bench/pubdrive.py --url http://127.0.0.1:8080 --rate 2000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
from urllib.parse import urlsplit

__all__ = ["drive", "main"]


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


class _Conn(asyncio.Protocol):
    __slots__ = ("state", "transport", "buf", "need", "status", "sent_at", "lost")

    def __init__(self, state: _State) -> None:
        self.state = state
        self.buf = b""
        self.need = -1
        self.sent_at = 0
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream connection: always an asyncio.Transport

    def send_next(self) -> None:
        st = self.state
        if st.stopping:
            self.transport.close()
            return
        req = st.requests[st.next % len(st.requests)]
        st.next += 1
        self.sent_at = time.perf_counter_ns()
        self.transport.write(req)  # type: ignore[attr-defined]  # a stream connection: always an asyncio.Transport

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        while True:
            if self.need < 0:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    self.buf = buf
                    return
                head = buf[:end]
                status = int(head[9:12])
                i = head.lower().find(b"content-length:")
                if i < 0:
                    self.state.errors += 1
                    self.transport.close()
                    return
                j = head.find(b"\r\n", i)
                length = int(head[i + 15 : j if j >= 0 else len(head)])
                self.need = end + 4 + length
                self.status = status
            if len(buf) < self.need:
                self.buf = buf
                return
            st = self.state
            if self.status == 200:
                st.ok += 1
            else:
                st.bad[self.status] = st.bad.get(self.status, 0) + 1
            st.lat.append(time.perf_counter_ns() - self.sent_at)
            buf = buf[self.need :]
            self.need = -1
            if not buf:
                self.buf = b""
                if st.idle is None:
                    self.send_next()
                elif st.stopping:
                    self.transport.close()
                else:
                    st.idle.append(self)  # paced: the pacer sends its next request
                return

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.state.stopping:
            self.state.errors += 1
        if not self.lost.done():
            self.lost.set_result(None)


class _State:
    def __init__(self, requests: list[bytes]) -> None:
        self.requests = requests
        self.next = 0
        self.ok = 0
        self.bad: dict[int, int] = {}
        self.errors = 0
        self.stopping = False
        self.lat: list[int] = []
        self.idle: list[_Conn] | None = None  # paced: the connections not waiting for an answer


async def _pace(st: _State, rate: float) -> None:
    """Send what is due at ``rate`` per second since the start, on idle connections, every millisecond."""
    assert st.idle is not None
    t0, sent = time.perf_counter(), 0
    while not st.stopping:
        due = int((time.perf_counter() - t0) * rate)
        while sent < due and st.idle:
            st.idle.pop().send_next()
            sent += 1
        sent = max(sent, due - int(rate))  # a backlog the server could not take is dropped, not sent late
        await asyncio.sleep(0.001)


def build_requests(
    host: str, prefix: str, topics: list[str], body_size: int, authorization: str | None = None
) -> list[bytes]:
    """One request per topic; ``authorization`` is an Authorization header value (``Basic ...`` or
    ``Bearer tk_...``) sent on every request, for a server with auth configured."""
    body = (b"lg:0:0:" + b"abcdefghijklmnopqrstuvwxyz0123456789" * (body_size // 36 + 1))[:body_size]
    auth = f"Authorization: {authorization}\r\n" if authorization else ""
    return [
        (
            f"POST {prefix}/{t} HTTP/1.1\r\nHost: {host}\r\nContent-Type: text/plain\r\n{auth}"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode("latin-1")
        + body
        for t in topics
    ]


async def drive(
    url: str,
    *,
    topics: list[str],
    connections: int = 64,
    duration: float = 5.0,
    warmup: float = 1.0,
    body_size: int = 100,
    authorization: str | None = None,
    rate: float = 0.0,
) -> dict[str, object]:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    st = _State(build_requests(f"{host}:{port}", parts.path.rstrip("/"), topics, body_size, authorization))
    loop = asyncio.get_running_loop()
    conns: list[_Conn] = []
    for _ in range(connections):
        _, proto = await loop.create_connection(lambda: _Conn(st), host, port)
        conns.append(proto)
    pacer = None
    if rate > 0:
        st.idle = list(conns)
        pacer = asyncio.create_task(_pace(st, rate))
    else:
        for c in conns:
            c.send_next()
    await asyncio.sleep(warmup)
    ok0, n0, cpu0, t0 = st.ok, len(st.lat), _cpu(), time.perf_counter()
    print("start", flush=True)  # the caller snapshots the server's CPU on these two lines
    await asyncio.sleep(duration)
    ok1, n1, cpu1, t1 = st.ok, len(st.lat), _cpu(), time.perf_counter()
    print("stop", flush=True)
    st.stopping = True
    if pacer is not None:
        await pacer
        for c in st.idle or ():
            c.transport.close()
    await asyncio.wait([c.lost for c in conns], timeout=10)
    lat = sorted(st.lat[n0:n1])
    pct = lambda q: round(lat[min(len(lat) - 1, int(q * len(lat)))] / 1e6, 3) if lat else 0.0  # noqa: E731
    wall = t1 - t0
    return {
        "url": url,
        "connections": connections,
        "rate": rate,
        "topics": len(topics),
        "body_size": body_size,
        "secs": round(wall, 3),
        "ok": ok1 - ok0,
        "ok_per_s": round((ok1 - ok0) / wall, 1),
        "non_200": st.bad,
        "errors": st.errors,
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
        "driver_cpu_pct": round(100 * (cpu1 - cpu0) / wall, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--duration", type=float, default=5.0, help="measured seconds (after --warmup)")
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--topics", type=int, default=1000, help="distinct topics, published round-robin")
    ap.add_argument("--topic-prefix", default="upBENCH", help="topic names are <prefix><index, 7 digits>")
    ap.add_argument("--body-size", type=int, default=100)
    ap.add_argument("--rate", type=float, default=0.0, help="requests/s, paced (default 0: closed loop)")
    ap.add_argument(
        "--authorization",
        default=None,
        help="an Authorization header value sent on every request (Basic or Bearer); default: none",
    )
    a = ap.parse_args(argv)
    if a.rate < 0:
        ap.error("--rate: requests per second, 0 or more")
    if a.authorization is not None and ("\r" in a.authorization or "\n" in a.authorization):
        ap.error("--authorization: a header value has no line breaks")
    topics = [f"{a.topic_prefix}{i:07d}" for i in range(a.topics)]
    out = asyncio.run(
        drive(
            a.url,
            topics=topics,
            connections=a.connections,
            duration=a.duration,
            warmup=a.warmup,
            body_size=a.body_size,
            authorization=a.authorization,
            rate=a.rate,
        )
    )
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
