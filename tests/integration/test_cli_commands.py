"""The kraftlog client commands against a real `kraftlog serve` node."""
import json
import os
import subprocess
import sys

import pytest

from deploy.local_node import ROOT, LocalNode

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = LocalNode(str(tmp_path_factory.mktemp("cli") / "data")).start()
    yield n
    n.stop()


def kraftlog(node, *args, stdin: str | None = None, timeout: float = 60):
    env = dict(os.environ, PYTHONPATH=ROOT, KRAFTLOG_URL=node.url)
    return subprocess.run([sys.executable, "-m", "deploy.cli", *args], input=stdin, capture_output=True,
                          text=True, env=env, timeout=timeout, cwd=ROOT)


def test_topic_commands(node):
    r = kraftlog(node, "topic", "create", "clitopic", "--partitions", "2", "--replication-factor", "1",
                 "--config", "retention.ms=3600000")
    assert r.returncode == 0, r.stderr
    assert "Created topic clitopic" in r.stdout
    r = kraftlog(node, "topic", "list")
    assert "clitopic" in r.stdout.split()
    r = kraftlog(node, "topic", "describe", "clitopic", "--output", "json")
    doc = json.loads(r.stdout)
    assert doc["configs"] == {"retention.ms": "3600000"} and len(doc["partitions"]) == 2
    r = kraftlog(node, "topic", "create", "clitopic")
    assert r.returncode == 1 and "TOPIC_ALREADY_EXISTS" in r.stderr
    r = kraftlog(node, "topic", "delete", "clitopic")
    assert r.returncode == 0
    r = kraftlog(node, "topic", "describe", "clitopic")
    assert r.returncode == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in r.stderr


def test_produce_then_consume_from_beginning(node):
    assert kraftlog(node, "topic", "create", "lines", "--partitions", "1").returncode == 0
    lines = [f"line {i}" for i in range(200)]
    r = kraftlog(node, "produce", "lines", stdin="\n".join(lines) + "\n")
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""  # no progress bar when stderr is not a terminal
    r = kraftlog(node, "consume", "lines", "--from-beginning", "--max-records", "200")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == lines


def test_produce_with_keys_and_json_output(node):
    assert kraftlog(node, "topic", "create", "keyed", "--partitions", "3").returncode == 0
    r = kraftlog(node, "produce", "keyed", "--key-separator", ":", stdin="a:1\nb:2\na:3\n")
    assert r.returncode == 0, r.stderr
    r = kraftlog(node, "consume", "keyed", "--from-beginning", "--max-records", "3", "--output", "json")
    recs = [json.loads(x) for x in r.stdout.splitlines()]
    by_key = {}
    for rec in recs:
        by_key.setdefault(rec["key"], set()).add(rec["partition"])
    assert set(by_key) == {"a", "b"} and len(by_key["a"]) == 1
    assert sorted(rec["value"] for rec in recs) == ["1", "2", "3"]


def test_consume_group_resumes_after_commit(node):
    assert kraftlog(node, "topic", "create", "grouped").returncode == 0
    kraftlog(node, "produce", "grouped", stdin="".join(f"m{i}\n" for i in range(10)))
    r = kraftlog(node, "consume", "grouped", "--group", "g1", "--from-beginning", "--max-records", "4")
    assert r.stdout.splitlines() == ["m0", "m1", "m2", "m3"]
    r = kraftlog(node, "consume", "grouped", "--group", "g1", "--max-records", "6")
    assert r.stdout.splitlines() == [f"m{i}" for i in range(4, 10)]


def test_errors_say_what_to_do():
    env = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-m", "deploy.cli", "topic", "list", "--bootstrap", "http://127.0.0.1:9"],
                       capture_output=True, text=True, env=env, timeout=30, cwd=ROOT)
    assert r.returncode == 1 and "check that the broker is running" in r.stderr


def test_consume_follows_until_interrupted(node):
    import select
    import signal
    assert kraftlog(node, "topic", "create", "follow").returncode == 0
    env = dict(os.environ, PYTHONPATH=ROOT, KRAFTLOG_URL=node.url)
    # SIGINT as a terminal delivers it: a suite started in the background by a non-interactive
    # shell inherits SIGINT ignored (POSIX), and so would the consumer
    p = subprocess.Popen([sys.executable, "-m", "deploy.cli", "consume", "follow", "--from-beginning"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        kraftlog(node, "produce", "follow", stdin="first\n")
        ready, _, _ = select.select([p.stdout], [], [], 20)
        assert ready and p.stdout.readline() == "first\n"
        kraftlog(node, "produce", "follow", stdin="second\n")  # arrives while following
        ready, _, _ = select.select([p.stdout], [], [], 20)
        assert ready and p.stdout.readline() == "second\n"
        p.send_signal(signal.SIGINT)
        assert p.wait(20) in (0, 130)
        assert "Traceback" not in p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
        p.communicate(timeout=10)   # reaped, pipes closed
