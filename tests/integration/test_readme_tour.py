"""The README's examples work as written: every curl command of the five-minute tour, the
CLI tour and the Python client example run against a real `kraftlog serve` node."""
from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from deploy.local_node import LocalNode

pytestmark = pytest.mark.integration

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
DEFAULT_URL = "http://127.0.0.1:8082"


def _section_blocks(heading: str, lang: str) -> list[str]:
    start = README.index(heading)
    nxt = README.find("\n## ", start + len(heading))
    section = README[start: nxt if nxt != -1 else len(README)]
    return re.findall(rf"```{lang}\n(.*?)```", section, re.S)


def _commands(block: str) -> list[str]:
    """Shell commands of a block: continuation lines joined, comments dropped."""
    joined = block.replace("\\\n", " ")
    return [line.strip() for line in joined.splitlines()
            if line.strip() and not line.strip().startswith("#")]


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = LocalNode(str(tmp_path_factory.mktemp("readme") / "data")).start()
    yield n
    assert n.stop() == 0, n.output


def _run(cmd: str, url: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{pathlib.Path(sys.executable).parent}:{os.environ['PATH']}",
               **(env_extra or {}))
    return subprocess.run(["bash", "-o", "pipefail", "-c", cmd.replace(DEFAULT_URL, url)],
                          capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL)


def test_curl_tour(node):
    cmds = [c for b in _section_blocks("## Five-minute tour with curl", "sh") for c in _commands(b)]
    assert len(cmds) >= 12, "the tour lost its curl commands"
    out = {}
    for cmd in cmds:
        # `| head` closes the pipe early; curl's broken pipe is not a failure of the example.
        res = _run(cmd.replace("| head -c 300", "| head -c 300; true").replace("| head", "| head; true"),
                   node.url)
        assert res.returncode == 0, f"{cmd}\n{res.stderr}"
        assert res.stdout.strip(), f"no output from: {cmd}"
        out[cmd] = res.stdout
    values = list(out.values())
    produced = json.loads(values[0])
    assert [o["offset"] for o in produced["offsets"]] == [0, 1]
    fetched = json.loads(values[1])
    assert [r["value"] for r in fetched["records"]] == ["hello", "world"]
    created = json.loads(values[2])
    assert created["name"] == "orders" and len(created["partitions"]) == 3
    same_key = json.loads(values[3])["offsets"]
    assert same_key[0]["partition"] == same_key[1]["partition"]
    assert {t["name"] for t in json.loads(values[4])["topics"]} >= {"greetings", "orders"}
    assert json.loads(values[5])["records"] == []  # long poll ended without new data
    assert json.loads(values[6]) == {"log_start_offset": 0, "local_log_start_offset": 0, "high_watermark": 2}
    assert json.loads(values[7]) == {"offset": 0}
    assert json.loads(values[9])["offsets"] == [{"topic": "greetings", "partition": 0, "offset": 2}]
    assert json.loads(values[10])["error_code"] == "OFFSET_OUT_OF_RANGE"
    assert "# TYPE" in values[12]
    assert values[13].startswith("{")


def test_cli_tour(node):
    cmds = [c for c in _commands(_section_blocks("## The CLI", "sh")[0])
            if not c.startswith("source ") and "--group" not in c]  # --group follows forever
    outputs = []
    for cmd in cmds:
        res = _run(cmd, node.url, env_extra={"KRAFTLOG_URL": node.url})  # client commands honour it
        assert res.returncode == 0, f"{cmd}\n{res.stdout}\n{res.stderr}"
        outputs.append(res.stdout)
    consumed = outputs[cmds.index(next(c for c in cmds if c.startswith("kraftlog consume")))]
    assert sorted(consumed.split()) == ["cart", "home"]


def test_python_client_example(node):
    code = _section_blocks("## The Python client", "python")[0].replace(DEFAULT_URL, node.url)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=str(ROOT))
    assert res.returncode == 0, res.stderr
    assert "written at" in res.stdout and "b'hi'" in res.stdout
