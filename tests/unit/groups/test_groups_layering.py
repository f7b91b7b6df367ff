"""The consumer-group core stays pure: no asyncio, sockets, HTTP or wall clock reads."""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[3]
FORBIDDEN = {"asyncio", "aiohttp", "socket", "subprocess", "uvloop", "http_api", "time", "random", "uuid"}


def test_partitions_groups_imports_nothing_impure():
    files = sorted((ROOT / "partitions" / "groups").rglob("*.py"))
    assert files
    for f in files:
        for node in ast.walk(ast.parse(f.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for n in names:
                assert n.split(".")[0] not in FORBIDDEN, f"{f.name} imports {n}"
