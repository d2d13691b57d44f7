"""pants.toml and the BUILD files kept in step with the uv workspace they describe.

Pants cannot be installed on the project's machines, so what it would build is checked here by reading its
config: one package macro per BUILD file naming the pyproject's distribution, module, version and console
script; a source root per package; the same third-party requirements as the pyprojects. The dependency
rules themselves are enforced on the real imports by import-linter (tests/test_import_rules.py).
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]

EXPECTED_MACRO = {
    "libs/upf-keyspace": "upf_shared_library",
    "libs/upf-edge": "upf_shared_library",
    "services/writer": "upf_role",
    "services/pusher": "upf_role",
    "services/janitor": "upf_role",
    "services/upf": "upf_program",
    "loadgen": "upf_black_box_tool",
}


def workspace() -> dict[str, dict[str, Any]]:
    """member directory -> its [project] table"""
    root = tomllib.loads((REPO / "pyproject.toml").read_text())
    members = root["tool"]["uv"]["workspace"]["members"]
    return {m: tomllib.loads((REPO / m / "pyproject.toml").read_text())["project"] for m in members}


def macro_call(member: str) -> tuple[str, dict[str, Any]]:
    """The package BUILD file's one statement: a call of a prelude macro with literal arguments."""
    tree = ast.parse((REPO / member / "BUILD").read_text())
    (statement,) = tree.body
    assert isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call)
    call = statement.value
    assert isinstance(call.func, ast.Name) and not call.args
    return call.func.id, {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg}


def test_every_package_macro_is_in_the_prelude() -> None:
    prelude = ast.parse((REPO / "build-support" / "visibility.py").read_text())
    defined = {node.name for node in prelude.body if isinstance(node, ast.FunctionDef)}
    assert set(EXPECTED_MACRO.values()) <= defined
    assert set(workspace()) == set(EXPECTED_MACRO)


@pytest.mark.parametrize("member", list(EXPECTED_MACRO))
def test_each_build_file_matches_its_pyproject(member: str) -> None:
    """The distribution, module, version and console script Pants would build are the ones uv builds."""
    project = workspace()[member]
    macro, kwargs = macro_call(member)
    assert macro == EXPECTED_MACRO[member]
    assert kwargs["dist"] == project["name"]
    assert kwargs["module"] == project["name"].replace("-", "_")
    assert (REPO / member / "src" / kwargs["module"] / "__init__.py").is_file()
    assert kwargs["version"] == project["version"]
    scripts = project.get("scripts", {})
    declared = {kwargs["console_script"]: kwargs["entry_point"]} if "console_script" in kwargs else {}
    assert declared == scripts


def test_pants_toml_roots_and_prelude() -> None:
    config = tomllib.loads((REPO / "pants.toml").read_text())
    assert {"pants.backend.python", "pants.backend.docker", "pants.backend.experimental.visibility"} <= set(
        config["GLOBAL"]["backend_packages"]
    )
    (prelude,) = config["GLOBAL"]["build_file_prelude_globs"]
    assert (REPO / prelude).is_file()
    roots = config["source"]["root_patterns"]
    for member in workspace():
        assert any(re.fullmatch(p.replace("*", "[^/]+"), f"/{member}/src") for p in roots), member
        if (REPO / member / "tests").is_dir():
            assert any(re.fullmatch(p.replace("*", "[^/]+"), f"/{member}/tests") for p in roots), member
    assert "/" in roots  # tests/ imports itself as `tests.<...>`
    assert config["python"]["interpreter_constraints"] == ["CPython>=3.11,<3.14"]
    assert tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"] == ">=3.11"


def parse_requirement(line: str) -> tuple[str, str]:
    found = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*(.*)", line)
    assert found, line
    return found[1].lower(), found[2].replace(" ", "")


def test_third_party_requirements_match_the_pyprojects() -> None:
    """3rdparty/python/requirements.txt is the union of the packages' third-party dependencies and the
    dev group, with the same specifiers (uv reads the pyprojects, Pants this file)."""
    members = {p["name"] for p in workspace().values()}
    root = tomllib.loads((REPO / "pyproject.toml").read_text())
    declared = [d for p in workspace().values() for d in p.get("dependencies", [])]
    declared += root["dependency-groups"]["dev"]
    wanted: dict[str, str] = {}
    for name, spec in map(parse_requirement, declared):
        if name in members:
            continue
        assert wanted.get(name, spec) == spec, f"{name}: two different specifiers in the pyprojects"
        wanted[name] = spec
    lines = [
        line.split("#", 1)[0].strip() for line in (REPO / "3rdparty/python/requirements.txt").read_text().splitlines()
    ]
    assert dict(parse_requirement(line) for line in lines if line) == wanted
