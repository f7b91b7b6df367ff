"""How long a periodic check on the event loop waits before its next run (issue 25).

The silence reporter (every 1/8 of `replica_silence_report_ms`) and the ISR loop (every
300 ms) look at the led partitions whose followers are not quiet. After a follower broker
dies that is every partition it followed, until the controller's ISR removals arrive: at
30,000 partitions the silence scan alone took 39% of a survivor's CPU during the failover,
on the loop that must also apply the new leaderships and answer the producers. A check
that took `took_s` waits at least long enough that it holds at most
`PERIODIC_CHECK_LOOP_SHARE_MAX` of the loop; a cheap check keeps its interval."""
from __future__ import annotations

import asyncio
import time

# the largest share of the event loop's time one periodic check may take
PERIODIC_CHECK_LOOP_SHARE_MAX = 0.25


def next_wait_s(interval_s: float, took_s: float, share_max: float = PERIODIC_CHECK_LOOP_SHARE_MAX) -> float:
    """The wait before the next run: `interval_s`, or longer so that a run taking `took_s`
    holds at most `share_max` of the loop (took / (took + wait) <= share_max)."""
    if took_s <= 0 or share_max >= 1:
        return interval_s
    return max(interval_s, took_s * (1 - share_max) / share_max)


# Applying a metadata change on a broker's event loop (the feed's pages parsed and replayed,
# then the replica manager's role changes) runs in slices of this much wall time with a turn
# of the loop between them. Between two slices the loop runs every other ready task once:
# after a kill -9 at 30,000 partitions that was about 170 ms of held produces, fetch
# sessions and periodic checks per turn, so a change applied in 7 ms slices (one chunk of
# 500 records or 256 partitions) took 25 times its CPU time in wall time (7.3 s for 10,003
# records), and every partition the dead broker led waited for it (issue 25).
METADATA_LOOP_SLICE_MS = 20


class LoopSlice:
    """Cooperative time slices on the event loop: call `maybe_yield()` between small steps;
    it yields (one turn of the loop) only once the current slice has run `slice_ms`."""

    def __init__(self, slice_ms: float = METADATA_LOOP_SLICE_MS) -> None:
        self.slice_s = slice_ms / 1000
        self.turns = 0
        self._end = time.perf_counter() + self.slice_s

    async def chunks(self, seq, size: int):
        """`seq` (a sliceable sequence) in slices of `size` items, with `maybe_yield()`
        between them: `async for chunk in LoopSlice().chunks(items, 512): ...`."""
        for i in range(0, len(seq), size):
            if i:
                await self.maybe_yield()
            yield seq[i:i + size]

    async def maybe_yield(self) -> bool:
        if time.perf_counter() < self._end:
            return False
        await asyncio.sleep(0)
        self.turns += 1
        self._end = time.perf_counter() + self.slice_s
        return True
