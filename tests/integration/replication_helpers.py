"""Shared pieces of the replication integration tests: a background producer that records
every acknowledged write, and checks that they all survived exactly once, in order."""
from __future__ import annotations

import asyncio
import threading
import time

from http_api.client import Producer


class BackgroundProducer:
    """Writes `p-i` values to each partition (one at a time per partition, acks=all,
    idempotent Python Producer) in a thread until `stop()`; `acked[p]` = [(offset, value,
    ack time)], `errors` = exceptions of writes that were not acknowledged."""

    def __init__(self, urls: list[str], topic: str, partitions: list[int], **producer_kw) -> None:
        self.urls = urls
        self.topic = topic
        self.partitions = partitions
        self.producer_kw = dict(acks="all", linger_ms=1, **producer_kw)
        self.acked: dict[int, list[tuple[int, str, float]]] = {p: [] for p in partitions}
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self.started_at = 0.0

    def start(self) -> "BackgroundProducer":
        self.started_at = time.monotonic()
        self._thread.start()
        return self

    def count(self) -> int:
        return sum(len(v) for v in self.acked.values())

    def wait_acked(self, n: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.count() < n:
            assert time.monotonic() < deadline, f"only {self.count()} writes acknowledged, errors {self.errors[:3]}"
            time.sleep(0.02)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(120)
        assert not self._thread.is_alive(), "producer thread did not stop"

    async def _main(self) -> None:
        async with Producer(self.urls, **self.producer_kw) as producer:
            await asyncio.gather(*(self._one(producer, p) for p in self.partitions))

    async def _one(self, producer: Producer, p: int) -> None:
        i = 0
        while not self._stop.is_set():
            value = f"{p}-{i}"
            i += 1
            try:
                fut = await producer.send(self.topic, value, partition=p)
                md = await fut
                self.acked[p].append((md.offset, value, time.monotonic()))
            except Exception as e:  # noqa: BLE001 - recorded: an unacknowledged write may be lost
                self.errors.append(e)
                await asyncio.sleep(0.05)

    def longest_gap_s(self, p: int) -> float:
        """Longest time between consecutive acknowledgements of partition p."""
        times = [self.started_at] + [t for _, _, t in self.acked[p]]
        return max(b - a for a, b in zip(times, times[1:])) if len(times) > 1 else 0.0


def assert_acked_exactly_once_in_order(acked: list[tuple[int, str, float]], log: list[tuple[int, str]]) -> None:
    """Every acknowledged value is in the log once, at the offset it was acknowledged with,
    and the acknowledged values appear in the order they were acknowledged."""
    by_value: dict[str, list[int]] = {}
    for offset, value in log:
        by_value.setdefault(value, []).append(offset)
    for offset, value, _ in acked:
        assert by_value.get(value) == [offset], f"{value!r} acked at {offset}, in the log at {by_value.get(value)}"
    offsets = [o for o, _, _ in acked]
    assert offsets == sorted(offsets), "acknowledged writes out of order"
    logged = [o for o, _ in log]
    assert logged == sorted(set(logged)), "log offsets not strictly increasing"


class BackgroundConsumer:
    """Polls one partition from the beginning with the Python Consumer (which follows the
    leader through metadata refreshes) until `stop()`; `records` = [(offset, value)]."""

    def __init__(self, urls: list[str], topic: str, partition: int) -> None:
        self.urls, self.topic, self.partition = urls, topic, partition
        self.records: list[tuple[int, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def start(self) -> "BackgroundConsumer":
        self._thread.start()
        return self

    def wait_offset(self, offset: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self.records or self.records[-1][0] < offset:
            assert time.monotonic() < deadline, f"consumer at {self.records[-1:]} not at {offset}"
            time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)

    async def _main(self) -> None:
        from http_api.client import Consumer
        async with Consumer(self.urls, auto_offset_reset="earliest", max_wait_ms=200) as c:
            c.assign([(self.topic, self.partition)])
            while not self._stop.is_set():
                try:
                    for r in await c.poll(200):
                        self.records.append((r.offset, r.value.decode()))
                except Exception:  # noqa: BLE001 - leader gone: the consumer refreshes metadata
                    await asyncio.sleep(0.05)
