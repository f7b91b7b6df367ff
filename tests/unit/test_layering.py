"""Guard the one-way dependency rule of the import graph, stated as a table.

Every module of the product packages belongs to exactly one layer (the first prefix in
`LAYERS` that matches it). A module may import project modules of its own layer or of the
layers listed as allowed for it; pure cores import no IO framework at all. The log, the
replication state, the controller logic and the metadata image are plain Python that tests
drive without sockets or event loops (DESIGN.md section 3); the IO shells wire them.

Every import counts: module level, inside functions and under `if TYPE_CHECKING:`, because a
hidden import is still an arrow a maintainer has to understand.
"""
from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("raft", "metadata_quorum", "partitions", "http_api", "deploy", "pipelines")

# (module prefix, layer). The first matching prefix wins, so specific modules come before
# their package.
LAYERS: list[tuple[str, str]] = [
    ("partitions.errors", "ground"),
    ("partitions.log.log_scheduler", "shell"),     # background threads and a cleaner process pool
    ("partitions.log.remote.s3", "shell"),        # tiered storage: boto3 against the object store
    ("partitions.log.remote.remote_log_manager", "shell"),  # tiered storage: copier/reader threads
    ("partitions.log", "core"),
    ("partitions.groups", "core"),
    ("partitions.replication.partition", "core"),
    ("partitions.replication.fetcher_state", "core"),
    ("partitions.replication.replica_state", "core"),
    ("partitions.replication.fetch_session", "core"),   # KIP-227 fetch sessions, both sides
    ("partitions.replication", "shell"),          # replica manager and fetcher: asyncio, files
    ("metadata_quorum.records", "core"),
    ("metadata_quorum.image", "core"),
    ("metadata_quorum.controller", "core"),        # exact module: controller_server is a shell
    ("metadata_quorum.placement", "core"),
    ("metadata_quorum.reassignment", "core"),     # KIP-455 moves and decommission: parse, targets, progress
    ("metadata_quorum.reassignment_planner", "core"),  # deterministic move planner (add/remove brokers, rebalance)
    ("metadata_quorum.feed", "core"),            # the broker's whole-change feed buffer, copy-on-write images
    ("metadata_quorum.security", "core"),        # ACL decisions, SCRAM, [security] settings
    ("metadata_quorum", "shell"),
    ("raft", "shell"),
    ("http_api", "shell"),
    ("deploy", "entry"),
    ("pipelines", "entry"),
    ("partitions", "core"),                        # partitions/__init__.py
]

# layer -> the layers it may import (its own included where listed)
ALLOWED: dict[str, set[str]] = {
    "ground": set(),
    "core": {"ground", "core"},
    "shell": {"ground", "core", "shell"},
    "entry": {"ground", "core", "shell", "entry"},
}

# Pure cores import none of these (an IO framework, a process or socket module, or a shell
# package's HTTP client).
IO_FRAMEWORKS = {"asyncio", "aiohttp", "pysyncobj", "socket", "subprocess", "multiprocessing",
                 "uvloop", "requests", "urllib", "http", "selectors", "threading_server"}


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _product_modules() -> dict[str, pathlib.Path]:
    mods: dict[str, pathlib.Path] = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            mods[_module_name(path)] = path
    return mods


MODULES = _product_modules()


def layer_of(module: str) -> str:
    for prefix, layer in LAYERS:
        if module == prefix or module.startswith(prefix + "."):
            return layer
    raise AssertionError(f"module {module} has no layer: add its prefix to LAYERS")


def _imports(module: str, path: pathlib.Path) -> tuple[set[str], set[str]]:
    """(project modules imported, external top-level names imported) by one file."""
    return _imports_of_source(module, path.read_text(), is_pkg=path.name == "__init__.py", filename=str(path))


def _imports_of_source(module: str, source: str, *, is_pkg: bool = False,
                       filename: str = "<source>") -> tuple[set[str], set[str]]:
    """As `_imports`, for source text. A process pool counts as the external name
    `multiprocessing` (concurrent.futures.ProcessPoolExecutor spawns processes too)."""
    tree = ast.parse(source, filename=filename)
    project: set[str] = set()
    external: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if (isinstance(node, ast.Name) and node.id == "ProcessPoolExecutor") or (
                isinstance(node, ast.Attribute) and node.attr == "ProcessPoolExecutor") or (
                isinstance(node, ast.alias) and node.name == "ProcessPoolExecutor"):
            external.add("multiprocessing")
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_pkg else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [f"{target}.{a.name}" if f"{target}.{a.name}" in MODULES else target for a in node.names]
        for name in names:
            if name.split(".")[0] in PACKAGES:
                resolved = name
                while resolved and resolved not in MODULES:
                    resolved = resolved.rpartition(".")[0]
                if resolved and resolved != module:
                    project.add(resolved)
            else:
                external.add(name.split(".")[0])
    return project, external


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def test_every_module_has_a_layer():
    assert MODULES, "no product module found: PACKAGES is stale"
    for module in MODULES:
        layer_of(module)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_follow_the_layer_table(module: str):
    layer = layer_of(module)
    project, external = GRAPH[module]
    upward = sorted(t for t in project if layer_of(t) not in ALLOWED[layer])
    assert not upward, (f"{module} ({layer}) imports {upward} "
                        f"({', '.join(layer_of(t) for t in upward)}); a {layer} module may import "
                        f"only {sorted(ALLOWED[layer])}: move the code down or the import up")
    if layer in ("ground", "core"):
        io = sorted(external & IO_FRAMEWORKS)
        assert not io, f"{module} is a pure core but imports {io}; move that IO to a shell"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_guard_catches_an_upward_import_and_a_forbidden_framework():
    assert layer_of("partitions.log.log") == "core"
    assert "shell" not in ALLOWED["core"]
    assert layer_of("metadata_quorum.controller_server") == "shell"
    assert layer_of("metadata_quorum.controller") == "core"
    _, external = _imports_of_source("partitions.log.x", "import multiprocessing\nfrom aiohttp import web\n")
    assert external & IO_FRAMEWORKS == {"multiprocessing", "aiohttp"}
    _, external = _imports_of_source("partitions.log.x", "import concurrent.futures as cf\n"
                                     "def f():\n    return cf.ProcessPoolExecutor(1)\n")
    assert "multiprocessing" in external
    _, external = _imports_of_source("partitions.log.x", "from concurrent.futures import ProcessPoolExecutor\n")
    assert "multiprocessing" in external
    project, _ = _imports_of_source("partitions.log.x", "def f():\n    from http_api.wire import codecs\n")
    assert project and all(layer_of(m) == "shell" for m in project)


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_import_graph_has_no_cycle():
    """No two product modules depend on each other, however indirectly: a lower module
    that needs something of a higher one gets it moved down or takes a Protocol."""
    cycles = _cycles({m: GRAPH[m][0] for m in GRAPH})
    assert cycles == [], f"import cycles (each a strongly connected set of modules): {cycles}"
