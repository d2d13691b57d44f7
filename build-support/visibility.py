"""Pants BUILD-file prelude: the kinds of UPF package, and the dependency rules that keep the roles apart.

Loaded by `[GLOBAL].build_file_prelude_globs` in pants.toml. Each package's BUILD file is one call to one
macro here, which declares the package's targets and its `__dependencies_rules__` / `__dependents_rules__`
(backend `pants.backend.experimental.visibility`). The rules are the architecture, enforced:

  upf_shared_library  libs/upf-keyspace,  depends on itself and third-party code, and the edge on the
                      libs/upf-edge       keyspace's records (users, tokens, ACL entries it authorises
                                          against) - never the other way, so the keyspace stays a leaf;
                                          used by the services (roles and the all-in-one program) and by
                                          tests/ - not by loadgen.
  upf_role            services/writer,    depends on itself, the shared libraries' sources and
                      services/pusher,    third-party code - never on another role, on loadgen, or on the
                      services/janitor    database bindings (only the keyspace library's store drivers
                                          touch a database). Used only by itself and by services/upf.
                                          Roles talk to each other only through the store.
  upf_program         services/upf        the all-in-one program: may depend on the three roles and the
                                          library; nothing depends on it.
  upf_black_box_tool  loadgen             depends on itself and third-party code only (it must test UPF
                                          from outside, with its own copy of the wire types); tests/ may
                                          reuse it.

Glob anchors: "//x" is relative to the repository root, "/x" to the BUILD file that declares the rule, so
"/**" is "this package, recursively" (it also matches the package directory itself, where non-file
targets such as pex_binary live). Rules are tried in order and the first match decides; every list ends
with "!*" so nothing falls through. The same rules are enforced on the real imports by the import-linter
contracts in the root pyproject.toml (tests/test_import_rules.py).
"""

ROLES = ("writer", "pusher", "janitor")

_THIRD_PARTY = "//3rdparty/python/**"
_DB_BINDINGS = "//3rdparty/python/reqs#foundationdb"
_KEYSPACE_SOURCES = "//libs/upf-keyspace/src/**"
_EDGE_SOURCES = "//libs/upf-edge/src/**"


def _python_package(dist, module, version, console_script=None, entry_point=None):
    """The targets every package has: sources, tests, a distribution, and a PEX per console script.

    `version` must equal [project].version in the package's pyproject.toml (tests/deploy checks it): the
    uv workspace builds from pyproject.toml, Pants from these targets, and both must ship the same version.
    """
    python_sources(name="src", sources=[f"src/{module}/**/*.py"])
    python_tests(name="tests", sources=["tests/**/test_*.py"])
    python_test_utils(name="test_utils", sources=["tests/**/conftest.py"])
    python_sources(
        name="test_helpers",
        sources=["tests/**/*.py", "!tests/**/test_*.py", "!tests/**/conftest.py"],
    )
    python_distribution(
        name="dist",
        dependencies=[":src"],
        provides=python_artifact(name=dist, version=version),
        entry_points={"console_scripts": {console_script: entry_point}} if console_script else None,
    )
    if console_script:
        # Depends on the distribution, not only on the sources, so the PEX carries the package metadata
        # (`GET /__version__` reads the installed version).
        pex_binary(
            name=console_script,
            entry_point=entry_point,
            dependencies=[":dist"],
            execution_mode="venv",
        )


def upf_shared_library(name, dist, module, version, uses=()):
    """libs/<name>: a library shared by the services (the keyspace; the edge). ``uses`` names the other
    libraries' sources it may import: only the edge, only the keyspace (the records it authorises
    against), so the dependency graph stays one-way and the keyspace a leaf."""
    _python_package(dist, module, version)
    __dependencies_rules__(
        (
            "*",
            "/**",
            *uses,
            _THIRD_PARTY,
            "!*",
        ),
    )
    __dependents_rules__(
        (
            "*",
            "/**",
            "//libs/upf-edge/**",  # the edge (and its tests) authorise against the keyspace's auth records
            "//services/**",  # the roles and the all-in-one program
            "//tests/**",  # cross-role tests may use its store fixtures
            "!*",  # in particular not loadgen, which must stay a black box
        ),
    )


def upf_role(name, dist, module, version, console_script, entry_point):
    """services/<name>: one deployable role."""
    _python_package(dist, module, version, console_script, entry_point)
    __dependencies_rules__(
        (
            "*",
            "/**",
            _KEYSPACE_SOURCES,
            _EDGE_SOURCES,
            "!" + _DB_BINDINGS,
            _THIRD_PARTY,
            "!*",  # never another role, loadgen, or anything else first-party
        ),
    )
    __dependents_rules__(
        (
            "*",
            "/**",
            "//services/upf/**",  # the all-in-one program runs the roles in one process
            "!*",  # never another role, loadgen or the cross-role tests
        ),
    )


def upf_program(name, dist, module, version, console_script, entry_point):
    """services/upf: the all-in-one program that runs the roles named in UPF_ROLES."""
    _python_package(dist, module, version, console_script, entry_point)
    __dependencies_rules__(
        (
            "*",
            "/**",
            *[f"//services/{role}/src/**" for role in ROLES],
            _KEYSPACE_SOURCES,
            _EDGE_SOURCES,
            "!" + _DB_BINDINGS,
            _THIRD_PARTY,
            "!*",
        ),
    )
    __dependents_rules__(
        (
            "*",
            "/**",
            "!*",
        ),
    )


def upf_black_box_tool(name, dist, module, version, console_script, entry_point):
    """loadgen: drives UPF only through its public HTTP/WS/SSE/NDJSON protocols."""
    _python_package(dist, module, version, console_script, entry_point)
    __dependencies_rules__(
        (
            "*",
            "/**",
            "!" + _DB_BINDINGS,
            _THIRD_PARTY,
            "!*",  # not upf_keyspace, not any service
        ),
    )
    __dependents_rules__(
        (
            "*",
            "/**",
            "//tests/**",  # test clients may reuse its wire types
            "!*",
        ),
    )
