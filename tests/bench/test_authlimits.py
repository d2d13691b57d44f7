"""bench's authlimits phase: its typed result, its table, the driver's Authorization option (and its
paced mode), and the check that the "on" server really applies auth and limits (two real all-in-one
servers)."""

from __future__ import annotations

import asyncio
import base64
import json
import sys
import time
from pathlib import Path

import msgspec
import pytest

from .test_results import _minimal  # the same minimal results.json

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
try:
    import harness
    import pubdrive
    import report
    import schema
    from phases import authlimits
finally:
    sys.path.remove(str(BENCH))


def _drive(ok_per_s: float, cpu_us: float | None, non_200: dict[int, int] | None = None) -> schema.Drive:
    return schema.Drive(
        url="http://127.0.0.1:1",
        connections=64,
        topics=1000,
        body_size=100,
        secs=3.0,
        ok=int(ok_per_s * 3),
        ok_per_s=ok_per_s,
        non_200=non_200 or {},
        errors=0,
        p50_ms=10.0,
        p99_ms=30.0,
        driver_cpu_pct=40.0,
        others_cpu_pct_of_machine=12.5,
        cpu_us_per_publish=cpu_us,
    )


def _pairs() -> list[schema.AuthLimitsPair]:
    return [
        schema.AuthLimitsPair(order=["off", "on"], off=_drive(3000, 200.0), on=_drive(2400, 250.0)),
        schema.AuthLimitsPair(order=["on", "off"], off=_drive(3200, 190.0), on=_drive(2000, 300.0, {429: 2})),
        schema.AuthLimitsPair(order=["off", "on"], off=_drive(2800, 210.0), on=_drive(2500, 240.0)),
    ]


def _summary(pairs):
    env = authlimits.on_env("$2b$10$abcdefghijklmnopqrstuv", "tk_secret")
    return authlimits.summarize_pairs(schema.QUICK, "basic", env, {"on anonymous": "403"}, pairs)


def test_medians_and_ratios_over_the_pairs_and_no_secret_kept():
    a = _summary(_pairs())
    assert (a.off_cpu_us_per_publish, a.on_cpu_us_per_publish) == (200.0, 250.0)
    assert (a.off_ok_per_s, a.on_ok_per_s) == (3000.0, 2400.0)
    assert a.ratio_cpu_on_over_off == 1.25 and a.ratio_ok_per_s_on_over_off == 0.8
    assert a.secs == schema.QUICK.al_secs and a.conns == 64 and a.topics == 1000
    raw = msgspec.json.encode(a).decode()
    assert "$2b$" not in raw and "tk_secret" not in raw
    assert a.on_env["UPF_LIMIT_EXEMPT"] == "" and a.on_env["UPF_AUTH_DEFAULT_ACCESS"] == "deny-all"


def test_no_priced_window_gives_no_figure_not_nan():
    pairs = [schema.AuthLimitsPair(order=["off", "on"], off=_drive(0, None), on=_drive(0, None))]
    a = _summary(pairs)
    assert a.off_cpu_us_per_publish is None and a.ratio_cpu_on_over_off is None
    assert a.ratio_ok_per_s_on_over_off is None  # 0 publishes/s off: no ratio, not a division by zero
    assert "| on / off | - | - | - |" in "\n".join(report.render_authlimits(a))


def test_the_table_shows_both_figures_the_ratio_and_the_spread():
    res = schema.decode(json.dumps(_minimal()))
    res.authlimits = _summary(_pairs())
    res = schema.decode(schema.encode(res))  # through results.json
    res.summary = report.summarize(res)
    assert res.summary["authlimits"]["ratio_cpu_on_over_off"] == 1.25 and res.summary["authlimits"]["pairs"] == 3
    md = report.render(res)
    assert "## Auth and limits on vs off: all-in-one, publish-only, 3 alternating pairs of 3 s windows" in md
    assert "| off (defaults: loopback exempt, auth open) | 200.0 | 190.0-210.0 | 3,000 | 2,800-3,200 | 0 |" in md
    assert (
        "| on (limits on loopback, basic auth, deny-all + ACL) | 250.0 | 240.0-300.0 | 2,400 | 2,000-2,500 | 2 |" in md
    )
    assert "| on / off | 1.250 | - | 0.800 | - | - | - |" in md
    assert "on/off: 190.0 vs 300.0 us (1.58x)" in md


def test_an_authlimits_result_missing_a_field_is_refused_with_its_path():
    raw = _minimal()
    raw["authlimits"] = {"secs": 3.0}
    with pytest.raises(msgspec.ValidationError, match=r"\$\.authlimits"):
        schema.decode(json.dumps(raw))


def test_pubdrive_sends_the_authorization_header_only_when_asked():
    with_auth = pubdrive.build_requests("h:1", "", ["t1"], 10, "Bearer tk_x")[0]
    without = pubdrive.build_requests("h:1", "", ["t1"], 10)[0]
    assert b"\r\nAuthorization: Bearer tk_x\r\n" in with_auth and b"Authorization" not in without
    assert with_auth.endswith(b"\r\n\r\n" + without.split(b"\r\n\r\n", 1)[1])  # same body
    with pytest.raises(SystemExit):
        pubdrive.main(["--url", "http://127.0.0.1:1", "--authorization", "Basic x\r\nX-Evil: 1"])


def test_the_on_server_applies_auth_and_limits_and_the_off_server_does_not(tmp_path):
    """Two real all-in-one servers, configured as the phase configures them."""
    from upf_edge.access import hash_password

    env = authlimits.on_env(hash_password("pw-for-the-bench"))
    good = "Basic " + base64.b64encode(f"{authlimits.USER}:pw-for-the-bench".encode()).decode()
    wrong = "Basic " + base64.b64encode(f"{authlimits.USER}:wrong".encode()).decode()
    off = on = None
    try:
        off = harness.Shape("allinone", tmp_path)
        on = harness.Shape("allinone", tmp_path, **env)
        checks = authlimits.check(off.writer, on.writer, good)
        assert checks["on with credentials"] == "200 with RateLimit headers"
        assert checks["on anonymous"].startswith("403") and checks["off anonymous"] == "200"
        with pytest.raises(RuntimeError, match="do not behave as configured"):
            authlimits.check(off.writer, on.writer, wrong)  # 401 instead of 200
        with pytest.raises(RuntimeError, match="do not behave as configured"):
            authlimits.check(on.writer, on.writer, good)  # "off" that is not open
    finally:
        for s in (off, on):
            if s is not None:
                s.stop()


async def _answering_server() -> tuple[asyncio.AbstractServer, int, list[int]]:
    """A keep-alive HTTP/1.1 server answering every request at once; counts requests per connection."""
    counts: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        counts.append(0)
        i = len(counts) - 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                counts[i] += 1
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], counts


def test_pubdrive_paced_never_sends_ahead_of_its_rate_and_closed_loop_keeps_every_connection_busy():
    async def run() -> None:
        server, port, counts = await _answering_server()
        try:
            t0 = time.perf_counter()
            paced = await pubdrive.drive(
                f"http://127.0.0.1:{port}", topics=["t"], connections=8, duration=0.5, warmup=0.2, rate=100
            )
            elapsed = time.perf_counter() - t0
            sent = sum(counts)
            counts.clear()
            closed = await pubdrive.drive(
                f"http://127.0.0.1:{port}", topics=["t"], connections=8, duration=0.5, warmup=0.2
            )
        finally:
            server.close()
        # Paced: however slow the machine, nothing is sent before it is due (100/s since the start).
        assert 0 < sent <= 100 * elapsed + 1 and paced["rate"] == 100 and paced["errors"] == 0
        # Closed loop: every connection always has a request out, so each of them was used.
        assert len(counts) == 8 and min(counts) > 0 and closed["rate"] == 0.0 and closed["errors"] == 0

    asyncio.run(run())
