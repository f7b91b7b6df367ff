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
