"""Fencing a broker at scale (issue 25): the entry that fences a broker holds only the
leader changes of the partitions it led (so they are writable again after one entry of
that size), its ISR-only removals follow in entries of at most `fence_batch_records_max`
(the maintenance loop), and the end state is exactly the one-batch fencing's. Pure: the
controller and the state machine, no raft, no sockets; work is counted in records, not
timed."""
from __future__ import annotations

import functools
import json
import pickle

from metadata_quorum.controller import QuorumController
from metadata_quorum.records import (FenceBrokerRecord, PartitionChangeRecord, PartitionRecord, record_from_dict,
                                     record_to_dict)
from tests.unit.metadata.metadata_harness import Harness

TOPICS, PER_TOPIC = 3, 1000   # 3,000 partitions, RF=3 on 3 brokers: broker 2 is in every ISR


def _cluster(**settings) -> Harness:
    settings.setdefault("fence_isr_removals_wait_max_ms", 0)   # the wait is tested on its own below
    h = Harness(**settings)
    for i in range(TOPICS):
        h.create(f"t{i}", partitions=PER_TOPIC, rf=3)
    return h


def _led_by(h: Harness, broker: int) -> set:
    return {(t.name, p.partition) for t in h.image.topics.values() for p in t.partitions.values()
            if p.leader == broker}


def _partitions(h: Harness) -> dict:
    return {(t.name, p.partition): p for t in h.image.topics.values() for p in t.partitions.values()}


def _finish(h: Harness) -> list:
    """Run maintenance rounds until nothing is left to write; the entries written."""
    entries = []
    while True:
        records = h.controller.maintenance(h.image, h.now)
        if not records:
            return entries
        h.run(records)
        entries.append(records)


@functools.lru_cache(maxsize=1)
def _reference() -> dict:
    """The partitions after the one-batch fencing of broker 2 (the split turned off)."""
    h = _cluster(fence_isr_removals_inline_max=10 ** 9, fence_batch_records_max=10 ** 9)
    records = h.controller.fence_broker(h.image, 2)
    assert len(records) == 1 + TOPICS * PER_TOPIC     # one entry: every partition changes in it
    h.run(records)
    assert _finish(h) == []
    return _partitions(h)


def test_the_fencing_entry_holds_only_the_leader_changes_and_the_rest_follows():
    h = _cluster()
    led = _led_by(h, 2)
    assert 900 <= len(led) <= 1100
    before = _partitions(h)
    records = h.controller.fence_broker(h.image, 2)
    assert isinstance(records[0], FenceBrokerRecord)
    changes = records[1:]
    # work of the fencing entry: one record per partition the broker led, none for the others
    assert {(r.topic, r.partition) for r in changes} == led
    assert len(changes) == len(led)
    h.run(records)
    for key in led:
        p = _partitions(h)[key]
        assert p.leader not in (2, -1) and 2 not in p.isr      # writable again after this entry
    followers = [k for k, p in _partitions(h).items() if k not in led]
    assert all(2 in _partitions(h)[k].isr for k in followers)   # not touched yet
    entries = _finish(h)
    assert len(entries) == 1 and len(entries[0]) == TOPICS * PER_TOPIC - len(led)
    assert all(r.leader == before[(r.topic, r.partition)].leader for r in entries[0])   # ISR-only
    assert _partitions(h) == _reference()
    assert not h.controller.fence_pending


def test_no_entry_of_a_fencing_exceeds_fence_batch_records_max_and_leaders_go_first():
    h = _cluster(fence_batch_records_max=400)
    led = _led_by(h, 2)
    first = h.controller.fence_broker(h.image, 2)
    h.run(first)
    entries = [first[1:]] + _finish(h)
    assert all(len(e) <= 400 for e in entries)
    assert sum(len(e) for e in entries) == TOPICS * PER_TOPIC
    order = [(r.topic, r.partition) in led for e in entries for r in e]
    assert order == sorted(order, reverse=True)        # every leader change before any ISR-only one
    assert _partitions(h) == _reference()


def test_a_new_active_controller_finishes_a_split_fencing():
    h = _cluster()
    h.run(h.controller.fence_broker(h.image, 2))
    # the active controller dies before writing the ISR removals; its successor has none of
    # its soft state
    h.controller = QuorumController(h.controller.settings)
    h.controller.reset_sessions(h.image, h.now)
    _finish(h)
    assert _partitions(h) == _reference()


def test_a_small_fencing_is_still_one_entry():
    h = Harness()
    h.create("small", partitions=30, rf=3)
    records = h.controller.fence_broker(h.image, 2)
    assert len(records) == 1 + 30
    h.run(records)
    assert all(2 not in p.isr for p in _partitions(h).values())
    assert not h.controller.fence_pending


def test_partition_records_leave_out_empty_elr_and_reassignment_fields():
    """The plain-data form (raft entry, metadata feed) of a fencing's records: the four
    fields that are empty in nearly every record are left out and read back as empty."""
    h = _cluster()
    records = h.controller.fence_broker(h.image, 2)[1:]
    dicts = [record_to_dict(r) for r in records]
    assert all(set(d) == {"type", "topic", "topic_id", "partition", "replicas", "isr", "leader", "leader_epoch",
                          "partition_epoch"} for d in dicts)
    assert [record_from_dict(json.loads(json.dumps(d))) for d in dicts] == records
    assert len(pickle.dumps(dicts)) / len(dicts) < 64            # was 77 bytes with the empty fields
    # records written before (every field present) and fields set still round-trip
    full = dict(dicts[0], elr=[], last_known_elr=[], adding_replicas=[], removing_replicas=[])
    assert record_from_dict(full) == records[0]
    moving = PartitionRecord("t0", "id", 0, (1, 2, 3), (1, 2), 1, 0, 0, adding_replicas=(3,))
    assert record_to_dict(moving)["adding_replicas"] == [3]
    assert record_from_dict(record_to_dict(moving)) == moving
    elr = PartitionChangeRecord("t0", "id", 0, (1, 2), (1,), 1, 1, 1, elr=(2,))
    assert record_from_dict(json.loads(json.dumps(record_to_dict(elr)))) == elr


def test_a_maintenance_round_while_the_fencing_commits_keeps_its_followups():
    """Issue 25 (kill -9 at 100,000 partitions with batches of 10,000: 23,335 partitions kept
    the dead broker as leader for good). The fencing is decided, and before its entry commits
    a maintenance round runs on the image that still shows the broker unfenced (the server
    kicks the maintenance loop after any committed write while a fencing is pending). That
    round must neither write anything for it nor forget it: once the entry commits, the rest
    follows."""
    h = _cluster(fence_batch_records_max=400)
    first = h.controller.fence_broker(h.image, 2)
    assert h.controller.maintenance(h.image, h.now) == []     # the fencing entry is not committed yet
    assert set(h.controller.fence_pending) == {2}
    h.run(first)
    entries = _finish(h)
    assert entries and all(len(e) <= 400 for e in entries)
    assert _partitions(h) == _reference()
    assert not h.controller.fence_pending


def test_a_fencing_that_never_commits_leaves_nothing_to_follow_once_the_broker_registers_again():
    h = _cluster(fence_batch_records_max=400)
    h.controller.fence_broker(h.image, 2)   # decided, never committed (the write lost a race)
    assert _finish(h) == []                  # nothing is written for an unfenced registration
    h.add_broker(2, incarnation="inc-2-restarted")   # a new registration: another epoch
    assert _finish(h) == [] and not h.controller.fence_pending


def test_the_isr_only_removals_wait_for_the_other_brokers_to_have_the_fencing():
    """`fence_isr_removals_wait_max_ms`: after the fencing entry (the leader changes), the
    ISR-only removals wait until every other live broker's feed requests or heartbeats
    name an offset past the fencing, at most that long; a wait of 0 writes them at once."""
    wait_ms = 3000
    h = _cluster(fence_isr_removals_wait_max_ms=wait_ms)
    led = _led_by(h, 2)
    h.run(h.controller.fence_broker(h.image, 2))
    fenced_at = h.image.offset
    c = h.controller
    assert c.maintenance(h.image, h.now) == []                 # brokers 1 and 3 have not caught up
    c.note_metadata_offset(1, fenced_at)                         # broker 1's feed request past it
    assert c.maintenance(h.image, h.now + 100) == []             # broker 3 still behind
    c.note_metadata_offset(3, fenced_at - 1)                     # a stale report moves nothing
    assert c.maintenance(h.image, h.now + 200) == []
    h.heartbeat(3, offset=fenced_at)                            # broker 3's heartbeat: it has it
    records = c.maintenance(h.image, h.now + 300)
    assert records and all(r.leader == _partitions(h)[(r.topic, r.partition)].leader for r in records)
    assert {(r.topic, r.partition) for r in records}.isdisjoint(led)
    h.run(records)
    assert _finish(h) == [] and _partitions(h) == _reference()

    # nobody reports: the removals come when the wait is over, not before
    h = _cluster(fence_isr_removals_wait_max_ms=wait_ms)
    h.run(h.controller.fence_broker(h.image, 2))
    assert h.controller.maintenance(h.image, h.now) == []
    assert h.controller.maintenance(h.image, h.now + wait_ms - 1) == []
    assert h.controller.maintenance(h.image, h.now + wait_ms)

    # leader changes beyond the first entry never wait
    h = _cluster(fence_isr_removals_wait_max_ms=wait_ms, fence_batch_records_max=400)
    first = h.controller.fence_broker(h.image, 2)
    h.run(first)
    nxt = h.controller.maintenance(h.image, h.now)
    assert nxt and all(r.leader != 2 and (r.topic, r.partition) in led for r in nxt)
