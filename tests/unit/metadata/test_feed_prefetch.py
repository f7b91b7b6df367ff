"""The metadata follower fetches the next feed page while it applies the current one when the
controller has it committed (issue 25: a fencing of 33,335 records at 100,000 partitions is
seven pages; fetched one after another's apply, they took 1.4 s to reach a survivor)."""
from __future__ import annotations

import asyncio

from metadata_quorum.client import MetadataFollower
from tests.unit.metadata.metadata_harness import Harness


class _SlowPagedFeed:
    """A controller feed of `sm`'s records in pages of `page` records, each answer `delay_s`
    late; notes (after, broker_id, the follower's next offset when asked) per request."""

    def __init__(self, sm, page: int, delay_s: float = 0.01, gap_at: int | None = None) -> None:
        self.sm, self.page, self.delay_s, self.gap_at = sm, page, delay_s, gap_at
        self.follower: MetadataFollower | None = None
        self.requests: list = []
        self._changed = asyncio.Event()   # the active controller never changes here

    def active_changed(self) -> asyncio.Event:
        return self._changed

    async def metadata_records(self, after, max_wait_ms=0, max_records=None, broker_id=None):
        self.requests.append((after, broker_id, self.follower.feed.next_offset))
        await asyncio.sleep(self.delay_s)
        records = self.sm.records_since(after, self.page)
        if self.gap_at is not None and records and records[0]["offset"] < self.gap_at < records[-1]["offset"]:
            records = [r for r in records if r["offset"] != self.gap_at]   # a torn answer, once
            self.gap_at = None
        if not records and max_wait_ms:
            await asyncio.sleep(max_wait_ms / 1000)
        return {"cluster_id": "c", "records": records, "metadata_offset": self.sm.image.offset}


def _run_until_caught_up(follower: MetadataFollower, sm, timeout_s: float = 10.0) -> None:
    async def go():
        task = asyncio.ensure_future(follower.run())
        try:
            await asyncio.wait_for(_wait(follower, sm.image.offset), timeout_s)
        finally:
            follower.stop()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    asyncio.run(go())


async def _wait(follower: MetadataFollower, offset: int) -> None:
    while follower.image.offset < offset:
        await asyncio.sleep(0.005)


def test_the_next_page_is_fetched_while_the_current_one_is_applied():
    h = Harness()
    h.create("big", partitions=1500, rf=3)   # one change of 1,501 records, in 4 pages of 400
    feed = _SlowPagedFeed(h.sm, 400)
    applied: list = []
    follower = MetadataFollower(feed, lambda image, records: applied.append(image.offset), max_wait_ms=50,
                                broker_id=7)
    feed.follower = follower
    _run_until_caught_up(follower, h.sm)
    assert follower.image.partition_count() == 1500
    assert follower.image.offset == h.sm.image.offset
    ahead = [(after, who) for after, who, next_offset in feed.requests if after > next_offset]
    # every page after the first was asked for before the one before it was taken in
    assert [after for after, _ in ahead] == [400, 800, 1200], feed.requests
    # ... by requests that do not claim the broker has those records (the controller's ISR
    # removals wait counts what a broker applied: its regular requests)
    assert all(who is None for _, who in ahead), feed.requests
    assert all(who == 7 for after, who, next_offset in feed.requests if after == next_offset), feed.requests
    # each record was taken in once: one request per page, no page fetched twice
    afters = [after for after, _, _ in feed.requests if after < h.sm.image.offset]
    assert len(afters) == len(set(afters)), feed.requests


def test_no_prefetch_once_caught_up():
    h = Harness()
    h.create("small", partitions=10, rf=3)
    feed = _SlowPagedFeed(h.sm, 400)
    follower = MetadataFollower(feed, None, max_wait_ms=20, broker_id=7)
    feed.follower = follower

    async def go():
        task = asyncio.ensure_future(follower.run())
        await asyncio.wait_for(_wait(follower, h.sm.image.offset), 5)
        await asyncio.sleep(0.2)   # a few long polls at the end of the feed
        follower.stop()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    asyncio.run(go())
    end = h.sm.image.offset
    polls = [r for r in feed.requests if r[0] == end]
    assert len(polls) >= 3, feed.requests
    assert all(who == 7 and after == next_offset for after, who, next_offset in feed.requests), feed.requests


def test_a_prefetched_page_that_no_longer_continues_the_feed_is_dropped():
    h = Harness()
    h.create("big", partitions=1500, rf=3)
    start = h.sm.image.offset - 1501
    feed = _SlowPagedFeed(h.sm, 400, gap_at=start + 200)   # the first page of the change misses a record
    seen: list = []
    follower = MetadataFollower(feed, lambda image, records: seen.append(len(records or ())), max_wait_ms=50,
                                broker_id=7)
    feed.follower = follower
    _run_until_caught_up(follower, h.sm)
    assert follower.image.partition_count() == 1500
    assert follower.image.offset == h.sm.image.offset
    assert sum(seen) == h.sm.image.offset   # every record applied exactly once, none skipped
    # the follower asked again from the record the torn answer lacked
    assert any(after == start + 200 and who == 7 for after, who, _ in feed.requests), feed.requests


def test_cancelling_the_follower_while_it_waits_for_a_prefetch_stops_it():
    h = Harness()
    h.create("big", partitions=1500, rf=3)
    feed = _SlowPagedFeed(h.sm, 400, delay_s=10)   # every answer takes long: the prefetch is awaited
    follower = MetadataFollower(feed, None, max_wait_ms=50, broker_id=7)
    feed.follower = follower

    async def go():
        feed.delay_s = 0.01
        task = asyncio.ensure_future(follower.run())
        while len(feed.requests) < 1:
            await asyncio.sleep(0.005)
        feed.delay_s = 10           # the prefetch of page 2 hangs
        while len(feed.requests) < 2:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.05)   # page 1 taken in: run() now awaits the prefetch
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=2)
        assert task in done and task.cancelled()   # not swallowed: run() ended
    asyncio.run(go())
