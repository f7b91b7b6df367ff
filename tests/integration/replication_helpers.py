"""Shared pieces of the replication integration tests: a background producer that records
every acknowledged write, and checks that they all survived exactly once, in order.

Every started background client is registered until it is stopped; `stop_all()` (called by
the autouse fixture in tests/integration/conftest.py after each test) stops the ones a
failing test left behind, so no client thread outlives its test."""
from __future__ import annotations

import asyncio
import threading
import time

from http_api.client import Producer

_running: list["_BackgroundClient"] = []


def stop_all(grace_s: float = 5.0) -> None:
    """Stop every background client still running, cancelling what does not finish within
    `grace_s` (the first error is raised after all stopped)."""
    error: BaseException | None = None
    while _running:
        try:
            _running[-1].stop(grace_s)
        except BaseException as e:  # noqa: BLE001 - stop the others first
            error = error or e
    if error is not None:
        raise error


class _BackgroundClient:
    """An asyncio client in a thread of its own: `start()`, then `stop()` -- which asks the
    loop to finish, and cancels it after `stop_grace_s` (a request hanging on a dead broker)."""

    stop_grace_s = 30.0

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=type(self).__name__)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None

    def start(self):
        _running.append(self)
        self._thread.start()
        return self

    def _run(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._task = asyncio.current_task()
            await self._main()
        try:
            asyncio.run(main())
        except asyncio.CancelledError:
            pass

    async def _main(self) -> None:
        raise NotImplementedError

    def stop(self, grace_s: float | None = None) -> None:
        self._stop.set()
        try:
            if self._thread.ident is not None:
                self._thread.join(self.stop_grace_s if grace_s is None else grace_s)
                if self._thread.is_alive() and self._loop is not None and self._task is not None:
                    try:
                        self._loop.call_soon_threadsafe(self._task.cancel)
                    except RuntimeError:   # the loop closed meanwhile: the thread is ending
                        pass
                    self._thread.join(30)
            assert not self._thread.is_alive(), f"{self._thread.name} thread did not stop"
        finally:
            if self in _running:
                _running.remove(self)


class BackgroundProducer(_BackgroundClient):
    """Writes `p-i` values to each partition (one at a time per partition, acks=all,
    idempotent Python Producer) in a thread until `stop()`; `acked[p]` = [(offset, value,
    ack time)], `errors` = exceptions of writes that were not acknowledged."""

    def __init__(self, urls: list[str], topic: str, partitions: list[int], **producer_kw) -> None:
        super().__init__()
        self.urls = urls
        self.topic = topic
        self.partitions = partitions
        self.producer_kw = dict(acks="all", linger_ms=1, **producer_kw)
        self.acked: dict[int, list[tuple[int, str, float]]] = {p: [] for p in partitions}
        self.errors: list[BaseException] = []
        self.started_at = 0.0

    def start(self) -> "BackgroundProducer":
        self.started_at = time.monotonic()
        return super().start()

    def count(self) -> int:
        return sum(len(v) for v in self.acked.values())

    def wait_acked(self, n: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.count() < n:
            assert time.monotonic() < deadline, f"only {self.count()} writes acknowledged, errors {self.errors[:3]}"
            time.sleep(0.02)

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


class BackgroundConsumer(_BackgroundClient):
    """Polls one partition from the beginning with the Python Consumer (which follows the
    leader through metadata refreshes) until `stop()`; `records` = [(offset, value)]."""

    def __init__(self, urls: list[str], topic: str, partition: int) -> None:
        super().__init__()
        self.urls, self.topic, self.partition = urls, topic, partition
        self.records: list[tuple[int, str]] = []

    def wait_offset(self, offset: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self.records or self.records[-1][0] < offset:
            assert time.monotonic() < deadline, f"consumer at {self.records[-1:]} not at {offset}"
            time.sleep(0.05)

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


class BackgroundGroupConsumer(_BackgroundClient):
    """A group member (the Python Consumer, subscribed to `topics`, from the earliest offset)
    polling until `stop()`; `values` = every record value it received (retriable errors
    during a move or a failover are recorded in `errors` and polling goes on)."""

    def __init__(self, url: str | list[str], group_id: str, topics: list[str]) -> None:
        super().__init__()
        self.url, self.group_id, self.topics = url, group_id, topics
        self.values: set[str] = set()
        self.errors: list[BaseException] = []

    async def _main(self) -> None:
        from http_api.client import Consumer
        consumer = Consumer(self.url, group_id=self.group_id, auto_offset_reset="earliest", max_wait_ms=200,
                            session_timeout_ms=10_000, metadata_max_age_ms=2_000)
        try:
            await consumer.subscribe(self.topics)
            while not self._stop.is_set():
                try:
                    for rec in await consumer.poll(200):
                        v = rec.value
                        self.values.add(v.decode() if isinstance(v, bytes) else v)
                except Exception as e:  # noqa: BLE001 - a move or failover answers retriable errors
                    self.errors.append(e)
                    await asyncio.sleep(0.2)
        finally:
            await consumer.close()

    def wait_consumed(self, producers: list[BackgroundProducer], timeout: float) -> None:
        """Every value the producers had acknowledged is consumed (0 lost to the group)."""
        want = {v for prod in producers for acked in prod.acked.values() for _, v, _ in acked}
        deadline = time.monotonic() + timeout
        while not want <= self.values:
            assert time.monotonic() < deadline, (f"{len(want - self.values)} acknowledged records never consumed "
                                                 f"by group {self.group_id} (errors {self.errors[-3:]})")
            time.sleep(0.2)


def longest_gaps_s(prod: BackgroundProducer, since: float | None = None,
                   until: float | None = None) -> dict[int, float]:
    """Per partition, the longest time without an acknowledged write within [since, until]
    (default: from the producer's start to its last acknowledgement): issue 17's
    unavailability figure."""
    out = {}
    for p, acked in prod.acked.items():
        lo = prod.started_at if since is None else since
        times = [t for _, _, t in acked if t >= lo and (until is None or t <= until)]
        edges = [lo] + times + ([until] if until is not None else [])
        out[p] = round(max((b - a for a, b in zip(edges, edges[1:])), default=0.0), 2)
    return out
