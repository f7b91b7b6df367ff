"""Work on many partitions in one request without holding the event loop (issue 25).

A produce request naming thousands of partitions (a Kafka client's batch after a failover,
`POST /v1/topics/{t}/records` with records for every partition) used to start one task per
partition with `asyncio.gather`: all of them take their first step in the same turn of the
loop, so at 3,334 partitions that turn held the loop 1.2-1.5 s (heartbeats, replica fetch
answers and `/healthz` waited behind it, and the controller's silence probe could take the
broker for stopped). `gather_in_slices` starts them `slice_size` at a time with a turn of the
loop between slices; they still run concurrently (an acks=all wait overlaps the others).
"""
from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, Iterable, TypeVar

T = TypeVar("T")
R = TypeVar("R")

# partitions of one request whose work starts in the same turn of the event loop
REQUEST_SLICE_PARTITIONS = 128


async def gather_in_slices(make: Callable[[T], Awaitable[R]], items: Iterable[T],
                           slice_size: int = REQUEST_SLICE_PARTITIONS) -> list[R]:
    """`asyncio.gather(*(make(i) for i in items))`, results in order, but the awaitables are
    started `slice_size` at a time with a turn of the event loop between slices. A
    cancellation cancels every started one (as gather does); exceptions propagate as gather's."""
    tasks: list[asyncio.Future] = []
    try:
        for n, item in enumerate(items):
            if n and n % slice_size == 0:
                await asyncio.sleep(0)   # the loop serves other requests between slices
            tasks.append(asyncio.ensure_future(make(item)))
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        raise
