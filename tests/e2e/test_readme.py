"""The README's curl smoke test, run as written (only the port differs: tests use a free one)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def smoke_block() -> str:
    text = README.read_text()
    m = re.search(r"Smoke test with curl.*?```sh\n(.*?)```", text, re.S)
    assert m, "the README lost its curl smoke test"
    return m.group(1)


def test_readme_quickstart_has_exactly_two_commands():
    text = README.read_text()
    m = re.search(r"## Quickstart.*?```sh\n(.*?)```", text, re.S)
    assert m
    commands = [line for line in m.group(1).splitlines() if line.strip() and not line.startswith("#")]
    assert [c.split("#")[0].strip() for c in commands] == ["./dev up", "./dev test"]
    ci = (README.parent / ".ci" / "run").read_text()
    assert "./dev test" in ci


def test_readme_curl_smoke_test(upf):
    script = "set -e\n" + smoke_block().replace("localhost:8080", f"127.0.0.1:{upf.port}") + "wait\n"
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
    assert out.returncode in (0, 143), out.stderr  # the backgrounded stream ends by `kill %1`
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    events = [re.search(r'"event":"(\w+)"', line).group(1) for line in lines]
    messages = re.findall(r'"message":"([^"]*)"', out.stdout)
    assert "open" in events
    # published twice (2 replies), streamed live (2), replayed by the poll (2)
    assert messages.count("hi there") == 3 and messages.count("while offline") == 3, out.stdout
