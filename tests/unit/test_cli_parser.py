"""`kraftlog` argument parsing: where --bootstrap may go and what it defaults to."""
from __future__ import annotations

import pytest

from deploy.cli import DEFAULT_BOOTSTRAP, build_parser


@pytest.mark.parametrize("argv", [
    ["--bootstrap", "http://b:1", "topic", "list"],
    ["topic", "list", "--bootstrap", "http://b:1"],
    ["--bootstrap", "http://b:1", "produce", "t"],
    ["--bootstrap", "http://b:1", "group", "list"],
])
def test_bootstrap_before_or_after_the_command(argv, monkeypatch):
    monkeypatch.delenv("KRAFTLOG_URL", raising=False)
    assert build_parser().parse_args(argv).bootstrap == "http://b:1"


def test_after_the_command_wins_then_env_then_default(monkeypatch):
    monkeypatch.delenv("KRAFTLOG_URL", raising=False)
    p = build_parser()
    assert p.parse_args(["--bootstrap", "http://a:1", "topic", "list", "--bootstrap", "http://b:1"]).bootstrap == "http://b:1"
    assert p.parse_args(["topic", "list"]).bootstrap == DEFAULT_BOOTSTRAP
    monkeypatch.setenv("KRAFTLOG_URL", "http://env:9")
    assert build_parser().parse_args(["topic", "list"]).bootstrap == "http://env:9"
    assert build_parser().parse_args(["--bootstrap", "http://a:1", "topic", "list"]).bootstrap == "http://a:1"


def test_commands_without_a_broker_have_no_bootstrap():
    args = build_parser().parse_args(["cluster", "status", "--data-dir", "/tmp/x"])
    assert not hasattr(args, "bootstrap")


def test_serve_says_which_key_replaces_a_renamed_one(tmp_path, monkeypatch, capsys):
    import deploy.supervisor

    started = []

    def fake_serve(cfg):
        started.append(cfg)
        return 0

    monkeypatch.setattr(deploy.supervisor, "serve_combined", fake_serve)
    path = tmp_path / "node.toml"
    path.write_text("max_concurrent_long_polls = 7\n")
    args = build_parser().parse_args(["serve", "--config", str(path), "--http-port", "9001"])
    assert args.func(args) == 0
    assert started[0].broker.long_poll_max_requests == 7 and started[0].http_port == 9001
    err = capsys.readouterr().err
    assert "kraftlog: warning: " in err
    assert "'max_concurrent_long_polls' is deprecated, use 'long_poll_max_requests' instead" in err


def test_consume_max_records_rewinds_every_partition_of_the_unprinted_rest():
    """`kraftlog consume --max-records N` stops inside a poll that may hold records of several
    partitions: each of them resumes (and commits) at its first unprinted record, not only the
    partition of the record it stopped at (committed offsets past unprinted records lose them)."""
    from types import SimpleNamespace as R

    from deploy.cli import first_unprinted_offsets
    rest = [R(topic="gl", partition=0, offset=8), R(topic="gl", partition=1, offset=0),
            R(topic="gl", partition=1, offset=1), R(topic="gl", partition=0, offset=9)]
    assert first_unprinted_offsets(rest) == {("gl", 0): 8, ("gl", 1): 0}
