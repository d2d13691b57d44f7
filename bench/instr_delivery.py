"""The pusher's instructions per delivered message at one ws subscriber per topic (or ``--subs``),
under callgrind.

Wall-clock and CPU-time figures are noise on a shared machine; instruction counts are not. This starts
a pusher (``upf_pusher``) on a fresh embedded store under ``valgrind --tool=callgrind`` with
instrumentation off, connects ``--subs`` ws subscribers (default 1) to each of ``--topics`` topics
from this process, turns instrumentation on (SIGUSR1 to a small wrapper that calls callgrind's client
requests through a tiny C library built here with gcc), publishes ``--messages`` messages round-robin
over the topics straight into the store (this process is the writer: it is not measured), ``--burst``
at a time, waiting after each burst until every subscriber got its frames, then turns instrumentation
off (SIGUSR2, which dumps) and prints the pusher's instructions (callgrind Ir) per delivered message. It checks every frame:
no loss, no duplicate, no reordering per subscriber.

    python3 -m uv run --locked python bench/instr_delivery.py                 # 200 topics, 2,000 msgs
    python3 -m uv run --locked python bench/instr_delivery.py --burst 1       # one message per wake-up
    python3 -m uv run --locked python bench/instr_delivery.py --role upf      # the all-in-one's delivery side
    python3 -m uv run --locked python bench/instr_delivery.py --cprofile /tmp/p.prof  # where it goes
    python3 -m uv run --locked python bench/instr_delivery.py --cpu --burst 50      # user / system CPU
    python3 -m uv run --locked python bench/instr_delivery.py --topics 10 --subs 100 --burst 2 --cpu  # fan-out
    python3 -m uv run --locked python bench/instr_delivery.py --burst 50 --shards 8  # the cost per rung shard

With ``--role upf`` the publishes still go straight into the store (not through its HTTP front door),
so it counts the all-in-one's delivery work, not its publish work. To compare two versions, alternate
runs of each in one session: runs spread by ~1% with ``--burst 1`` and up to ~3% with ``--burst 10``
(how messages group into wake-ups still depends on timing). The difference between ``--shards 64`` and
``--shards 8`` at one burst is what the rung shards cost (a burst of 50 topics rings ~35 of 64 shards). Needs valgrind, gcc and valgrind's headers
(``/usr/include/valgrind/callgrind.h``). Takes ~1 minute per run on an idle machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

_TOGGLE_C = r"""
#include <valgrind/callgrind.h>
void cg_start(void) { CALLGRIND_START_INSTRUMENTATION; CALLGRIND_ZERO_STATS; }
void cg_stop(void) { CALLGRIND_DUMP_STATS; CALLGRIND_STOP_INSTRUMENTATION; }
"""


def _child(lib: str, module: str) -> None:
    """Run the role in this process; SIGUSR1/SIGUSR2 turn callgrind's instrumentation on/off."""
    import ctypes
    import importlib

    if lib.endswith(".cpu"):  # --cpu: the window's user and system CPU, nothing instrumented
        import resource

        marks: list[resource.struct_rusage] = []

        def mark(*_: Any) -> None:
            marks.append(resource.getrusage(resource.RUSAGE_SELF))
            if len(marks) == 2:
                a, b = marks
                Path(lib).write_text(
                    json.dumps(
                        {
                            "user_s": b.ru_utime - a.ru_utime,
                            "sys_s": b.ru_stime - a.ru_stime,
                            "minflt": b.ru_minflt - a.ru_minflt,
                            "ctxsw": b.ru_nvcsw - a.ru_nvcsw + b.ru_nivcsw - a.ru_nivcsw,
                        }
                    )
                )

        signal.signal(signal.SIGUSR1, mark)
        signal.signal(signal.SIGUSR2, mark)
    elif lib.endswith(".prof"):  # --cprofile: the same window under cProfile, no valgrind
        here = str(Path(__file__).resolve().parent)
        sys.path[:] = [p for p in sys.path if p not in ("", here)]  # bench/profile.py shadows the stdlib's
        import cProfile

        prof = cProfile.Profile()
        signal.signal(signal.SIGUSR1, lambda *_: prof.enable())
        signal.signal(signal.SIGUSR2, lambda *_: (prof.disable(), prof.dump_stats(lib)))
    else:
        cg = ctypes.CDLL(lib)
        signal.signal(signal.SIGUSR1, lambda *_: cg.cg_start())
        signal.signal(signal.SIGUSR2, lambda *_: cg.cg_stop())
    sys.argv = [module]  # the role's own argument parsing must not see ours
    importlib.import_module(f"{module}.__main__").main()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _wait_ready(port: int, proc: subprocess.Popen[bytes], timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("the role exited")
        try:
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(b"GET /__lbheartbeat__ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = await asyncio.wait_for(r.read(), 10)
            w.close()
            if data.startswith(b"HTTP/1.1 2"):
                return
        except (TimeoutError, OSError):
            pass
        await asyncio.sleep(0.5)
    raise TimeoutError("the role did not become ready")


async def _measure(args: argparse.Namespace, work: Path) -> dict[str, float]:
    from websockets.asyncio.client import connect

    from upf_keyspace import Envelope, load_settings, open_store

    lib = work / "cgtoggle.so"
    (work / "cgtoggle.c").write_text(_TOGGLE_C)
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(lib), str(work / "cgtoggle.c")], check=True)
    store_path = work / "store" / "upf.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UPF_", "OTEL_"))}
    env.update(UPF_STORE_PATH=str(store_path), UPF_LOG_LEVEL="WARNING", PYTHONUNBUFFERED="1")
    if args.shards is not None:  # this process pokes the shards the role watches: both need the count
        env.update(UPF_SHARD_COUNT=str(args.shards))
    # A quota sizes LMDB's map (twice it): valgrind cannot map the 1 TiB reserved without one.
    env.update(UPF_EMBEDDED_MAX_BYTES=str(256 << 20))
    settings = load_settings(env)
    store = await open_store(settings)  # creates the store; this process publishes into it
    port = _free_port()
    env.update(UPF_BIND=f"127.0.0.1:{port}", UPF_NODE_ID="instr-pusher", UPF_WORKERS="1")
    out = work / "callgrind.out"
    module = "upf_pusher" if args.role == "pusher" else "upf"
    if args.cpu:
        argv = [sys.executable, __file__, "--child", str(work / "window.cpu"), module]
    elif args.cprofile is not None:
        argv = [sys.executable, __file__, "--child", str(args.cprofile.resolve()), module]
    else:
        argv = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={out}",
            sys.executable,
            __file__,
            "--child",
            str(lib),
            module,
        ]
    log = open(work / "role.log", "wb")  # noqa: SIM115 - the role writes to it until it is stopped, past this block
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        try:
            await _wait_ready(port, proc)
        except (RuntimeError, TimeoutError):
            log.flush()
            sys.stderr.write((work / "role.log").read_text()[-3000:])
            raise
        topics = [f"instr{i:04d}" for i in range(args.topics)]
        held = [t for t in topics for _ in range(args.subs)]  # each topic's subscribers, side by side
        got: list[list[str]] = [[] for _ in held]
        conns = []
        for i in range(0, len(held), 50):
            chunk = held[i : i + 50]
            opened = await asyncio.gather(*(connect(f"ws://127.0.0.1:{port}/{t}/ws", open_timeout=120) for t in chunk))
            conns += opened
        for ws in conns:  # the open event
            json.loads(await asyncio.wait_for(ws.recv(), 120))
        delivered = asyncio.Event()
        expected = 0
        count = 0

        async def reader(seen: list[str], ws: Any) -> None:
            nonlocal count
            async for raw in ws:
                m = json.loads(raw)
                if m.get("event") == "message":
                    seen.append(m["message"])
                    count += 1
                    if count >= expected:
                        delivered.set()

        readers = [asyncio.create_task(reader(seen, ws)) for seen, ws in zip(got, conns, strict=True)]
        await asyncio.sleep(1.0)
        os.kill(proc.pid, signal.SIGUSR1)
        await asyncio.sleep(1.0)
        now = int(time.time())
        sent = 0
        t0 = time.monotonic()
        while sent < args.messages:
            n = min(args.burst, args.messages - sent)
            expected += n * args.subs
            delivered.clear()
            await asyncio.gather(
                *(
                    store.publish(
                        topics[(sent + j) % len(topics)],
                        Envelope(now, now + 3600, f"m{sent + j}", published_ms=int(time.time() * 1000)),
                    )
                    for j in range(n)
                )
            )
            sent += n
            await asyncio.wait_for(delivered.wait(), 120)
        elapsed = time.monotonic() - t0
        os.kill(proc.pid, signal.SIGUSR2)
        await asyncio.sleep(2.0)
        for r in readers:
            r.cancel()
        for ws in conns:
            await ws.close()
        violations = 0
        for i, seen in enumerate(got):  # per subscriber: no loss, no duplicate, no reordering
            want = [f"m{k}" for k in range(i // args.subs, args.messages, len(topics))]
            if seen != want:
                violations += 1
        ir = 0
        if args.cpu:
            cpu = json.loads((work / "window.cpu").read_text())
            return {"ir": ir, "delivered": count, "violations": violations, "wall_s": elapsed, **cpu}
        if args.cprofile is not None:
            return {"ir": ir, "delivered": count, "violations": violations, "wall_s": elapsed}
        dumps = sorted(work.glob("callgrind.out*"), key=lambda p: p.stat().st_mtime)
        for line in dumps[-1].read_text().splitlines():
            if line.startswith("totals:"):
                ir = int(line.split()[1])
        if args.keep is not None:
            args.keep.write_bytes(dumps[-1].read_bytes())
        return {"ir": ir, "delivered": count, "violations": violations, "wall_s": elapsed}
    finally:
        stop_role(proc)
        log.close()
        await store.close()


def stop_role(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the role under valgrind (its exit dumps once more), then its whole group if it hangs."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return n


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        _child(sys.argv[2], sys.argv[3])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topics", type=_positive, default=200)
    ap.add_argument(
        "--subs", type=_positive, default=1, help="ws subscribers per topic (fan-out: each message goes to all)"
    )
    ap.add_argument("--messages", type=int, default=2000)
    ap.add_argument("--burst", type=int, default=10, help="messages published together before waiting for delivery")
    ap.add_argument("--role", choices=("pusher", "upf"), default="pusher")
    ap.add_argument("--cprofile", type=Path, help="no valgrind: write a cProfile of the same window here (*.prof)")
    ap.add_argument("--keep", type=Path, help="copy the callgrind dump here (for callgrind_annotate)")
    ap.add_argument("--cpu", action="store_true", help="no valgrind: the role's user and system CPU per delivery")
    ap.add_argument(
        "--shards", type=int, help="UPF_SHARD_COUNT (default: the settings' 64): fewer shards, fewer rung per wake-up"
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="upf-instr-") as d:
        r = asyncio.run(_measure(args, Path(d)))
    if args.cpu:
        n = max(1, r["delivered"])
        print(
            f"role={args.role} topics={args.topics} subs={args.subs} messages={args.messages} burst={args.burst} shards={args.shards or 64}: "
            f"delivered {r['delivered']}, violations {r['violations']}, per delivery "
            f"{r['user_s'] * 1e6 / n:.1f} us user + {r['sys_s'] * 1e6 / n:.1f} us system, "
            f"{r['minflt'] / n:.2f} page faults and {r['ctxsw'] / n:.2f} context switches ({r['wall_s']:.1f} s)"
        )
        return
    print(
        f"role={args.role} topics={args.topics} subs={args.subs} messages={args.messages} burst={args.burst} shards={args.shards or 64}: "
        f"delivered {r['delivered']}, violations {r['violations']}, "
        f"{r['ir'] / max(1, r['delivered']):,.0f} Ir per delivery (total {r['ir']:,}, {r['wall_s']:.1f} s under callgrind)"
    )


if __name__ == "__main__":
    main()
