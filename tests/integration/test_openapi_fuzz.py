"""Schema fuzz of the broker's /openapi.json with schemathesis against a single node without
credentials (issue 16): no 5xx, and every answer is one the document describes for its
route (status, content type, schema). Bounded: about 30 s of generated requests."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from tests.rigs.cluster import ReplicatedCluster, http
from tests.rigs.controllers import ROOT

pytestmark = pytest.mark.integration

FUZZ_TIME_S = 30
CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"


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
        proc = subprocess.run(
            st_command() + ["run", url + "/openapi.json", "--checks", CHECKS, "--phases", "coverage,fuzzing",
                            "--max-examples", "5", "--workers", "1", "--request-timeout", "25",
                            "--max-time", str(FUZZ_TIME_S), "--seed", "16", "--no-color"],
            cwd=ROOT, capture_output=True, text=True, timeout=FUZZ_TIME_S + 60)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-6000:]
        assert " passed" in out and "failures" not in out.split("SUMMARY")[-1].lower(), out[-3000:]
        assert http("GET", url + "/healthz")[0] == 200   # the node survived the fuzz
        with open(c.log_path(1), errors="replace") as f:
            assert "Traceback" not in f.read()
    assert time.monotonic() - started < 90
