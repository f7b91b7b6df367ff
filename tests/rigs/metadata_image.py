"""A metadata state machine driven by the real controller's decisions, without raft or
sockets: for tests and in-process benches that need an image of many partitions.
`ImageBuilder()` registers and unfences brokers 1-3; `create(name, partitions)` adds a topic
as the controller places it; `write(records)` applies any decision."""
from __future__ import annotations

import random
from typing import Optional

from metadata_quorum.controller import QuorumController
from metadata_quorum.records import LeaderChangeRecord, UnfenceBrokerRecord, entry_items
from metadata_quorum.state_machine import MetadataStateMachine


class ImageBuilder:
    """`sm` (the state machine) and `controller` (its decisions), brokers registered and unfenced."""

    def __init__(self, sm: Optional[MetadataStateMachine] = None, seed: int = 1, brokers: tuple = (1, 2, 3)) -> None:
        self.sm = sm if sm is not None else MetadataStateMachine()
        self.controller = QuorumController(rng=random.Random(seed))
        self.write([LeaderChangeRecord(1, 1)])
        for b in brokers:
            self.write(self.controller.register_broker(self.sm.image, b, f"i{b}", f"http://b{b}", now_ms=0))
            self.write([UnfenceBrokerRecord(b, self.sm.image.brokers[b].epoch)])

    @property
    def image(self):
        return self.sm.image

    def write(self, records: list) -> None:
        """Apply `records` as one committed entry; AssertionError when the state machine refuses it."""
        r = self.sm.apply([{"request_id": None, "controller_epoch": self.sm.image.controller_epoch,
                            "records": entry_items(records)}])[0]
        assert r["ok"], r

    def create(self, name: str, partitions: int, rf: int = 3, configs: Optional[dict] = None) -> None:
        self.write(self.controller.create_topic(self.sm.image, name, partitions, rf, configs))
