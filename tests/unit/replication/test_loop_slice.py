"""LoopSlice (partitions/replication/loop_share.py, issue 25): a broker applies a metadata
change in slices of METADATA_LOOP_SLICE_MS of wall time, one turn of the event loop between
them, instead of one turn per small chunk: after a kill -9 at 30,000 partitions every turn
let about 170 ms of other work run, so 7 ms chunks made the fencing's apply 25 times its CPU
time while every partition the dead broker led waited for it."""
from __future__ import annotations

import asyncio

from partitions.replication import loop_share
from partitions.replication.loop_share import METADATA_LOOP_SLICE_MS, LoopSlice
from tests.unit.replication.loop_turns import LoopTurns


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_it_yields_once_per_slice_of_wall_time(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(loop_share.time, "perf_counter", clock)
    turns = LoopSlice(20)
    yielded = []
    for _ in range(40):          # 40 steps of 5 ms: 200 ms of work
        clock.now += 0.0050001   # (a hair over 5 ms: float sums)
        yielded.append(await turns.maybe_yield())
    assert sum(yielded) == 10 and turns.turns == 10            # one turn per 20 ms
    assert yielded[:4] == [False, False, False, True]


async def test_a_long_walk_still_lets_the_loop_run_between_slices():
    async with LoopTurns() as loop_turns:
        start = loop_turns.count
        turns = LoopSlice()
        deadline = asyncio.get_running_loop().time() + 5 * METADATA_LOOP_SLICE_MS / 1000
        while asyncio.get_running_loop().time() < deadline:   # busy, as an apply is
            sum(range(2000))
            await turns.maybe_yield()
        assert turns.turns >= 3
        assert loop_turns.count - start >= turns.turns - 1      # the other task ran at each yield
