"""Guard the one-way dependency rule: pure cores import no IO frameworks.

The log, the replication state, the controller logic and the metadata image are plain
Python that tests drive without sockets or event loops (DESIGN.md section 3). This test
parses every pure-core module and fails if it imports asyncio, aiohttp, pysyncobj or a
process/socket module, so a shell concern cannot creep into a core unnoticed.
"""
from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Modules (files or whole packages) that must stay pure.
PURE_CORES = [
    "partitions/log",
    "partitions/replication/partition.py",
    "partitions/replication/fetcher_state.py",
    "partitions/groups",
    "metadata_quorum/records.py",
    "metadata_quorum/image.py",
    "metadata_quorum/controller.py",
    "metadata_quorum/placement.py",
]

FORBIDDEN = {"asyncio", "aiohttp", "pysyncobj", "socket", "subprocess", "uvloop", "requests", "http_api"}


def _pure_files() -> list[pathlib.Path]:
    files: list[pathlib.Path] = []
    for entry in PURE_CORES:
        path = ROOT / entry
        if path.is_dir():
            files.extend(sorted(path.rglob("*.py")))
        elif path.exists():
            files.append(path)
    return files


def _imported_roots(tree: ast.AST) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_there_are_pure_cores_to_check():
    assert _pure_files(), "no pure-core module found: PURE_CORES paths are stale"


@pytest.mark.parametrize("path", _pure_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_pure_core_imports_no_io_framework(path: pathlib.Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    bad = _imported_roots(tree) & FORBIDDEN
    # http_api.errors is the one allowed import from http_api: it is pure (an enum + exception).
    if "http_api" in bad:
        allowed = all(
            not (isinstance(n, (ast.Import, ast.ImportFrom)))
            or not _mentions_http_api_other_than_errors(n)
            for n in ast.walk(tree)
        )
        if allowed:
            bad.discard("http_api")
    assert not bad, f"{path.relative_to(ROOT)} is a pure core but imports {sorted(bad)}; move that IO to a shell"


def _mentions_http_api_other_than_errors(node: ast.AST) -> bool:
    if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "http_api":
        return node.module != "http_api.errors"
    if isinstance(node, ast.Import):
        return any(a.name.split(".")[0] == "http_api" and a.name != "http_api.errors" for a in node.names)
    return False


def test_guard_catches_a_forbidden_import():
    tree = ast.parse("import asyncio\nfrom aiohttp import web\n")
    assert _imported_roots(tree) & FORBIDDEN == {"asyncio", "aiohttp"}
