"""Fixtures for functional tests: in-process brokers (see broker_harness.py)."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from broker_harness import running_broker  # noqa: E402
from fake_controller import FakeControllerClient  # noqa: E402


@pytest.fixture
async def broker(tmp_path):
    async with running_broker(tmp_path, FakeControllerClient()) as h:
        yield h


@pytest.fixture
async def two_brokers(tmp_path):
    controller = FakeControllerClient()
    async with running_broker(tmp_path, controller, 1) as b1, running_broker(tmp_path, controller, 2) as b2:
        yield b1, b2
