"""A role started with a bad setting stops at once with a message naming the variable (exit 2)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import urllib.request

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


@pytest.mark.parametrize(
    ("argv", "extra"),
    [
        (["-m", "upf"], {"UPF_WORKERS": "2"}),  # the supervisor stops at its workers' exit 2: no restart loop
        (["-m", "upf"], {"UPF_WORKERS": "1"}),
        (["-m", "upf"], {"UPF_ROLES": "writer"}),
        (["-m", "upf"], {"UPF_ROLES": "janitor"}),
        (["-m", "upf_writer"], {}),
        (["-m", "upf_pusher"], {}),
        (["-m", "upf_janitor"], {}),
        (["-m", "upf", "user", "list"], {}),
        (["-m", "upf", "backup", "out.upfb"], {}),
    ],
)
def test_a_store_path_that_cannot_be_opened_stops_every_entry_point_in_one_line(argv, extra, tmp_path):
    """A store path that is a directory (as a read-only disk or a foreign file) is a setting to fix:
    exit 2 with one line naming UPF_STORE_PATH and why, never a traceback, never a worker restarted."""
    store = tmp_path / "upf.db"
    store.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("UPF_")}
    env.update(UPF_STORE_PATH=str(store), UPF_BIND="127.0.0.1:0", **extra)
    out = subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert f"UPF_STORE_PATH {store} cannot be opened: Is a directory" in out.stderr
    assert "Traceback" not in out.stderr and "restarting" not in out.stderr


@pytest.mark.parametrize(
    ("module", "roles", "server"),
    [
        ("upf_janitor", None, None),
        ("upf", "janitor", None),
        ("upf_writer", None, None),
        ("upf", "writer", None),
        ("upf", "writer,janitor", None),
        ("upf_writer", None, "granian"),
        ("upf", "writer", "granian"),
    ],
)
def test_a_busy_port_stops_the_janitor_and_the_writer_in_one_line(module, roles, server, tmp_path):
    """As the pusher and the supervisor do: one line naming UPF_BIND, exit 1, not a traceback (granian's
    own is some 70 lines of Python and Rust)."""
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("UPF_")}
        env.update(UPF_STORE_PATH=str(tmp_path / "upf.db"), UPF_BIND=f"127.0.0.1:{port}")
        if roles is not None:
            env["UPF_ROLES"] = roles
        if server is not None:
            env["UPF_WRITER_SERVER"] = server
        out = subprocess.run([sys.executable, "-m", module], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out.stderr
    assert f"cannot bind UPF_BIND 127.0.0.1:{port}" in out.stderr and "Traceback" not in out.stderr


def test_port_0_is_named_as_the_port_bound(tmp_path):
    """``UPF_BIND=…:0`` (the kernel picks a port): one worker printed ``:0`` as its address. The start
    line names the port bound, and it answers there."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UPF_", "FDB_"))}
    env.update(UPF_BIND="127.0.0.1:0", UPF_WORKERS="1", UPF_STORE_PATH=str(tmp_path / "upf.db"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "upf"], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        found = re.search(r" on http://127\.0\.0\.1:(\d+) ", line)
        assert found and found.group(1) != "0", line
        with urllib.request.urlopen(f"http://127.0.0.1:{found.group(1)}/v1/health", timeout=10) as r:
            assert r.status == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
