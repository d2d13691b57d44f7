"""The releaser's pure part: when to look for due scheduled messages next."""

from __future__ import annotations

import pytest

from upf_pusher.release import next_sleep


def test_sleeps_until_the_earliest_due_time_but_polls_at_least_every_poll_secs():
    assert next_sleep(100.0, None, 1.0) == 1.0  # nothing scheduled
    assert next_sleep(100.0, 100, 1.0) == 0.01  # due now: never a busy loop
    assert next_sleep(100.2, 101, 1.0) == pytest.approx(0.8)
    assert next_sleep(100.0, 500, 1.0) == 1.0  # far off: something sooner may be scheduled meanwhile
