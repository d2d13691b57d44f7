"""The standalone writer under granian, layer by layer: what each layer adds to a publish's CPU, and the
same writer on UPF's own front door (its default server) beside them.

Why: the writer's goal is a ratio to a bare granian ASGI app (the ``rounds`` phase's ingest), and a
ratio alone does not say where the rest goes. Four servers answer the same load, each configured as
``upf-writer`` configures granian (``upf_writer.__main__.build_server``), on one core, driven by
bench/pubdrive.py (64 keep-alive connections, 1,000 topics) in alternating rounds, and a fifth as a
reference:

- ``bare``: bench/bare_asgi.py, the ceiling;
- ``edge``: the writer's app (``WriterApp``, its ASGI adapter ``serve_asgi``, the body read) whose
  publish handler answers a fixed reply: granian's bridge and UPF's ASGI layer;
- ``front``: the real ``WriterFront`` (headers, the access gate, the request limits, ingest, the
  reply) over a store whose ``publish`` answers at once: what the front adds;
- ``writer``: ``upf-writer`` itself on granian (UPF_WRITER_SERVER=granian): what the store adds (the
  publish transaction on the event loop, the group commit's thread, the LMDB commit and the kernel's
  writes);
- ``door``, the reference: ``upf-writer`` on its default server, UPF's own HTTP/1.1 front door
  (``upf_edge.frontdoor``): the same front and store without granian.

Not part of bench/run.py. Each round prints publishes/s and server CPU per publish; the end prints
the medians, each layer's increment, the ratio to ``bare``, and the CPU split over the server's
threads (each thread's share of the whole drive, connecting included, applied to the window's CPU).

    python3 -m uv run python bench/writer_layers.py                 # 3 rounds of 4 s
    python3 -m uv run python bench/writer_layers.py --rounds 5 --secs 6
    python3 -m uv run python bench/writer_layers.py --rate 2000     # paced: each layer at 2,000/s
    python3 -m uv run python bench/writer_layers.py --connections 2 # a small closed loop

With ``--rate`` every server takes the same paced load (bench/pubdrive.py's ``--rate``), so the
figures are each layer's CPU per publish at that rate, where requests come apart and each may wake
the server's threads alone: at 2,000/s that is the split shape's writer in the ``pubdeliver`` phase,
and the ratios to ``bare`` are of CPU per publish (publishes/s is the rate).

With ``--connections N`` the closed loop has N connections instead of 64: clients that each await
their answer, fewer than the group commit's target (32), are what its quiet rule is for.

``serve <layer>`` is how the driver starts ``edge`` and ``front`` (granian imports this module in its
worker as ``writer_layers:<layer>``).
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import procs
from harness import SERVER_CPUS, pubdrive
from procs import PY, Proc

from upf_edge.asgi import lazy_app
from upf_edge.handler import Reply

LAYERS = ("bare", "edge", "front", "writer")
SERVERS = (*LAYERS, "door")  # the last is a reference, not a layer (see the module docstring)
_TOPICS = 1000
_BODY = (
    b'{"id":"AAAAAAAAAAIAAAAAAAAA","time":1764450000,"expires":1766869200,"event":"message",'
    b'"topic":"upBENCH0000000","message":"lg:0:0:abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz'
    b'0123456789abcdefghijklmnopqrstuvwxyz0"}\n'
)
"""bench/bare_asgi.py's ``BODY`` (the size of UPF's reply), not imported: importing bare_asgi sets the
collector policy of the importing process (the driver's, a test run's)."""
_CONNS = 64


class _FixedReply:
    """The writer's publish handler, answering ``_BODY`` without reading or storing anything beyond
    the body (``serve_asgi`` reads it within the real limit)."""

    def __init__(self, front: Any) -> None:
        self._front = front
        self._reply = Reply(200, _BODY)

    def wants(self, method: str, path: str) -> bool:
        return bool(self._front.wants(method, path))

    def body_limit(self, method: str, topic: str, headers: Sequence[tuple[bytes, bytes]], query: bytes) -> int:
        return int(self._front.body_limit(method, topic, headers, query))

    async def admit(self, *_: object) -> Reply | None:
        return None

    async def __call__(self, *_: object) -> Reply:
        return self._reply


def _build(layer: str) -> Any:
    """A stub layer's app, built as ``upf_writer.asgi`` builds the writer's (in granian's worker only:
    the driver never imports the writer)."""
    from upf_edge.gcpolicy import settle_gc
    from upf_keyspace import Published, load_settings
    from upf_writer.app import create_app

    app = create_app(load_settings())
    if layer == "edge":
        app.front = _FixedReply(app.front)
    else:
        stamps = itertools.count(1)

        async def instant(topic: str, envelope: Any, *, idem: str = "") -> Published:
            return Published(next(stamps).to_bytes(12, "big"), envelope, False)

        def no_store_wait() -> None:
            app.state.writer.require_store().publish = instant

        app.on_startup.append(no_store_wait)  # after the lifespan opened the store
    app.on_startup.append(settle_gc)  # as upf_writer.asgi does
    return app


_BUILT = {layer: lazy_app(lambda layer=layer: _build(layer)) for layer in ("edge", "front")}


def __getattr__(name: str) -> Any:
    """``writer_layers:edge`` and ``writer_layers:front``, built on first access in granian's worker."""
    if name in _BUILT:
        return _BUILT[name]("app")
    raise AttributeError(name)


def _serve(layer: str) -> None:
    from upf_keyspace import load_settings
    from upf_writer.__main__ import build_server

    s = load_settings()
    build_server(s.bind_host, s.bind_port, log_level="warning", target=f"writer_layers:{layer}").serve()


_GROUPS = ("event loop", "granian I/O", "other threads")
"""The server's threads as the table shows them: the worker's main thread (the asyncio loop),
granian's tokio runtime, and the rest (granian's Python thread; the store's group commit thread)."""


def _threads(pid: int) -> dict[str, float]:
    """CPU seconds so far of the server's threads, by ``_GROUPS``."""
    out = dict.fromkeys(_GROUPS, 0.0)
    for name, secs in procs.tree_thread_cpu([pid]).items():
        if name.endswith(" main"):
            out[_GROUPS[0]] += secs
        elif name.startswith("tokio"):
            out[_GROUPS[1]] += secs
        else:
            out[_GROUPS[2]] += secs
    return out


def _start(layer: str, work: Path) -> tuple[Proc, int]:
    store = work / f"{layer}.db"
    if layer == "bare":
        return procs.start_bare_asgi(work, SERVER_CPUS)
    if layer in ("writer", "door"):
        server = "granian" if layer == "writer" else "upf"
        return procs.start_upf_writer(work, store, SERVER_CPUS, UPF_WRITER_SERVER=server)
    argv = [PY, __file__, "serve", layer]
    return procs.start_upf_command(f"writer-{layer}", argv, layer, f"bench-{layer}", work, store, SERVER_CPUS)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd")
    serve = sub.add_parser("serve", help="serve one layer (the driver starts it)")
    serve.add_argument("layer", choices=("edge", "front"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--secs", type=float, default=4.0)
    ap.add_argument("--rate", type=float, default=0.0, help="paced publishes/s (default 0: as fast as answered)")
    ap.add_argument("--connections", type=int, default=_CONNS, help=f"keep-alive connections (default {_CONNS})")
    a = ap.parse_args()
    if a.connections < 1:
        ap.error("--connections must be at least 1")
    if a.cmd == "serve":
        _serve(a.layer)
        return
    work = Path(tempfile.mkdtemp(prefix="upf-writer-layers-"))
    rate: dict[str, list[float]] = {k: [] for k in SERVERS}
    cpu: dict[str, list[float]] = {k: [] for k in SERVERS}
    split: dict[str, list[dict[str, float]]] = {k: [] for k in SERVERS}
    try:
        for r in range(a.rounds):
            order = SERVERS if r % 2 == 0 else tuple(reversed(SERVERS))
            line = []
            for layer in order:
                p, port = _start(layer, work)
                try:
                    before = _threads(p.pid)
                    d = pubdrive(
                        f"http://127.0.0.1:{port}",
                        [p.pid],
                        secs=a.secs,
                        conns=a.connections,
                        topics=_TOPICS,
                        rate=a.rate,
                    )
                    after = _threads(p.pid)
                finally:
                    p.stop()
                if d.errors or d.non_200 or d.cpu_us_per_publish is None:
                    raise SystemExit(f"{layer}: {d.errors} errors, answers other than 200: {d.non_200}")
                rate[layer].append(d.ok_per_s)
                cpu[layer].append(d.cpu_us_per_publish)
                used = {k: after[k] - before.get(k, 0.0) for k in after}
                whole = sum(used.values()) or 1.0
                split[layer].append({k: d.cpu_us_per_publish * v / whole for k, v in used.items()})
                line.append(f"{layer} {d.ok_per_s:,.0f}/s {d.cpu_us_per_publish:.1f} us")
            print(f"round {r + 1}: " + ", ".join(line), flush=True)
    finally:
        procs.stop_all()
        shutil.rmtree(work, ignore_errors=True)
    load = f"paced at {a.rate:,.0f}/s" if a.rate else "as fast as answered"
    print(f"\nmedians of {a.rounds} rounds (server on CPU {min(SERVER_CPUS)}, {a.connections} connections, {load}):")
    print(f"| layer | publishes/s | vs bare | CPU us per publish | added by the layer | {' | '.join(_GROUPS)} |")
    print("|---|---|---|---|---|" + "---|" * len(_GROUPS))
    previous = None
    for layer in SERVERS:
        r, c = statistics.median(rate[layer]), statistics.median(cpu[layer])
        if layer == "bare":
            ratio = "-"
        elif a.rate:  # every layer answers the same rate: the ratio is of CPU per publish
            ratio = f"{statistics.median(cpu['bare']) / c:.2f}"
        else:
            ratio = f"{r / statistics.median(rate['bare']):.2f}"
        label = layer
        if layer == "door":  # a reference: the writer's front and store without granian
            label, added = "(door)", f"{c - previous:+.1f} (vs writer)" if previous is not None else "-"
        else:
            added = "-" if previous is None else f"{c - previous:+.1f}"
            previous = c
        parts = [statistics.median(s.get(g, 0.0) for s in split[layer]) for g in _GROUPS]
        print(f"| {label} | {r:,.0f} | {ratio} | {c:.1f} | {added} | {' | '.join(f'{x:.1f}' for x in parts)} |")


if __name__ == "__main__":
    sys.exit(main())
