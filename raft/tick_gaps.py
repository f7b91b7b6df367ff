"""TickGapMonitor: how long the raft thread went without a tick, and how much of that a
garbage collection took.

pysyncobj's raft thread ticks every `auto_tick_period_s` (15 ms). A gap longer than the
election timeout means this node sent no heartbeat (leader) or read no message (follower)
for that long: followers elect a new leader although nothing failed. Gaps come from the
process holding the GIL (a full garbage collection, a large apply, C code such as
json.dumps) or from no CPU. `on_tick` reports each gap of `warn_s` or more together with
the collection time that fell inside it, so a log line names the cause (raft/README.md,
"Garbage collection"). Pure: no threads, no clock of its own; `gc_callback` is installed
into `gc.callbacks` by the caller.
"""
from __future__ import annotations

import time
from typing import Optional


class TickGapMonitor:
    """Invariant: `gc_s` holds the collection time since the last tick (any thread)."""

    def __init__(self, warn_s: float, clock=time.perf_counter) -> None:
        self.warn_s = warn_s
        self.clock = clock
        self.last_tick: Optional[float] = None
        self.gc_s = 0.0
        self._gc_start: Optional[float] = None
        self.gaps = 0          # gaps of warn_s or more so far
        self.max_gap_s = 0.0

    def gc_callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_start = self.clock()
        elif self._gc_start is not None:
            self.gc_s += self.clock() - self._gc_start
            self._gc_start = None

    def on_tick(self, now: Optional[float] = None) -> Optional[tuple]:
        """Call once per raft tick. Returns (gap_s, gc_s) when the gap since the previous
        tick was `warn_s` or more, else None."""
        now = self.clock() if now is None else now
        last, self.last_tick = self.last_tick, now
        in_gc, self.gc_s = self.gc_s, 0.0
        if last is None or now - last < self.warn_s:
            return None
        gap = now - last
        self.gaps += 1
        self.max_gap_s = max(self.max_gap_s, gap)
        return gap, in_gc
