"""Fixtures for functional tests: in-process brokers (see broker_harness.py)."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from broker_harness import start_broker, stop_broker  # noqa: E402
from fake_controller import FakeControllerClient  # noqa: E402


@pytest.fixture
async def broker(tmp_path):
    controller = FakeControllerClient()
    h = await start_broker(tmp_path, controller)
    yield h
    await stop_broker(h)


@pytest.fixture
async def two_brokers(tmp_path):
    controller = FakeControllerClient()
    b1 = await start_broker(tmp_path, controller, 1)
    b2 = await start_broker(tmp_path, controller, 2)
    yield b1, b2
    for h in (b1, b2):
        await stop_broker(h)
