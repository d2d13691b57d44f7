"""Counters and histograms one worker process shares between its publishers and subscribers.

Plain attributes, no locks: everything in a worker runs on one event loop.
"""

from __future__ import annotations

from hdrh.histogram import HdrHistogram

__all__ = ["LiveStats", "new_histogram", "record_us", "HIST_MAX_US"]

HIST_MAX_US = 3_600_000_000  # one hour; slower deliveries are clamped, not dropped


def new_histogram() -> HdrHistogram:
    return HdrHistogram(1, HIST_MAX_US, 3)


def record_us(hist: HdrHistogram, micros: int) -> None:
    hist.record_value(min(max(micros, 1), HIST_MAX_US))


class LiveStats:
    def __init__(self) -> None:
        self.offered = 0
        self.accepted = 0
        self.rejected = 0
        self.errors = 0
        self.delivered = 0
        self.latency = new_histogram()
        """send -> receive, microseconds, first receipt of each seq per subscriber"""
        self.publish_latency = new_histogram()
        """POST round trip, microseconds"""
