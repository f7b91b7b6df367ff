"""Fixtures for the partition log tests."""
from __future__ import annotations

import pytest
from logtest_helpers import FakeClock


@pytest.fixture
def clock():
    return FakeClock()
