"""The open-files limit helper raises the soft limit to the hard one and logs what is in force."""

from __future__ import annotations

import logging
import resource

import pytest

from upf_edge.limits_os import raise_open_files_limit


@pytest.fixture
def lowered_soft_limit():
    """This process's soft limit lowered (as a default 1024 would be), restored after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 256), hard))
    yield hard
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_soft_limit_is_raised_to_the_hard_limit(lowered_soft_limit, caplog) -> None:
    hard = lowered_soft_limit
    if hard == resource.RLIM_INFINITY:
        pytest.skip("the hard limit is unlimited here: the soft limit is left as it is")
    with caplog.at_level(logging.INFO, logger="upf.edge.limits"):
        assert raise_open_files_limit() == (hard, hard)
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)
    [record] = [r for r in caplog.records if r.name == "upf.edge.limits"]
    assert record.getMessage() == "open files limit" and (record.soft, record.hard) == (hard, hard)
