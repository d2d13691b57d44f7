"""bench/: results.json read and written through the Structs, and summary.md rendered from them.

Every committed results.json must still load and render to its committed summary.md: the bench's
history stays readable when the code that wrote it changes."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import msgspec
import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
try:
    import harness
    import report
    import schema
    from phases.idle import parse_idle_memory
finally:
    sys.path.remove(str(BENCH))

COMMITTED = sorted(p for p in (BENCH / "results").rglob("results.json"))


def _nan_to_none(x):
    """The old writer (json) wrote NaN; msgspec writes null: the same missing median."""
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _nan_to_none(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_nan_to_none(v) for v in x]
    return x


def test_the_committed_results_are_found():
    assert len(COMMITTED) >= 4, COMMITTED


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: str(p.parent.relative_to(BENCH)))
def test_committed_results_load_and_give_the_stored_summary(path):
    res = schema.load(path)
    stored = json.loads(path.read_text())["summary"]
    assert _nan_to_none(json.loads(msgspec.json.encode(report.summarize(res)))) == _nan_to_none(stored)


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: str(p.parent.relative_to(BENCH)))
def test_committed_results_render_to_the_committed_summary(path):
    """Identical, except the fastpath summaries' plot paths: those runs wrote their PNGs under /tmp, and
    the paths in the committed summary.md were edited by hand afterwards (results.json still has /tmp)."""
    res = schema.load(path)
    res.summary = report.summarize(res)
    got = report.render(res).splitlines()
    want = (path.parent / "summary.md").read_text().splitlines()
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        if g != w:
            assert "Plot: `/tmp/" in g and g.split("Plot: `")[0] == w.split("Plot: `")[0], (g, w)


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: str(p.parent.relative_to(BENCH)))
def test_results_round_trip_through_the_encoder(path):
    res = schema.load(path)
    again = schema.decode(schema.encode(res))
    assert again == res
    assert report.render(msgspec.structs.replace(again, summary=report.summarize(again))) == report.render(
        msgspec.structs.replace(res, summary=report.summarize(res))
    )


def _minimal() -> dict:
    return {
        "mode": "quick",
        "config": {},
        "goals": schema.GOALS,
        "started_at": "2026-12-01 00:00:00 UTC",
        "machine": {
            "nproc": 2,
            "cpu_model": "x",
            "python": "3.11",
            "granian": "2",
            "websockets": "15",
            "kernel": "6",
            "mem_total_mb": 1000,
            "nofile": [1024, 4096],
            "uvloop": True,
            "loadavg_start": "0 0 0",
        },
        "noise": {
            "wall_secs": 3.0,
            "machine_busy_cpu_secs": 1.0,
            "bench_cpu_secs": 0.5,
            "others_cpu_pct_of_machine": 0.1,
            "loadavg_end": "0 0 0",
        },
    }


def test_a_probe_only_run_renders_an_empty_goal_table():
    res = schema.decode(json.dumps(_minimal()))
    res.summary = report.summarize(res)
    md = report.render(res)
    assert res.summary == {"goals": {}}
    assert md.startswith("# UPF bench results (quick, 2026-12-01 00:00:00 UTC)")
    assert md.endswith("| goal | target | measured | met |\n|---|---|---|---|\n")


@pytest.mark.parametrize(
    "bad, where",
    [
        ({"machine": {"nproc": "two"}}, "$.machine"),
        ({"rounds": [{"loadavg": 1.5}]}, "$.rounds[0].loadavg"),
        ({"topics": {"small_topics": 1000}}, "$.topics"),
        ({"sweeps": {"split": [{"shape": "split"}]}}, "$.sweeps[...][0]"),
        ({"noise": None}, "$.noise"),
    ],
)
def test_a_mistyped_or_incomplete_results_json_is_refused_with_its_path(bad, where):
    raw = _minimal()
    for k, v in bad.items():
        raw[k] = {**raw[k], **v} if isinstance(v, dict) and isinstance(raw.get(k), dict) else v
    with pytest.raises(msgspec.ValidationError) as info:
        schema.decode(json.dumps(raw))
    assert where in str(info.value)


def test_results_json_that_is_not_json_is_refused():
    with pytest.raises(msgspec.DecodeError):
        schema.decode(b'{"mode": ')


def _loadgen_report(rate=1000.0, accepted=4000, delivered=3990):
    """The parts of ``upf-loadgen run --json -`` the bench reads."""
    return {
        "scenario": {"rate": rate},
        "verdict": "clean",
        "throughput": {
            "offered": 4000,
            "accepted": accepted,
            "delivered": delivered,
            "expected_deliveries": 4000,
            "offered_per_s": 1000.0,
            "accepted_per_s": 1000.0,
            "delivered_per_s": 997.5,
            "rejected": 0,
            "errors": 0,
        },
        "latency": {"p50_ms": 2.0, "p99_ms": 9.5, "max_ms": 20.0},
        "publish_latency": {"p99_ms": 3.0},
        "drain": {"secs": 0.2, "complete": True},
        "violations": {"loss": 0, "dup": 1, "reorder": 0},
        "subscriptions": {"disconnects": 0},
        "cpu": {"pct_of_wall": 40.0, "saturated": False},
    }


def test_summarize_run_and_prices():
    s = harness.summarize_run(_loadgen_report(), schema.RunSummary)
    assert isinstance(s, schema.RunSummary) and s.violations_total == 1 and s.expected == 4000
    live = [
        {
            "kind": "live",
            "phase": "load",
            "lt": t,
            "accepted": 1000,
            "delivered": 1000,
            "cpu": {"writer": 0.1 * t, "pusher": 0.05 * t},
        }
        for t in (1.0, 2.0, 3.0)
    ]
    harness.price_run(s, live, {"writer": 0.8, "pusher": 0.4})
    assert s.whole.writer_cpu_us_per_publish == 200.0  # 0.8 s over 4,000 accepted
    assert s.whole.pusher_cpu_us_per_delivery == round(1e6 * 0.4 / 3990, 1)
    assert s.steady.secs == 2.0 and s.steady.accepted == 2000
    assert s.steady.writer_cpu_us_per_publish == 100.0  # 0.2 s over 2,000
    assert s.steady.pusher_frames_per_cpu_sec == 20000.0
    assert s.steady.allinone_frames_per_cpu_sec is None  # no all-in-one role in this shape


def test_a_run_with_no_priced_window_renders_dashes():
    s = harness.summarize_run(_loadgen_report(accepted=0, delivered=0), schema.RunSummary)
    harness.price_run(s, [], {"upf": 0.0})
    assert s.steady == schema.Price() and s.whole.cpu_us_per_publish_total is None
    sweep = schema.Sweep(
        shape="allinone", rates=[1000], plot="", idle_rss_kb={}, end_rss_kb={}, peak_rss_kb={}, steps=[s]
    )
    res = schema.decode(json.dumps(_minimal()))
    res.sweeps = {"allinone": [sweep]}
    res.summary = report.summarize(res)
    assert res.summary["correctness"] == {
        "runs": 1,
        "violations": 1,
        "undelivered": 4000,
        "rejected_or_failed": 0,
        "unclean": [],
    }
    assert "| 1,000 | 1,000 | 998 | 2.0 | 9.5 | - | - | - | 1 | 0.0 |" in report.render(res)
    assert "Knee: not reached. Plot: ``." in report.render(res)
    assert report.knee_of([sweep]) == 1000.0  # no knee: the top rate, a lower bound


def test_scaling_names_a_knee_one_sweep_found_and_bounds_the_other():
    """The lower of two sweeps is a real knee when a sweep found it at that rate, even if the other
    sweep held up to its top rate; a shape whose sweeps all held up gives a lower bound, so the
    ratio is one too."""

    def sweep(shape: str, knee: schema.Knee | None) -> schema.Sweep:
        return schema.Sweep(
            shape=shape, rates=[5000, 6000], knee=knee, plot="", idle_rss_kb={}, end_rss_kb={}, peak_rss_kb={}, steps=[]
        )

    res = schema.decode(json.dumps(_minimal()))
    res.sweeps = {
        "allinone": [sweep("allinone", None), sweep("allinone", schema.Knee(rate=6000, last_good_rate=5000))],
        "allinone_w2": [sweep("allinone_w2", None), sweep("allinone_w2", None)],
    }
    res.summary = report.summarize(res)
    sc = res.summary["scaling"]
    assert (sc["knee_reached_1"], sc["knee_reached_2"], sc["ratio"]) == (True, False, 1.0)
    text = report.render(res)
    assert "6000/s with 1 worker, 6000/s with 2 (not reached: a lower bound); ratio >= 1.0" in text
    res.sweeps["allinone"] = [sweep("allinone", None)]
    res.summary = report.summarize(res)
    assert "(not reached: a lower bound); ratio 1.0 (not resolved" in report.render(res)


def test_half_and_twice_the_kneegen_knee_give_the_p99_goal_and_count_as_runs():
    """Each kneegen sweep's runs at half and twice its knee: the p99 goal is judged at every shape's
    half, a violation at twice counts in the correctness line, and the table names both."""

    def step(rate: int, p99: float, violations: int = 0, reasons: list[str] | None = None) -> schema.KneegenStep:
        return schema.KneegenStep(
            rate=rate, offered_per_s=rate, accepted_per_s=rate, delivered_per_s=rate, p50_ms=5.0, p99_ms=p99,
            violations=violations, undelivered=0, errors=0, server_cpu_pct=50.0, reasons=reasons or [],
        )  # fmt: skip

    res = schema.decode(json.dumps(_minimal()))
    res.scaling = schema.Scaling(
        sweeps={
            "allinone_w2": schema.ScalingSweep(
                shape="allinone_w2", knee=8000, last_good_rate=6000,
                steps=[step(6000, 40.0), step(8000, 300.0, reasons=["p99 300.0 ms > 250 ms"])],
                half_knee=step(4000, 20.5), twice_knee=step(16000, 400.0, violations=2, reasons=["x"]),
            ),
            "split": schema.ScalingSweep(
                shape="split", knee=None, last_good_rate=6000, steps=[step(6000, 30.0)],
                half_knee=step(3000, 61.0), twice_knee=step(12000, 200.0),
            ),
        },
        p99_bound_ms=250.0,
        tolerance=0.05,
    )  # fmt: skip
    res.summary = report.summarize(res)
    goal = res.summary["goals"]["p99_half_knee_kneegen"]
    assert goal == {"met": False, "value": "allinone_w2 20.5 ms at 4,000/s, split 61.0 ms at 3,000/s"}
    assert (res.summary["correctness"]["runs"], res.summary["correctness"]["violations"]) == (7, 2)
    text = report.render(res)
    assert "split (writer and pusher apart): held every rate up to 6000/s (a lower bound)." in text
    assert "| allinone_w2 | 8,000 | 4,000 | 4,000 | 5.0 | 20.5 | 0 | 16,000 | 16,000 | 16,000 | 400.0 | 2 | 0 |" in text
    assert "| split | 6,000 | 3,000 | 3,000 | 5.0 | 61.0 | 0 | 12,000 | 12,000 | 12,000 | 200.0 | 0 | 0 |" in text


def test_med_and_spread_skip_missing_figures():
    assert report.med([3.0, None, 1.0, 2.0]) == 2.0
    assert math.isnan(report.med([None]))
    assert report.spread([None, 2.25, 1.04]) == [1.0, 2.2]
    assert report.spread([]) == []


def test_idle_memory_table_is_parsed():
    out = parse_idle_memory("kind   before   after   per conn\nws   40.1 MB   89.9 MB   5.10 KB\nnoise\n")
    assert out == {"ws": schema.IdleKind(rss_before_mb=40.1, rss_after_mb=89.9, kb_per_conn=5.1)}


def test_quick_is_full_made_shorter():
    full, quick = msgspec.structs.asdict(schema.FULL), msgspec.structs.asdict(schema.QUICK)
    changed = {k for k in full if full[k] != quick[k]}
    assert changed and changed <= {
        "rounds",
        "ingest_secs",
        "bcast_secs",
        "lg_topics",
        "sweep_rates",
        "sweep_secs",
        "sweep_rounds",
        "fixed_secs",
        "topics_large",
        "topics_secs",
        "topics_rounds",
        "idle_kinds",
        "idle_rounds",
        "idle_max_n",
        "idle_cpu_secs",
        "idle_cpu_n",
        "pd_secs",
        "pp_channels",
        "pp_streams",
        "pp_rate",
        "al_secs",
        "scaling_rates",
        "stall_secs",
    }
    assert quick["rounds"] == 1 and max(quick["sweep_rates"]) == 4000


def test_a_loadgen_report_of_the_wrong_shape_fails_at_the_producer():
    bad = _loadgen_report()
    bad["latency"]["p99_ms"] = "9.5 ms"
    with pytest.raises(msgspec.ValidationError, match="p99_ms"):
        harness.summarize_run(bad, schema.RunSummary)
    with pytest.raises(msgspec.ValidationError, match="subs_per_topic"):
        harness.summarize_run(_loadgen_report(), schema.FanoutRun, topics=10)  # the fan-out's own field missing
    fan = harness.summarize_run(_loadgen_report(rate=100), schema.FanoutRun, subs_per_topic=100, topics=10)
    assert fan.rate == 100.0 and isinstance(fan.rate, float) and fan.subs_per_topic == 100


def _pushpin(cpu_us: float) -> schema.Pushpin:
    return schema.Pushpin(
        channels=10, streams=1000, rate=100.0, expected=20000, delivered=20000, item_bytes=64,
        cpu_us_per_item=cpu_us, items_per_cpu_sec=1e6 / cpu_us, cpu_secs_by_thread={"pushpin-proxy": 0.25},
    )  # fmt: skip


def test_a_round_pushpin_failed_in_is_named_and_the_others_give_its_figure():
    res = schema.decode(json.dumps(_minimal()))
    failed = schema.Pushpin(skipped="Pushpin failed twice in a round (the driver failed (streams 0-9 not answered))")
    res.rounds = [schema.Round(loadavg="0 0 0", pushpin=p) for p in (failed, _pushpin(20.0), _pushpin(30.0))]
    res.summary = report.summarize(res)
    pp = res.summary["pushpin"]
    assert (pp["cpu_us_per_item"], pp["first_round"], pp["failed_rounds"]) == (25.0, 2, [failed.skipped])
    text = report.render(res)
    assert f"Pushpin did not run in 1 round(s): {failed.skipped}." in text
    assert "Its CPU by process and thread (round 2, CPU s): pushpin-proxy 0.25." in text
    res.rounds = [schema.Round(loadavg="0 0 0", pushpin=failed)] * 3
    res.summary = report.summarize(res)
    assert res.summary["pushpin"] == {"skipped": failed.skipped}
    assert f"Skipped: {failed.skipped}." in report.render(res)


def test_pushpin_is_tried_twice_a_round_then_its_failure_is_recorded(monkeypatch, tmp_path):
    """A Pushpin that does not answer its streams fails the attempt, not the 27-minute run."""
    sys.path.insert(0, str(BENCH))
    try:
        import pushpin_peer
        from phases import rounds
    finally:
        sys.path.remove(str(BENCH))
    outcomes: list[object] = []

    def run(*_args: object) -> dict[str, object]:
        outcome = outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome  # type: ignore[return-value]

    monkeypatch.setattr(pushpin_peer, "run", run)
    ok = {"channels": 10, "streams": 1000, "delivered": 20000, "expected": 20000, "cpu_us_per_item": 21.5}
    outcomes[:] = [pushpin_peer.PeerError("the driver failed (streams 0-9 not answered)", "its log"), ok]
    got = rounds.phase_pushpin(schema.FULL, 64, tmp_path)
    assert (got.skipped, got.cpu_us_per_item, outcomes) == (None, 21.5, [])
    outcomes[:] = [TimeoutError("pushpin not listening"), pushpin_peer.PeerError("pushpin exited at start", "log")]
    got = rounds.phase_pushpin(schema.FULL, 64, tmp_path)
    assert got.skipped == "Pushpin failed twice in a round (pushpin exited at start)"
    assert (
        pushpin_peer.failure_reason(TimeoutError("pushpin not listening\nmore"))
        == "TimeoutError: pushpin not listening"
    )


def test_the_disk_probe_times_flushes_and_the_summary_names_them(tmp_path):
    """bench/run.py times the disk's flushes at its start and end; a run that did shows them under its
    noise line, and a run from before (every committed one so far) renders as it did."""
    st = harness.disk_stalls(tmp_path, 0.2, "start", every=0.005)
    assert st.flushes >= 5
    assert 0 < st.median_ms <= st.p99_ms <= st.p999_ms <= st.max_ms
    assert 0 <= st.over_100 <= st.over_50 <= st.flushes
    assert list(tmp_path.iterdir()) == []  # its file is gone
    res = schema.load(COMMITTED[-1])
    before = report.render(res)
    assert "Disk:" not in before
    res.noise.disk_stalls = [st, msgspec.structs.replace(st, when="end")]
    lines = report.render(res).splitlines()
    disk = [line for line in lines if line.startswith("Disk:")]
    assert len(disk) == 1 and f"start: median {st.median_ms} ms" in disk[0] and "end: median" in disk[0]
    assert len(lines) == len(before.splitlines()) + 1
    again = schema.decode(schema.encode(res))  # results.json keeps it
    assert again.noise.disk_stalls[0] == st
