"""Throttler (log.cleaner.io.max.bytes.per.second) on a fake clock."""
from __future__ import annotations

import math

from partitions.log.throttler import Throttler


class FakeTime:
    def __init__(self):
        self.now = 0.0
        self.slept = []

    def clock(self):
        return self.now

    def sleep(self, s):
        self.slept.append(s)
        self.now += s


def test_a_stream_faster_than_the_limit_is_slowed_to_it():
    t = FakeTime()
    th = Throttler(1_000_000, check_interval_ms=100, clock=t.clock, sleep=t.sleep)
    sent = 0
    for _ in range(1000):          # 100 KB every 10 ms = 10 MB/s offered
        t.now += 0.01
        th.maybe_throttle(100_000)
        sent += 100_000
    rate = sent / t.now
    assert 0.95e6 <= rate <= 1.01e6 and th.throttled_s > 0.8 * t.now   # the last, open period is not slowed


def test_a_stream_under_the_limit_never_sleeps():
    t = FakeTime()
    th = Throttler(10_000_000, check_interval_ms=100, clock=t.clock, sleep=t.sleep)
    for _ in range(1000):          # 1 MB/s offered
        t.now += 0.01
        th.maybe_throttle(10_000)
    assert t.slept == [] and th.throttled_s == 0


def test_no_limit():
    t = FakeTime()
    for limit in (-1, 0, math.inf):
        th = Throttler(limit, clock=t.clock, sleep=t.sleep)
        for _ in range(100):
            t.now += 0.001
            th.maybe_throttle(10**9)
        assert not th.enabled and t.slept == []
