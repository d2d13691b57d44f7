"""A role started with a bad setting stops at once with a message naming the variable (exit 2)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["upf", "upf_writer", "upf_pusher", "upf_janitor"])
def test_bad_setting_stops_the_role_with_a_clear_message(module, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("UPF_")}
    env.update(UPF_SHARD_COUNT="zero", UPF_STORE_PATH=str(tmp_path / "upf.db"))
    out = subprocess.run([sys.executable, "-m", module], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "UPF_SHARD_COUNT must be an integer" in out.stderr


@pytest.mark.parametrize("value", ["0", "two"])
def test_bad_worker_count_stops_upf_naming_it(value, tmp_path):
    """UPF_WORKERS is checked before any worker starts: exit 2, the variable named."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("UPF_")}
    env.update(UPF_WORKERS=value, UPF_STORE_PATH=str(tmp_path / "upf.db"))
    out = subprocess.run([sys.executable, "-m", "upf"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "UPF_WORKERS must be" in out.stderr
