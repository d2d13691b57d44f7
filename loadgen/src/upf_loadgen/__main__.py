"""``upf-loadgen run|sweep``: the command line. Exit codes are part of the interface: 0 clean,
1 a correctness violation (or, with --strict, failed publishes/disconnects), 2 the run could not
start or measure anything (bad arguments, subscribers not connected, nothing accepted)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

import msgspec

from .report import SweepPoint, format_run, format_sweep, rates_from
from .runner import SetupError, run_scenario
from .scenario import TRANSPORTS, Scenario
from .sweep import run_sweep

__all__ = ["main", "build_parser"]

log = logging.getLogger("upf_loadgen")


def _add_common(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("target")
    g.add_argument("--url", help="one ingress URL serving both publish and subscribe (sets --writer and --pusher)")
    g.add_argument("--writer", default="http://127.0.0.1:8080", help="publish base URL (default %(default)s)")
    g.add_argument("--pusher", default="http://127.0.0.1:8081", help="subscribe base URL (default %(default)s)")
    g.add_argument("--allow-remote", action="store_true", help="allow non-loopback targets (refused by default)")
    g = p.add_argument_group("load")
    g.add_argument("--transport", choices=TRANSPORTS, default="ws", help="subscriber protocol (default %(default)s)")
    g.add_argument("--topics", type=int, default=1000, help="topics, one publisher each (default %(default)s)")
    g.add_argument("--subs-per-topic", type=int, default=1, help="subscribers per topic (default %(default)s)")
    g.add_argument("--duration", type=float, default=30.0, help="seconds of publishing (default %(default)s)")
    g.add_argument("--message-size", type=int, default=0, help="pad each body to this many bytes (default: no padding)")
    g.add_argument("--binary", action="store_true", help="UnifiedPush binary bodies: POST ?up=1 with non-UTF-8 bytes")
    g.add_argument(
        "--procs", type=int, default=1, help="worker processes; topics are split across them (default %(default)s)"
    )
    g.add_argument(
        "--pool-size", type=int, default=256, help="keep-alive publish connections per worker (default %(default)s)"
    )
    g.add_argument(
        "--drain-timeout",
        type=float,
        default=30.0,
        help="max seconds to wait for the backlog after publishing (default %(default)s)",
    )
    g.add_argument(
        "--connect-timeout",
        type=float,
        default=30.0,
        help="max seconds for all subscribers to get their open frame (default %(default)s)",
    )
    g.add_argument(
        "--publish-timeout", type=float, default=10.0, help="per-publish timeout in seconds (default %(default)s)"
    )
    g.add_argument(
        "--reconnects",
        type=int,
        default=3,
        help="times a dropped subscriber resumes with since=<last id> (default %(default)s)",
    )
    g = p.add_argument_group("output")
    g.add_argument(
        "--json", metavar="FILE", help="write the report as JSON ('-' for stdout; the text report then goes to stderr)"
    )
    g.add_argument("--quiet", action="store_true", help="no live per-second line")
    g.add_argument(
        "--strict",
        action="store_true",
        help="also exit 1 on rejected/failed publishes, disconnects or an unfinished drain",
    )
    g.add_argument("-v", "--verbose", action="store_true", help="debug logging")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="upf-loadgen", description="UPF load generator and delivery-correctness checker"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="one load run with a correctness verdict")
    run.add_argument(
        "--rate", type=float, default=2000.0, help="total publishes per second across topics (default %(default)s)"
    )
    _add_common(run)
    sw = sub.add_parser("sweep", help="step the offered rate and find the knee")
    g = sw.add_argument_group("rates")
    g.add_argument("--rates", help="comma-separated offered rates, e.g. 500,1000,2000,4000")
    g.add_argument(
        "--start", type=float, default=500.0, help="first rate when --rates is not given (default %(default)s)"
    )
    g.add_argument("--factor", type=float, default=2.0, help="rate multiplier per step (default %(default)s)")
    g.add_argument("--steps", type=int, default=4, help="number of steps (default %(default)s)")
    g.add_argument("--p99-bound-ms", type=float, default=250.0, help="knee when p99 passes this (default %(default)s)")
    g.add_argument(
        "--tolerance",
        type=float,
        default=0.05,
        help="knee when delivered falls this far behind offered (default %(default)s)",
    )
    g.add_argument("--pause", type=float, default=2.0, help="seconds between steps (default %(default)s)")
    g.add_argument("--stop-after-knee", action="store_true", help="stop at the first step past the knee")
    g.add_argument("--plot", default="loadgen-sweep.png", help="PNG path (default %(default)s; '' for none)")
    _add_common(sw)
    return parser


def _scenario(args: argparse.Namespace, rate: float) -> Scenario:
    writer, pusher = args.writer, args.pusher
    if args.url:
        writer = pusher = args.url
    return Scenario(
        writer=writer,
        pusher=pusher,
        transport=args.transport,
        topics=args.topics,
        subs_per_topic=args.subs_per_topic,
        rate=rate,
        duration=args.duration,
        message_size=args.message_size,
        binary=args.binary,
        procs=args.procs,
        drain_timeout=args.drain_timeout,
        connect_timeout=args.connect_timeout,
        publish_timeout=args.publish_timeout,
        pool_size=args.pool_size,
        reconnects=args.reconnects,
        allow_remote=args.allow_remote,
        live=not args.quiet,
        strict=args.strict,
    )


def _write_json(path: str, obj: msgspec.Struct) -> None:
    data = msgspec.json.format(msgspec.json.encode(obj), indent=2)
    if path == "-":
        sys.stdout.buffer.write(data + b"\n")
        sys.stdout.flush()
    else:
        with open(path, "wb") as f:
            f.write(data + b"\n")


def _emit_text(args: argparse.Namespace, text: str) -> None:
    out = sys.stderr if args.json == "-" else sys.stdout
    print(text, file=out, flush=True)


def _cmd_run(args: argparse.Namespace) -> int:
    scn = _scenario(args, args.rate)
    report = asyncio.run(run_scenario(scn))
    _emit_text(args, format_run(report))
    if args.json:
        _write_json(args.json, report)
    return report.exit_code


def _cmd_sweep(args: argparse.Namespace) -> int:
    if args.rates:
        try:
            rates = [float(x) for x in args.rates.split(",") if x.strip()]
        except ValueError:
            log.error("--rates must be comma-separated numbers")
            return 2
    else:
        rates = list(rates_from(args.start, args.factor, args.steps))
    if not rates or any(r <= 0 for r in rates):
        log.error("rates must be positive")
        return 2
    base = _scenario(args, rates[0])

    def on_point(p: SweepPoint) -> None:
        log.info(
            "sweep point: rate %.0f/s delivered %.0f/s p99 %.2f ms violations %d",
            p.rate,
            p.delivered_per_s,
            p.p99_ms,
            p.violations,
        )

    report = asyncio.run(
        run_sweep(
            base,
            rates,
            tolerance=args.tolerance,
            p99_bound_ms=args.p99_bound_ms,
            pause=args.pause,
            stop_after_knee=args.stop_after_knee,
            on_point=on_point,
        )
    )
    if args.plot and report.points:
        from .plot import plot_sweep

        plot_sweep(report, args.plot)
        report = msgspec.structs.replace(report, plot=args.plot)
    if report.exit_code == 2 and report.runs:
        _emit_text(args, format_run(report.runs[-1]))
    _emit_text(args, format_sweep(report))
    if args.json:
        _write_json(args.json, report)
    return report.exit_code


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        if args.command == "run":
            return _cmd_run(args)
        return _cmd_sweep(args)
    except SetupError as exc:
        log.error("cannot run: %s", exc)
        return 2


if __name__ == "__main__":
    sys.exit(main())
