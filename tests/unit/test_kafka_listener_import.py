"""Starting the Kafka listener does not import hypothesis through kio (http_api/kafka/__init__.py):
that import built hypothesis's character map on the broker's event loop (about 2 s in a working
directory without `.hypothesis/`) and left that folder in the broker's directory."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(code: str, cwd) -> list[str]:
    """`code` in a fresh interpreter in `cwd`; its printed words."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_listener_import_leaves_hypothesis_out(tmp_path):
    assert _run("import sys, http_api.kafka.server, kio.static._phantom as p; "
                "print(p.hypothesis is None, 'hypothesis' in sys.modules)", tmp_path) == ["True", "False"]
    assert not (tmp_path / ".hypothesis").exists()


def test_a_process_that_uses_hypothesis_keeps_it(tmp_path):
    assert _run("import hypothesis, http_api.kafka.server, kio.static._phantom as p; "
                "print(p.hypothesis is not None)", tmp_path) == ["True"]
