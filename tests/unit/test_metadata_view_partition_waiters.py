"""MetadataView.partition_change (issue 25): a produce waiting for a partition's new leader
is woken by an update that touches that partition, not by every update (after a kill -9 at
30,000 partitions each of ~30 ISR updates woke 10,000 waiting produces)."""
import asyncio
import collections
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


def _image_led_by(leader: int, taken: int, followed: int):
    """Broker 1's view: topic "t" (`taken` partitions) and "u" (`followed`), replicas [2, 1,
    3], led by `leader` in "t" and by 2 or 3 in "u"."""
    from metadata_quorum.image import MetadataImage
    from metadata_quorum.records import PartitionRecord, RegisterBrokerRecord, TopicRecord
    img = MetadataImage("c")
    for b in (1, 2, 3):
        img.replay(RegisterBrokerRecord(b, f"i{b}", -1, f"http://b{b}", None, False))
    img.replay(TopicRecord("t", "tid"))
    img.replay(TopicRecord("u", "uid"))
    epoch = 0 if leader == 2 else 1
    for p in range(taken):
        img.replay(PartitionRecord("t", "tid", p, (2, 1, 3), (2, 1, 3), leader, epoch, epoch))
    for p in range(followed):
        img.replay(PartitionRecord("u", "uid", p, (2, 1, 3), (2, 1, 3), 2 if leader == 2 else 3, epoch, epoch))
    return img


async def test_produces_held_for_leaderships_taken_up_go_on_before_the_change_is_published(monkeypatch):
    """After a fencing a survivor applies the leaderships it takes up first, then the
    partitions it now follows (half of a 33,334-partition change at 100,000 partitions).
    The produces held for a leadership go on as soon as the replica manager took it up,
    during the rest of the apply, not after the whole change is published."""
    from partitions.log import record_batch as rb
    from partitions.replication import replica_manager as rm_module
    from partitions.replication.loop_share import LoopSlice
    from partitions.replication.replica_manager import ACKS_LEADER, ReplicaManager
    from tests.unit.replication.fake_log import MemoryLogManager
    monkeypatch.setattr(rm_module, "LoopSlice", lambda: LoopSlice(0))   # a turn of the loop per chunk
    rm = ReplicaManager(1, MemoryLogManager(), default_log_config_factory=lambda c: None, request_timeout_ms=200)
    view = MetadataView(rm)
    taken, followed = 3 * rm_module.APPLY_CHUNK_PARTITIONS, 20 * rm_module.APPLY_CHUNK_PARTITIONS
    before = _image_led_by(2, taken, followed)
    await view.update(before)
    published_before = view.image
    went_on: list = []

    async def held(p: int) -> None:
        await view.partition_change("t", p, 10)
        res = await rm.append("t", p, rb.build_batch([rb.Record(None, b"v")]), acks=ACKS_LEADER)
        went_on.append((p, res.first_offset, view.image is published_before))
    tasks = [asyncio.ensure_future(held(p)) for p in range(taken)]
    await asyncio.sleep(0)
    await view.update(_image_led_by(1, taken, followed))   # broker 2 fenced: 1 takes up "t"
    await asyncio.gather(*tasks)
    assert sorted(p for p, _, _ in went_on) == list(range(taken))
    assert all(offset == 0 for _, offset, _ in went_on)
    early = [p for p, _, old in went_on if old]
    assert len(early) == taken, f"{taken - len(early)} of {taken} produces waited for the publication"
    assert view.woken_during_apply == taken   # what the broker's log line of a large change reports
    assert view.image is not published_before and rm.leads(("t", 0)) and not rm.leads(("u", 0))


async def test_leadership_wakes_and_update_wakes_share_one_slice_per_turn():
    """Produces woken by a taken leadership and by a publication queue behind each other:
    never more than WAKE_SLICE_WAITERS resume in one turn of the loop."""
    from http_api.broker.metadata_view import WAKE_SLICE_WAITERS
    view = MetadataView(replica_manager=None)
    n = 3 * WAKE_SLICE_WAITERS
    waiters = [view.partition_change("t", p, 10) for p in range(n)]
    turns: list = []
    resumed: list = []

    async def held(p: int, fut) -> None:
        await fut
        resumed.append(len(turns))
    tasks = [asyncio.ensure_future(held(p, f)) for p, f in enumerate(waiters)]
    await asyncio.sleep(0)
    loop = asyncio.get_running_loop()

    def tick() -> None:
        turns.append(None)
        if len(resumed) < n:
            loop.call_soon(tick)
    loop.call_soon(tick)
    for start in range(0, n, 100):   # many small announcements within one turn
        view._wake_taken([("t", p) for p in range(start, start + 100)])
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    per_turn: dict = {}
    for turn in resumed:
        per_turn[turn] = per_turn.get(turn, 0) + 1
    assert max(per_turn.values()) <= WAKE_SLICE_WAITERS, per_turn
    assert view._wake_queue == collections.deque() and view._wake_idle is None
