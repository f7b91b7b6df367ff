"""Issue 25: the feed reads the applied entries under its own lock (`feed_lock`), never the
state machine's lock the raft thread holds for a whole apply. A page during an apply holds
every entry applied before it and nothing of the entry being applied (its records join the
feed together when its apply is done)."""
from __future__ import annotations

import threading

from metadata_quorum.records import PartitionRecord, TopicRecord, record_to_dict
from metadata_quorum.state_machine import MetadataStateMachine


def _entry(topic: str, partitions: int) -> dict:
    records = [TopicRecord(topic, f"id-{topic}")] + [
        PartitionRecord(topic, f"id-{topic}", p, (1, 2, 3), (1, 2, 3), 1, 0, 0) for p in range(partitions)]
    return {"request_id": None, "controller_epoch": 0, "records": [record_to_dict(r) for r in records]}


def test_a_page_during_an_apply_holds_whole_entries_and_does_not_wait():
    sm = MetadataStateMachine("c")
    assert sm.apply([_entry("a", 10)])[0]["ok"]
    first_end = sm.image.offset
    assert first_end == 11 and sm.feed_end == first_end
    inside = threading.Event()
    go_on = threading.Event()
    replay = sm.image.replay
    seen = []

    def slow_replay(record):   # the raft thread, half way through the next entry
        replay(record)
        seen.append(record)
        if len(seen) == 5:
            inside.set()
            assert go_on.wait(10)
    sm.image.replay = slow_replay
    t = threading.Thread(target=lambda: sm.apply([_entry("b", 10)]))
    t.start()
    try:
        assert inside.wait(5)
        assert sm.image.offset == first_end + 5                  # the image is half way
        assert not sm.lock.acquire(blocking=False)               # and the raft thread holds its lock
        texts, end, ends = sm.feed_page(0, 1000)                 # answered all the same
        assert end == first_end and len(texts) == first_end and ends == [first_end]
        assert sm.feed_page(first_end, 1000) == ([], first_end, [])   # nothing of the entry in progress
        assert sm.records_since(first_end, 1000) == []
    finally:
        go_on.set()
        t.join(10)
    texts, end, ends = sm.feed_page(first_end, 1000)
    assert end == sm.image.offset == first_end + 11 and len(texts) == 11 and ends == [end]
