"""TickGapMonitor (raft/tick_gaps.py): a late raft tick is reported with the garbage
collection time inside it; on-time ticks are not."""
import gc

from raft.tick_gaps import TickGapMonitor


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_a_gap_over_the_threshold_is_reported_with_its_gc_time():
    clock = Clock()
    m = TickGapMonitor(0.3, clock=clock)
    assert m.on_tick() is None                 # first tick: nothing to compare with
    clock.t += 0.015
    assert m.on_tick() is None                 # on time
    clock.t += 0.1
    m.gc_callback("start", {"generation": 2})
    clock.t += 0.45                            # a full collection of 450 ms
    m.gc_callback("stop", {"generation": 2})
    clock.t += 0.05
    gap, in_gc = m.on_tick()
    assert round(gap, 3) == 0.6 and round(in_gc, 3) == 0.45
    assert m.gaps == 1 and round(m.max_gap_s, 3) == 0.6
    clock.t += 0.29
    assert m.on_tick() is None                 # under the threshold; GC time was reset by the last tick
    assert m.gc_s == 0.0


def test_real_collections_are_timed_through_gc_callbacks():
    m = TickGapMonitor(0.0)
    gc.callbacks.append(m.gc_callback)
    try:
        m.on_tick()
        junk = [[i] for i in range(200_000)]
        gc.collect()
        del junk
        gap, in_gc = m.on_tick()
    finally:
        gc.callbacks.remove(m.gc_callback)
    assert 0 < in_gc <= gap
