"""`kraftlog consume --group` uses group membership; `kraftlog group list / describe` show
groups and per-partition lag (text and --output json), against a real `kraftlog serve`."""
import json
import os
import subprocess
import sys

import pytest

from deploy.local_node import ROOT, LocalNode

pytestmark = pytest.mark.integration


def kraftlog(node, *args, stdin=None, timeout=60):
    env = dict(os.environ, PYTHONPATH=ROOT, KRAFTLOG_URL=node.url)
    return subprocess.run([sys.executable, "-m", "deploy.cli", *args], input=stdin, capture_output=True,
                          text=True, env=env, timeout=timeout, cwd=ROOT)


def test_consume_group_then_list_and_describe_with_lag(tmp_path):
    with LocalNode(str(tmp_path / "data")) as node:
        assert kraftlog(node, "topic", "create", "gl", "--partitions", "2").returncode == 0
        r = kraftlog(node, "produce", "gl", "--key-separator", ":",
                     stdin="".join(f"k{i % 2}:m{i}\n" for i in range(10)))
        assert r.returncode == 0, r.stderr
        r = kraftlog(node, "consume", "gl", "--group", "cg", "--from-beginning", "--max-records", "4")
        assert r.returncode == 0, r.stderr
        first = r.stdout.split()
        assert len(first) == 4
        r = kraftlog(node, "group", "list", "--output", "json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["groups"] == [{"group_id": "cg", "state": "empty", "members": 0,
                                                   "coordinator_id": 1}]
        r = kraftlog(node, "group", "describe", "cg", "--output", "json")
        d = json.loads(r.stdout)
        parts = {p["partition"]: p for p in d["partitions"]}
        assert sum(p["committed_offset"] or 0 for p in parts.values()) == 4
        assert sum(p["high_watermark"] for p in parts.values()) == 10
        assert d["total_lag"] == 6 and d["members"] == []
        r = kraftlog(node, "group", "describe", "cg")
        assert r.returncode == 0 and "CURRENT-OFFSET" in r.stdout and "LAG" in r.stdout
        assert "Total lag: 6" in r.stdout
        r = kraftlog(node, "group", "list")
        assert r.stdout.split("\t")[0] == "cg"
        # the next consumer of the group resumes at the committed offsets: the 6 others
        r = kraftlog(node, "consume", "gl", "--group", "cg", "--max-records", "6")
        assert r.returncode == 0, r.stderr
        assert sorted(first + r.stdout.split()) == sorted(f"m{i}" for i in range(10))
        r = kraftlog(node, "group", "describe", "cg", "--output", "json")
        assert json.loads(r.stdout)["total_lag"] == 0
        r = kraftlog(node, "group", "describe", "missing")
        assert r.returncode == 1 and "GROUP_ID_NOT_FOUND" in r.stderr
        r = kraftlog(node, "group", "delete", "cg")
        assert r.returncode == 0 and "Deleted group cg." in r.stdout, r.stderr
        r = kraftlog(node, "group", "list", "--output", "json")
        assert json.loads(r.stdout)["groups"] == []
