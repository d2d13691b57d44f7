"""The linter and the type checker, run on the whole tree with the root pyproject.toml's configuration.

ruff ([tool.ruff]: pyflakes, bugbear, pycodestyle errors, sorted imports, stale `noqa`) over every Python
file; mypy ([tool.mypy]: strict on the libraries, loadgen and the roles' pure cores, the rest non-strict)
over the sources it lists. Each `type: ignore` in the sources says what it ignores and why.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

# `# type: ignore[code]  # why`: the code (mypy's ignore-without-code checks it too) and a reason after it.
_IGNORE = re.compile(r"#\s*type:\s*ignore(?P<codes>\[[^\]]*\])?(?P<rest>.*)$")
_REASON = re.compile(r"^\s+#\s*\S")

# Files allowed an unexplained ignore for a while (a branch in flight); none now. A file listed here that has
# no unexplained ignore left fails the last test, so the list cannot go stale.
PENDING_REASONS: set[str] = set()


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)


def test_ruff_finds_nothing() -> None:
    done = _run(str(BIN / "ruff"), "check", "--no-cache", ".")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "All checks passed!" in done.stdout, done.stdout


def test_the_tree_is_formatted() -> None:
    """``ruff format`` (line length 120, as configured) leaves every file as it is."""
    done = _run(str(BIN / "ruff"), "format", "--check", "--no-cache", ".")
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_finds_nothing() -> None:
    done = _run(str(BIN / "mypy"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("Success: no issues found"), done.stdout


def test_mypy_is_strict_where_the_architecture_says() -> None:
    """The strict set is the libraries, loadgen and the roles' pure cores: a section that relaxed one of
    them would pass the run above silently."""
    mypy = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]
    assert mypy["strict"] is True
    assert {"libs/upf-keyspace/src", "libs/upf-edge/src", "loadgen/src"} <= set(mypy["files"])
    cores = {
        "upf_writer.ingest",
        "upf_writer.actions",
        "upf_writer.futuretime",
        "upf_pusher.session",
        "upf_pusher.framing",
        "upf_pusher.query",
    }
    for section in mypy["overrides"]:
        modules = set(section["module"])
        if section.get("disallow_untyped_defs") is False:
            assert not modules & cores, section
            assert not any(m.startswith(("upf_loadgen", "upf_edge")) for m in modules), section
            assert not any(m.startswith("upf_keyspace") for m in modules), section
        if modules & cores:
            assert section.get("disallow_untyped_defs") is True and section.get("warn_return_any") is True, section


def _unexplained_ignores(path: Path) -> list[str]:
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        m = _IGNORE.search(line)
        if m and (not m["codes"] or not _REASON.match(m["rest"])):
            out.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    return out


def test_every_type_ignore_gives_its_reason() -> None:
    sources = [
        p
        for pattern in ("libs/*/src/**/*.py", "loadgen/src/**/*.py", "services/*/src/**/*.py", "bench/**/*.py")
        for p in sorted(REPO.glob(pattern))
    ]
    assert len(sources) > 50
    unexplained = [
        u for p in sources if str(p.relative_to(REPO)) not in PENDING_REASONS for u in _unexplained_ignores(p)
    ]
    assert not unexplained, "\n".join(unexplained)
    still_pending = {f for f in PENDING_REASONS if _unexplained_ignores(REPO / f)}
    assert still_pending == PENDING_REASONS, (
        f"explained now, delete from PENDING_REASONS: {PENDING_REASONS - still_pending}"
    )
