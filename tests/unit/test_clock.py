"""The injected clock: SYSTEM_CLOCK reads the machine, ManualClock moves only when told."""
from __future__ import annotations

import pickle
import time

import pytest

from partitions.clock import SYSTEM_CLOCK, Clock, ManualClock


def test_system_clock_reads_wall_and_monotonic_time():
    before = int(time.time() * 1000)
    now = SYSTEM_CLOCK.now_ms()
    after = int(time.time() * 1000)
    assert before <= now <= after
    m1 = SYSTEM_CLOCK.monotonic_ms()
    m2 = SYSTEM_CLOCK.monotonic_ms()
    assert isinstance(m1, int) and m1 <= m2


def test_both_clocks_satisfy_the_protocol():
    assert isinstance(SYSTEM_CLOCK, Clock)
    assert isinstance(ManualClock(), Clock)


def test_manual_clock_moves_only_when_told():
    clock = ManualClock(10_000)
    assert clock.now_ms() == 10_000 and clock.monotonic_ms() == 0
    assert clock.advance(250) == 10_250
    assert (clock.now_ms(), clock.monotonic_ms()) == (10_250, 250)
    clock.set_ms(11_000)
    assert (clock.now_ms(), clock.monotonic_ms()) == (11_000, 1_000)
    clock.set_ms(9_000)  # a wall-clock step back leaves the monotonic clock where it was
    assert (clock.now_ms(), clock.monotonic_ms()) == (9_000, 1_000)
    with pytest.raises(ValueError, match="set_ms"):
        clock.advance(-1)


def test_system_clock_pickles_to_the_same_object():
    assert pickle.loads(pickle.dumps(SYSTEM_CLOCK)) is SYSTEM_CLOCK
    manual = pickle.loads(pickle.dumps(ManualClock(42)))
    assert manual.now_ms() == 42
