"""Synchronous wrappers (`SyncProducer`, `SyncConsumer`, `SyncAdminClient`): the asyncio
clients run on an event loop in a daemon thread."""
from __future__ import annotations

import asyncio
import threading
from typing import Any

from http_api.client.admin import AdminClient
from http_api.client.columns import RecordColumns
from http_api.client.consumer import Consumer, ConsumerRecord
from http_api.client.producer import Producer

class _LoopThread:
    """An event loop in a daemon thread, for the sync wrappers."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="kraftlog-client")
        self.thread.start()

    def run(self, coro, timeout: float | None = None):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


class _SyncWrapper:
    _factory: Any = None

    def __init__(self, *args, **kwargs) -> None:
        self._lt = _LoopThread()

        async def make():
            return self._factory(*args, **kwargs)
        self._inner = self._lt.run(make())

    def close(self) -> None:
        try:
            self._lt.run(self._inner.close())
        finally:
            self._lt.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class SyncProducer(_SyncWrapper):
    """Blocking Producer: `send(...)` returns a concurrent future; `flush()` waits for all."""

    _factory = Producer

    def send(self, topic, value, key=None, headers=None, partition=None, timestamp=None):
        async def go():
            fut = await self._inner.send(topic, value, key, headers, partition, timestamp)
            return asyncio.ensure_future(_await(fut))
        task = self._lt.run(go())
        return asyncio.run_coroutine_threadsafe(_await(task), self._lt.loop)

    def flush(self) -> None:
        self._lt.run(self._inner.flush())


async def _await(fut):
    return await fut


class SyncConsumer(_SyncWrapper):
    """Blocking Consumer."""

    _factory = Consumer

    def assign(self, partitions) -> None:
        self._inner.assign(partitions)

    def subscribe(self, topics) -> None:
        self._lt.run(self._inner.subscribe(topics))

    def poll(self, timeout_ms: int | None = None) -> list[ConsumerRecord]:
        return self._lt.run(self._inner.poll(timeout_ms))

    def poll_columns(self, timeout_ms: int | None = None) -> list[RecordColumns]:
        return self._lt.run(self._inner.poll_columns(timeout_ms))

    def position(self, tp) -> int:
        return self._lt.run(self._inner.position(tp))

    def seek(self, tp, offset: int) -> None:
        self._lt.loop.call_soon_threadsafe(self._inner.seek, tp, offset)

    def commit(self, offsets=None) -> None:
        self._lt.run(self._inner.commit(offsets))


class SyncAdminClient(_SyncWrapper):
    """Blocking AdminClient."""

    _factory = AdminClient

    def create_topic(self, name, partitions=1, replication_factor=1, configs=None) -> dict:
        return self._lt.run(self._inner.create_topic(name, partitions, replication_factor, configs))

    def list_topics(self) -> list[str]:
        return self._lt.run(self._inner.list_topics())

    def describe_topic(self, name) -> dict:
        return self._lt.run(self._inner.describe_topic(name))

    def delete_topic(self, name) -> None:
        self._lt.run(self._inner.delete_topic(name))

    def metadata(self) -> dict:
        return self._lt.run(self._inner.metadata())
