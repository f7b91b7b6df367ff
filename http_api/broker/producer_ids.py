"""Producer ids for idempotent producers, handed out by a broker from controller blocks."""
from __future__ import annotations

import asyncio

from partitions.errors import ErrorCode, KraftlogError


class ProducerIdAllocator:
    """Hands out producer ids from blocks the controller allocates to this broker
    (`POST /controller/v1/producer-ids`, fenced by broker epoch); one block request at a time."""

    def __init__(self, client, broker_id: int, broker_epoch) -> None:
        self.client = client
        self.broker_id = broker_id
        self.broker_epoch = broker_epoch
        self._next = 0
        self._end = 0
        self._lock = asyncio.Lock()

    async def next(self) -> int:
        async with self._lock:
            if self._next >= self._end:
                epoch = self.broker_epoch()
                if epoch is None:
                    raise KraftlogError(ErrorCode.BROKER_NOT_AVAILABLE,
                                        "this broker has not registered with the controllers yet; retry shortly")
                first, size = await self.client.allocate_producer_ids(self.broker_id, epoch)
                self._next, self._end = first, first + size
            pid = self._next
            self._next += 1
            return pid
