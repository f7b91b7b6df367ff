"""The image's index of leaderless partitions (issue 25, controller quorum at scale).

The active controller's maintenance round (every `maintenance_interval_ms`, 200 ms) elects
leaders for leaderless partitions. It walked every partition of the image to find them,
holding the GIL and the state machine's lock against the raft thread: 14% of the active
controller's GIL samples (py-spy) during a 10,000-partition create under load. The image
now keeps `leaderless` by replay; these tests count the partitions a round visits (not
time) and check the index against a full walk after every kind of change. Pure: the
controller and the state machine, no raft, no sockets."""
from __future__ import annotations

import random

from metadata_quorum.feed import apply_records
from metadata_quorum.image import MetadataImage
from metadata_quorum.records import NO_LEADER, UnfenceBrokerRecord
from tests.unit.metadata.metadata_harness import Harness


class _CountingPartitions(dict):
    """A topic's partition map that counts walks (lookups by key are free)."""

    walks = 0

    def __iter__(self):
        type(self).walks += 1
        return super().__iter__()

    def values(self):
        type(self).walks += 1
        return super().values()

    def items(self):
        type(self).walks += 1
        return super().items()

    def keys(self):
        type(self).walks += 1
        return super().keys()


def _brute_force(image: MetadataImage) -> list:
    return [(t.name, p.partition) for t in image.topics.values() for p in t.partitions.values()
            if p.leader == NO_LEADER]


def _indexed(image: MetadataImage) -> list:
    return [(t.name, p.partition) for t, p in image.leaderless_partitions()]


def _fence(h: Harness, broker: int) -> None:
    """Fence `broker` with every entry of a (split) fencing written."""
    h.run(h.controller.fence_broker(h.image, broker))
    while True:
        records = h.controller.fence_followups(h.image)
        if not records:
            return
        h.run(records)


def test_a_maintenance_round_elects_leaderless_partitions_without_walking_the_partitions():
    h = Harness()
    h.create("big", partitions=3000, rf=3)
    h.create("solo", partitions=6, rf=1)        # one replica: leaderless while it is fenced
    solo_on_2 = sorted(p.partition for p in h.image.topics["solo"].partitions.values() if p.replicas == (2,))
    assert solo_on_2
    _fence(h, 2)
    assert [k for k in _indexed(h.image) if k[0] == "solo"] == [("solo", p) for p in solo_on_2]
    h.run([UnfenceBrokerRecord(2, h.image.brokers[2].epoch)])
    h.controller.sessions = {b: h.now for b in h.image.brokers}
    for t in h.image.topics.values():
        t.partitions = _CountingPartitions(t.partitions)
    _CountingPartitions.walks = 0

    records = h.controller.maintenance(h.image, h.now)

    assert [(r.topic, r.partition, r.leader) for r in records] == [("solo", p, 2) for p in solo_on_2]
    assert _CountingPartitions.walks == 0, "the maintenance round walked a topic's partitions"
    h.run(records)
    assert _indexed(h.image) == _brute_force(h.image) == []
    _CountingPartitions.walks = 0
    assert h.controller.maintenance(h.image, h.now) == []   # nothing leaderless: no walk either
    assert _CountingPartitions.walks == 0


def test_the_index_matches_a_full_walk_after_every_change_and_survives_snapshots_and_feed_copies():
    rng = random.Random(25)
    h = Harness(brokers=(1, 2, 3, 4))
    names = [f"t{i}" for i in range(5)]
    for name in names:
        h.create(name, partitions=rng.randint(1, 40), rf=rng.choice((1, 2)))
    seen_leaderless = 0
    for step in range(60):
        op = rng.choice(("fence", "unfence", "elect", "delete", "create", "grow"))
        fenced = [b for b, reg in h.image.brokers.items() if reg.fenced]
        live = [b for b, reg in h.image.brokers.items() if not reg.fenced]
        if op == "fence" and len(live) > 1:
            _fence(h, rng.choice(live))
        elif op == "unfence" and fenced:
            b = rng.choice(fenced)
            h.run([UnfenceBrokerRecord(b, h.image.brokers[b].epoch)])
        elif op == "elect":
            h.controller.sessions = {b: h.now for b in h.image.brokers}
            h.run(h.controller.maintenance(h.image, h.now))
        elif op == "delete" and h.image.topics:
            h.run(h.controller.delete_topic(h.image, rng.choice(sorted(h.image.topics))))
        elif op == "create":
            missing = [n for n in names if n not in h.image.topics]
            if missing and len(live) >= 2:
                h.create(rng.choice(missing), partitions=rng.randint(1, 40), rf=rng.choice((1, 2)))
        elif op == "grow" and h.image.topics and len(live) >= 2:
            name = rng.choice(sorted(h.image.topics))
            h.run(h.controller.create_partitions(h.image, name, len(h.image.topics[name].partitions) + 3))
        expected = _brute_force(h.image)
        seen_leaderless += len(expected)
        assert _indexed(h.image) == expected, f"step {step} ({op})"
        restored = MetadataImage.from_snapshot(h.image.to_snapshot())
        assert _indexed(restored) == expected
        # a broker's feed image is a copy: replaying into the copy leaves the original's index alone
        before = _indexed(h.image)
        if expected:
            copy = apply_records(h.image, [])
            copy.leaderless[next(iter(copy.leaderless))].clear()
            assert _indexed(h.image) == before
    assert seen_leaderless > 0, "the random walk never made a partition leaderless"
