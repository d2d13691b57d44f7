"""pants.toml, build-support/visibility.py and the BUILD files, checked against the tree.

Pants cannot be installed on the project's machines, so its config is kept honest here instead:

- the BUILD files are executed (with recording stand-ins for Pants's target types) to see exactly which
  targets and dependency rules they declare;
- the visibility rules are evaluated with the semantics Pants documents (first matching rule set by
  selector, first matching rule by glob, "//" root-anchored, "/" anchored at the declaring BUILD file,
  rules inherited by subdirectories without rules of their own, both ends of a dependency must allow
  it) - on representative dependencies and on every import in the repository's code;
- source roots, versions and third-party requirements are compared with the packages' pyprojects.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
ROLES = ("writer", "pusher", "janitor")

# --- executing BUILD files ----------------------------------------------------------------------------


@dataclass
class Build:
    directory: str  # "" for the repository root
    targets: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    dependencies_rules: tuple[Any, ...] | None = None
    dependents_rules: tuple[Any, ...] | None = None
    macros: list[str] = field(default_factory=list)

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [kwargs for k, kwargs in self.targets if k == kind]


TARGET_TYPES = (
    "python_sources",
    "python_tests",
    "python_test_utils",
    "python_distribution",
    "pex_binary",
    "docker_image",
    "files",
    "python_requirements",
)


def build_files() -> list[Path]:
    tracked = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "BUILD", "*/BUILD"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return sorted({REPO / p for p in tracked if (REPO / p).exists()})


@cache
def load_builds() -> dict[str, Build]:
    """Run the prelude and every BUILD file the way Pants does: plain Python, prelude symbols in scope."""
    current: list[Build] = []

    def recorder(kind: str):
        def record(**kwargs: Any) -> None:
            current[-1].targets.append((kind, kwargs))

        return record

    def rules(attr: str):
        def declare(*rule_sets: Any, extend: bool = False) -> None:
            assert getattr(current[-1], attr) is None, f"{attr} declared twice in {current[-1].directory}/BUILD"
            assert not extend
            setattr(current[-1], attr, rule_sets)

        return declare

    stand_ins: dict[str, Any] = {kind: recorder(kind) for kind in TARGET_TYPES}
    stand_ins["python_artifact"] = lambda **kwargs: kwargs
    stand_ins["__dependencies_rules__"] = rules("dependencies_rules")
    stand_ins["__dependents_rules__"] = rules("dependents_rules")

    prelude_path = REPO / "build-support" / "visibility.py"
    prelude: dict[str, Any] = dict(stand_ins)
    exec(compile(prelude_path.read_text(), str(prelude_path), "exec"), prelude)
    exported = {k: v for k, v in prelude.items() if not k.startswith("_") and callable(v) and k not in stand_ins}

    builds: dict[str, Build] = {}
    for path in build_files():
        directory = path.parent.relative_to(REPO).as_posix()
        directory = "" if directory == "." else directory
        build = Build(directory)
        current.append(build)

        def traced(name: str, fn: Any) -> Any:
            def call(*args: Any, **kwargs: Any) -> Any:
                build.macros.append(name)
                return fn(*args, **kwargs)

            return call

        namespace = {**stand_ins, **{k: traced(k, v) for k, v in exported.items()}}
        exec(compile(path.read_text(), str(path), "exec"), namespace)
        current.pop()
        builds[directory] = build
    return builds


def workspace() -> dict[str, dict[str, Any]]:
    """member directory -> its [project] table"""
    root = tomllib.loads((REPO / "pyproject.toml").read_text())
    return {m: tomllib.loads((REPO / m / "pyproject.toml").read_text())["project"] for m in root["tool"]["uv"]["workspace"]["members"]}


EXPECTED_MACRO = {
    "libs/upf-keyspace": "upf_shared_library",
    "libs/upf-edge": "upf_shared_library",
    "services/writer": "upf_role",
    "services/pusher": "upf_role",
    "services/janitor": "upf_role",
    "services/upf": "upf_program",
    "loadgen": "upf_black_box_tool",
}

# --- Pants glob semantics -------------------------------------------------------------------------------


def glob_regex(glob: str) -> str:
    """Path glob -> regex: `*` stays within a path segment, `**` crosses segments, and a trailing `/**`
    also matches the directory itself."""
    out = re.escape(glob).replace(r"\*", "*")
    out = out.replace("/**", "\x00")
    out = out.replace("**/", "\x01")
    out = out.replace("**", "\x02")
    out = out.replace("*", "[^/]*")
    return out.replace("\x00", "(/.*)?").replace("\x01", "(.*/)?").replace("\x02", ".*") + "$"


def sources_match(build_dir: str, globs: list[str], path: str) -> bool:
    """Does a target's `sources` field (relative to its BUILD directory, `!` excludes) own `path`?"""
    prefix = f"{build_dir}/" if build_dir else ""
    if not path.startswith(prefix):
        return False
    rel = path[len(prefix) :]
    included = any(re.match(glob_regex(g), rel) for g in globs if not g.startswith("!"))
    excluded = any(re.match(glob_regex(g[1:]), rel) for g in globs if g.startswith("!"))
    return included and not excluded


def rule_matches(pattern: str, declared_in: str, path: str) -> bool:
    if pattern.startswith("//"):
        return re.match(glob_regex(pattern[2:]), path) is not None
    if pattern.startswith("/"):
        base = f"{declared_in}/{pattern[1:]}" if declared_in else pattern[1:]
        return re.match(glob_regex(base), path) is not None
    return re.search(r"(^|/)" + glob_regex(pattern), path) is not None


def flatten(rules: Any) -> list[str]:
    if isinstance(rules, str):
        return [rules]
    return [r for item in rules for r in flatten(item)]


def selector_matches(selector: Any, kind: str, path: str, declared_in: str) -> bool:
    if isinstance(selector, str):
        return selector == "*" or selector == kind
    if isinstance(selector, dict):
        if "type" in selector and selector["type"] not in ("*", kind):
            return False
        return "path" not in selector or rule_matches(selector["path"], declared_in, path)
    return any(selector_matches(s, kind, path, declared_in) for s in selector)


@dataclass(frozen=True)
class Node:
    path: str  # file path, package directory, or 3rdparty/python/reqs#name
    build_dir: str  # where the target is declared
    kind: str = "python_sources"


def governing_rules(build_dir: str, attr: str) -> tuple[str, tuple[Any, ...]] | None:
    """A BUILD file without rules of its own inherits the nearest ancestor's."""
    builds = load_builds()
    parts = build_dir.split("/") if build_dir else []
    for n in range(len(parts), -1, -1):
        candidate = "/".join(parts[:n])
        if candidate in builds and getattr(builds[candidate], attr) is not None:
            return candidate, getattr(builds[candidate], attr)
    return None


def action(node: Node, other: Node, attr: str) -> str | None:
    governed = governing_rules(node.build_dir, attr)
    if governed is None:
        return "allow"
    declared_in, rule_sets = governed
    for rule_set in rule_sets:
        selector, *rules = rule_set
        if selector_matches(selector, node.kind, node.path, declared_in):
            for rule in flatten(rules):
                deny = rule.startswith("!")
                if rule_matches(rule.lstrip("!"), declared_in, other.path):
                    return "deny" if deny else "allow"
            return None  # no rule matched: Pants reports an error
    return None


def decide(origin: Node, dependency: Node) -> str:
    outgoing = action(origin, dependency, "dependencies_rules")
    incoming = action(dependency, origin, "dependents_rules")
    if outgoing is None or incoming is None:
        return f"error: no matching rule (outgoing={outgoing}, incoming={incoming})"
    return "deny" if "deny" in (outgoing, incoming) else "allow"


def src(package_dir: str, module: str, file: str = "__init__.py") -> Node:
    return Node(f"{package_dir}/src/{module}/{file}", package_dir)


def req(name: str) -> Node:
    return Node(f"3rdparty/python/reqs#{name}", "3rdparty/python", "python_requirement")


KEYSPACE = src("libs/upf-keyspace", "upf_keyspace", "store.py")
EDGE = src("libs/upf-edge", "upf_edge", "http11.py")
LOADGEN = src("loadgen", "upf_loadgen", "wire.py")
UPF = src("services/upf", "upf", "__main__.py")
ROLE = {r: src(f"services/{r}", f"upf_{r}", "app.py") for r in ROLES}
CROSS_ROLE_TEST = Node("tests/e2e/test_split.py", "", "python_tests")

CASES = [
    *[(f"{a} -> {b}", ROLE[a], ROLE[b], "deny") for a in ROLES for b in ROLES if a != b],
    *[(f"{r} -> keyspace", ROLE[r], KEYSPACE, "allow") for r in ROLES],
    *[(f"{r} -> edge", ROLE[r], EDGE, "allow") for r in ROLES],
    ("upf -> edge", UPF, EDGE, "allow"),
    ("edge -> keyspace", EDGE, KEYSPACE, "allow"),
    ("keyspace -> edge", KEYSPACE, EDGE, "deny"),
    *[(f"edge -> {r}", EDGE, ROLE[r], "deny") for r in ROLES],
    ("loadgen -> edge", LOADGEN, EDGE, "deny"),
    *[(f"{r} -> loadgen", ROLE[r], LOADGEN, "deny") for r in ROLES],
    *[(f"{r} -> upf", ROLE[r], UPF, "deny") for r in ROLES],
    *[(f"{r} -> third-party", ROLE[r], req("msgspec"), "allow") for r in ROLES],
    *[(f"{r} -> fdb bindings", ROLE[r], req("foundationdb"), "deny") for r in ROLES],
    *[(f"{r} tests -> {r}", Node(f"services/{r}/tests/test_x.py", f"services/{r}", "python_tests"), ROLE[r], "allow") for r in ROLES],
    *[(f"upf -> {r}", UPF, ROLE[r], "allow") for r in ROLES],
    ("upf -> keyspace", UPF, KEYSPACE, "allow"),
    ("upf -> fdb bindings", UPF, req("foundationdb"), "deny"),
    ("keyspace -> fdb bindings", KEYSPACE, req("foundationdb"), "allow"),
    *[(f"keyspace -> {r}", KEYSPACE, ROLE[r], "deny") for r in ROLES],
    ("keyspace -> loadgen", KEYSPACE, LOADGEN, "deny"),
    ("loadgen -> keyspace", LOADGEN, KEYSPACE, "deny"),
    *[(f"loadgen -> {r}", LOADGEN, ROLE[r], "deny") for r in ROLES],
    ("loadgen -> upf", LOADGEN, UPF, "deny"),
    ("loadgen -> websockets", LOADGEN, req("websockets"), "allow"),
    ("loadgen -> fdb bindings", LOADGEN, req("foundationdb"), "deny"),
    *[(f"cross-role tests -> {r}", CROSS_ROLE_TEST, ROLE[r], "deny") for r in ROLES],
    ("cross-role tests -> keyspace", CROSS_ROLE_TEST, KEYSPACE, "allow"),
    ("cross-role tests -> loadgen", CROSS_ROLE_TEST, LOADGEN, "allow"),
    ("cross-role tests -> compose.yaml", CROSS_ROLE_TEST, Node("compose.yaml", "", "files"), "allow"),
    ("pex_binary -> its distribution", Node("services/writer", "services/writer", "pex_binary"), Node("services/writer", "services/writer", "python_distribution"), "allow"),
    ("image -> workspace files", Node("deploy/containers", "deploy/containers", "docker_image"), Node("services/writer/pyproject.toml", "", "files"), "allow"),
]


@pytest.mark.parametrize(("origin", "dependency", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_dependency_rules(origin: Node, dependency: Node, expected: str) -> None:
    """Roles never depend on each other (or on loadgen, or on the database bindings); the all-in-one
    program may depend on the roles; loadgen depends on no first-party code; cross-role tests are black box."""
    assert decide(origin, dependency) == expected


def test_role_rules_allow_no_other_service() -> None:
    """Read straight from the rules: a role's dependency rules mention services only to deny them (via
    the closing "!*"), so no edit of an allow list can quietly open a role->role path."""
    builds = load_builds()
    for role in ROLES:
        (rule_set,) = builds[f"services/{role}"].dependencies_rules
        rules = flatten(rule_set[1:])
        assert rules[-1] == "!*"
        assert not [r for r in rules if r.startswith("//services/")], rules
        assert "/**" in rules and "//libs/upf-keyspace/src/**" in rules


def test_every_rule_list_closes() -> None:
    """Each rule list ends in a catch-all, so no dependency can fall through to a Pants error."""
    for build in load_builds().values():
        for rule_sets in (build.dependencies_rules, build.dependents_rules):
            for rule_set in rule_sets or ():
                assert flatten(rule_set[1:])[-1] in ("!*", "*"), (build.directory, rule_set)


# --- the real import graph ------------------------------------------------------------------------------


def source_roots() -> list[str]:
    patterns = tomllib.loads((REPO / "pants.toml").read_text())["source"]["root_patterns"]
    roots: set[str] = set()
    for pattern in patterns:
        assert pattern.startswith("/"), f"unanchored root pattern {pattern!r}"
        if pattern == "/":
            roots.add("")
            continue
        roots.update(p.relative_to(REPO).as_posix() for p in REPO.glob(pattern[1:]) if p.is_dir())
    return sorted(roots)


def root_of(path: str, roots: list[str]) -> str:
    owning = [r for r in roots if r == "" or path.startswith(r + "/")]
    return max(owning, key=len)


def python_owner(path: str) -> str | None:
    """The BUILD directory whose python target owns this file, if any."""
    for directory, build in load_builds().items():
        for kind, kwargs in build.targets:
            if kind in ("python_sources", "python_tests", "python_test_utils") and sources_match(directory, kwargs["sources"], path):
                return directory
    return None


def resolve_first_party(module: str, roots: list[str], importer_root: str) -> str | None:
    candidates = []
    for root in roots:
        base = PurePosixPath(root) / module.replace(".", "/")
        for path in (f"{base}.py", f"{base}/__init__.py"):
            if (REPO / path).is_file():
                candidates.append((root, path))
    if not candidates:
        return None
    for root, path in candidates:  # ambiguity_resolution = "by_source_root"
        if root == importer_root:
            return path
    return candidates[0][1]


def imports(path: str) -> list[tuple[str, bool]]:
    """(module, weak) for every import in a file; `weak` when inside `try: ... except ImportError`."""
    tree = ast.parse((REPO / path).read_text(), path)
    found: list[tuple[str, bool]] = []
    package = PurePosixPath(path).parent

    def visit(node: ast.AST, weak: bool) -> None:
        if isinstance(node, ast.Try):
            guarded = any(
                isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError") for h in node.handlers
            )
            for child in node.body:
                visit(child, weak or guarded)
            for child in [*node.handlers, *node.orelse, *node.finalbody]:
                visit(child, weak)
            return
        if isinstance(node, ast.Import):
            found.extend((alias.name, weak) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package
                for _ in range(node.level - 1):
                    base = base.parent
                found.append((f"relative:{base}/{(node.module or '').replace('.', '/')}", weak))
            elif node.module and node.module != "__future__":
                found.append((node.module, weak))
                found.extend((f"{node.module}.{alias.name}", True) for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child, weak)

    visit(tree, False)
    return found


def third_party_index() -> dict[str, str]:
    """import name -> requirement name, as Pants maps them (explicit module_mapping, else the name)."""
    (reqs,) = load_builds()["3rdparty/python"].of_type("python_requirements")
    index: dict[str, str] = {}
    for name in requirement_specs():
        modules = reqs.get("module_mapping", {}).get(name, [name.replace("-", "_")])
        for module in modules:
            index[module] = name
    return index


def third_party_owner(module: str, index: dict[str, str]) -> str | None:
    """The requirement owning a module: the longest mapped module prefix wins, as in Pants."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in index:
            return index[".".join(parts[:n])]
    return None


def test_every_import_obeys_the_rules() -> None:
    """What Pants would infer from the code as it stands: each import of every owned Python file,
    resolved through the source roots, must be allowed by the rules - and must be owned (pants.toml
    sets unowned_dependency_behavior = "error"; imports guarded by `except ImportError` are exempt, as
    in Pants)."""
    roots = source_roots()
    third_party = third_party_index()
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    problems: list[str] = []
    checked = 0
    for path in files:
        owner = python_owner(path)
        if owner is None:
            continue
        origin = Node(path, owner, "python_tests" if PurePosixPath(path).name.startswith("test_") else "python_sources")
        importer_root = root_of(path, roots)
        for module, weak in imports(path):
            if module.startswith("relative:"):
                target_base = module.removeprefix("relative:").rstrip("/")
                target = next((p for p in (f"{target_base}.py", f"{target_base}/__init__.py") if (REPO / p).is_file()), None)
                if target is None:
                    continue
            else:
                top = module.split(".")[0]
                if top in sys.stdlib_module_names:
                    continue
                target = resolve_first_party(module, roots, importer_root)
                if target is None:
                    if weak or "." in module and resolve_first_party(module.rsplit(".", 1)[0], roots, importer_root):
                        continue  # `from pkg import name` where name is not a module
                    requirement = third_party_owner(module, third_party)
                    if requirement is not None:
                        verdict = decide(origin, req(requirement))
                        if verdict != "allow":
                            problems.append(f"{path}: import {module} -> {requirement}: {verdict}")
                        checked += 1
                    else:
                        problems.append(f"{path}: import {module}: no target owns it (add it to 3rdparty/python)")
                    continue
            dep_owner = python_owner(target)
            if dep_owner is None:
                problems.append(f"{path}: import {module} resolves to {target}, which no python target owns")
                continue
            verdict = decide(origin, Node(target, dep_owner))
            checked += 1
            if verdict != "allow":
                problems.append(f"{path}: import {module} ({target}): {verdict}")
    assert checked > 50, "suspiciously few imports checked"
    assert not problems, "\n".join(problems)


# --- targets, versions, roots, requirements ------------------------------------------------------------


@pytest.mark.parametrize("member", list(workspace()))
def test_each_package_declares_its_targets(member: str) -> None:
    """One macro call per package BUILD; sources, distribution name and version, and one pex_binary per
    console script, all matching the package's pyproject."""
    project = workspace()[member]
    build = load_builds().get(member)
    assert build is not None, f"{member}/BUILD is missing"
    assert build.macros == [EXPECTED_MACRO[member]]
    module = project["name"].replace("-", "_")
    (sources,) = [t for t in build.of_type("python_sources") if t["name"] == "src"]
    assert sources["sources"] == [f"src/{module}/**/*.py"]
    assert (REPO / member / "src" / module / "__init__.py").is_file()
    (dist,) = build.of_type("python_distribution")
    assert dist["provides"] == {"name": project["name"], "version": project["version"]}
    scripts = project.get("scripts", {})
    pex = {t["name"]: t["entry_point"] for t in build.of_type("pex_binary")}
    assert pex == scripts
    assert (dist.get("entry_points") or {}).get("console_scripts", {}) == scripts
    assert build.dependencies_rules and build.dependents_rules


def test_every_service_has_an_image() -> None:
    """A docker_image per deployable, built from its Containerfile, tagged with the package version,
    with the workspace files as its build context."""
    images = {t["name"]: t for t in load_builds()["deploy/containers"].of_type("docker_image")}
    projects = workspace()
    for name, member in (("writer", "services/writer"), ("pusher", "services/pusher"), ("janitor", "services/janitor"), ("upf", "services/upf"), ("loadgen", "loadgen")):
        image = images[name]
        assert image["source"] == f"{name}.Containerfile"
        assert (REPO / "deploy/containers" / image["source"]).is_file()
        assert image["image_tags"] == [projects[member]["version"]]
        assert image["repository"] == projects[member]["name"]
        assert "//:workspace" in image["dependencies"]
    assert (REPO / "deploy/containers" / images["ingress"]["source"]).is_file()


def test_image_context_covers_every_copy() -> None:
    """Every file a Containerfile copies from the repository is in //:workspace, so a Pants-built image
    gets the same context as `podman build .`."""
    (workspace_files,) = [t for t in load_builds()[""].of_type("files") if t["name"] == "workspace"]
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    for containerfile in sorted((REPO / "deploy/containers").glob("*.Containerfile")):
        for line in re.findall(r"^COPY (?!--from)(.+)$", containerfile.read_text(), re.M):
            for source in line.split()[:-1]:
                if (REPO / source).is_file():
                    assert sources_match("", workspace_files["sources"], source), f"{containerfile.name}: {source}"
                else:
                    needed = [p for p in tracked if p.startswith(source) and ("/src/" in p or p.endswith("pyproject.toml"))]
                    assert needed, source
                    for path in needed:
                        assert sources_match("", workspace_files["sources"], path), f"{containerfile.name}: {path}"


def test_source_roots_cover_every_package() -> None:
    """Each package's src and tests directory is a source root, and every Python file a target owns has
    a root that gives it an importable module name."""
    roots = source_roots()
    for member in workspace():
        assert f"{member}/src" in roots, member
        if (REPO / member / "tests").is_dir():
            assert f"{member}/tests" in roots, member
    assert "" in roots  # tests/ imports itself as `tests.<...>`
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    owned = [p for p in files if python_owner(p) is not None]
    assert owned
    for path in owned:
        module = PurePosixPath(path).relative_to(root_of(path, roots) or ".").with_suffix("").parts
        assert all(part.isidentifier() for part in module), f"{path} would be module {'.'.join(module)}"


def test_pants_toml_backends_and_prelude() -> None:
    config = tomllib.loads((REPO / "pants.toml").read_text())
    backends = config["GLOBAL"]["backend_packages"]
    assert {"pants.backend.python", "pants.backend.docker", "pants.backend.experimental.visibility"} <= set(backends)
    (prelude,) = config["GLOBAL"]["build_file_prelude_globs"]
    assert (REPO / prelude).is_file()
    assert config["python-infer"]["unowned_dependency_behavior"] == "error"
    assert config["python"]["interpreter_constraints"] == ["CPython>=3.11,<3.14"]
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires == ">=3.11"
    lock = config["python.resolves"][config["python"]["default_resolve"]] if "python.resolves" in config else config["python"]["resolves"][config["python"]["default_resolve"]]
    assert lock.startswith("3rdparty/python/")


def requirement_specs() -> dict[str, str]:
    specs: dict[str, str] = {}
    for line in (REPO / "3rdparty/python/requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, spec = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*(.*)", line).groups()  # type: ignore[union-attr]
            specs[name.lower()] = spec.replace(" ", "")
    return specs


def test_third_party_requirements_match_the_pyprojects() -> None:
    """3rdparty/python/requirements.txt is the union of the packages' third-party dependencies and the
    dev group, with the same specifiers (uv reads the pyprojects, Pants this file)."""
    members = {p["name"] for p in workspace().values()}
    root = tomllib.loads((REPO / "pyproject.toml").read_text())
    wanted: dict[str, str] = {}
    declared = [d for p in workspace().values() for d in p.get("dependencies", [])]
    declared += root["dependency-groups"]["dev"]
    for requirement in declared:
        name, spec = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*(.*)", requirement).groups()  # type: ignore[union-attr]
        if name in members:
            continue
        spec = spec.replace(" ", "")
        assert wanted.get(name.lower(), spec) == spec, f"{name}: two different specifiers in the pyprojects"
        wanted[name.lower()] = spec
    assert requirement_specs() == wanted
