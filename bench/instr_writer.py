"""The standalone writer's instructions per HTTP publish, under callgrind: every thread of the process.

``bench/instr_publish.py`` counts ``WriterFront.publish`` in process, without HTTP. This counts what
the ``rounds`` phase's ingest pays for: ``upf-writer`` on its default server (UPF's front door), its
head parsing, routing, reply and socket I/O included. It starts the writer on a fresh embedded store
under ``valgrind --tool=callgrind`` with instrumentation off, opens 64 keep-alive connections, sends
warm-up publishes, turns instrumentation on (SIGUSR1, through the tiny C library
bench/instr_delivery.py builds with gcc), sends ``--publishes`` more (each connection awaits each
answer, as bench/pubdrive.py does), turns it off (SIGUSR2, which dumps) and prints the Ir per publish.
Every publish must answer 200.

    python3 -m uv run --locked python bench/instr_writer.py                # pubdrive's head: 3 fields
    python3 -m uv run --locked python bench/instr_writer.py --fields 5     # a Go client's: 5 fields
    python3 -m uv run --locked python bench/instr_writer.py --keep /tmp/w.cg   # keep the dump

How publishes group into commits depends on timing under callgrind; runs of one tree agreed within
~0.5% (four of each head), so compare two trees by alternating runs. Needs valgrind, gcc and
valgrind's headers. Takes ~20 s.

``--gap SECS`` sends the counted publishes one at a time, one every SECS on a connection not awaiting
an answer, instead of each connection's next as soon as its last is answered: lone arrivals, as at a
moderate rate (2,000/s) rather than at saturation. Under callgrind the writer runs ~50 times slower,
so a gap that keeps arrivals apart also gives smaller commits than the real rate does; the line it
prints therefore counts the commits (LMDB's ``mdb_txn_commit``) and the event loop's turns (libuv's
``uv__io_poll``) per publish too, to price each (BENCHMARKS.md, forty-fourth pass).

    python3 -m uv run --locked python bench/instr_writer.py --gap 0.005
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from instr_delivery import _TOGGLE_C, _free_port, _wait_ready, stop_role
from pubdrive import build_requests

HERE = Path(__file__).resolve().parent
CONNECTIONS = 64
TOPICS = [f"iw{i:04d}" for i in range(1000)]
_GO_HEAD = (
    "POST /{topic} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: Go-http-client/1.1\r\n"
    "Content-Length: 100\r\nContent-Type: text/plain\r\nAccept-Encoding: gzip\r\n\r\n"
)


def build(fields: int, host: str) -> list[bytes]:
    """A publish per topic: bench/pubdrive.py's own requests (3 fields), or a Go client's head (5)."""
    if fields == 3:
        return build_requests(host, "", TOPICS, 100)
    return [_GO_HEAD.format(topic=t, host=host).encode() + b"x" * 100 for t in TOPICS]


async def _publish(conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], request: bytes) -> None:
    r, w = conn
    w.write(request)
    got = await r.readuntil(b"\r\n\r\n")
    if not got.startswith(b"HTTP/1.1 200"):
        raise SystemExit(f"publish answered {got[:40]!r}")
    length = next(
        int(v) for k, _, v in (line.partition(b":") for line in got.split(b"\r\n")) if k.lower() == b"content-length"
    )
    await r.readexactly(length)


def _calls(text: str, name: str) -> int:
    """Calls to the function ``name`` in a callgrind dump (its compressed names: "fn=(id) name" once,
    "(id)" after), summed over every caller's ``calls=`` line."""
    ids: set[str] = set()
    total = 0
    counting = False
    for line in text.splitlines():
        if line.startswith(("fn=(", "cfn=(")):
            ref, _, named = line.partition("=")[2].partition(" ")
            if named == name:
                ids.add(ref)
            counting = line.startswith("cfn=") and ref in ids
        elif counting and line.startswith("calls="):
            total += int(line[6:].split()[0])
            counting = False
    return total


async def _paced(
    conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]], requests: list[bytes], gap: float
) -> None:
    """Each request alone, one every ``gap`` seconds, on a connection that is not awaiting an answer."""
    free: asyncio.Queue[int] = asyncio.Queue()
    for k in range(len(conns)):
        free.put_nowait(k)

    async def one(k: int, request: bytes) -> None:
        await _publish(conns[k], request)
        free.put_nowait(k)

    sent = []
    for request in requests:
        sent.append(asyncio.create_task(one(await free.get(), request)))
        await asyncio.sleep(gap)
    await asyncio.gather(*sent)


async def measure(publishes: int, fields: int, keep: Path | None, gap: float = 0.0) -> tuple[float, float, float]:
    """Ir, commits and event-loop turns, each per counted publish."""
    work = Path(tempfile.mkdtemp(prefix="upf-instr-writer-"))
    try:
        lib = work / "cgtoggle.so"
        (work / "cgtoggle.c").write_text(_TOGGLE_C)
        subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(lib), str(work / "cgtoggle.c")], check=True)
        port = _free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("UPF_", "OTEL_"))}
        env.update(
            UPF_STORE_PATH=str(work / "store" / "upf.db"),
            UPF_LOG_LEVEL="WARNING",
            PYTHONUNBUFFERED="1",
            UPF_EMBEDDED_MAX_BYTES=str(256 << 20),  # valgrind cannot map the 1 TiB reserved without a quota
            UPF_BIND=f"127.0.0.1:{port}",
        )
        out = work / "callgrind.out"
        argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
        argv += [sys.executable, str(HERE / "instr_delivery.py"), "--child", str(lib), "upf_writer"]
        with open(work / "role.log", "wb") as log:
            proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                await _wait_ready(port, proc)
                conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(CONNECTIONS)]
                per = max(1, publishes // CONNECTIONS)
                each = build(fields, f"127.0.0.1:{port}")
                requests = [[each[(k * 2 * per + i) % len(each)] for i in range(2 * per)] for k in range(CONNECTIONS)]

                async def run(start: int) -> None:
                    async def one_connection(k: int) -> None:
                        for request in requests[k][start : start + per]:
                            await _publish(conns[k], request)

                    await asyncio.gather(*(one_connection(k) for k in range(CONNECTIONS)))

                await run(0)  # warm: imports, caches, the store's first pages
                os.kill(proc.pid, signal.SIGUSR1)
                await asyncio.sleep(1.0)
                if gap:
                    await _paced(
                        conns,
                        [requests[i % CONNECTIONS][per + i // CONNECTIONS] for i in range(per * CONNECTIONS)],
                        gap,
                    )
                else:
                    await run(per)
                os.kill(proc.pid, signal.SIGUSR2)
                await asyncio.sleep(3.0)
                for _, w in conns:
                    w.close()
                # This one, before the exit's own dump (nothing instrumented) is the newest.
                dump = max(work.glob("callgrind.out*"), key=lambda p: p.stat().st_mtime)
                text = dump.read_text()
            finally:
                stop_role(proc)
        if keep is not None:
            keep.write_text(text)
        total = next(int(line.split()[1]) for line in text.splitlines() if line.startswith("totals:"))
        n = per * CONNECTIONS
        return total / n, _calls(text, "_mdb_txn_commit") / n, _calls(text, "uv__io_poll") / n
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--publishes", type=int, default=2048, help="publishes counted (a multiple of 64)")
    ap.add_argument("--fields", type=int, choices=(3, 5), default=3, help="header fields a publish sends")
    ap.add_argument("--keep", type=Path, help="copy the callgrind dump here")
    ap.add_argument("--gap", type=float, default=0.0, help="send the counted publishes one every GAP seconds")
    args = ap.parse_args()
    if not 0 <= args.gap <= 1:
        ap.error("--gap is between 0 and 1 second")
    ir, commits, turns = asyncio.run(measure(args.publishes, args.fields, args.keep, args.gap))
    print(
        f"publishes={args.publishes // CONNECTIONS * CONNECTIONS} fields={args.fields} gap={args.gap:g}: "
        f"{ir:,.0f} Ir per publish (all threads); {commits:.3f} commits and {turns:.3f} event-loop turns per publish"
    )


if __name__ == "__main__":
    main()
