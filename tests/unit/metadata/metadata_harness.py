"""Shared fixtures for metadata unit tests: a state machine driven through the pure
controller, with no raft and no sockets."""
from __future__ import annotations

import random

from metadata_quorum.controller import ControllerSettings, QuorumController
from metadata_quorum.records import LeaderChangeRecord, entry_items
from metadata_quorum.state_machine import MetadataStateMachine


class Harness:
    def __init__(self, brokers=(1, 2, 3), racks=None, seed=7, **settings):
        self.sm = MetadataStateMachine("test-cluster")
        self.controller = QuorumController(ControllerSettings(**settings), random.Random(seed))
        self.epoch = 1
        assert self.propose([LeaderChangeRecord(1, 1)])["ok"]
        self.now = 0
        for b in brokers:
            self.add_broker(b, rack=(racks or {}).get(b))

    @property
    def image(self):
        return self.sm.image

    def propose(self, records, request_id=None, epoch=None):
        entry = {"request_id": request_id, "controller_epoch": self.epoch if epoch is None else epoch,
                 "records": entry_items(records)}   # as the controller writes it
        return self.sm.apply([entry])[0]

    def run(self, records):
        if records:
            res = self.propose(records)
            assert res["ok"], res
        return records

    def add_broker(self, b, rack=None, incarnation=None):
        self.run(self.controller.register_broker(self.image, b, incarnation or f"inc-{b}", f"http://h:{b}", rack, self.now))
        self.heartbeat(b)

    def heartbeat(self, b, offset=None, want_shutdown=False):
        epoch = self.image.brokers[b].epoch
        return self.run(self.controller.heartbeat(self.image, b, epoch, self.image.offset if offset is None else offset,
                                                  self.now, want_shutdown))

    def create(self, name, partitions=3, rf=3, configs=None):
        return self.run(self.controller.create_topic(self.image, name, partitions, rf, configs))
