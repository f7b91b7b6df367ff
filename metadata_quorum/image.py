"""MetadataImage: the cluster metadata as a pure replay of metadata records.

Invariants: `offset` is the number of records applied (so the next record's offset); the
image only changes through `replay`; replay never raises for records that passed
`check_batch` (the quorum state machine checks every batch before applying it, so every
node applies exactly the same records). Broker and partition registrations are frozen and
replaced on change, so a reader holding one never sees it mutate.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Iterable, Optional

from metadata_quorum.records import (
    BROKER_STATES,
    NO_LEADER,
    BrokerMembershipRecord,
    BrokerRegistrationChangeRecord,
    ConfigRecord,
    FenceBrokerRecord,
    LeaderChangeRecord,
    NoOpRecord,
    PartitionChangeRecord,
    PartitionRecord,
    ProducerIdsRecord,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
    UnfenceBrokerRecord,
    frozen_instance,
)
from metadata_quorum.security.image import SecurityImage
from metadata_quorum.security.records import SECURITY_RECORDS


@dataclass(frozen=True)
class BrokerRegistration:
    id: int
    epoch: int
    incarnation_id: str
    url: str
    rack: Optional[str] = None
    fenced: bool = True
    in_controlled_shutdown: bool = False
    kafka_address: Optional[str] = None   # "host:port" of its Kafka listener (None: none)

    def to_json(self) -> dict:
        return {"id": self.id, "url": self.url, "rack": self.rack, "fenced": self.fenced}


@dataclass(frozen=True)
class PartitionRegistration:
    partition: int
    replicas: tuple
    isr: tuple
    leader: int
    leader_epoch: int = 0
    partition_epoch: int = 0
    elr: tuple = ()
    last_known_elr: tuple = ()
    # a reassignment in flight (KIP-455): `replicas` = target + removing (see PartitionChangeRecord)
    adding_replicas: tuple = ()
    removing_replicas: tuple = ()

    def to_json(self) -> dict:
        out = {
            "partition": self.partition,
            "leader": self.leader,
            "leader_epoch": self.leader_epoch,
            "replicas": list(self.replicas),
            "isr": list(self.isr),
            "adding_replicas": list(self.adding_replicas),
            "removing_replicas": list(self.removing_replicas),
        }
        if self.elr:
            out["elr"] = list(self.elr)
        if self.last_known_elr:
            out["last_known_elr"] = list(self.last_known_elr)
        return out

    @property
    def awaiting_recovery(self) -> bool:
        """Leaderless with no replica known to hold every committed record: the ISR and ELR
        are empty because their last members restarted after an unclean shutdown. The
        controller elects the longest log once every `last_known_elr` member reported."""
        return self.leader == NO_LEADER and not self.isr and not self.elr and bool(self.last_known_elr)

    @property
    def preferred_leader(self) -> int:
        return self.replicas[0] if self.replicas else NO_LEADER

    @property
    def reassigning(self) -> bool:
        return bool(self.adding_replicas or self.removing_replicas)

    @property
    def target_replicas(self) -> tuple:
        """The replicas a running reassignment moves to (`replicas` when none runs)."""
        return tuple(r for r in self.replicas if r not in self.removing_replicas)

    @property
    def original_replicas(self) -> tuple:
        """The replicas before the running reassignment (what a cancel returns to)."""
        return tuple(r for r in self.replicas if r not in self.adding_replicas)


@dataclass
class TopicImage:
    name: str
    topic_id: str
    partitions: dict = field(default_factory=dict)  # int -> PartitionRegistration
    configs: dict = field(default_factory=dict)  # str -> str

    def to_json(self, include_configs: bool = False) -> dict:
        out = {
            "name": self.name,
            "partitions": [self.partitions[p].to_json() for p in sorted(self.partitions)],
        }
        if include_configs:
            out["configs"] = dict(self.configs)
        return out


class MetadataImage:
    """Cluster metadata at metadata offset `offset` (records applied so far)."""

    def __init__(self, cluster_id: str = ""):
        self.cluster_id = cluster_id
        self.offset = 0
        self.controller_id = NO_LEADER
        self.controller_epoch = 0
        self.brokers: dict[int, BrokerRegistration] = {}
        self.topics: dict[str, TopicImage] = {}
        self.broker_configs: dict[str, dict] = {}
        self.next_producer_id = 0
        self.security = SecurityImage()   # users, tokens, ACLs (immutable, replaced on change)
        # decommission: broker id -> "draining" | "decommissioned" (absent: "active"), and
        # the last url / rack of decommissioned (unregistered) brokers, for listings
        self.broker_states: dict[int, str] = {}
        self.decommissioned: dict[int, tuple] = {}
        self.moving: set[tuple[str, int]] = set()   # (topic, partition) of running reassignments
        # topic -> partitions with no leader (NO_LEADER), kept by replay: the controller's
        # leader election every maintenance round looks at these, not at every partition
        self.leaderless: dict[str, set[int]] = {}

    # ---------------------------------------------------------------- queries
    def topic(self, name: str) -> Optional[TopicImage]:
        return self.topics.get(name)

    def partition(self, topic: str, partition: int) -> Optional[PartitionRegistration]:
        t = self.topics.get(topic)
        return None if t is None else t.partitions.get(partition)

    def partitions_led_by(self, topic: str, broker_id: int) -> dict[int, int]:
        """Partition -> leader epoch of `topic`'s partitions `broker_id` leads (empty when the
        topic does not exist): what a coordinator of an internal topic loads."""
        t = self.topics.get(topic)
        if t is None:
            return {}
        return {p: reg.leader_epoch for p, reg in t.partitions.items() if reg.leader == broker_id}

    def live_broker_ids(self) -> list[int]:
        """Unfenced brokers not in controlled shutdown, sorted."""
        return sorted(
            b.id for b in self.brokers.values() if not b.fenced and not b.in_controlled_shutdown
        )

    def is_usable(self, broker_id: int) -> bool:
        b = self.brokers.get(broker_id)
        return b is not None and not b.fenced and not b.in_controlled_shutdown

    def broker_state(self, broker_id: int) -> str:
        return self.broker_states.get(broker_id, "active")

    def placeable_broker_ids(self) -> list[int]:
        """Live brokers that take new replicas: not draining (cordoned), sorted."""
        return [b for b in self.live_broker_ids() if b not in self.broker_states]

    def reassignments(self) -> list:
        """(topic, PartitionRegistration) of every partition with a reassignment in flight."""
        out = []
        for name, p in sorted(self.moving):
            reg = self.partition(name, p)
            if reg is not None and reg.reassigning:
                out.append((name, reg))
        return out

    def replica_count(self, broker_id: int) -> int:
        return sum(1 for t in self.topics.values() for p in t.partitions.values() if broker_id in p.replicas)

    def brokers_json(self) -> list:
        """`GET /v1/brokers`: registered and decommissioned brokers with their state."""
        out = {b.id: dict(b.to_json(), state=self.broker_state(b.id)) for b in self.brokers.values()}
        for bid, (url, rack) in self.decommissioned.items():
            out.setdefault(bid, {"id": bid, "url": url, "rack": rack, "fenced": True, "state": "decommissioned"})
        return [out[b] for b in sorted(out)]

    def leaderless_partitions(self) -> list:
        """(TopicImage, PartitionRegistration) of every partition without a leader, in topic
        order then partition order: an index kept by replay, no walk of the partitions."""
        if not self.leaderless:
            return []
        out = []
        for name, t in self.topics.items():
            parts = self.leaderless.get(name)
            if parts:
                out.extend((t, t.partitions[p]) for p in sorted(parts) if p in t.partitions)
        return out

    def partition_count(self) -> int:
        return sum(len(t.partitions) for t in self.topics.values())

    def to_metadata_json(self, controller_id: Optional[int] = None) -> dict:
        """Exactly the `GET /v1/metadata` body of API.md."""
        return {
            "cluster_id": self.cluster_id,
            "controller_id": self.controller_id if controller_id is None else controller_id,
            "brokers": [self.brokers[b].to_json() for b in sorted(self.brokers)],
            "topics": [self.topics[t].to_json() for t in sorted(self.topics)],
        }

    def topic_json(self, name: str, include_configs: bool = False) -> Optional[dict]:
        t = self.topics.get(name)
        return None if t is None else t.to_json(include_configs)

    # ---------------------------------------------------------------- replay
    def replay_all(self, records: Iterable) -> None:
        for r in records:
            self.replay(r)

    def replay(self, record) -> None:
        """Apply one record at offset `self.offset`, then advance the offset."""
        offset = self.offset
        handler = _HANDLERS.get(type(record))
        if handler is not None:
            handler(self, record, offset)
        self.offset = offset + 1

    def _replay_register(self, r: RegisterBrokerRecord, offset: int) -> None:
        self.brokers[r.broker_id] = BrokerRegistration(
            id=r.broker_id,
            epoch=offset,
            incarnation_id=r.incarnation_id,
            url=r.url,
            rack=r.rack,
            fenced=r.fenced,
            in_controlled_shutdown=False,
            kafka_address=r.kafka_address,
        )

    def _replay_registration_change(self, r: BrokerRegistrationChangeRecord, offset: int) -> None:
        b = self.brokers.get(r.broker_id)
        if b is None or b.epoch != r.broker_epoch:
            return
        changes = {}
        if r.fenced is not None:
            changes["fenced"] = r.fenced
        if r.in_controlled_shutdown is not None:
            changes["in_controlled_shutdown"] = r.in_controlled_shutdown
        self.brokers[r.broker_id] = dataclasses.replace(b, **changes)

    def _replay_fence(self, r: FenceBrokerRecord, offset: int) -> None:
        b = self.brokers.get(r.broker_id)
        if b is not None and b.epoch == r.broker_epoch:
            self.brokers[r.broker_id] = dataclasses.replace(b, fenced=True)

    def _replay_unfence(self, r: UnfenceBrokerRecord, offset: int) -> None:
        b = self.brokers.get(r.broker_id)
        if b is not None and b.epoch == r.broker_epoch:
            self.brokers[r.broker_id] = dataclasses.replace(
                b, fenced=False, in_controlled_shutdown=False
            )

    def _replay_membership(self, r: BrokerMembershipRecord, offset: int) -> None:
        if r.state == "active":
            self.broker_states.pop(r.broker_id, None)
            self.decommissioned.pop(r.broker_id, None)
            return
        self.broker_states[r.broker_id] = r.state
        if r.state == "decommissioned":
            b = self.brokers.pop(r.broker_id, None)
            old = self.decommissioned.get(r.broker_id, (None, None))
            self.decommissioned[r.broker_id] = (b.url, b.rack) if b is not None else old

    def _replay_topic(self, r: TopicRecord, offset: int) -> None:
        self.topics[r.name] = TopicImage(name=r.name, topic_id=r.topic_id)
        self._forget_moves(r.name)
        self.leaderless.pop(r.name, None)

    def _forget_moves(self, topic: str) -> None:
        if any(name == topic for name, _ in self.moving):
            self.moving = {k for k in self.moving if k[0] != topic}

    def _replay_partition(self, r, offset: int) -> None:
        t = self.topics.get(r.topic)
        if t is None or t.topic_id != r.topic_id:
            return
        # frozen_instance: this runs on the raft thread once per partition of an entry
        t.partitions[r.partition] = frozen_instance(PartitionRegistration, {
            "partition": r.partition,
            "replicas": tuple(r.replicas),
            "isr": tuple(r.isr),
            "leader": r.leader,
            "leader_epoch": r.leader_epoch,
            "partition_epoch": r.partition_epoch,
            "elr": tuple(getattr(r, "elr", ())),
            "last_known_elr": tuple(getattr(r, "last_known_elr", ())),
            "adding_replicas": tuple(r.adding_replicas),
            "removing_replicas": tuple(r.removing_replicas),
        })
        if r.adding_replicas or r.removing_replicas:
            self.moving.add((r.topic, r.partition))
        else:
            self.moving.discard((r.topic, r.partition))
        if r.leader == NO_LEADER:
            self.leaderless.setdefault(r.topic, set()).add(r.partition)
        else:
            none = self.leaderless.get(r.topic)
            if none is not None:
                none.discard(r.partition)
                if not none:
                    del self.leaderless[r.topic]

    def _replay_remove_topic(self, r: RemoveTopicRecord, offset: int) -> None:
        t = self.topics.get(r.name)
        if t is not None and t.topic_id == r.topic_id:
            del self.topics[r.name]
            self._forget_moves(r.name)
            self.leaderless.pop(r.name, None)

    def _replay_config(self, r: ConfigRecord, offset: int) -> None:
        if r.resource_type == "topic":
            t = self.topics.get(r.resource_name)
            if t is None:
                return
            target = t.configs
        else:
            target = self.broker_configs.setdefault(r.resource_name, {})
        if r.value is None:
            target.pop(r.key, None)
        else:
            target[r.key] = r.value

    def _replay_producer_ids(self, r: ProducerIdsRecord, offset: int) -> None:
        self.next_producer_id = max(self.next_producer_id, r.next_producer_id)

    def _replay_security(self, r, offset: int) -> None:
        self.security = self.security.replay(r, offset)

    def _replay_leader_change(self, r: LeaderChangeRecord, offset: int) -> None:
        self.controller_id = r.leader_id
        self.controller_epoch = r.epoch

    # ---------------------------------------------------------------- batch check
    def check_batch(self, records: list) -> Optional[str]:
        """Preconditions of an atomic batch against this image (None = applicable).

        This is the optimistic-concurrency check that lets the active controller decide
        several commands concurrently: a batch decided on a stale view (another batch changed
        the same partition, topic, broker or producer id block first) is rejected whole on
        every node, and the controller decides again. Never raises.
        """
        new_topics: dict[str, str] = {}
        removed: set[str] = set()
        part_epochs: dict[tuple, int] = {}
        new_parts: set[tuple] = set()
        next_pid = self.next_producer_id
        try:
            for r in records:
                if isinstance(r, TopicRecord):
                    if (r.name in self.topics and r.name not in removed) or r.name in new_topics:
                        return f"topic {r.name} already exists"
                    new_topics[r.name] = r.topic_id
                elif isinstance(r, RemoveTopicRecord):
                    t = self.topics.get(r.name)
                    if t is None or t.topic_id != r.topic_id or r.name in removed:
                        return f"topic {r.name} does not exist"
                    removed.add(r.name)
                elif isinstance(r, PartitionRecord):
                    tid = self._topic_id(r.topic, new_topics, removed)
                    if tid != r.topic_id:
                        return f"topic {r.topic} does not exist"
                    key = (r.topic, r.partition)
                    if key in new_parts or (
                        r.topic not in new_topics and r.partition in self.topics[r.topic].partitions
                    ):
                        return f"partition {r.topic}-{r.partition} already exists"
                    new_parts.add(key)
                    part_epochs[key] = r.partition_epoch
                elif isinstance(r, PartitionChangeRecord):
                    tid = self._topic_id(r.topic, new_topics, removed)
                    if tid != r.topic_id:
                        return f"topic {r.topic} does not exist"
                    key = (r.topic, r.partition)
                    if key in part_epochs:
                        current = part_epochs[key]
                    else:
                        p = self.partition(r.topic, r.partition)
                        if p is None:
                            return f"partition {r.topic}-{r.partition} does not exist"
                        current = p.partition_epoch
                    if r.partition_epoch != current + 1:
                        return f"partition {r.topic}-{r.partition} changed concurrently"
                    part_epochs[key] = r.partition_epoch
                elif isinstance(
                    r, (FenceBrokerRecord, UnfenceBrokerRecord, BrokerRegistrationChangeRecord)
                ):
                    b = self.brokers.get(r.broker_id)
                    if b is None or b.epoch != r.broker_epoch:
                        return f"broker {r.broker_id} epoch {r.broker_epoch} is stale"
                elif isinstance(r, ProducerIdsRecord):
                    b = self.brokers.get(r.broker_id)
                    if b is None or b.epoch != r.broker_epoch:
                        return f"broker {r.broker_id} epoch {r.broker_epoch} is stale"
                    if r.next_producer_id <= next_pid:
                        return "producer id block allocated concurrently"
                    next_pid = r.next_producer_id
                elif isinstance(r, BrokerMembershipRecord):
                    if r.state not in BROKER_STATES:
                        return f"unknown broker state {r.state!r}"
                    if r.state == "decommissioned" and (
                            self.broker_states.get(r.broker_id) != "draining" or self.replica_count(r.broker_id)):
                        return f"broker {r.broker_id} is not drained"
                elif isinstance(r, RegisterBrokerRecord):
                    if r.broker_id in self.decommissioned:
                        return f"broker {r.broker_id} is decommissioned"
                elif isinstance(r, ConfigRecord):
                    if r.resource_type == "topic" and self._topic_id(
                        r.resource_name, new_topics, removed
                    ) is None:
                        return f"topic {r.resource_name} does not exist"
        except Exception as exc:  # a check must never raise into the raft apply path
            return f"malformed batch: {exc!r}"
        if any(type(r) in _SECURITY_TYPES for r in records):
            return self.security.check_batch(records)
        return None

    def _topic_id(self, name: str, new_topics: dict, removed: set) -> Optional[str]:
        if name in new_topics:
            return new_topics[name]
        if name in removed:
            return None
        t = self.topics.get(name)
        return None if t is None else t.topic_id

    # ---------------------------------------------------------------- snapshots
    def to_snapshot(self) -> dict:
        """Plain-data snapshot (compact partition tuples); `from_snapshot` inverts it."""
        return {
            "cluster_id": self.cluster_id,
            "offset": self.offset,
            "controller_id": self.controller_id,
            "controller_epoch": self.controller_epoch,
            "next_producer_id": self.next_producer_id,
            "brokers": [
                [b.id, b.epoch, b.incarnation_id, b.url, b.rack, b.fenced, b.in_controlled_shutdown,
                 b.kafka_address]
                for b in self.brokers.values()
            ],
            "topics": [
                {
                    "name": t.name,
                    "topic_id": t.topic_id,
                    "configs": dict(t.configs),
                    "partitions": [
                        [p.partition, list(p.replicas), list(p.isr), p.leader, p.leader_epoch,
                         p.partition_epoch, list(p.elr), list(p.last_known_elr),
                         list(p.adding_replicas), list(p.removing_replicas)]
                        for p in t.partitions.values()
                    ],
                }
                for t in self.topics.values()
            ],
            "broker_configs": {k: dict(v) for k, v in self.broker_configs.items()},
            "security": self.security.to_snapshot(),
            "broker_states": [[b, s] for b, s in self.broker_states.items()],
            "decommissioned": [[b, url, rack] for b, (url, rack) in self.decommissioned.items()],
        }

    @classmethod
    def from_snapshot(cls, data: dict) -> "MetadataImage":
        image = cls(data.get("cluster_id", ""))
        image.offset = data["offset"]
        image.controller_id = data["controller_id"]
        image.controller_epoch = data["controller_epoch"]
        image.next_producer_id = data["next_producer_id"]
        for b in data["brokers"]:
            reg = BrokerRegistration(b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7] if len(b) > 7 else None)
            image.brokers[reg.id] = reg
        for t in data["topics"]:
            ti = TopicImage(name=t["name"], topic_id=t["topic_id"], configs=dict(t["configs"]))
            for p in t["partitions"]:
                ti.partitions[p[0]] = PartitionRegistration(p[0], tuple(p[1]), tuple(p[2]), p[3], p[4], p[5],
                                                            tuple(p[6]) if len(p) > 6 else (),
                                                            tuple(p[7]) if len(p) > 7 else (),
                                                            tuple(p[8]) if len(p) > 8 else (),
                                                            tuple(p[9]) if len(p) > 9 else ())
            image.topics[ti.name] = ti
            image.moving.update((ti.name, p) for p, reg in ti.partitions.items() if reg.reassigning)
            none = {p for p, reg in ti.partitions.items() if reg.leader == NO_LEADER}
            if none:
                image.leaderless[ti.name] = none
        image.broker_configs = {k: dict(v) for k, v in data.get("broker_configs", {}).items()}
        image.security = SecurityImage.from_snapshot(data.get("security"))
        image.broker_states = {b: s for b, s in data.get("broker_states", [])}
        image.decommissioned = {b: (url, rack) for b, url, rack in data.get("decommissioned", [])}
        return image


_HANDLERS = {
    RegisterBrokerRecord: MetadataImage._replay_register,
    BrokerRegistrationChangeRecord: MetadataImage._replay_registration_change,
    FenceBrokerRecord: MetadataImage._replay_fence,
    UnfenceBrokerRecord: MetadataImage._replay_unfence,
    TopicRecord: MetadataImage._replay_topic,
    PartitionRecord: MetadataImage._replay_partition,
    PartitionChangeRecord: MetadataImage._replay_partition,
    RemoveTopicRecord: MetadataImage._replay_remove_topic,
    ConfigRecord: MetadataImage._replay_config,
    ProducerIdsRecord: MetadataImage._replay_producer_ids,
    LeaderChangeRecord: MetadataImage._replay_leader_change,
    BrokerMembershipRecord: MetadataImage._replay_membership,
    NoOpRecord: None,
    **{cls: MetadataImage._replay_security for cls in SECURITY_RECORDS},
}
_SECURITY_TYPES = frozenset(SECURITY_RECORDS)
_HANDLERS = {k: v for k, v in _HANDLERS.items() if v is not None}
