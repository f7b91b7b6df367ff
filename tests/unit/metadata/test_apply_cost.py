"""The raft thread's apply builds records and registrations without their dataclass
__init__ (issue 25, controller quorum at scale).

In 3-controller runs at 10,000 partitions on a loaded 2-core machine, 105 of 106 raft tick
gaps over 300 ms had the process on a CPU for under a quarter of the gap, with the raft
thread's own work a median 54 ms of it (the event loop: ~3 ms): the raft thread's CPU per
tick, stretched by the load, is what delays heartbeats. py-spy puts about half of that
thread's time in applying entries: `record_from_dict` and `_replay_partition`, most of it
in frozen dataclasses' __init__ (one object.__setattr__ per field). Both now fill the
fields directly (`records.frozen_instance`). These tests count __init__ calls (not time)
and check the objects are equal to constructed ones. Pure: no raft, no sockets."""
from __future__ import annotations

import dataclasses
import pickle

import pytest

from metadata_quorum.image import MetadataImage, PartitionRegistration
from metadata_quorum.records import (RECORD_TYPES, PartitionChangeRecord, PartitionRecord, record_from_dict,
                                     record_to_dict)
from tests.unit.metadata.metadata_harness import Harness


def test_applying_a_create_calls_no_record_or_registration_init(monkeypatch):
    h = Harness()
    records = h.controller.create_topic(h.image, "big", 1000, 3, None)
    entry = {"request_id": None, "controller_epoch": h.epoch, "records": [record_to_dict(r) for r in records]}
    inits = []
    for cls in (PartitionRecord, PartitionChangeRecord, PartitionRegistration):
        real = cls.__init__

        def counting(self, *a, _real=real, **kw):
            inits.append(type(self).__name__)
            _real(self, *a, **kw)
        monkeypatch.setattr(cls, "__init__", counting)
    assert h.sm.apply([entry])[0]["ok"]
    assert len(h.image.topics["big"].partitions) == 1000
    assert inits == [], f"{len(inits)} dataclass __init__ calls on the apply path"


def test_records_and_registrations_built_so_equal_constructed_ones():
    h = Harness()
    h.create("t", partitions=20, rf=3, configs={"retention.ms": "5"})
    h.run(h.controller.fence_broker(h.image, 2))
    for offset, record in h.sm.tail:   # as the apply built them (entry runs and single records)
        built = type(record)(**{f.name: getattr(record, f.name) for f in dataclasses.fields(record)})
        assert record == built and hash(record) == hash(built) and repr(record) == repr(built)
        assert pickle.loads(pickle.dumps(record)) == record
        with pytest.raises(dataclasses.FrozenInstanceError):
            record.__setattr__(dataclasses.fields(record)[0].name, None)
    for p in h.image.topics["t"].partitions.values():
        built = PartitionRegistration(**{f.name: getattr(p, f.name) for f in dataclasses.fields(p)})
        assert p == built and hash(p) == hash(built) and list(vars(p)) == list(vars(built))
    restored = MetadataImage.from_snapshot(h.image.to_snapshot())
    assert restored.topics["t"].partitions == h.image.topics["t"].partitions


def test_defaults_missing_fields_and_unknown_keys_as_before():
    d = {"type": "Partition", "topic": "t", "topic_id": "id", "partition": 1, "replicas": [1, 2], "isr": [1],
         "leader": 1, "from_a_newer_writer": True}
    r = record_from_dict(d)
    assert r == PartitionRecord("t", "id", 1, (1, 2), (1,), 1)
    assert r.adding_replicas == () and r.leader_epoch == 0
    with pytest.raises(ValueError, match="missing"):
        record_from_dict({"type": "Partition", "topic": "t"})
    with pytest.raises(ValueError, match="unknown"):
        record_from_dict({"type": "NoSuchRecord"})
    for cls in RECORD_TYPES.values():
        required = [f for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING]
        sample = cls(**{f.name: (() if "replicas" in f.name or f.name in ("isr",) else 1) for f in required})
        assert record_from_dict(record_to_dict(sample)) == sample
