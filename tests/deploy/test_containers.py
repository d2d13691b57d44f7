"""deploy/containers and deploy/fdb: what can be checked without a container engine.

Images cannot be built or run on the project's machines (no registry serves base images and `podman run`
fails in the runtime), so these tests read the Containerfiles (labels against each pyproject, entrypoints
against the console scripts, the FoundationDB client against uv.lock, every COPY source against the tree),
and run the scripts the images and compose ship - the entrypoint, the health check and the FoundationDB
init - against stand-ins for what a container would provide.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import tomllib
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

PACKAGES = {
    # Containerfile name -> package directory
    "writer": "services/writer",
    "pusher": "services/pusher",
    "janitor": "services/janitor",
    "upf": "services/upf",
    "loadgen": "loadgen",
}
SERVERS = ("writer", "pusher", "janitor", "upf")


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined and comment lines dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("#") or (not line.strip() and not pending):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        if full:
            word, _, rest = full.partition(" ")
            out.append((word.upper(), rest.strip()))
    assert not pending, f"{path}: dangling line continuation"
    return out


def final_stage(instrs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    last_from = max(i for i, (word, _) in enumerate(instrs) if word == "FROM")
    return instrs[last_from:]


def labels(instrs: list[tuple[str, str]]) -> dict[str, str]:
    found: dict[str, str] = {}
    for word, args in final_stage(instrs):
        if word == "LABEL":
            for item in shlex.split(args):
                key, _, value = item.partition("=")
                found[key] = value
    return found


def pyproject(repo: Path, package_dir: str) -> dict:
    return tomllib.loads((repo / package_dir / "pyproject.toml").read_text())["project"]


def workspace_members(repo: Path) -> dict[str, str]:
    """distribution name -> member directory"""
    root = tomllib.loads((repo / "pyproject.toml").read_text())
    return {
        tomllib.loads((repo / m / "pyproject.toml").read_text())["project"]["name"]: m
        for m in root["tool"]["uv"]["workspace"]["members"]
    }


def workspace_closure(repo: Path, dist: str) -> set[str]:
    """The workspace members a distribution needs, itself included."""
    members = workspace_members(repo)
    seen: set[str] = set()
    todo = [dist]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for requirement in pyproject(repo, members[name]).get("dependencies", []):
            dep = re.match(r"[A-Za-z0-9._-]+", requirement).group(0)  # type: ignore[union-attr]
            if dep in members:
                todo.append(dep)
    return seen


def locked_version(repo: Path, name: str) -> str:
    lock = tomllib.loads((repo / "uv.lock").read_text())
    (version,) = {p["version"] for p in lock["package"] if p["name"] == name}
    return version


def arg_default(instrs: list[tuple[str, str]], name: str) -> str:
    (value,) = [args.partition("=")[2] for word, args in instrs if word == "ARG" and args.startswith(f"{name}=")]
    return value


@pytest.mark.parametrize("name", PACKAGES)
def test_labels_carry_the_package_version(repo: Path, name: str) -> None:
    """org.opencontainers.image.{title,version} are the package's own name and pyproject version."""
    project = pyproject(repo, PACKAGES[name])
    found = labels(instructions(repo / f"deploy/containers/{name}.Containerfile"))
    assert found["org.opencontainers.image.title"] == project["name"]
    assert found["org.opencontainers.image.version"] == project["version"]


@pytest.mark.parametrize("name", PACKAGES)
def test_entrypoint_runs_the_console_script(repo: Path, name: str) -> None:
    project = pyproject(repo, PACKAGES[name])
    instrs = instructions(repo / f"deploy/containers/{name}.Containerfile")
    (entrypoint,) = [json.loads(args) for word, args in final_stage(instrs) if word == "ENTRYPOINT"]
    script = entrypoint[-1]
    assert script in project["scripts"], f"{script} is not a console script of {project['name']}"
    if name in SERVERS:
        assert entrypoint == ["/usr/local/bin/upf-entrypoint", script]
        assert script == project["name"]


@pytest.mark.parametrize("name", PACKAGES)
def test_build_installs_this_package_from_the_lock(repo: Path, name: str) -> None:
    """uv sync --package <this dist> --frozen --no-dev, with every workspace pyproject (uv loads the whole
    workspace) and the sources of every workspace package this one needs copied in first."""
    dist = pyproject(repo, PACKAGES[name])["name"]
    instrs = instructions(repo / f"deploy/containers/{name}.Containerfile")
    syncs = [shlex.split(args) for word, args in instrs if word == "RUN" and "uv sync" in args]
    assert syncs, "no uv sync"
    for argv in syncs:
        assert argv[argv.index("--package") + 1] == dist
        assert "--frozen" in argv and "--no-dev" in argv
    assert "--no-editable" in syncs[-1]
    copies = [args.split() for word, args in instrs if word == "COPY" and not args.startswith("--from")]
    sources = {src.rstrip("/") for parts in copies for src in parts[:-1]}
    members = workspace_members(repo)
    for member_dir in members.values():
        assert f"{member_dir}/pyproject.toml" in sources, f"{member_dir}/pyproject.toml not copied"
    for needed in workspace_closure(repo, dist):
        assert members[needed] in sources, f"{members[needed]}/ (needed by {dist}) not copied"
    assert {"pyproject.toml", "uv.lock"} <= sources


@pytest.mark.parametrize("name", [*PACKAGES, "ingress"])
def test_every_copy_source_exists(repo: Path, name: str) -> None:
    for word, args in instructions(repo / f"deploy/containers/{name}.Containerfile"):
        if word == "COPY" and not args.startswith("--from"):
            for src in args.split()[:-1]:
                assert (repo / src).exists(), f"{name}: COPY source {src} missing"


@pytest.mark.parametrize("name", [*PACKAGES, "ingress"])
def test_base_images_pinned_by_tag(repo: Path, name: str) -> None:
    instrs = instructions(repo / f"deploy/containers/{name}.Containerfile")
    images = [
        args.partition("=")[2] for word, args in instrs if word == "ARG" and args.split("=")[0].endswith("_IMAGE")
    ]
    assert images
    for image in images:
        tag = image.rpartition(":")[2]
        assert "/" not in tag and tag not in ("", "latest"), image


@pytest.mark.parametrize("name", SERVERS)
def test_roles_carry_the_locked_fdb_client(repo: Path, name: str) -> None:
    """libfdb_c.so comes from the official image whose version is the bindings' version in uv.lock."""
    instrs = instructions(repo / f"deploy/containers/{name}.Containerfile")
    assert (
        arg_default(instrs, "FDB_IMAGE")
        == f"docker.io/foundationdb/foundationdb:{locked_version(repo, 'foundationdb')}"
    )
    assert ("FROM", "${FDB_IMAGE} AS fdb") in instrs
    assert ("COPY", "--from=fdb /usr/lib/libfdb_c.so /usr/lib/libfdb_c.so") in final_stage(instrs)


@pytest.mark.parametrize("name", [*PACKAGES, "ingress"])
def test_runs_as_a_non_root_user(repo: Path, name: str) -> None:
    stage = final_stage(instructions(repo / f"deploy/containers/{name}.Containerfile"))
    users = [args for word, args in stage if word == "USER"]
    assert users and users[-1] not in ("root", "0")
    last_user = max(i for i, (word, _) in enumerate(stage) if word == "USER")
    assert all(word != "RUN" for word, _ in stage[last_user:]), "RUN after USER would run as the app user"


@pytest.mark.parametrize("name", SERVERS)
def test_healthcheck_probes_lbheartbeat(repo: Path, name: str) -> None:
    stage = final_stage(instructions(repo / f"deploy/containers/{name}.Containerfile"))
    (check,) = [args for word, args in stage if word == "HEALTHCHECK"]
    assert check.endswith('CMD ["python", "/usr/local/lib/upf/healthcheck.py"]')
    assert ("COPY", "deploy/containers/healthcheck.py /usr/local/lib/upf/healthcheck.py") in stage
    assert "/__lbheartbeat__" in (repo / "deploy/containers/healthcheck.py").read_text()


def test_ingress_image_copies_what_nginx_conf_includes(repo: Path) -> None:
    instrs = instructions(repo / "deploy/containers/ingress.Containerfile")
    conf = (repo / "deploy/ingress/nginx.conf").read_text()
    includes = re.findall(r"include (/etc/nginx/upf/[\w.-]+);", conf)
    assert includes
    copies = [args.split() for word, args in instrs if word == "COPY"]
    installed = {
        dest.rstrip("/") + "/" + Path(src).name if dest.endswith("/") else dest
        for *srcs, dest in copies
        for src in srcs
    }
    assert set(includes) <= installed
    assert "/etc/nginx/nginx.conf" in installed
    assert any("apt-get install" in args and re.search(r"\bnginx\b", args) for word, args in instrs if word == "RUN")


def build_stage(instrs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    starts = [i for i, (word, args) in enumerate(instrs) if word == "FROM"]
    (first,) = [i for i in starts if instrs[i][1].endswith(" AS build")]
    end = min([i for i in starts if i > first], default=len(instrs))
    return instrs[first + 1 : end]


def replay_build_stage(repo: Path, name: str, workdir: Path, uv: list[str]) -> Path:
    """Run a Containerfile's build stage outside a container: its ENV, WORKDIR and COPY steps into
        `workdir`, then its `uv sync` commands (served from uv's cache when the test environment's own sync
    filled it). Returns the virtualenv that the
        runtime stage would copy."""
    src, venv = workdir / "src", workdir / "venv"
    src.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT")}
    for word, args in build_stage(instructions(repo / f"deploy/containers/{name}.Containerfile")):
        if word == "ENV":
            env.update(item.split("=", 1) for item in shlex.split(args))
            env["UV_PROJECT_ENVIRONMENT"] = str(venv)  # /app/.venv in the image
        elif word == "WORKDIR":
            assert args == "/src"
        elif word == "COPY":
            *sources, dest = args.split()
            for source in sources:
                target = src / dest
                if (repo / source).is_dir():
                    shutil.copytree(
                        repo / source, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__", ".venv")
                    )
                else:
                    target.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(repo / source, target / Path(source).name)
        elif word == "RUN" and "uv sync" in args:
            argv = shlex.split(args)
            result = subprocess.run([*uv, *argv[1:]], cwd=src, env=env, capture_output=True, text=True, timeout=300)
            assert result.returncode == 0, f"{args}\n{result.stderr}"
        elif word == "RUN":
            assert "pip install" in args and "uv==" in args, f"unexpected build step: {args}"  # uv is already here
        else:
            assert word == "ARG", (word, args)
    return venv


PROBE = """
import importlib.metadata, importlib.util, json, sys
modules = json.loads(sys.argv[1])
print(json.dumps({d: importlib.metadata.version(d) if importlib.util.find_spec(m) else None for d, m in modules.items()}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("name", PACKAGES)
def test_build_stage_produces_a_self_contained_environment(
    repo: Path, tmp_path: Path, uv: list[str], name: str
) -> None:
    """Replayed with the COPY set the Containerfile declares, the build gives a virtualenv holding this
    package at its pyproject version, its console script, and none of the other deployables (a writer
    image carries no pusher code); the role images also get the FoundationDB bindings."""
    project = pyproject(repo, PACKAGES[name])
    venv = replay_build_stage(repo, name, tmp_path, uv)
    for script in project["scripts"]:
        assert (venv / "bin" / script).is_file(), script
    members = workspace_members(repo)
    inside = workspace_closure(repo, project["name"])
    modules = {
        dist: tomllib.loads((repo / d / "pyproject.toml").read_text())["tool"]["uv"]["build-backend"]["module-name"]
        for dist, d in members.items()
    }
    check = subprocess.run(
        [str(venv / "bin" / "python"), "-c", PROBE, json.dumps(modules)], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stderr
    installed = json.loads(check.stdout)
    assert installed[project["name"]] == project["version"]
    for dist in members:
        assert (installed[dist] is not None) == (dist in inside), f"{dist} in the {name} image: {installed[dist]}"
    if name in SERVERS:
        fdb = subprocess.run(
            [str(venv / "bin" / "python"), "-c", "import fdb; print(fdb.__file__)"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert fdb.returncode == 0, fdb.stderr


# --- the entrypoint ---------------------------------------------------------------------------------


def entrypoint_process(
    repo: Path,
    tmp_path: Path,
    script: str,
    env: dict[str, str],
    hostname: str | None = None,
    as_user: Sequence[str] = (),
) -> subprocess.CompletedProcess[str]:
    """Run deploy/containers/entrypoint.sh under /bin/sh (dash, as in the image) with a stand-in console
    script that prints the environment it was started with (``as_user``: a command prefix that switches
    user)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / script
    fake.write_text("#!/bin/sh\nenv\n")
    fake.chmod(0o755)
    if hostname is not None:
        uname = bin_dir / "uname"
        uname.write_text(f"#!/bin/sh\necho '{hostname}'\n")
        uname.chmod(0o755)
    full_env = {"PATH": f"{bin_dir}:/usr/bin:/bin", **env}
    return subprocess.run(
        [*as_user, "/bin/sh", str(repo / "deploy/containers/entrypoint.sh"), script],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=30,
    )


def run_entrypoint(
    repo: Path, tmp_path: Path, script: str, env: dict[str, str], hostname: str | None = None
) -> dict[str, str]:
    """entrypoint_process that must succeed: the environment the console script was started with."""
    result = entrypoint_process(repo, tmp_path, script, env, hostname)
    assert result.returncode == 0, result.stderr
    return dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)


NODE_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


def test_entrypoint_derives_a_per_container_node_id(repo: Path, tmp_path: Path) -> None:
    """Without UPF_NODE_ID, a pusher is "pusher-<hostname>": stable for a container, distinct per replica."""
    env = run_entrypoint(repo, tmp_path, "upf-pusher", {}, hostname="3f2a9c1b7d4e")
    assert env["UPF_NODE_ID"] == "pusher-3f2a9c1b7d4e"
    other = run_entrypoint(repo, tmp_path, "upf-pusher", {}, hostname="9e8d7c6b5a41")
    assert other["UPF_NODE_ID"] != env["UPF_NODE_ID"]


def test_entrypoint_keeps_an_explicit_node_id(repo: Path, tmp_path: Path) -> None:
    env = run_entrypoint(repo, tmp_path, "upf-pusher", {"UPF_NODE_ID": "pusher-eu-1"}, hostname="ignored")
    assert env["UPF_NODE_ID"] == "pusher-eu-1"


def test_entrypoint_node_id_is_always_valid(repo: Path, tmp_path: Path) -> None:
    """Odd or long hostnames still give an id the settings accept (1-64 of [A-Za-z0-9._-])."""
    env = run_entrypoint(repo, tmp_path, "upf-pusher", {}, hostname="host name:with/odd*chars-" + "x" * 80)
    assert NODE_ID.fullmatch(env["UPF_NODE_ID"]), env["UPF_NODE_ID"]
    assert env["UPF_NODE_ID"].startswith("pusher-host-name-with-odd-chars-")
    from upf_keyspace.settings import load_settings

    assert load_settings({"UPF_NODE_ID": env["UPF_NODE_ID"]}).node_id == env["UPF_NODE_ID"]


def test_entrypoint_writes_the_cluster_file(repo: Path, tmp_path: Path) -> None:
    """FDB_CLUSTER_FILE_CONTENTS (compose's convention, like the FoundationDB image's) becomes the file
    FDB_CLUSTER_FILE names, before the role starts."""
    cluster_file = tmp_path / "fdb.cluster"
    env = run_entrypoint(
        repo,
        tmp_path,
        "upf-writer",
        {"FDB_CLUSTER_FILE": str(cluster_file), "FDB_CLUSTER_FILE_CONTENTS": "docker:docker@10.89.73.10:4500"},
    )
    assert cluster_file.read_text() == "docker:docker@10.89.73.10:4500\n"
    assert env["FDB_CLUSTER_FILE"] == str(cluster_file)
    assert env["UPF_NODE_ID"].startswith("writer-")


def test_entrypoint_creates_the_cluster_file_directory(repo: Path, tmp_path: Path) -> None:
    """A FDB_CLUSTER_FILE in a directory that does not exist yet (a fresh volume, a new path) gets it."""
    cluster_file = tmp_path / "state" / "fdb" / "fdb.cluster"
    env = run_entrypoint(
        repo,
        tmp_path,
        "upf-pusher",
        {"FDB_CLUSTER_FILE": str(cluster_file), "FDB_CLUSTER_FILE_CONTENTS": "docker:docker@10.89.73.10:4500"},
    )
    assert cluster_file.read_text() == "docker:docker@10.89.73.10:4500\n"
    assert env["FDB_CLUSTER_FILE"] == str(cluster_file)


def assert_refused_in_one_line(result: subprocess.CompletedProcess[str], cluster_file: Path) -> None:
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert result.stdout == "", "the role started anyway"
    (line,) = result.stderr.splitlines()
    assert line.startswith("upf-entrypoint: cannot write FDB_CLUSTER_FILE=") and str(cluster_file) in line, line


def test_entrypoint_refuses_an_unwritable_cluster_file_in_one_line(repo: Path, tmp_path: Path) -> None:
    """A path that cannot be written (here: under a regular file, which even root cannot create a
    directory in) stops the container with one line naming the variable and the path, not a shell error."""
    (tmp_path / "plain").write_text("")
    cluster_file = tmp_path / "plain" / "fdb.cluster"
    env = {"FDB_CLUSTER_FILE": str(cluster_file), "FDB_CLUSTER_FILE_CONTENTS": "docker:docker@10.89.73.10:4500"}
    assert_refused_in_one_line(entrypoint_process(repo, tmp_path, "upf-writer", env), cluster_file)


def test_entrypoint_refuses_a_directory_its_user_cannot_write(repo: Path) -> None:
    """What the old samples' /etc/foundationdb/fdb.cluster did in the image: a directory the non-root user
    cannot create or write in. Run as an unprivileged user (root can write anywhere)."""
    as_user: list[str] = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: cannot run the entrypoint as an unprivileged user")
        as_user = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    base = Path(tempfile.mkdtemp(prefix="upf-entrypoint-"))  # reachable by that user, unlike tmp_path
    try:
        base.chmod(0o755)
        locked = base / "etc"
        locked.mkdir(mode=0o555)
        locked.chmod(0o555)
        for cluster_file in (locked / "fdb.cluster", locked / "foundationdb" / "fdb.cluster"):
            env = {"FDB_CLUSTER_FILE": str(cluster_file), "FDB_CLUSTER_FILE_CONTENTS": "docker:docker@10.89.73.10:4500"}
            result = entrypoint_process(repo, base, "upf-writer", env, as_user=as_user)
            assert_refused_in_one_line(result, cluster_file)
    finally:
        shutil.rmtree(base)


def test_entrypoint_leaves_the_store_alone_without_fdb(repo: Path, tmp_path: Path) -> None:
    env = run_entrypoint(repo, tmp_path, "upf", {})
    assert "FDB_CLUSTER_FILE" not in env
    assert env["UPF_NODE_ID"].startswith("upf-")


def test_entrypoint_is_executable_in_git(repo: Path) -> None:
    """The images COPY it and compose mounts fdb-init.bash: both must keep their exec bit."""
    for path in ("deploy/containers/entrypoint.sh", "deploy/fdb/fdb-init.bash"):
        assert os.stat(repo / path).st_mode & stat.S_IXUSR, path


# --- the health check -------------------------------------------------------------------------------


class _Heartbeat(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status if self.path == "/__lbheartbeat__" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def heartbeat_server() -> Iterator[tuple[http.server.HTTPServer, type[_Heartbeat]]]:
    handler = type("Handler", (_Heartbeat,), {})
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server, handler
    server.shutdown()
    server.server_close()


def run_healthcheck(repo: Path, bind: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "UPF_BIND": bind, "HTTP_PROXY": "http://127.0.0.1:9", "http_proxy": "http://127.0.0.1:9"}
    return subprocess.run(
        [sys.executable, str(repo / "deploy/containers/healthcheck.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_healthcheck_healthy_on_200(repo: Path, heartbeat_server) -> None:
    """A 200 from /__lbheartbeat__ on the UPF_BIND port is healthy (a wildcard bind probes loopback, and
    a proxy in the environment is ignored)."""
    server, _ = heartbeat_server
    assert run_healthcheck(repo, f"0.0.0.0:{server.server_address[1]}").returncode == 0
    assert run_healthcheck(repo, f"127.0.0.1:{server.server_address[1]}").returncode == 0


def test_healthcheck_unhealthy_otherwise(repo: Path, heartbeat_server, free_port) -> None:
    server, handler = heartbeat_server
    handler.status = 503
    failed = run_healthcheck(repo, f"0.0.0.0:{server.server_address[1]}")
    assert failed.returncode == 1
    assert "/__lbheartbeat__" in failed.stderr
    assert run_healthcheck(repo, f"0.0.0.0:{free_port()}").returncode == 1


# --- the FoundationDB init --------------------------------------------------------------------------

FAKE_FDBCLI = r"""#!/usr/bin/env bash
# Stand-in for fdbcli: the cluster's state lives in $FAKE_FDB/state, calls are logged to $FAKE_FDB/calls.
state_file="$FAKE_FDB/state"
echo "$*" >> "$FAKE_FDB/calls"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --exec) cmd="$2"; shift 2 ;;
        *) shift ;;
    esac
done
state="$(cat "$state_file")"
case "$cmd" in
    "status json")
        if [[ "$state" == down:* ]]; then
            left="${state#down:}"
            if (( left > 1 )); then echo "down:$((left - 1))" > "$state_file"; else echo fresh > "$state_file"; fi
            echo '{"client":{"coordinators":{"quorum_reachable":false},"database_status":{"available":false}}}'
        elif [[ "$state" == fresh || "$state" == racy ]]; then
            echo '{"client":{"coordinators":{"quorum_reachable":true},"database_status":{"available":false}},"cluster":{"messages":[{"name":"unreadable_configuration","description":"Unable to read database configuration."}]}}'
        elif [[ "$state" == configured ]]; then
            echo '{"client":{"coordinators":{"quorum_reachable":true},"database_status":{"available":true,"healthy":true}},"cluster":{"messages":[]}}'
        else
            echo '{"client":{"coordinators":{"quorum_reachable":false}}}'
        fi
        ;;
    "configure new "*)
        case "$state" in
            fresh) echo configured > "$state_file"; echo "Database created" ;;
            racy|configured) echo configured > "$state_file"; echo "ERROR: Database already exists! To change configuration, don't say \`new'"; exit 1 ;;
            broken) echo "ERROR: the configuration is invalid"; exit 1 ;;
        esac
        ;;
esac
"""


@pytest.fixture
def fake_fdb(tmp_path: Path) -> Path:
    if shutil.which("jq") is None:
        pytest.skip("jq is not installed here (the FoundationDB image that runs fdb-init.bash ships it)")
    home = tmp_path / "fdb"
    (home / "bin").mkdir(parents=True)
    fdbcli = home / "bin" / "fdbcli"
    fdbcli.write_text(FAKE_FDBCLI)
    fdbcli.chmod(0o755)
    return home


def run_init(repo: Path, fake_fdb: Path, state: str, **env: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    (fake_fdb / "state").write_text(state + "\n")
    (fake_fdb / "calls").write_text("")
    full_env = {
        "PATH": f"{fake_fdb / 'bin'}:/usr/bin:/bin",
        "FAKE_FDB": str(fake_fdb),
        "FDB_CLUSTER_FILE": str(fake_fdb / "fdb.cluster"),
        "FDB_CLUSTER_FILE_CONTENTS": "docker:docker@10.89.73.10:4500",
        "UPF_FDB_INIT_TIMEOUT_SECS": "20",
        **env,
    }
    result = subprocess.run(
        ["bash", str(repo / "deploy/fdb/fdb-init.bash")], env=full_env, capture_output=True, text=True, timeout=60
    )
    calls = (fake_fdb / "calls").read_text().splitlines()
    return result, [c for c in calls if "--exec configure" in c]


def test_init_creates_a_fresh_database_once(repo: Path, fake_fdb: Path) -> None:
    """Waits for the coordinators, configures once, then waits until the database is available."""
    result, configures = run_init(repo, fake_fdb, "down:2")
    assert result.returncode == 0, result.stderr
    assert len(configures) == 1 and "configure new single memory" in configures[0]
    assert (fake_fdb / "fdb.cluster").read_text() == "docker:docker@10.89.73.10:4500\n"
    assert "database available" in result.stderr


def test_init_rerun_leaves_an_existing_database_alone(repo: Path, fake_fdb: Path) -> None:
    result, configures = run_init(repo, fake_fdb, "configured")
    assert result.returncode == 0, result.stderr
    assert configures == []


def test_init_treats_database_already_exists_as_success(repo: Path, fake_fdb: Path) -> None:
    """Another run created the database between the status read and the configure: still success."""
    result, configures = run_init(repo, fake_fdb, "racy")
    assert result.returncode == 0, result.stderr
    assert len(configures) == 1
    assert "already exists" in result.stderr


def test_init_passes_the_configured_engine(repo: Path, fake_fdb: Path) -> None:
    result, configures = run_init(repo, fake_fdb, "fresh", UPF_FDB_CONFIGURE="single ssd")
    assert result.returncode == 0, result.stderr
    assert "configure new single ssd" in configures[0]


def test_init_fails_on_a_real_configure_error(repo: Path, fake_fdb: Path) -> None:
    (fake_fdb / "state").write_text("broken\n")
    script = FAKE_FDBCLI.replace(
        'elif [[ "$state" == configured ]]',
        'elif [[ "$state" == broken ]]; then\n            echo \'{"client":{"coordinators":{"quorum_reachable":true},"database_status":{"available":false}},"cluster":{"messages":[{"name":"unreadable_configuration"}]}}\'\n        elif [[ "$state" == configured ]]',
    )
    (fake_fdb / "bin" / "fdbcli").write_text(script)
    result, configures = run_init(repo, fake_fdb, "broken", UPF_FDB_INIT_TIMEOUT_SECS="3")
    assert result.returncode == 1
    assert "configuration is invalid" in result.stderr
    assert len(configures) == 1


def test_init_gives_up_when_the_cluster_never_answers(repo: Path, fake_fdb: Path) -> None:
    result, configures = run_init(repo, fake_fdb, "down:1000", UPF_FDB_INIT_TIMEOUT_SECS="2")
    assert result.returncode == 1
    assert "not available in time" in result.stderr
    assert configures == []
