"""Cluster processes start from cached bytecode (issue 24: restart time of a killed broker).

The harness often runs with PYTHONDONTWRITEBYTECODE=1; its children then compiled every
kraftlog module from source at each restart, which delayed a killed broker's return to
the ISR by 1-1.5 s on a loaded machine (the windows after kill-several in the 1,008-fault
run). `ChaosCluster.child_env` caches bytecode under the cluster root instead."""
import glob
import os
import subprocess
import sys
from types import SimpleNamespace

from tests.chaos.harness.cluster import ROOT, ChaosCluster, ProcessSpec


def test_restarted_process_reuses_bytecode_written_by_its_first_start(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    fake = SimpleNamespace(root=str(tmp_path), clock_file=lambda role, i: str(tmp_path / f"clock-{role}-{i}"))
    spec = ProcessSpec("broker", 1, [], {}, str(tmp_path / "broker.log"))
    env = ChaosCluster.child_env(fake, spec)
    probe = "import tests.chaos.harness.report as m, os; print(m.__cached__, os.path.exists(m.__cached__))"
    first = subprocess.run([sys.executable, "-c", probe], env=env, cwd=ROOT, capture_output=True, text=True,
                           timeout=120)
    assert first.returncode == 0, first.stderr
    cached = glob.glob(str(tmp_path / "pycache" / "**" / "report.cpython-*.pyc"), recursive=True)
    assert cached, f"the first start wrote no bytecode under {tmp_path / 'pycache'}"
    again = subprocess.run([sys.executable, "-c", probe], env=env, cwd=ROOT, capture_output=True, text=True,
                           timeout=120)
    path, exists = again.stdout.split()
    assert exists == "True" and path.startswith(str(tmp_path / "pycache")), again.stdout
