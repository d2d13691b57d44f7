"""Report figures on known data and the sweep's knee rule on synthetic points."""

from __future__ import annotations

import pytest

from upf_loadgen.metrics import new_histogram, record_us
from upf_loadgen.report import SweepPoint, SweepReport, find_knee, format_sweep, latency_summary


def test_percentiles_of_known_uniform_data() -> None:
    h = new_histogram()
    for ms in range(1, 1001):  # 1..1000 ms, once each
        record_us(h, ms * 1000)
    s = latency_summary(h)
    assert s.count == 1000
    # hdrhistogram keeps 3 significant digits, so allow 0.1 %
    assert s.p50_ms == pytest.approx(500, rel=1e-3)
    assert s.p90_ms == pytest.approx(900, rel=1e-3)
    assert s.p95_ms == pytest.approx(950, rel=1e-3)
    assert s.p99_ms == pytest.approx(990, rel=1e-3)
    assert s.max_ms == pytest.approx(1000, rel=1e-3)
    assert s.min_ms == pytest.approx(1, rel=1e-3)
    assert s.mean_ms == pytest.approx(500.5, rel=1e-3)
    assert sum(b.count for b in s.buckets) == 1000


def test_buckets_on_known_data() -> None:
    h = new_histogram()
    for _ in range(10):
        record_us(h, 300)  # 0.3 ms
    for _ in range(5):
        record_us(h, 7_000)  # 7 ms
    record_us(h, 90_000_000)  # 90 s, beyond the last bound
    s = latency_summary(h)
    by_bound = {b.le_ms: b.count for b in s.buckets}
    assert by_bound[0.5] == 10
    assert by_bound[10] == 5
    assert by_bound[None] == 1
    assert s.p50_ms == pytest.approx(0.3, rel=1e-2)


def test_empty_histogram_summary_is_zero() -> None:
    s = latency_summary(new_histogram())
    assert s.count == 0 and s.p99_ms == 0 and s.buckets == []


def point(rate: float, delivered: float | None = None, p99: float = 5.0, offered: float | None = None) -> SweepPoint:
    return SweepPoint(
        rate=rate,
        offered_per_s=rate if offered is None else offered,
        accepted_per_s=rate,
        delivered_per_s=rate if delivered is None else delivered,
        p50_ms=1.0,
        p90_ms=2.0,
        p95_ms=3.0,
        p99_ms=p99,
        max_ms=p99 * 2,
        drain_secs=0.0,
        violations=0,
    )


def test_no_knee_when_every_point_holds() -> None:
    assert find_knee([point(500), point(1000), point(2000, delivered=1950)]) is None


def test_knee_when_delivery_falls_more_than_five_percent_behind() -> None:
    pts = [point(500), point(1000), point(2000, delivered=1850), point(4000, delivered=2100)]
    knee = find_knee(pts)
    assert knee is not None
    assert knee.rate == 2000 and knee.last_good_rate == 1000
    assert len(knee.reasons) == 1 and "delivered" in knee.reasons[0]


def test_knee_when_p99_passes_the_bound() -> None:
    pts = [point(4000, p99=400), point(1000, p99=20), point(2000, p99=120)]  # unsorted on purpose
    knee = find_knee(pts, p99_bound_ms=250)
    assert knee is not None
    assert knee.rate == 4000 and knee.last_good_rate == 2000
    assert knee.reasons == ["p99 400.0 ms > 250 ms"]


def test_knee_at_first_point_has_no_last_good_rate() -> None:
    knee = find_knee([point(500, p99=300), point(1000)], p99_bound_ms=250)
    assert knee is not None and knee.rate == 500 and knee.last_good_rate is None


def test_exactly_five_percent_behind_is_not_yet_the_knee() -> None:
    assert find_knee([point(1000, delivered=950)]) is None


def test_loadgen_unable_to_offer_is_named_in_the_reason() -> None:
    knee = find_knee([point(1000), point(8000, offered=5000, delivered=5000)])
    assert knee is not None and knee.rate == 8000
    assert any("loadgen offered only" in r for r in knee.reasons)


def test_sweep_table_mentions_the_knee() -> None:
    pts = [point(500), point(1000, p99=300)]
    rep = SweepReport(ok=True, exit_code=0, tolerance=0.05, p99_bound_ms=250, points=pts, knee=find_knee(pts))
    text = format_sweep(rep)
    assert "knee: at 1000/s (last good 500/s)" in text
