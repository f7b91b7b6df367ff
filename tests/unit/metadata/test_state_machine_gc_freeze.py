"""A large apply freezes the metadata image out of full garbage collections (issue 24/25):
the apply runs on the raft thread, and a full collection walks every tracked object with
the GIL held, so at 10,000 partitions the controller's raft thread stopped ticking for
0.3-1.8 s, longer than an election timeout (raft/README.md, "Garbage collection")."""
import dataclasses
import gc

import pytest

from metadata_quorum.controller_server import ControllerConfig
from metadata_quorum.records import LeaderChangeRecord, PartitionRecord, TopicRecord, record_to_dict
from metadata_quorum.state_machine import GC_FREEZE_MIN_RECORDS_DEFAULT, MetadataStateMachine


@pytest.fixture(autouse=True)
def _unfreeze():
    gc.unfreeze()
    yield
    gc.unfreeze()   # do not leave this process's objects frozen for the next tests


def _entry(records, epoch=1):
    return {"request_id": None, "controller_epoch": epoch, "records": [record_to_dict(r) for r in records]}


def _create(name, partitions):
    return _entry([TopicRecord(name, f"id-{name}")]
                  + [PartitionRecord(name, f"id-{name}", p, (1, 2, 3), (1, 2, 3), 1, 0, 0) for p in range(partitions)])


def _collected(obj) -> bool:
    """True while a full collection would still walk `obj` (frozen objects are not listed)."""
    return any(o is obj for o in gc.get_objects())


def _sm(min_records=GC_FREEZE_MIN_RECORDS_DEFAULT):
    sm = MetadataStateMachine("c", gc_freeze_min_records=min_records)
    sm.apply([_entry([LeaderChangeRecord(1, 1)])])
    return sm


def test_large_apply_freezes_the_image_out_of_full_collections():
    sm = _sm()
    thresholds = gc.get_threshold()
    assert sm.apply([_create("big", GC_FREEZE_MIN_RECORDS_DEFAULT)])[0]["ok"]
    partitions = sm.image.topics["big"].partitions
    assert len(partitions) == GC_FREEZE_MIN_RECORDS_DEFAULT
    assert gc.get_freeze_count() > GC_FREEZE_MIN_RECORDS_DEFAULT
    assert not _collected(partitions) and not _collected(sm.image.topics)
    assert sm.gc_freezes == 1
    assert gc.get_threshold() == thresholds   # generation 2 collections are back on after the apply


def test_small_apply_and_zero_setting_leave_the_collector_alone():
    sm = _sm()
    assert sm.apply([_create("small", 10)])[0]["ok"]
    assert gc.get_freeze_count() == 0 and _collected(sm.image.topics["small"].partitions)
    off = _sm(min_records=0)
    assert off.apply([_create("big", GC_FREEZE_MIN_RECORDS_DEFAULT)])[0]["ok"]
    assert gc.get_freeze_count() == 0 and off.gc_freezes == 0
    assert _collected(off.image.topics["big"].partitions)


def test_restoring_a_large_snapshot_freezes_it():
    src = _sm(min_records=0)
    src.apply([_create("big", GC_FREEZE_MIN_RECORDS_DEFAULT)])
    snapshot = src.snapshot()
    copy = MetadataStateMachine("c", gc_freeze_min_records=GC_FREEZE_MIN_RECORDS_DEFAULT)
    copy.restore(snapshot)
    assert len(copy.image.topics["big"].partitions) == GC_FREEZE_MIN_RECORDS_DEFAULT
    assert copy.gc_freezes == 1 and not _collected(copy.image.topics["big"].partitions)


def test_the_controller_process_freezes_by_default():
    default = {f.name: f.default for f in dataclasses.fields(ControllerConfig)}["gc_freeze_min_records"]
    assert default == GC_FREEZE_MIN_RECORDS_DEFAULT > 0
