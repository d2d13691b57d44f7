"""bench/kneegen (the Go load generator of the bench's scaling phase) against the real all-in-one: it
subscribes, publishes on schedule and checks every delivery; and the knee rule read from its report."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
try:
    from phases import scaling
    from schema import QUICK
finally:
    sys.path.remove(str(BENCH))


@pytest.fixture(scope="module")
def kneegen(tmp_path_factory) -> Path:
    if shutil.which("go") is None:
        pytest.skip("no Go toolchain on PATH to build bench/kneegen")
    binary = scaling.build_kneegen(tmp_path_factory.mktemp("kneegen"))
    assert binary is not None and binary.exists()
    return binary


def _run(binary: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=120)


def test_a_run_against_the_all_in_one_delivers_every_publish_once_in_order(kneegen, upf):
    url = f"http://127.0.0.1:{upf.port}"
    done = _run(kneegen, "-writer", url, "-pusher", url, "-topics", "20", "-rate", "200", "-duration", "2")
    assert done.returncode == 0, done.stderr
    r = json.loads(done.stdout)
    sent = r["offered_per_s"] * r["secs"]
    assert 340 <= sent <= 410, r  # 200/s for 2 s, less the schedule's last partial period
    assert r["accepted_per_s"] == r["offered_per_s"] == r["delivered_per_s"], r
    assert r["violations"] == {"lost": 0, "duplicate": 0, "reordered": 0, "corrupt": 0}
    assert r["undelivered"] == 0 and r["errors"] == {"timeout": 0, "connection": 0, "status": 0}
    assert 0 < r["p50_ms"] <= r["p99_ms"] < 1000
    assert scaling.knee_reasons(200, r) == []


def test_a_step_prices_each_role_over_the_publishing_window(kneegen, upf):
    """``run_step`` reads kneegen's "publishing" and "drained" lines and prices each role's CPU
    between them: the subscribers' connects are outside, the run's publishing inside."""

    class AllInOne:
        kind = "allinone"
        roles = {"upf": upf.proc}
        writer = pusher = f"http://127.0.0.1:{upf.port}"

    step = scaling.run_step(kneegen, AllInOne(), 200, 20, 2.0, "kgw")
    assert step.reasons == [] and step.violations == 0
    assert step.window_secs is not None and 1.9 <= step.window_secs <= 10, step
    assert set(step.role_cpu_secs) == {"upf"} and step.role_cpu_secs["upf"] > 0, step
    assert step.pusher_frames_per_cpu_sec is None  # the all-in-one has no pusher of its own to price


def test_a_topic_the_server_refuses_fails_the_run_at_subscribe(kneegen, upf):
    """A dot in a topic name is refused (ntfy's 40009): kneegen says so and exits 1 before it
    publishes anything, rather than measuring a run of refusals."""
    url = f"http://127.0.0.1:{upf.port}"
    done = _run(
        kneegen, "-writer", url, "-pusher", url, "-topics", "2", "-rate", "20", "-duration", "1", "-prefix", "a.b"
    )
    assert done.returncode == 1
    assert "subscribe failed" in done.stderr and "400" in done.stderr


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["-writer", "http://127.0.0.1:1", "-pusher", "http://127.0.0.1:1", "-rate", "0"],
        ["-writer", "not a url", "-pusher", "http://127.0.0.1:1"],
        ["-writer", "http://127.0.0.1:1", "-pusher", "http://127.0.0.1:1", "-topics", "0"],
    ],
)
def test_bad_arguments_exit_2_with_the_reason(kneegen, args):
    done = _run(kneegen, *args)
    assert done.returncode == 2
    assert "kneegen:" in done.stderr


def test_a_server_that_is_gone_fails_the_run(kneegen):
    done = _run(kneegen, "-writer", "http://127.0.0.1:1", "-pusher", "http://127.0.0.1:1", "-duration", "1")
    assert done.returncode == 1
    assert "subscribe failed" in done.stderr


def test_the_knee_rule_names_each_reason():
    held = {
        "offered_per_s": 4990.0,
        "delivered_per_s": 4990.0,
        "p99_ms": 20.0,
        "violations": {"lost": 0, "duplicate": 0, "reordered": 0, "corrupt": 0},
        "undelivered": 0,
    }
    assert scaling.knee_reasons(5000, held) == []
    slow = {**held, "offered_per_s": 4000.0, "delivered_per_s": 4000.0, "p99_ms": 300.0}
    reasons = scaling.knee_reasons(5000, slow)
    assert len(reasons) == 3
    assert reasons[0].startswith("offered 4000/s")
    assert reasons[1].startswith("delivered 4000/s < 95% of 5000/s")
    assert reasons[2] == "p99 300.0 ms > 250 ms"
    lost = {**held, "violations": {**held["violations"], "lost": 2}, "undelivered": 2}
    assert scaling.knee_reasons(5000, lost) == ["violations {'lost': 2}, undelivered 2"]


def test_a_run_that_cannot_finish_is_the_knee_not_the_end_of_the_bench(monkeypatch, tmp_path):
    """A kneegen run that exits without a report (its subscribers refused at a rate past the knee)
    fails that rate with the reason, and the sweep stops there, as at any failed rate; then it runs
    half and twice that knee on the same server, and a failed run there is said the same way."""

    class FakeShape:
        roles: dict[str, object] = {}
        stopped = False

        def __init__(self, kind, work):
            self.kind = kind

        def check_alive(self):
            pass

        def stop(self):
            FakeShape.stopped = True

    def run_step(binary, shape, rate, topics, secs, prefix):
        if rate > 1000:
            raise RuntimeError("kneegen at 2000/s exited 1: subscribe failed")
        return scaling.KneegenStep(
            rate=rate, offered_per_s=rate, accepted_per_s=rate, delivered_per_s=rate, p50_ms=5, p99_ms=9,
            violations=0, undelivered=0, errors=0, server_cpu_pct=10,
        )  # fmt: skip

    monkeypatch.setattr(scaling, "Shape", FakeShape)
    monkeypatch.setattr(scaling, "run_step", run_step)
    monkeypatch.setattr(scaling.time, "sleep", lambda s: None)
    cfg = msgspec.structs.replace(QUICK, scaling_rates=[1000, 2000, 3000])
    sw = scaling.sweep(Path("kneegen"), "allinone", cfg, tmp_path)
    assert (sw.knee, sw.last_good_rate, [s.rate for s in sw.steps]) == (2000, 1000, [1000, 2000])
    assert sw.steps[-1].reasons == ["kneegen failed: kneegen at 2000/s exited 1: subscribe failed"]
    assert sw.half_knee is not None and (sw.half_knee.rate, sw.half_knee.reasons) == (1000, [])
    assert sw.twice_knee is not None and sw.twice_knee.rate == 4000
    assert sw.twice_knee.reasons == ["kneegen failed: kneegen at 2000/s exited 1: subscribe failed"]
    assert FakeShape.stopped
