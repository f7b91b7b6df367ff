"""`LoopTurns`: counts turns of the running event loop, for tests that check a long walk
yields to the loop between chunks (issue 25)."""
from __future__ import annotations

import asyncio


class LoopTurns:
    """`async with LoopTurns() as turns:` runs a task that yields forever; `turns.count` is
    how many times it has run so far (a walk that never yields leaves it unchanged)."""

    def __init__(self) -> None:
        self.count = 0
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        while True:
            self.count += 1
            await asyncio.sleep(0)

    async def __aenter__(self) -> "LoopTurns":
        self._task = asyncio.create_task(self._run())
        await asyncio.sleep(0)
        return self

    async def __aexit__(self, *exc) -> None:
        self._task.cancel()
