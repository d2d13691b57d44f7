"""What loadgen's publish client costs, beside what it measures: client CPU per publish for loadgen's
hand-written HTTP/1.1 pool (upf_loadgen.http11), httpx, and h11 over asyncio streams, against a real
all-in-one UPF (one worker, embedded store), whose CPU per publish is read from /proc in the same run.

    python3 -m uv run --locked python loadgen/bench/client_cost.py [requests] [concurrency]

Each client runs the same keep-alive POSTs twice, interleaved (A B C A B C); the figure is the better
of its two runs. Under a minute on a 2-core machine.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h11
import httpx

from upf_loadgen.http11 import Pool, parse_endpoint

BODY = b"x" * 100


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def hand_written(base: str, n: int, conc: int) -> None:
    pool = Pool(parse_endpoint(base), conc)
    try:
        await fan(n, conc, lambda i: pool.request("POST", f"/bench{i % 8}", BODY))
    finally:
        await pool.aclose()


async def with_httpx(base: str, n: int, conc: int) -> None:
    limits = httpx.Limits(max_connections=conc, max_keepalive_connections=conc)
    async with httpx.AsyncClient(base_url=base, limits=limits) as client:

        async def one(i: int) -> None:
            r = await client.post(f"/bench{i % 8}", content=BODY)
            assert r.status_code == 200, r.status_code

        await fan(n, conc, one)


class H11Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer, self.h11 = reader, writer, h11.Connection(h11.CLIENT)

    async def post(self, host: str, target: str, body: bytes) -> int:
        c = self.h11
        if c.our_state is h11.DONE:
            c.start_next_cycle()
        headers = [("Host", host), ("Content-Length", str(len(body)))]
        self.writer.write(
            c.send(h11.Request(method="POST", target=target, headers=headers))
            + c.send(h11.Data(data=body))
            + c.send(h11.EndOfMessage())
        )
        status = 0
        while True:
            event = c.next_event()
            if event is h11.NEED_DATA:
                c.receive_data(await self.reader.read(65536))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.EndOfMessage):
                return status


async def with_h11(base: str, n: int, conc: int) -> None:
    ep = parse_endpoint(base)
    conns = [H11Conn(*await asyncio.open_connection(ep.host, ep.port)) for _ in range(conc)]
    idle = list(conns)

    async def one(i: int) -> None:
        conn = idle.pop()
        try:
            assert await conn.post(ep.host_header, f"/bench{i % 8}", BODY) == 200
        finally:
            idle.append(conn)

    try:
        await fan(n, conc, one)
    finally:
        for conn in conns:
            conn.writer.close()


async def fan(n: int, conc: int, one) -> None:  # type: ignore[no-untyped-def]
    sem = asyncio.Semaphore(conc)

    async def guarded(i: int) -> None:
        async with sem:
            await one(i)

    await asyncio.gather(*(guarded(i) for i in range(n)))


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    conc = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("UPF_", "OTEL_"))}
        env.update(UPF_BIND=f"127.0.0.1:{port}", UPF_STORE_PATH=f"{tmp}/upf.db", UPF_WORKERS="1")
        server = subprocess.Popen(
            [sys.executable, "-m", "upf"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            base = f"http://127.0.0.1:{port}"
            for _ in range(200):
                try:
                    if httpx.get(base + "/__lbheartbeat__", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
            clients = {"hand-written": hand_written, "httpx": with_httpx, "h11+asyncio": with_h11}
            asyncio.run(hand_written(base, 200, conc))  # warm-up
            best: dict[str, tuple[float, float, float]] = {}
            for _ in range(2):
                for name, run in clients.items():
                    s0, c0, w0 = proc_cpu(server.pid), time.process_time(), time.perf_counter()
                    asyncio.run(run(base, n, conc))
                    s1, c1, w1 = proc_cpu(server.pid), time.process_time(), time.perf_counter()
                    row = ((c1 - c0) / n * 1e6, (s1 - s0) / n * 1e6, n / (w1 - w0))
                    best[name] = min(best.get(name, row), row)
            print(f"{n} POSTs, {conc} keep-alive connections, one UPF worker; better of 2 interleaved runs")
            print(f"{'client':14} {'client CPU us/publish':>22} {'server CPU us/publish':>22} {'publishes/s':>12}")
            for name, (client, srv, rate) in best.items():
                print(f"{name:14} {client:22.0f} {srv:22.0f} {rate:12.0f}")
        finally:
            server.terminate()
            server.wait(10)


if __name__ == "__main__":
    main()
