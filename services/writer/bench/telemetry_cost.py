"""What telemetry costs a publish: the writer's publish throughput with telemetry off (the default: metric
cells and /metrics only), with traces on (exported over OTLP/HTTP by the batch span processor: the
compose setup, where the collector scrapes /metrics), the same with 1% ratio sampling
(``OTEL_TRACES_SAMPLER=traceidratio``, ``OTEL_TRACES_SAMPLER_ARG=0.01``), and with every trace plus OTLP
metric push every second ("all"), side by side, in one run.

    cd /work/main && python3 -m uv run python services/writer/bench/telemetry_cost.py [--seconds 3] [--rounds 5]

Each measurement is a fresh process configured from the environment exactly as ``upf-writer``'s worker
is (``setup_telemetry`` then ``create_app``), publishing by calling the writer's ASGI app directly (no
HTTP server or client, so the writer's own work is all that is timed) from ``--concurrency`` tasks, each
request carrying a ``traceparent`` header. "traces" and "all" export to a local collector stub (a
separate process that answers every OTLP POST with 200). Two stores: ``null`` (answers without I/O: the writer's CPU path
alone, where telemetry's share is largest) and ``embedded`` (the real SQLite store, fsync per group
commit, in a temporary directory). Modes alternate within each round; medians are compared.

Also printed: the per-publish cost of the metric cells the off mode keeps (the hot path's only
telemetry work when nothing is configured).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import timeit

TRACEPARENT = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
BODY = b"x" * 100

STUB = textwrap.dedent(
    """
    import sys
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a):
            pass

    s = ThreadingHTTPServer(("127.0.0.1", 0), H)
    print(s.server_address[1], flush=True)
    s.serve_forever()
    """
)


# --- one measurement (child process) -------------------------------------------------------------------
async def _measure(store_kind: str, seconds: float, concurrency: int, warmup: float) -> dict[str, float]:
    from upf_keyspace import Envelope, Published, Settings, open_store
    from upf_writer.app import create_app

    try:
        from upf_keyspace.telemetry import setup_telemetry
    except ImportError:  # --baseline: a tree from before telemetry existed
        telemetry = None
    else:
        telemetry = setup_telemetry("upf-writer", "bench")

    class NullStore:
        async def publish(self, topic: str, envelope: Envelope, *, idem: str = "") -> Published:
            return Published(bytes(12), envelope, False)

        async def close(self) -> None:
            pass

    tmp = tempfile.mkdtemp(prefix="upf-telemetry-cost-")
    settings = Settings(store_path=os.path.join(tmp, "upf.db"))
    store = NullStore() if store_kind == "null" else await open_store(settings)
    if telemetry is None:
        app = create_app(settings, store)  # type: ignore[arg-type]
    else:
        app = create_app(settings, store, telemetry=telemetry)  # type: ignore[arg-type]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/bench1",
        "raw_path": b"/bench1",
        "query_string": b"up=1",
        "root_path": "",
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"content-type", b"application/octet-stream"),
            (b"content-length", str(len(BODY)).encode()),
            (b"traceparent", TRACEPARENT),
        ],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 8080),
        "state": {},
    }
    request = {"type": "http.request", "body": BODY, "more_body": False}
    done = 0
    failed = 0
    counting = False
    stop_at = 0.0

    async def receive() -> dict[str, object]:
        return request

    async def worker() -> None:
        nonlocal done, failed
        status = [0]

        async def send(message: dict[str, object]) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]  # type: ignore[assignment]

        while time.perf_counter() < stop_at:
            await app(dict(scope), receive, send)  # type: ignore[arg-type]
            if counting:
                if status[0] == 200:
                    done += 1
                else:
                    failed += 1

    stop_at = time.perf_counter() + warmup
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    counting = True
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    stop_at = t0 + seconds
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    await store.close()
    tracing = False
    if telemetry is not None:
        tracing = telemetry.tracing
        telemetry.shutdown()
    return {
        "rate": done / elapsed,
        "failed": failed,
        "cpu_us_per_publish": 1e6 * cpu / max(done, 1),
        "tracing": tracing,
    }


def _child(args: argparse.Namespace) -> None:
    result = asyncio.run(_measure(args.store, args.seconds, args.concurrency, args.warmup))
    print(json.dumps(result), flush=True)


# --- the run (parent) ----------------------------------------------------------------------------------
def _env(mode: str, stub_port: int, baseline_src: str = "") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "UPF_"))}
    if mode == "before":
        # the writer and keyspace sources of the baseline revision shadow the workspace's
        env["PYTHONPATH"] = os.pathsep.join(
            [os.path.join(baseline_src, "libs/upf-keyspace/src"), os.path.join(baseline_src, "services/writer/src")]
        )
    env["UPF_LOG_LEVEL"] = "warning"
    env["NO_PROXY"] = "127.0.0.1,localhost"
    if mode != "off":
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{stub_port}"
    if mode == "all":
        env.update(OTEL_METRICS_EXPORTER="otlp", OTEL_METRIC_EXPORT_INTERVAL="1000")
    if mode == "1%":
        env.update(OTEL_TRACES_SAMPLER="traceidratio", OTEL_TRACES_SAMPLER_ARG="0.01")
    return env


def _run_one(
    mode: str, store: str, args: argparse.Namespace, stub_port: int, baseline_src: str = ""
) -> dict[str, float]:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        "--store",
        store,
        "--seconds",
        str(args.seconds),
        "--concurrency",
        str(args.concurrency),
        "--warmup",
        str(args.warmup),
    ]
    out = subprocess.run(cmd, env=_env(mode, stub_port, baseline_src), capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"{mode}/{store} failed: {out.stderr[-2000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if result["tracing"] != (mode not in ("off", "before")):
        raise RuntimeError(f"{mode}: tracing is {result['tracing']}")
    if result["failed"]:
        raise RuntimeError(f"{mode}/{store}: {result['failed']} publishes failed")
    return result


def _cell_cost() -> float:
    """ns per publish of the cell updates the off mode does: writer (commit and size histograms, one
    counter) and store (one transaction counter; the batch histograms are per group commit, ignored)."""
    from upf_keyspace import telemetry as tm

    reg = tm.Registry()
    commit = reg.histogram("c", "c", unit="s", bounds=tm.LATENCY_BUCKETS).cell()
    size = reg.histogram("s", "s", unit="By", bounds=tm.BYTES_BUCKETS).cell()
    stored = reg.counter("p", "p").cell()
    tx = reg.counter("t", "t").cell()

    def one() -> None:
        commit.record(0.0012)
        size.record(100)
        stored.add()
        tx.add()

    n = 200_000
    return min(timeit.repeat(one, number=n, repeat=5)) / n * 1e9


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=3.0, help="measured seconds per round and mode")
    p.add_argument("--warmup", type=float, default=0.5)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--store", choices=["null", "embedded", "both"], default="both")
    p.add_argument(
        "--baseline",
        metavar="REV",
        default="",
        help="also measure the writer as of git revision REV (e.g. the commit before telemetry) as mode 'before'",
    )
    p.add_argument("--modes", default="off,traces,1%,all", help="comma list of modes to run (default: all four)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        _child(args)
        return
    stub = subprocess.Popen([sys.executable, "-c", STUB], stdout=subprocess.PIPE, text=True)
    try:
        stub_port = int(stub.stdout.readline())  # type: ignore[union-attr]
        stores = ["null", "embedded"] if args.store == "both" else [args.store]
        baseline_src = ""
        modes: tuple[str, ...] = tuple(m.strip() for m in args.modes.split(",") if m.strip())
        if "off" not in modes:
            modes = ("off", *modes)
        if args.baseline:
            baseline_src = tempfile.mkdtemp(prefix="upf-baseline-")
            repo = subprocess.run(
                ["git", "rev-parse", "--show-toplevel"],
                capture_output=True,
                text=True,
                check=True,
                cwd=os.path.dirname(os.path.abspath(__file__)),
            ).stdout.strip()
            archive = subprocess.run(
                ["git", "archive", args.baseline, "libs/upf-keyspace/src", "services/writer/src"],
                capture_output=True,
                check=True,
                cwd=repo,
            ).stdout
            subprocess.run(["tar", "-x", "-C", baseline_src], input=archive, check=True)
            modes = ("before", *modes)
        if args.baseline:
            print(f"before = the writer as of {args.baseline} (no telemetry code at all)")
        print(
            f"telemetry cost: {args.rounds} rounds x {args.seconds:g} s per mode, {args.concurrency} concurrent publishers, "
            f"100-byte body, traceparent header. off = default (cells + /metrics); traces = OTLP/HTTP traces "
            f"(batch processor, every publish sampled) to a local stub; 1% = the same, ratio-sampled; "
            f"all = every trace + OTLP metric push every 1 s"
        )
        for store in stores:
            rates: dict[str, list[float]] = {m: [] for m in modes}
            cpu: dict[str, list[float]] = {m: [] for m in modes}
            for r in range(args.rounds):
                order = modes[r % len(modes) :] + modes[: r % len(modes)]  # rotate: no mode always runs first
                for mode in order:
                    res = _run_one(mode, store, args, stub_port, baseline_src)
                    rates[mode].append(res["rate"])
                    cpu[mode].append(res["cpu_us_per_publish"])
            med = {m: statistics.median(rates[m]) for m in modes}
            cmed = {m: statistics.median(cpu[m]) for m in modes}
            print(f"\nstore={store}")
            print(
                f"  {'mode':<7} {'publishes/s (median)':>21}  {'ratio to off':>12}  {'CPU us/publish':>14}  all rounds"
            )
            for m in modes:
                rounds = ", ".join(f"{x:,.0f}" for x in rates[m])
                print(f"  {m:<7} {med[m]:>21,.0f}  {med[m] / med['off']:>12.3f}  {cmed[m]:>14.1f}  {rounds}")
        print(
            f"\nmetric cells with telemetry off: {_cell_cost():.0f} ns per publish "
            f"(2 histogram records, 2 counter adds)"
        )
    finally:
        stub.terminate()
        stub.wait(5)


if __name__ == "__main__":
    main()
