"""The controller's decision when a broker is fenced at scale (issue 25): `fence_broker`
walks the partitions once (the leader changes built, the ISR-only removals counted in the
same walk), `fence_followups` stops walking once it has `fence_batch_records_max` changes,
and the records are exactly the ones the previous per-partition code decided, on images
with every kind of partition state (ELR, last-known ELR, reassignments, unclean election,
min.insync.replicas, fenced and shutting-down brokers). Pure: no raft, no sockets; work is
counted in partitions visited, not timed."""
from __future__ import annotations

import dataclasses
import random

from metadata_quorum.controller import NO_LEADER, QuorumController, _unclean_election_enabled
from metadata_quorum.image import PartitionRegistration
from metadata_quorum.records import FenceBrokerRecord
from tests.unit.metadata.metadata_harness import Harness


class _CountingPartitions(dict):
    """A topic's partition map that counts the registrations its walks yield."""

    visited = 0

    def values(self):
        for v in dict.values(self):
            _CountingPartitions.visited += 1
            yield v


def _count_walks(h: Harness) -> None:
    for t in h.image.topics.values():
        t.partitions = _CountingPartitions(t.partitions)
    _CountingPartitions.visited = 0


def _reference_removals(c: QuorumController, image, broker_id: int, unclean: bool = False,
                        led_only: bool = False) -> list:
    """The per-partition decision as written before the single walk (ebccf0c), verbatim."""
    out = []
    excluded = (broker_id,)
    for t in image.topics.values():
        unclean_election = _unclean_election_enabled(t)
        for p in t.partitions.values():
            if led_only and p.leader != broker_id:
                continue
            if broker_id not in p.isr and p.leader != broker_id and not (unclean and broker_id in p.elr):
                continue
            new_isr = tuple(r for r in p.isr if r != broker_id)
            if new_isr and p.leader in new_isr and c._usable(image, p.leader, excluded):
                leader = p.leader
            else:
                leader = c._elect(image, p.replicas, new_isr, excluded)
                if leader == NO_LEADER:
                    leader = c._elect(image, p.replicas, p.elr, excluded)
                    if leader != NO_LEADER:
                        new_isr = (leader,)
            if leader == NO_LEADER and not new_isr and not unclean:
                new_isr = p.isr
            if leader == NO_LEADER and unclean_election:
                cand = next((r for r in p.replicas if c._usable(image, r, excluded)), None)
                if cand is not None:
                    leader, new_isr = cand, (cand,)
            rec = c._change(t, p, isr=new_isr, leader=leader, unclean=broker_id if unclean else None)
            if rec is not None:
                out.append(rec)
    return out


def _random_image(seed: int) -> Harness:
    """5 brokers (3 fenced or shutting down in some seeds), 4 topics with random configs and
    partitions in random states: any ISR / ELR / last-known ELR / leader, some reassigning."""
    rng = random.Random(seed)
    h = Harness(brokers=(1, 2, 3, 4, 5))
    for b in (1, 2, 3, 4, 5):
        h.run([r for r in h.controller.heartbeat(h.image, b, h.image.brokers[b].epoch, h.image.offset, 0, False)])
    for i in range(4):
        configs = {}
        if rng.random() < 0.5:
            configs["min.insync.replicas"] = str(rng.randint(1, 3))
        if rng.random() < 0.4:
            configs["unclean.leader.election.enable"] = rng.choice(["true", "false", "TRUE"])
        h.create(f"t{i}", partitions=60, rf=3, configs=configs or None)
        t = h.image.topics[f"t{i}"]
        for p, reg in list(t.partitions.items()):
            replicas = tuple(rng.sample([1, 2, 3, 4, 5], rng.randint(1, 4)))
            isr = tuple(r for r in replicas if rng.random() < 0.7)
            elr = tuple(r for r in replicas if r not in isr and rng.random() < 0.5)
            lke = tuple(r for r in replicas if r not in isr and rng.random() < 0.3)
            leader = rng.choice(isr + (NO_LEADER, 2)) if isr else rng.choice((NO_LEADER, 2))
            adding = removing = ()
            if len(replicas) > 2 and rng.random() < 0.15:
                adding, removing = replicas[:1], replicas[-1:]
            t.partitions[p] = PartitionRegistration(p, replicas, isr, leader, rng.randint(0, 9), rng.randint(0, 9),
                                                    elr, lke, adding, removing)
    for b in rng.sample([1, 3, 4, 5], rng.randint(0, 3)):
        reg = h.image.brokers[b]
        h.image.brokers[b] = dataclasses.replace(reg, fenced=rng.random() < 0.5,
                                                 in_controlled_shutdown=rng.random() < 0.5)
    return h


def test_removals_equal_the_per_partition_decision_on_random_images():
    cases = 0
    for seed in range(40):
        h = _random_image(seed)
        c = h.controller
        for broker in (1, 2, 3):
            for unclean in (False, True):
                for led_only in (False, True):
                    got = c._remove_broker_changes(h.image, broker, unclean=unclean, led_only=led_only)
                    want = _reference_removals(c, h.image, broker, unclean=unclean, led_only=led_only)
                    assert got == want, (seed, broker, unclean, led_only)
                    assert [r.__dict__ for r in got] == [r.__dict__ for r in want]   # same field order
                    cases += bool(want)
                    for limit in (1, 7):
                        assert c._remove_broker_changes(h.image, broker, unclean=unclean, led_only=led_only,
                                                        limit=limit) == want[:limit]
    assert cases > 300


def _fence_reference(c: QuorumController, image, broker_id: int) -> list:
    b = image.brokers[broker_id]
    limit = c.settings.fence_batch_records_max
    led = _reference_removals(c, image, broker_id, led_only=True)
    isr_only = sum(1 for t in image.topics.values() for p in t.partitions.values()
                   if p.leader != broker_id and broker_id in p.isr)
    if isr_only <= c.settings.fence_isr_removals_inline_max and len(led) + isr_only <= limit:
        return [FenceBrokerRecord(broker_id, b.epoch)] + _reference_removals(c, image, broker_id)
    return [FenceBrokerRecord(broker_id, b.epoch)] + led[:limit]


def test_fence_broker_decides_as_before_on_random_images_inline_and_split():
    for seed in range(40):
        for inline_max in (0, 40, 10 ** 9):
            h = _random_image(seed)
            h.controller.settings = dataclasses.replace(h.controller.settings, fence_isr_removals_inline_max=inline_max)
            want = _fence_reference(h.controller, h.image, 2)
            assert h.controller.fence_broker(h.image, 2) == want, (seed, inline_max)


def test_fence_broker_walks_the_partitions_once():
    h = Harness(fence_isr_removals_inline_max=0)
    for i in range(3):
        h.create(f"t{i}", partitions=500, rf=3)
    _count_walks(h)
    records = h.controller.fence_broker(h.image, 2)
    led = sum(1 for r in records[1:])
    assert 400 <= led <= 600 and set(h.controller.fence_pending) == {2}   # split: ISR-only removals follow
    # one walk of the 1,500 partitions (the per-partition code walked them twice: once to
    # build the leader changes, once to count the ISR-only removals)
    assert _CountingPartitions.visited == 1500


def test_fence_followups_stop_walking_at_the_batch_limit():
    h = Harness(fence_batch_records_max=100)
    for i in range(3):
        h.create(f"t{i}", partitions=500, rf=3)
    h.run(h.controller.fence_broker(h.image, 2))
    while True:   # the leader changes (at most 100 per entry) until broker 2 leads nothing
        records = h.controller.fence_followups(h.image)
        assert len(records) <= 100
        if all(r.leader == (h.image.partition(r.topic, r.partition).leader) for r in records):
            break
        h.run(records)
    _count_walks(h)
    records = h.controller.fence_followups(h.image)
    assert len(records) == 100 and all(2 not in r.isr for r in records)
    # the led-only walk sees all 1,500 partitions (none led); the ISR removals' walk stops
    # at the 100th change, about 150 partitions in (it walked all 1,500 and kept 100 before)
    assert _CountingPartitions.visited < 1500 + 500
