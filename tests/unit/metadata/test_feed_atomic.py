"""The broker's metadata feed core (metadata_quorum/feed.py, issue 25): a change reaches
readers whole (a topic with all its partitions, a batch of leader changes), however the
controller pages its record feed, and publishing it copies only what it touches."""
import random

from metadata_quorum.feed import FeedState, apply_records, change_of, describe_records
from metadata_quorum.image import MetadataImage
from metadata_quorum.records import (ConfigRecord, FenceBrokerRecord, PartitionChangeRecord, PartitionRecord,
                                     RegisterBrokerRecord, RemoveTopicRecord, TopicRecord, record_to_dict)


def _topic(name: str, n: int, tid: str = None) -> list:
    tid = tid or f"id-{name}"
    return [TopicRecord(name, tid)] + [PartitionRecord(name, tid, p, (1, 2), (1, 2), 1) for p in range(n)]


def _brokers() -> list:
    return [RegisterBrokerRecord(1, "i1", -1, "http://b1", None, False),
            RegisterBrokerRecord(2, "i2", -1, "http://b2", None, False)]


class FakeController:
    """Applies batches whole and serves them as a paged feed, like controller_server's
    /metadata/records (metadata_offset = its applied offset when answering)."""

    def __init__(self, page: int) -> None:
        self.log: list = []
        self.batch_ends: list = [0]
        self.page = page

    def commit(self, records: list) -> None:
        self.log.extend(records)
        self.batch_ends.append(len(self.log))

    def answer(self, after: int) -> dict:
        items = [{"offset": o, "record": record_to_dict(r)}
                 for o, r in enumerate(self.log[after:after + self.page], start=after)]
        return {"cluster_id": "c", "records": items, "metadata_offset": len(self.log)}


def _count(image: MetadataImage, topic: str) -> int:
    t = image.topics.get(topic)
    return 0 if t is None else len(t.partitions)


def test_a_topic_paged_over_several_answers_is_released_whole():
    ctl = FakeController(page=40)
    ctl.commit(_brokers())
    ctl.commit(_topic("big", 100))       # 101 records: three pages
    feed = FeedState()
    seen = []
    while feed.next_offset < len(ctl.log):
        change = feed.accept(ctl.answer(feed.next_offset))
        seen.append(_count(feed.image, "big"))
        if change is not None:
            assert _count(change.image, "big") in (0, 100)
    assert seen[-1] == 100
    assert set(seen) <= {0, 100}
    assert feed.accept(ctl.answer(feed.next_offset)) is None   # nothing new: no change


def test_an_incomplete_answer_leaves_the_published_image_untouched():
    ctl = FakeController(page=10)
    ctl.commit(_topic("big", 25))
    feed = FeedState()
    before = feed.image
    assert feed.accept(ctl.answer(0)) is None
    assert feed.image is before and feed.image.offset == 0 and feed.pending
    assert feed.next_offset == 10


def test_every_released_image_ends_at_a_batch_boundary_whatever_the_pages():
    rng = random.Random(7)
    for _ in range(30):
        ctl = FakeController(page=rng.randint(1, 30))
        ctl.commit(_brokers())
        feed = FeedState()
        names = []
        for i in range(rng.randint(3, 8)):
            if names and rng.random() < 0.3:
                name = names.pop(rng.randrange(len(names)))
                ctl.commit([RemoveTopicRecord(name, f"id-{name}")])
            elif names and rng.random() < 0.5:
                name = rng.choice(names)
                ctl.commit([PartitionChangeRecord(name, f"id-{name}", p, (1, 2), (2,), 2, 1, 1)
                            for p in range(5)])
            else:
                name = f"t{i}"
                names.append(name)
                ctl.commit(_topic(name, rng.randint(1, 60)))
            # the feed polls between commits, so answers end anywhere
            for _ in range(rng.randint(0, 3)):
                change = feed.accept(ctl.answer(feed.next_offset))
                if change is not None:
                    assert change.image.offset in ctl.batch_ends
        while feed.next_offset < len(ctl.log):
            change = feed.accept(ctl.answer(feed.next_offset))
            if change is not None:
                assert change.image.offset in ctl.batch_ends
        whole = MetadataImage("c")
        whole.replay_all(ctl.log)
        assert feed.image.to_snapshot() == whole.to_snapshot()


def test_a_change_copies_only_the_topics_it_touches_and_never_mutates_the_old_image():
    old = MetadataImage("c")
    old.replay_all(_brokers() + _topic("a", 50) + _topic("b", 50))
    a_before, b_before = old.topics["a"], old.topics["b"]
    reg_before = old.topics["a"].partitions[3]
    new = apply_records(old, [PartitionChangeRecord("a", "id-a", 3, (1, 2), (2,), 2, 1, 1),
                              ConfigRecord("topic", "a", "retention.ms", "1000"),
                              FenceBrokerRecord(1, old.brokers[1].epoch)])
    # the old image is as it was
    assert old.topics["a"] is a_before and old.topics["a"].partitions[3] is reg_before
    assert old.topics["a"].configs == {} and not old.brokers[1].fenced and old.offset == 104
    # the new one has the change; the untouched topic is shared, not copied
    assert new.topics["a"].partitions[3].leader == 2 and new.topics["a"].configs == {"retention.ms": "1000"}
    assert new.brokers[1].fenced and new.offset == 107
    assert new.topics["b"] is b_before
    assert new.topics["a"].partitions[4] is a_before.partitions[4]


def test_answers_of_a_controller_without_metadata_offset_are_taken_whole():
    ctl = FakeController(page=10)
    ctl.commit(_topic("t", 3))
    body = ctl.answer(0)
    del body["metadata_offset"]
    change = FeedState().accept(body)
    assert change is not None and _count(change.image, "t") == 3


def test_a_gap_is_ignored_and_a_snapshot_replaces_pending_records():
    ctl = FakeController(page=5)
    ctl.commit(_topic("t", 20))
    feed = FeedState()
    assert feed.accept(ctl.answer(3)) is None and not feed.pending    # not our offset
    feed.accept(ctl.answer(0))
    assert feed.pending
    whole = MetadataImage("c")
    whole.replay_all(ctl.log)
    change = feed.accept({"cluster_id": "c", "snapshot": whole.to_snapshot(), "metadata_offset": whole.offset})
    assert change is not None and change.records is None and change.delta.everything
    assert not feed.pending and feed.image.offset == 21 and _count(feed.image, "t") == 20


def test_each_image_says_how_it_was_made():
    ctl = FakeController(page=100)
    ctl.commit(_topic("t", 2))
    feed = FeedState()
    first = feed.accept(ctl.answer(0)).image
    ctl.commit([PartitionChangeRecord("t", "id-t", 1, (1, 2), (2,), 2, 1, 1)])
    second = feed.accept(ctl.answer(feed.next_offset)).image
    info = change_of(second)
    assert info.base_offset == first.offset == 3 and len(info.records) == 1 and info.source is feed
    assert change_of(first).base_offset == 0
    assert change_of(MetadataImage()) is None


def test_the_delta_names_what_changed():
    d = describe_records(_topic("n", 3) + [PartitionChangeRecord("o", "id-o", 2, (1,), (1,), 1, 1, 1),
                                           RemoveTopicRecord("gone", "x"), FenceBrokerRecord(2, 5),
                                           ConfigRecord("topic", "o", "k", "v")])
    assert d.partitions == {"n": None, "o": {2}} and d.removed_topics == {"gone"}
    assert d.brokers == {2} and d.topics_configs == {"n", "o"} and not d.everything


def test_the_lag_counts_from_what_readers_see_and_for_how_long():
    now = [100.0]
    ctl = FakeController(page=10)
    ctl.commit(_topic("t", 30))
    feed = FeedState(clock=lambda: now[0])
    feed.accept(ctl.answer(0))                 # incomplete: nothing published
    now[0] += 2.5
    assert feed.lag() == (31, 2500)
    while feed.next_offset < len(ctl.log):
        change = feed.accept(ctl.answer(feed.next_offset))
    now[0] += 1.0
    assert feed.lag() == (31, 3500)           # received, not published yet
    feed.observe(change.image.offset)
    assert feed.lag() == (0, 0)


def test_record_types_added_later_are_itemized_by_what_they_name():
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Moved:          # a future record naming a partition
        topic: str
        partition: int

    @dataclass(frozen=True)
    class Cordoned:       # a future record naming a broker
        broker_id: int

    @dataclass(frozen=True)
    class Opaque:
        what: str

    d = describe_records([Moved("t", 4), Cordoned(3)])
    assert d.partitions == {"t": {4}} and d.brokers == {3} and not d.everything
    assert describe_records([Opaque("?")]).everything


def test_a_large_change_is_built_in_steps_and_published_only_when_whole():
    ctl = FakeController(page=5000)
    ctl.commit(_topic("big", 2000))
    feed = FeedState()
    before = feed.image
    steps = feed.accept_in_steps(ctl.answer(0), chunk_records=500)
    pauses = 0
    while True:
        try:
            next(steps)
        except StopIteration as done:
            change = done.value
            break
        pauses += 1
        assert feed.image is before and _count(before, "big") == 0   # nothing published mid-way
    assert pauses >= 2001 // 500 * 2 - 1          # parsing and replaying both pause
    assert change.image is feed.image and _count(change.image, "big") == 2000
