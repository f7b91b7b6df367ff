"""Integration-test fixtures: background clients a test started are stopped after it."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import replication_helpers  # noqa: E402


@pytest.fixture(autouse=True)
def stop_background_clients():
    """Stops the BackgroundProducer/BackgroundConsumer threads a test left running (it failed
    before its own stop()), before the leak guard of tests/conftest.py looks for threads."""
    yield
    replication_helpers.stop_all()
