"""Work on many partitions in one request without holding the event loop (issue 25).

A produce request naming thousands of partitions (a Kafka client's batch after a failover,
`POST /v1/topics/{t}/records` with records for every partition) used to start one task per
partition with `asyncio.gather`: all of them take their first step in the same turn of the
loop, so at 3,334 partitions that turn held the loop 1.2-1.5 s (heartbeats, replica fetch
answers and `/healthz` waited behind it, and the controller's silence probe could take the
broker for stopped). `gather_in_slices` starts them `slice_size` at a time with a turn of the
loop between slices; they still run concurrently (an acks=all wait overlaps the others).

The slice is the loop's, not the request's: every request of a turn draws on one budget of
`slice_size` starts (`_TurnBudget`). After a kill -9 at 100,000 partitions a Kafka-style
client sends a request of 200 partitions for each of thousands of partitions at once; 167
requests each starting its own slice of 128 in the same turn held a survivor's loop 1.3 s
before the fencing arrived, and the feed's pages waited behind it (issue 25).
"""
from __future__ import annotations

import asyncio
import weakref
from typing import Awaitable, Callable, Iterable, TypeVar

T = TypeVar("T")
R = TypeVar("R")

# partitions of one request whose work starts in the same turn of the event loop
REQUEST_SLICE_PARTITIONS = 128


class _TurnBudget:
    """Starts made in the current turn of one event loop, by every `gather_in_slices` of
    it. Invariant: `used` counts the starts since the last turn began; a reset callback is
    pending whenever `used` > 0 (it runs first in the next turn: it was queued before the
    steps of the tasks started in this one)."""

    __slots__ = ("used", "_reset_pending", "__weakref__")

    def __init__(self) -> None:
        self.used = 0
        self._reset_pending = False

    def spend(self, loop: asyncio.AbstractEventLoop) -> None:
        self.used += 1
        if not self._reset_pending:
            self._reset_pending = True
            loop.call_soon(self._reset)

    def _reset(self) -> None:
        self.used = 0
        self._reset_pending = False


_budgets: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _TurnBudget]" = weakref.WeakKeyDictionary()


def _budget(loop: asyncio.AbstractEventLoop) -> _TurnBudget:
    b = _budgets.get(loop)
    if b is None:
        b = _budgets[loop] = _TurnBudget()
    return b


async def gather_in_slices(make: Callable[[T], Awaitable[R]], items: Iterable[T],
                           slice_size: int = REQUEST_SLICE_PARTITIONS) -> list[R]:
    """`asyncio.gather(*(make(i) for i in items))`, results in order, but at most
    `slice_size` awaitables are started per turn of the event loop by all the calls of that
    turn together (see the module docstring). A cancellation cancels every started one (as
    gather does); exceptions propagate as gather's."""
    loop = asyncio.get_running_loop()
    budget = _budget(loop)
    tasks: list[asyncio.Future] = []
    try:
        for item in items:
            while budget.used >= slice_size:
                await asyncio.sleep(0)   # the loop serves other requests between slices
            budget.spend(loop)
            tasks.append(asyncio.ensure_future(make(item)))
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        raise
