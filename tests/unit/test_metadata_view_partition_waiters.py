"""MetadataView.partition_change (issue 25): a produce waiting for a partition's new leader
is woken by an update that touches that partition, not by every update (after a kill -9 at
30,000 partitions each of ~30 ISR updates woke 10,000 waiting produces)."""
import asyncio
from types import SimpleNamespace

from http_api.broker.metadata_view import MetadataView
from http_api.broker.produce import ProduceRoutes
from http_api.wire.errors import ErrorCode, KraftlogError
from metadata_quorum.feed import ChangeInfo
from metadata_quorum.records import FenceBrokerRecord, PartitionChangeRecord
from metadata_quorum.security.image import SecurityImage


def change(topic: str, partition: int) -> PartitionChangeRecord:
    return PartitionChangeRecord(topic, "id", partition, (1, 2), (2,), 2, 1, 1)


class FeedImage:
    """What update() reads of a feed-made image: its offset, security and change records."""

    def __init__(self, offset: int, records: list) -> None:
        self.offset = offset
        self.security = SecurityImage()
        self.feed_change = ChangeInfo(offset - len(records), records, None)


class AppliesNothing:
    async def apply_metadata(self, image, changed=None) -> None:
        pass


async def test_only_the_touched_partitions_waiters_wake():
    view = MetadataView(replica_manager=None)
    a = view.partition_change("t", 0, 10)
    b = view.partition_change("t", 1, 10)
    view._wake_partition_waiters([change("t", 0), change("u", 1)])
    await asyncio.sleep(0)
    assert a.done() and not b.done()
    assert list(view._partition_waiters) == [("t", 1)]
    view._wake_partition_waiters([FenceBrokerRecord(1, 3)])   # may move any route: all wake
    await asyncio.sleep(0)
    assert b.done() and view._partition_waiters == {}


async def test_an_expired_or_cancelled_waiter_leaves_nothing_behind():
    view = MetadataView(replica_manager=None)
    f = view.partition_change("t", 0, 0.01)
    g = view.partition_change("t", 0, 10)
    await asyncio.wait_for(f, 1)
    assert view._partition_waiters == {("t", 0): [g]}
    g.cancel()
    await asyncio.sleep(0)
    assert view._partition_waiters == {}


async def test_a_produce_for_a_dead_leader_retries_on_its_partitions_change_only():
    attempts = []
    leader = {"id": 1}
    view = MetadataView(replica_manager=AppliesNothing())

    class Routes(ProduceRoutes):
        async def _append_once(self, topic, partition, payload, acks):
            attempts.append(leader["id"])
            if leader["id"] == 1:
                return KraftlogError(ErrorCode.BROKER_NOT_AVAILABLE, "refused", refused=True)
            return 7

    rm = SimpleNamespace(leads=lambda key: False, leader_info=lambda t, p: (leader["id"], f"http://b{leader['id']}"))
    ctx = SimpleNamespace(config=SimpleNamespace(request_timeout_ms=30_000),
                          deps=SimpleNamespace(metadata=view), rm=rm, metrics=None)
    routes = Routes(ctx)
    offset = 0
    task = asyncio.ensure_future(routes._append_anywhere("t", 0, [b"x"], 1))
    await asyncio.sleep(0.05)
    for p in range(1, 30):                      # other partitions' ISR changes: not woken
        offset += 1
        await view.update(FeedImage(offset, [change("t", p)]))
        await asyncio.sleep(0)
    assert attempts == [1] and not task.done()
    leader["id"] = 2                            # the fencing moved this partition
    await view.update(FeedImage(offset + 1, [change("t", 0)]))
    assert await asyncio.wait_for(task, 0.5) == 7
    assert attempts == [1, 2]


async def test_thousands_of_waiters_are_woken_a_slice_per_turn_of_the_loop():
    """After a fencing a new leader wakes every produce held for its partitions; each one
    appends before it awaits. Woken at once they held the loop for seconds (16,667 at
    100,000 partitions): a slice per turn lets I/O callbacks run in between."""
    from http_api.broker.metadata_view import WAKE_SLICE_WAITERS
    view = MetadataView(replica_manager=None)
    n = 1007
    assert WAKE_SLICE_WAITERS <= 250   # a slice is a few tens of milliseconds of appends
    waiters = [view.partition_change("t", p, 10) for p in range(n)]
    resumed: list = []
    turns: list = []

    async def held(p: int, fut) -> None:
        await fut
        resumed.append((p, len(turns)))   # the loop turns seen when this produce went on

    tasks = [asyncio.ensure_future(held(p, f)) for p, f in enumerate(waiters)]
    await asyncio.sleep(0)
    loop = asyncio.get_running_loop()

    def tick() -> None:   # an I/O-like callback: counts the turns of the loop
        turns.append(None)
        if len(resumed) < n:
            loop.call_soon(tick)
    view._wake_partition_waiters([FenceBrokerRecord(1, 3)])   # every waiter
    loop.call_soon(tick)
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert [p for p, _ in resumed] == list(range(n))   # oldest waiter first, none lost
    per_turn: dict = {}
    for _, turn in resumed:
        per_turn[turn] = per_turn.get(turn, 0) + 1
    assert max(per_turn.values()) <= WAKE_SLICE_WAITERS, per_turn
    assert len(per_turn) >= -(-n // WAKE_SLICE_WAITERS), per_turn
    assert view._partition_waiters == {}


async def test_an_update_that_woke_thousands_of_produces_returns_once_they_all_went_on():
    """The feed's next change (after a fencing: its ISR removals) waits until the produces
    held for this one have had their turn, so they do not share the new leader's loop with it."""
    from http_api.broker.metadata_view import WAKE_SLICE_WAITERS
    view = MetadataView(replica_manager=AppliesNothing())
    n = 4 * WAKE_SLICE_WAITERS + 3
    went_on: list = []

    async def held(p: int) -> None:
        await view.partition_change("t", p, 10)
        went_on.append(p)
    tasks = [asyncio.ensure_future(held(p)) for p in range(n)]
    await asyncio.sleep(0)
    await view.update(FeedImage(1, [FenceBrokerRecord(1, 3)]))
    assert len(went_on) == n            # every one of them went on before update returned
    await asyncio.gather(*tasks)
    # a few: woken in the update's own turn, nothing to wait for
    few = [asyncio.ensure_future(held(p)) for p in range(3)]
    await asyncio.sleep(0)
    went_on.clear()
    await view.update(FeedImage(2, [FenceBrokerRecord(1, 3)]))
    assert went_on == []
    await asyncio.gather(*few)
    assert sorted(went_on) == [0, 1, 2]
