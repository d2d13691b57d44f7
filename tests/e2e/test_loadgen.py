"""upf-loadgen against a real all-in-one UPF process: a short, small load run per transport whose JSON
verdict must be clean, with every accepted message delivered once, in order, with no gap.

The numbers are small on purpose (20 topics, ~100 publishes/s, a few seconds): this is a correctness
check of the whole path under concurrent load, not a benchmark (that is bench/run.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import TIMEOUT_FACTOR

TOPICS = 20
RATE = 100

CASES = [
    pytest.param("ws", 3.0, [], id="ws"),
    pytest.param("json", 2.0, [], id="json"),
    pytest.param("sse", 2.0, ["--binary"], id="sse-binary"),
]


def run_loadgen(base: str, transport: str, duration: float, extra: list[str]) -> tuple[int, dict, str]:
    argv = [
        sys.executable,
        "-m",
        "upf_loadgen",
        "run",
        "--url",
        base,
        "--transport",
        transport,
        "--topics",
        str(TOPICS),
        "--rate",
        str(RATE),
        "--duration",
        str(duration),
        "--message-size",
        "64",
        "--drain-timeout",
        "10",
        "--connect-timeout",
        "10",
        "--strict",  # a rejected publish, a disconnect or an unfinished drain also fails the verdict
        "--quiet",
        "--json",
        "-",
        *extra,
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=(duration + 40) * TIMEOUT_FACTOR)
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"loadgen printed no JSON report (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.returncode, report, proc.stderr


@pytest.mark.parametrize(("transport", "duration", "extra"), CASES)
def test_loadgen_run_is_clean(upf, transport, duration, extra):
    code, r, text = run_loadgen(upf.base, transport, duration, extra)
    context = f"{text[-3000:]}\nserver log:\n{upf.log()}"

    assert (code, r["verdict"], r["ok"]) == (0, "clean", True), context
    assert r["violations"] == {
        "loss": 0,
        "duplicates": 0,
        "out_of_order": 0,
        "gaps": 0,
        "id_mismatch": 0,
        "corrupt": 0,
        "unexpected": 0,
    }, context

    subs = r["subscriptions"]
    assert (subs["wanted"], subs["connected"], subs["failed"], subs["disconnects"]) == (TOPICS, TOPICS, 0, 0), context
    assert subs["bad_frame_samples"] == [], context

    th = r["throughput"]
    scheduled = int(RATE * duration)
    assert th["offered"] >= 0.9 * scheduled, context  # the server kept up with the schedule
    assert (th["rejected"], th["errors"]) == (0, 0), context
    assert th["accepted"] == th["offered"], context
    # every accepted message delivered, exactly once per subscriber
    assert th["expected_deliveries"] == th["accepted"], context
    assert th["delivered"] == th["expected_deliveries"], context
    assert r["drain"]["complete"] and r["drain"]["backlog_left"] == 0, context
    assert r["publish_failures"]["bad_replies"] == 0, context

    assert r["topics_total"] == r["topics_clean"] == TOPICS, context
    for topic in r["topics"]:
        assert topic["clean"], topic
