"""deploy/config/<role>.env.sample: valid env files whose settings the roles' own loader accepts."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path, PurePosixPath

import pytest
import yaml

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


@pytest.mark.parametrize("role", ROLES)
def test_sample_cluster_file_is_where_the_image_can_write_it(repo: Path, role: str) -> None:
    """The path compose.yaml uses, in the home the role images give their user (uid 10001): the
    entrypoint writes FDB_CLUSTER_FILE_CONTENTS there, and the client rewrites it when coordinators
    change. (/etc/foundationdb does not exist in the images and the user could not create it.)"""
    active, _ = entries(repo / f"deploy/config/{role}.env.sample")
    compose = yaml.safe_load((repo / "compose.yaml").read_text())["x-upf-env"]
    assert active["FDB_CLUSTER_FILE"] == compose["FDB_CLUSTER_FILE"]
    for image in ("writer", "pusher", "janitor", "upf"):
        containerfile = (repo / f"deploy/containers/{image}.Containerfile").read_text()
        (home,) = re.findall(r"useradd [^\n]*--home-dir (\S+) --create-home", containerfile)
        assert PurePosixPath(active["FDB_CLUSTER_FILE"]).is_relative_to(home), (image, home)


@pytest.mark.parametrize("role", ["writer", "pusher"])
def test_client_facing_samples_set_the_trusted_proxy(repo: Path, role: str) -> None:
    """Writers and pushers sit behind the ingress: their samples set UPF_PROXY_TRUSTED (to an IP), or
    every client would be the ingress and share one visitor's limits."""
    active, _ = entries(repo / f"deploy/config/{role}.env.sample")
    assert active.get("UPF_PROXY_TRUSTED"), f"{role}.env.sample leaves UPF_PROXY_TRUSTED unset"
    for item in active["UPF_PROXY_TRUSTED"].split(","):
        ipaddress.ip_network(item)  # an IP or a range, never a name resolved once at start


def test_public_url_is_not_called_informational(repo: Path) -> None:
    """The Matrix gateway, Web Push replies and the VAPID audience all use UPF_PUBLIC_URL."""
    for role in ROLES:
        text = (repo / f"deploy/config/{role}.env.sample").read_text()
        assert "informational" not in text.lower(), role
