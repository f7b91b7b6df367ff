"""Schema fuzz of the broker's /openapi.json with schemathesis (issue 16): a single node
without security, and a single `cluster up --secure` node (https) with the admin's
credentials and without any; no 5xx, and every answer is one the document describes for
its route (status, content type, schema: 401/403 included). Bounded: 30 s of generated
requests each."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from tests.rigs.cluster import ReplicatedCluster, http
from tests.rigs.controllers import ROOT, free_port

pytestmark = pytest.mark.integration

FUZZ_TIME_S = 30
CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"


def fuzz(url: str, seconds: int, *extra: str, cwd: str) -> str:
    """Run schemathesis against `url`/openapi.json for `seconds` in `cwd` (it keeps a cache
    directory there); its output (it passed)."""
    proc = subprocess.run(
        st_command() + ["run", url + "/openapi.json", "--checks", CHECKS, "--phases", "coverage,fuzzing",
                        "--max-examples", "5", "--workers", "1", "--request-timeout", "25",
                        "--max-time", str(seconds), "--seed", "16", "--no-color",
                        # an SSE stream is an answer that does not end: not for a request/answer fuzzer
                        "--exclude-path-regex", "/records/stream$", *extra],
        cwd=cwd, capture_output=True, text=True, timeout=seconds + 60)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert " passed" in out and "failures" not in out.split("SUMMARY")[-1].lower(), out[-3000:]
    return out


def st_command() -> list[str]:
    exe = os.path.join(os.path.dirname(sys.executable), "st")
    assert os.path.exists(exe) or shutil.which("st"), "schemathesis is in the test extra: pip install -e '.[test]'"
    return [exe if os.path.exists(exe) else shutil.which("st")]


def test_openapi_document_describes_every_answer_of_a_fuzzed_single_node(tmp_path):
    started = time.monotonic()
    with ReplicatedCluster(str(tmp_path), brokers=1) as c:
        url = c.url(1)
        status, doc = http("GET", url + "/openapi.json")
        assert status == 200 and doc["paths"], doc
        for path, item in doc["paths"].items():   # every operation describes 400, 401 and 403
            for method, op in item.items():
                if method in ("get", "post", "put", "delete"):
                    assert {"400", "401", "403"} <= set(op["responses"]), (method, path)
        fuzz(url, FUZZ_TIME_S, cwd=str(tmp_path))
        assert http("GET", url + "/healthz")[0] == 200   # the node survived the fuzz
        with open(c.log_path(1), errors="replace") as f:
            assert "Traceback" not in f.read()
    assert time.monotonic() - started < 90


def bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def free_base_port() -> int:
    """A base port whose broker, controller (+1000) and raft (+2000) ports are all free now."""
    for _ in range(100):
        base = free_port()
        if base + 2000 < 65535 and all(bindable(base + off) for off in (0, 1000, 2000)):
            return base
    raise RuntimeError("no free base port")


def kraftlog(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "deploy.cli", *args], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=ROOT), timeout=timeout, cwd=ROOT)


def test_openapi_document_describes_every_answer_of_a_fuzzed_secure_node(tmp_path):
    """TLS, authentication and ACLs on: the admin (a super user) and an anonymous client."""
    data = str(tmp_path / "secure")
    base = free_base_port()
    up = kraftlog("cluster", "up", "--secure", "--nodes", "1", "--data-dir", data, "--base-port", str(base),
                  "--kafka-base-port", str(free_port()))
    try:
        assert up.returncode == 0, up.stderr
        url = up.stdout.split()[0]
        assert url.startswith("https://"), up.stdout
        ca = os.path.join(data, "ca.pem")
        with open(os.path.join(data, "admin.password")) as f:
            password = f.read().strip()
        fuzz(url, 20, "--tls-verify", ca, "--auth", f"admin:{password}", cwd=str(tmp_path))
        out = fuzz(url, 10, "--tls-verify", ca, cwd=str(tmp_path))   # no credentials: 401s, described
        assert "401" in out
    finally:
        down = kraftlog("cluster", "down", "--data-dir", data)
        assert down.returncode == 0, down.stderr
