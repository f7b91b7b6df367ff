"""The feed's batch boundaries (issue 25, failover at 100,000 partitions): an answer names
the offset after each entry that ends inside its page (`batch_ends`), so a broker publishes
a committed fencing as soon as it has read it, even while the controller keeps committing
follow-up changes behind it. Before, a broker published only where an answer ended at the
controller's applied offset: at 100,000 partitions the fencing's 33,334 leader changes
waited 20 s for the 66,667 ISR removals committed after them, and were applied as one
change of 100,011 records. Pure: the real state machine and the real page text, no raft."""
from __future__ import annotations

import json
import random

from metadata_quorum.controller_server import feed_page_text
from metadata_quorum.feed import FeedState
from metadata_quorum.state_machine import MetadataStateMachine
from tests.unit.metadata.metadata_harness import Harness


def _answer(sm: MetadataStateMachine, after: int, page: int, with_ends: bool = True) -> dict:
    """What `GET /metadata/records?after=` answers (controller_server.h_metadata_records)."""
    texts = sm.records_since_json(after, page)
    metadata_offset = sm.image.offset
    ends = sm.batch_ends_in(after, after + len(texts)) if with_ends else None
    return json.loads(feed_page_text(sm.image.cluster_id, texts, metadata_offset, ends))


def _leader_of_all(image, broker: int) -> int:
    return sum(1 for t in image.topics.values() for p in t.partitions.values() if p.leader == broker)


def _fencing_behind_a_busy_controller(with_ends: bool) -> tuple:
    """A broker reads a fencing in pages of 50 while the controller commits one more small
    change after every answer. -> (answers until broker 2 is fenced in the published image
    (None: never within 40 answers), the feed)."""
    h = Harness()
    h.create("big", partitions=120, rf=3)
    feed = FeedState()
    while feed.next_offset < h.sm.image.offset:
        feed.accept(_answer(h.sm, feed.next_offset, 50))
    assert _leader_of_all(feed.image, 2) > 0
    h.now = 10 ** 9
    for b in (1, 3):
        h.heartbeat(b)
    h.run(h.controller.fence_broker(h.image, 2))
    for i in range(40):
        feed.accept(_answer(h.sm, feed.next_offset, 50, with_ends))
        if feed.image.brokers[2].fenced:
            return i + 1, feed
        h.create(f"more-{i}", partitions=60, rf=1)   # the controller never rests
    return None, feed


def test_a_fencing_is_published_once_read_while_the_controller_keeps_committing():
    answers, feed = _fencing_behind_a_busy_controller(with_ends=True)
    assert answers is not None and answers <= 4, answers
    assert _leader_of_all(feed.image, 2) == 0             # with all its leader changes
    assert feed.next_offset < feed.controller_offset       # published while still behind


def test_without_batch_ends_the_same_fencing_waits_for_the_controller_to_rest():
    answers, feed = _fencing_behind_a_busy_controller(with_ends=False)
    assert answers is None                                  # 40 answers, never a boundary
    assert feed.image.brokers[2].fenced is False and len(feed.pending) > 1000


def test_every_published_image_ends_at_an_entry_boundary_whatever_the_pages():
    rng = random.Random(25)
    for trial in range(20):
        h = Harness(seed=trial)
        feed = FeedState()
        boundaries = {0, *h.sm.batch_ends}   # the harness's broker registrations
        page = rng.randint(1, 40)
        for i in range(rng.randint(4, 10)):
            h.create(f"t{i}", partitions=rng.randint(1, 60), rf=rng.randint(1, 3))
            boundaries.add(h.sm.image.offset)
            for _ in range(rng.randint(0, 3)):   # pages read while the controller commits
                change = feed.accept(_answer(h.sm, feed.next_offset, page))
                if change is not None:
                    assert change.image.offset in boundaries
                    for name, t in change.image.topics.items():   # every topic whole
                        assert len(t.partitions) == len(h.image.topics[name].partitions)
        while feed.image.offset < h.sm.image.offset:
            feed.accept(_answer(h.sm, feed.next_offset, page))
        assert feed.image.partition_count() == h.image.partition_count()
        assert not feed.pending and not feed.batch_ends


def test_the_state_machine_keeps_boundaries_only_for_its_retained_tail():
    h = Harness()
    h.sm.feed_retained_records = 10
    for i in range(12):
        h.create(f"t{i}", partitions=2, rf=1)   # 3 records per entry
    ends = h.sm.batch_ends
    assert ends == sorted(ends) and all(e > h.sm.tail_start for e in ends)
    assert h.sm.tail_start > 0 and ends[-1] == h.sm.image.offset
    assert h.sm.batch_ends_in(h.sm.image.offset - 3, h.sm.image.offset) == [h.sm.image.offset]
    assert h.sm.batch_ends_in(h.sm.image.offset, h.sm.image.offset + 10) == []


def test_a_boundary_is_not_taken_from_an_answer_beyond_the_buffer():
    """Ends the feed named past a gap wait until the records up to them are buffered."""
    h = Harness()
    feed = FeedState()
    feed.accept(_answer(h.sm, 0, 100))
    base = feed.image.offset
    assert base == h.sm.image.offset and not feed.pending
    h.create("a", partitions=5, rf=1)
    end_a = h.sm.image.offset
    h.create("b", partitions=5, rf=1)
    h.create("c", partitions=5, rf=1)
    body = _answer(h.sm, base, 100)
    assert body["batch_ends"] == [end_a, end_a + 6, end_a + 12]
    body["records"] = body["records"][:end_a - base - 2]      # cut short before a's end
    assert feed.accept(body) is None and feed.image.offset == base
    change = feed.accept(_answer(h.sm, feed.next_offset, 100))
    assert change is not None and change.image.offset == h.sm.image.offset
