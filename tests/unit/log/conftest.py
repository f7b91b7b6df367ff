"""Fixtures for the partition log tests."""
from __future__ import annotations

import pytest

from partitions.clock import ManualClock


@pytest.fixture
def clock():
    return ManualClock()


@pytest.fixture(scope="module")
def no_fsync():
    """Make fsync/fdatasync no-ops for a module whose tests reopen logs hundreds of times
    (they test recovery logic, not the disk; fsync dominated their run time)."""
    import os

    import partitions.log.segment as segment

    saved = (segment._fdatasync, os.fsync)
    segment._fdatasync = lambda fd: None
    os.fsync = lambda fd: None
    try:
        yield
    finally:
        segment._fdatasync, os.fsync = saved
