"""End to end against the fake ntfy server: the real client code, publishers, subscribers, runner
and CLI, with faults injected on the server side."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from upf_loadgen.runner import SetupError, run_scenario
from upf_loadgen.scenario import Scenario


def scenario(srv: Any, transport: str = "ws", **kw: object) -> Scenario:
    base = dict(
        writer=srv.http_url,
        pusher=srv.ws_url if transport == "ws" else srv.http_url,
        transport=transport,
        topics=4,
        rate=100.0,
        duration=1.5,
        drain_timeout=1.5,
        connect_timeout=5.0,
        message_size=64,
        live=False,
    )
    base.update(kw)
    return Scenario(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(("transport", "binary"), [("ws", False), ("ws", True), ("json", False), ("sse", True)])
async def test_clean_run(fake_ntfy, transport: str, binary: bool) -> None:
    srv = await fake_ntfy()
    r = await run_scenario(scenario(srv, transport, binary=binary))
    assert r.verdict == "clean", r.reason
    assert r.exit_code == 0 and r.ok
    assert r.violations.total() == 0
    assert r.subscriptions.connected == 4 and r.subscriptions.failed == 0
    t = r.throughput
    assert t.offered == 150 and t.accepted == 150 and t.rejected == 0 and t.errors == 0
    assert t.delivered == t.expected_deliveries == 150
    assert r.drain.complete and r.drain.backlog_left == 0
    assert r.latency.count == 150 and 0 < r.latency.p50_ms <= r.latency.p99_ms <= r.latency.max_ms
    assert r.topics_total == r.topics_clean == 4
    assert len(r.cpu.worker_load_pct) == 1


async def test_several_subscribers_per_topic(fake_ntfy) -> None:
    srv = await fake_ntfy()
    r = await run_scenario(scenario(srv, "json", subs_per_topic=3, topics=2))
    assert r.verdict == "clean"
    assert r.subscriptions.connected == 6
    assert r.throughput.delivered == r.throughput.expected_deliveries == 3 * r.throughput.accepted


@pytest.mark.parametrize(
    ("fault", "expect"),
    [
        ("drop", {"loss": 1, "gaps": 1}),
        ("dup", {"duplicates": 1}),
        ("swap", {"out_of_order": 1}),
    ],
)
async def test_injected_fault_is_reported(fake_ntfy, fault: str, expect: dict[str, int]) -> None:
    srv = await fake_ntfy(fault=fault)
    r = await run_scenario(scenario(srv, "ws", drain_timeout=1.0))
    assert r.verdict == "violations" and r.exit_code == 1 and not r.ok
    got = {k: v for k, v in msgspec.structs.asdict(r.violations).items() if v}
    assert got == expect
    bad = [tv for tv in r.topics if not tv.clean]
    assert len(bad) == 1
    if fault == "drop":
        assert not r.drain.complete and r.drain.backlog_left == 1
        assert r.throughput.delivered == r.throughput.accepted - 1


async def test_rejected_publish_is_reported_not_lost(fake_ntfy) -> None:
    srv = await fake_ntfy(fault="reject")
    r = await run_scenario(scenario(srv, "ws"))
    assert r.verdict == "clean" and r.exit_code == 0
    assert r.throughput.rejected == 1 and r.throughput.accepted == r.throughput.offered - 1
    assert r.publish_failures.by_kind == {"429": 1}
    assert r.violations.loss == 0
    srv2 = await fake_ntfy(fault="reject")  # the fault fires once per fake
    strict = await run_scenario(scenario(srv2, "ws", strict=True))
    assert strict.verdict == "degraded" and strict.exit_code == 1


async def test_unreachable_pusher_is_a_setup_failure() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # nothing listens on port now; the publisher side is never reached
    scn = Scenario(
        writer=f"http://127.0.0.1:{port}",
        pusher=f"http://127.0.0.1:{port}",
        topics=2,
        rate=10,
        duration=1,
        connect_timeout=3,
        live=False,
    )
    r = await run_scenario(scn)
    assert r.verdict == "setup_failed" and r.exit_code == 2
    assert r.subscriptions.failed == 2 and r.throughput.offered == 0


async def test_non_loopback_target_is_refused() -> None:
    with pytest.raises(SetupError):
        await run_scenario(Scenario(writer="http://192.0.2.1:8080", pusher="http://192.0.2.1:8081", live=False))


async def _cli(*args: str, timeout: float = 30.0) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "upf_loadgen", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_cli_clean_run_exits_zero_and_writes_json(fake_ntfy, tmp_path: Path) -> None:
    srv = await fake_ntfy()
    out_json = tmp_path / "report.json"
    rc, out, err = await _cli(
        "run",
        "--writer",
        srv.http_url,
        "--pusher",
        srv.ws_url,
        "--topics",
        "3",
        "--rate",
        "60",
        "--duration",
        "1",
        "--drain-timeout",
        "2",
        "--json",
        str(out_json),
    )
    assert rc == 0, out + err
    assert "VERDICT: CLEAN" in out
    assert "offered" in err  # the live line
    rep = json.loads(out_json.read_text())
    assert rep["ok"] is True and rep["verdict"] == "clean" and rep["exit_code"] == 0
    assert rep["violations"] == {
        "loss": 0,
        "duplicates": 0,
        "out_of_order": 0,
        "gaps": 0,
        "id_mismatch": 0,
        "corrupt": 0,
        "unexpected": 0,
    }
    assert rep["throughput"]["accepted"] == rep["throughput"]["delivered"] == 60
    assert {"p50_ms", "p90_ms", "p95_ms", "p99_ms", "max_ms", "buckets"} <= rep["latency"].keys()
    assert len(rep["topics"]) == 3 and all(t["clean"] for t in rep["topics"])
    assert rep["scenario"]["transport"] == "ws"
    assert {"user_secs", "sys_secs", "pct_of_wall", "worker_load_pct", "saturated"} <= rep["cpu"].keys()


async def test_cli_loss_exits_one(fake_ntfy) -> None:
    srv = await fake_ntfy(fault="drop", fault_at=2)
    rc, out, err = await _cli(
        "run",
        "--url",
        srv.http_url,
        "--transport",
        "json",
        "--topics",
        "2",
        "--rate",
        "40",
        "--duration",
        "1",
        "--drain-timeout",
        "1",
        "--json",
        "-",
        "--quiet",
    )
    assert rc == 1, out + err
    rep = json.loads(out)  # --json - puts JSON alone on stdout
    assert rep["verdict"] == "violations" and rep["violations"]["loss"] == 1
    assert "VERDICT: VIOLATIONS" in err


async def test_cli_two_worker_processes(fake_ntfy) -> None:
    srv = await fake_ntfy()
    rc, out, err = await _cli(
        "run",
        "--url",
        srv.http_url,
        "--transport",
        "sse",
        "--binary",
        "--topics",
        "4",
        "--rate",
        "80",
        "--duration",
        "1.5",
        "--procs",
        "2",
        "--json",
        "-",
        "--quiet",
    )
    assert rc == 0, out + err
    rep = json.loads(out)
    assert rep["throughput"]["accepted"] == rep["throughput"]["delivered"] == 120
    assert len(rep["cpu"]["worker_load_pct"]) == 2
    assert rep["subscriptions"]["connected"] == 4


async def test_cli_sweep_writes_table_plot_and_json(fake_ntfy, tmp_path: Path) -> None:
    srv = await fake_ntfy()
    png, out_json = tmp_path / "sweep.png", tmp_path / "sweep.json"
    rc, out, err = await _cli(
        "sweep",
        "--url",
        srv.http_url,
        "--transport",
        "json",
        "--topics",
        "2",
        "--rates",
        "20,40",
        "--duration",
        "0.6",
        "--pause",
        "0",
        "--plot",
        str(png),
        "--json",
        str(out_json),
        "--quiet",
    )
    assert rc == 0, out + err
    assert "knee: not reached" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rep = json.loads(out_json.read_text())
    assert [p["rate"] for p in rep["points"]] == [20.0, 40.0]
    assert rep["knee"] is None and rep["ok"] is True


async def test_cli_bad_arguments_exit_two() -> None:
    rc, _, err = await _cli("run", "--topics", "0", "--quiet")
    assert rc == 2
    assert "cannot run" in err


@pytest.mark.parametrize("transport", ["ws", "json"])
async def test_dropped_stream_resumes_with_since_and_loses_nothing(fake_ntfy, transport: str) -> None:
    srv = await fake_ntfy(fault="kick", fault_at=10)
    r = await run_scenario(scenario(srv, transport))
    assert srv.kicked == 1
    assert r.subscriptions.disconnects == 1 and r.subscriptions.reconnects == 1
    assert r.verdict == "clean", r.violations
    assert r.throughput.delivered == r.throughput.accepted == 150


async def test_dropped_stream_without_reconnects_shows_loss(fake_ntfy) -> None:
    srv = await fake_ntfy(fault="kick", fault_at=10)
    r = await run_scenario(scenario(srv, "ws", reconnects=0, drain_timeout=0.5))
    assert r.subscriptions.disconnects == 1 and r.subscriptions.reconnects == 0
    assert r.verdict == "violations"
    bad = [tv for tv in r.topics if not tv.clean]
    assert len(bad) == 1 and bad[0].violations.loss > 0 and bad[0].tail_loss_from
