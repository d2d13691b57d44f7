"""deploy/config/<role>.env.sample: valid env files whose settings the roles' own loader accepts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from upf_keyspace.settings import load_settings, variables

ROLES = ("writer", "pusher", "janitor")
LINE = re.compile(r"#?([A-Z][A-Z0-9_]*)=(.*)")


def entries(path: Path) -> tuple[dict[str, str], set[str]]:
    """(active settings, every variable mentioned, commented-out ones included)"""
    active: dict[str, str] = {}
    mentioned: set[str] = set()
    for line in path.read_text().splitlines():
        if not line.strip() or (line.startswith("#") and not LINE.fullmatch(line)):
            continue
        match = LINE.fullmatch(line)
        assert match, f"{path.name}: not KEY=VALUE: {line!r}"
        mentioned.add(match.group(1))
        if not line.startswith("#"):
            assert match.group(1) not in active, f"{path.name}: {match.group(1)} set twice"
            active[match.group(1)] = match.group(2)
    return active, mentioned


def known_upf_variables(repo: Path) -> set[str]:
    return {name for name in variables() if name.startswith("UPF_")}


@pytest.mark.parametrize("role", ROLES)
def test_sample_names_only_real_settings(repo: Path, role: str) -> None:
    _, mentioned = entries(repo / f"deploy/config/{role}.env.sample")
    upf = {name for name in mentioned if name.startswith("UPF_")}
    assert upf <= known_upf_variables(repo), upf - known_upf_variables(repo)
    assert mentioned - upf <= {
        "FDB_CLUSTER_FILE",
        "FDB_CLUSTER_FILE_CONTENTS",
        "OTEL_SERVICE_NAME",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        "OTEL_RESOURCE_ATTRIBUTES",
    }


@pytest.mark.parametrize("role", ROLES)
def test_sample_values_load(repo: Path, tmp_path: Path, role: str) -> None:
    """The sample's active values pass the settings loader every role uses, and name the role."""
    active, _ = entries(repo / f"deploy/config/{role}.env.sample")
    cluster_file = tmp_path / "fdb.cluster"
    cluster_file.write_text("docker:docker@127.0.0.1:4500\n")
    active["FDB_CLUSTER_FILE"] = str(cluster_file)  # the sample's path exists only in a deployment
    settings = load_settings(active)
    assert settings.roles == (role,)
    assert active["OTEL_SERVICE_NAME"] == f"upf-{role}"


def test_samples_agree_on_the_shard_count(repo: Path) -> None:
    counts = {role: entries(repo / f"deploy/config/{role}.env.sample")[0].get("UPF_SHARD_COUNT") for role in ROLES}
    assert counts["writer"] == counts["pusher"] == counts["janitor"] is not None, counts
