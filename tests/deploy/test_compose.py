"""compose.yaml and deploy/compose.fdb-multi.yaml: accepted by a real compose implementation
(podman-compose, which needs Debian's podman binary), and the invariants the deployment relies on.

podman-compose's `config` parses, merges and interpolates the files exactly as `podman compose up` would,
but checks little beyond that (a dangling depends_on passes), so the invariants are asserted here on both
the raw file and podman-compose's normalised output.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

BASE = "compose.yaml"
MULTI = "deploy/compose.fdb-multi.yaml"
ROLES = ("writer", "pusher", "janitor")


def podman_compose() -> list[str]:
    exe = shutil.which("podman-compose") or str(Path(sys.executable).with_name("podman-compose"))
    if not Path(exe).exists():
        pytest.fail(
            "podman-compose is missing from the environment although the dev dependency group lists it: "
            "run `python3 -m uv sync` (or ./dev test)",
            pytrace=False,
        )
    if shutil.which("podman") is None:
        installable = os.geteuid() == 0 and shutil.which("apt-get") is not None
        if not installable:
            pytest.skip(
                "podman is not installed and cannot be installed here (needs root and apt-get): podman-compose cannot run"
            )
        pytest.fail(
            "podman is not installed, and podman-compose needs it even for `config`: run the tests with "
            "`./dev test` (it installs Debian's podman) or `apt-get install podman`",
            pytrace=False,
        )
    return [exe]


def compose_config(
    repo: Path, *files: str, profiles: tuple[str, ...] = (), env: dict[str, str] | None = None
) -> dict[str, Any]:
    """`podman-compose -f ... config`, in an environment without the variables the files interpolate."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("UPF_", "FDB_", "COMPOSE_"))}
    clean.update(env or {})
    cmd = podman_compose()
    for f in files:
        cmd += ["-f", f]
    for p in profiles:
        cmd += ["--profile", p]
    result = subprocess.run([*cmd, "config"], cwd=repo, env=clean, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"podman-compose rejected {files}:\n{result.stderr}"
    return yaml.safe_load(result.stdout)


@pytest.fixture(scope="module")
def raw(repo: Path) -> dict[str, Any]:
    return yaml.safe_load((repo / BASE).read_text())


@pytest.fixture(scope="module")
def normalised(repo: Path) -> dict[str, Any]:
    return compose_config(repo, BASE, profiles=("loadgen",))


@pytest.fixture(scope="module")
def multi(repo: Path) -> dict[str, Any]:
    return compose_config(repo, BASE, MULTI)


def env_of(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.partition("=")[::2] for item in env)
    return {k: str(v) for k, v in env.items()}


def locked_fdb_version(repo: Path) -> str:
    lock = tomllib.loads((repo / "uv.lock").read_text())
    (version,) = {p["version"] for p in lock["package"] if p["name"] == "foundationdb"}
    return version


def test_podman_compose_accepts_the_files(repo: Path) -> None:
    """The main file alone, with the loadgen profile, and with the multi-process FDB override all parse."""
    assert set(compose_config(repo, BASE)["services"]) == {"fdb", "fdb-init", *ROLES, "ingress", "otel-collector"}
    assert "loadgen" in compose_config(repo, BASE, profiles=("loadgen",))["services"]
    assert {"fdb-log", "fdb-storage-1", "fdb-storage-2"} <= set(compose_config(repo, BASE, MULTI)["services"])


@pytest.mark.parametrize("view", ["raw", "normalised"])
def test_writer_and_pusher_agree_on_the_shard_count(view: str, request: pytest.FixtureRequest) -> None:
    """A writer pokes shard fnv1a(topic) % K and the pusher watches K bells: K must be the same."""
    services = request.getfixturevalue(view)["services"]
    counts = {role: env_of(services[role]).get("UPF_SHARD_COUNT") for role in ROLES}
    assert counts["writer"] is not None
    assert counts["writer"] == counts["pusher"] == counts["janitor"], counts


def test_shard_count_is_defined_once(repo: Path) -> None:
    """One definition (the shared x-upf-env anchor), so the roles cannot drift apart by an edit."""
    text = (repo / BASE).read_text()
    assert len(re.findall(r"^\s*UPF_SHARD_COUNT:", text, re.M)) == 1


@pytest.mark.parametrize("view", ["raw", "normalised"])
def test_pusher_node_id_is_per_container(view: str, request: pytest.FixtureRequest) -> None:
    """No fixed UPF_NODE_ID, hostname or container_name on the pusher: every replica of --scale stays its
    own node (the entrypoint derives the id from the container hostname; test_containers checks that)."""
    pusher = request.getfixturevalue(view)["services"]["pusher"]
    node_id = env_of(pusher).get("UPF_NODE_ID")
    assert node_id is None or "${" in node_id, node_id
    assert "hostname" not in pusher
    assert "container_name" not in pusher
    assert not pusher.get("ports"), "a fixed host port on the pusher breaks --scale; publish through the ingress"


@pytest.mark.parametrize("view", ["raw", "normalised"])
def test_roles_wait_for_the_database_init(view: str, request: pytest.FixtureRequest) -> None:
    services = request.getfixturevalue(view)["services"]
    for role in ROLES:
        assert services[role]["depends_on"]["fdb-init"]["condition"] == "service_completed_successfully", role
    assert services["fdb-init"]["restart"] == "no"


def test_every_dependency_names_a_service(normalised: dict[str, Any], multi: dict[str, Any]) -> None:
    for config in (normalised, multi):
        services = config["services"]
        for name, service in services.items():
            assert set(service.get("depends_on", {})) <= set(services), name


def test_loadgen_is_only_in_its_profile(raw: dict[str, Any]) -> None:
    services = raw["services"]
    assert services["loadgen"]["profiles"] == ["loadgen"]
    assert [name for name, s in services.items() if "profiles" in s] == ["loadgen"]
    assert "--url" in services["loadgen"]["command"]


def test_builds_use_the_shipped_containerfiles(repo: Path, raw: dict[str, Any]) -> None:
    for name in (*ROLES, "ingress", "loadgen"):
        build = raw["services"][name]["build"]
        assert build["context"] == "."
        assert build["dockerfile"] == f"deploy/containers/{name}.Containerfile"
        assert (repo / build["dockerfile"]).is_file()


def test_only_the_ingress_is_public(raw: dict[str, Any]) -> None:
    """One base URL for publish and subscribe (what ntfy clients expect); the collector binds loopback."""
    published = {name: s["ports"] for name, s in raw["services"].items() if s.get("ports")}
    assert set(published) == {"ingress", "otel-collector"}
    assert all(p.startswith("127.0.0.1:") for p in published["otel-collector"])
    assert set(raw["services"]["ingress"]["depends_on"]) == {"writer", "pusher"}


def test_fdb_cluster_string_is_one_fixed_address(normalised: dict[str, Any]) -> None:
    """Server, init and every role use the same connection string, naming fdb's pinned address in the
    network's subnet (coordinators must keep their IP across restarts)."""
    services = normalised["services"]
    cluster = env_of(services["fdb"])["FDB_CLUSTER_FILE_CONTENTS"]
    for name in ("fdb-init", *ROLES):
        assert env_of(services[name])["FDB_CLUSTER_FILE_CONTENTS"] == cluster, name
    address = services["fdb"]["networks"]["upf"]["ipv4_address"]
    assert cluster == f"docker:docker@{address}:4500"
    (subnet,) = [c["subnet"] for c in normalised["networks"]["upf"]["ipam"]["config"]]
    assert ipaddress.ip_address(address) in ipaddress.ip_network(subnet)


def test_network_prefix_moves_everything_together(repo: Path) -> None:
    """Overriding UPF_NET_PREFIX (a subnet clash on the host) keeps subnet, addresses, cluster string,
    the trusted ingress and the exempt load generator consistent."""
    config = compose_config(repo, BASE, MULTI, profiles=("loadgen",), env={"UPF_NET_PREFIX": "10.201.7"})
    services = config["services"]
    (ipam,) = config["networks"]["upf"]["ipam"]["config"]
    assert ipam["subnet"] == "10.201.7.0/24"
    assert ipam["ip_range"].startswith("10.201.7.")
    for name in ("fdb", "fdb-log", "fdb-storage-1", "fdb-storage-2", "ingress", "loadgen"):
        assert fixed_address(services[name]).startswith("10.201.7."), name
    for name in ("fdb", "fdb-log", "fdb-storage-1", "fdb-storage-2"):
        assert env_of(services[name])["FDB_CLUSTER_FILE_CONTENTS"] == "docker:docker@10.201.7.10:4500", name
    writer = env_of(services["writer"])
    assert writer["FDB_CLUSTER_FILE_CONTENTS"] == "docker:docker@10.201.7.10:4500"
    assert writer["UPF_PROXY_TRUSTED"] == fixed_address(services["ingress"])
    assert fixed_address(services["loadgen"]) in writer["UPF_LIMIT_EXEMPT"].split(",")


def fixed_address(service: dict[str, Any]) -> str:
    networks = service.get("networks")
    assert isinstance(networks, dict), f"no fixed address: networks is {networks!r}"
    return str(networks["upf"]["ipv4_address"])


def role_settings(env: dict[str, str]) -> Any:
    """The settings a role would start with from this environment (the roles' own loader)."""
    from upf_keyspace.settings import load_settings

    return load_settings({k: v for k, v in env.items() if k.startswith("UPF_")})


@pytest.mark.parametrize("view", ["raw", "normalised"])
def test_every_role_trusts_exactly_the_ingress(view: str, request: pytest.FixtureRequest) -> None:
    """Clients reach the roles through the ingress, so the roles must take the client from the ingress's
    X-Forwarded-For: UPF_PROXY_TRUSTED is the ingress's fixed address (the same text in the raw file),
    and nothing else. Unset, every client is the ingress and all share one visitor's limits."""
    services = request.getfixturevalue(view)["services"]
    ingress = fixed_address(services["ingress"])
    for role in ROLES:
        assert env_of(services[role]).get("UPF_PROXY_TRUSTED") == ingress, role


def test_the_trusted_ingress_is_one_ip_the_roles_accept(normalised: dict[str, Any]) -> None:
    """An IP, not the service name (the settings resolve names once, at start, and the ingress may not
    exist yet) and not a range (another container could forward as anyone); the roles' loader takes it."""
    services = normalised["services"]
    ingress = ipaddress.ip_address(fixed_address(services["ingress"]))
    for role in ROLES:
        settings = role_settings(env_of(services[role]))
        assert settings.proxy_trusted == (f"{ingress}/32",), role
        exempt = [ipaddress.ip_network(n) for n in settings.limit_exempt]
        assert not any(ingress in n for n in exempt), "an exempt ingress would exempt every client"


@pytest.mark.parametrize("view", ["raw", "normalised"])
def test_the_load_generator_is_exempt_and_loopback_stays(view: str, request: pytest.FixtureRequest) -> None:
    """The loadgen profile drives thousands of subscriptions from one address through the ingress: its
    fixed address is in every role's UPF_LIMIT_EXEMPT, next to loopback (the containers' health checks)."""
    services = request.getfixturevalue(view)["services"]
    loadgen = fixed_address(services["loadgen"])
    for role in ROLES:
        exempt = env_of(services[role]).get("UPF_LIMIT_EXEMPT", "").split(",")
        assert loadgen in exempt, role
        assert {"127.0.0.0/8", "::1"} <= set(exempt), role


def test_fixed_addresses_are_distinct_and_outside_the_dynamic_range(
    normalised: dict[str, Any], multi: dict[str, Any]
) -> None:
    """Every fixed address is in the subnet and outside ip_range, the range containers without one are
    given addresses from: a scaled or restarted role can never take the ingress's or fdb's address first."""
    for config in (normalised, multi):
        (ipam,) = config["networks"]["upf"]["ipam"]["config"]
        subnet, dynamic = ipaddress.ip_network(ipam["subnet"]), ipaddress.ip_network(ipam["ip_range"])
        assert dynamic.subnet_of(subnet)  # type: ignore[arg-type]
        fixed = {
            name: ipaddress.ip_address(fixed_address(s))
            for name, s in config["services"].items()
            if isinstance(s.get("networks"), dict)
        }
        assert {"fdb", "ingress"} <= set(fixed)
        assert len(set(fixed.values())) == len(fixed), fixed
        for name, address in fixed.items():
            assert address in subnet and address not in dynamic, (name, address)
            assert address not in (subnet.network_address, subnet.network_address + 1, subnet.broadcast_address)
    assert "loadgen" in {n for n, s in normalised["services"].items() if isinstance(s.get("networks"), dict)}


def test_public_url_is_unset_unless_given(repo: Path) -> None:
    """UPF_PUBLIC_URL is what clients use (Matrix pushkeys must start with it; Web Push replies and the
    VAPID audience use it), and no default can know it: unset, the Matrix gateway answers ntfy's 500
    50003, so homeservers use another gateway rather than being told to drop their pushers (a default of
    http://localhost:PORT matched no phone's pushkey). Set, it reaches every role."""
    unset = compose_config(repo, BASE, env={"UPF_HTTP_PORT": "9090"})["services"]
    assert unset["ingress"]["ports"] == ["9090:8080"]
    for role in ROLES:
        assert env_of(unset[role]).get("UPF_PUBLIC_URL", "") == "", role
    explicit = compose_config(repo, BASE, env={"UPF_HTTP_PORT": "9090", "UPF_PUBLIC_URL": "https://push.example.org"})
    for role in ROLES:
        assert env_of(explicit["services"][role])["UPF_PUBLIC_URL"] == "https://push.example.org", role


def test_fdb_image_matches_the_locked_bindings(repo: Path, normalised: dict[str, Any]) -> None:
    version = locked_fdb_version(repo)
    assert version.startswith("7.3.")
    for name in ("fdb", "fdb-init"):
        assert normalised["services"][name]["image"] == f"docker.io/foundationdb/foundationdb:{version}"


def test_fdb_init_script_is_mounted_and_run(repo: Path, raw: dict[str, Any]) -> None:
    init = raw["services"]["fdb-init"]
    (mount,) = init["volumes"]
    source, target, _ = mount.split(":")
    assert (repo / source).is_file()
    assert init["entrypoint"] == ["bash", target]


def test_collector_config_is_mounted_and_complete(repo: Path, raw: dict[str, Any]) -> None:
    """The collector gets deploy/otel/collector.yaml; its pipelines use only defined components, it
    receives OTLP where the roles send it, and it scrapes every role's /metrics."""
    collector = raw["services"]["otel-collector"]
    (mount,) = collector["volumes"]
    source, target, _ = mount.split(":")
    assert source == "./deploy/otel/collector.yaml"
    assert f"--config={target}" in collector["command"]
    config = yaml.safe_load((repo / source).read_text())
    for pipeline in config["service"]["pipelines"].values():
        for kind in ("receivers", "processors", "exporters"):
            assert set(pipeline.get(kind, [])) <= set(config[kind]), (kind, pipeline)
    assert set(config["service"].get("extensions", [])) <= set(config.get("extensions", {}))
    http_endpoint = config["receivers"]["otlp"]["protocols"]["http"]["endpoint"]
    for role in ROLES:
        env = env_of(raw["services"][role])
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == f"http://otel-collector:{http_endpoint.rsplit(':', 1)[1]}"
        assert env["OTEL_SERVICE_NAME"] == f"upf-{role}"
    scraped = {
        name
        for job in config["receivers"]["prometheus"]["config"]["scrape_configs"]
        for sd in job.get("dns_sd_configs", [])
        for name in sd["names"]
        if job.get("metrics_path", "/metrics") == "/metrics"
    }
    assert scraped == set(ROLES)


def test_multi_process_override(repo: Path, normalised: dict[str, Any], multi: dict[str, Any]) -> None:
    """The benchmark variant: several fdbserver containers with distinct fixed addresses on the same
    cluster string, process classes, the ssd engine, and the init waits for all of them."""
    services = multi["services"]
    servers = ["fdb", "fdb-log", "fdb-storage-1", "fdb-storage-2"]
    cluster = env_of(normalised["services"]["fdb"])["FDB_CLUSTER_FILE_CONTENTS"]
    addresses = [services[s]["networks"]["upf"]["ipv4_address"] for s in servers]
    assert len(set(addresses)) == len(servers)
    assert {env_of(services[s])["FDB_CLUSTER_FILE_CONTENTS"] for s in servers} == {cluster}
    assert [env_of(services[s]).get("FDB_PROCESS_CLASS") for s in servers] == ["stateless", "log", "storage", "storage"]
    assert env_of(services["fdb-init"])["UPF_FDB_CONFIGURE"] == "single ssd"
    assert set(servers) <= set(services["fdb-init"]["depends_on"])
    data_volumes = {services[s]["volumes"][0].split(":")[0] for s in servers}
    assert len(data_volumes) == len(servers)
    assert data_volumes <= set(multi["volumes"])
    image = f"docker.io/foundationdb/foundationdb:{locked_fdb_version(repo)}"
    assert {services[s]["image"] for s in servers} == {image}
