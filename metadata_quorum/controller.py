"""QuorumController: the active controller's decisions, as a pure function image -> records.

Every command reads the committed MetadataImage and returns the records to propose as one
atomic batch, or raises KraftlogError with a Kafka error code and a message that says what
to do. No IO, no clock reads, no global randomness: time (`now_ms`) and the rng are passed
in, so tests drive it without sockets.

Soft state (not replicated): broker session leases (last heartbeat per broker). A new
active controller grants every unfenced broker a fresh lease (`reset_sessions`).

Partition rules (KRaft):
- leader election picks the first replica, in replica order, that is in the ISR and usable
  (registered, unfenced, not in controlled shutdown);
- fencing a broker removes it from every ISR and re-elects leaders in the same batch; when
  it is the last ISR member it stays in the ISR with leader -1 (so it can lead again when it
  comes back), unless the topic has unclean.leader.election.enable=true, in which case any
  usable replica becomes leader with ISR = [it];
- eligible leader replicas (KIP-966): brokers hold the high watermark while the ISR is
  smaller than min.insync.replicas, so a replica leaving the ISR then still has every
  committed record. It joins the partition's ELR and may be elected when no ISR member is
  usable (the ELR empties once the ISR is back to min.insync.replicas);
- a broker that registers after an unclean shutdown (kill -9, crash: its unflushed tail may
  be gone) leaves every ISR and ELR, the last member included. When that empties both, the
  partition waits for unclean recovery: it records the members as `last_known_elr`, they
  report (last leader epoch, log end offset) in heartbeats, and once all of them are usable
  and reported the longest log leads (ISR = [it]);
- the leader epoch is bumped exactly when the leader changes; the partition epoch on every
  change.
"""
from __future__ import annotations

import dataclasses
import random
import re
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

from partitions.errors import ErrorCode, KraftlogError
from partitions import internal_topics
from metadata_quorum.image import MetadataImage, PartitionRegistration
from metadata_quorum import reassignment
from metadata_quorum.placement import assign_replicas
from metadata_quorum.records import (
    NO_LEADER,
    BrokerMembershipRecord,
    BrokerRegistrationChangeRecord,
    ConfigRecord,
    FenceBrokerRecord,
    PartitionChangeRecord,
    PartitionRecord,
    ProducerIdsRecord,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
    UnfenceBrokerRecord,
    frozen_instance,
)
from partitions.replication.partition import effective_min_insync_replicas

TOPIC_NAME_RE = re.compile(r"^[a-zA-Z0-9._-]+$")
TOPIC_NAME_LENGTH_MAX = 249
ALTER_PARTITIONS_MAX = 2000   # partitions per batched AlterPartition request (one controller write)


def _validate_topic_configs(configs: dict) -> None:
    from partitions.log.config import validate_topic_configs

    validate_topic_configs(configs)


@dataclass(frozen=True)
class MinInsyncReplicasDefault:
    """The broker-wide default of the topic config min.insync.replicas, declared once for the
    two roles that need it: the brokers gate the high watermark on it, the controller's ELR
    rule relies on that (http_api.broker.config.ReplicationConfig and ControllerSettings inherit it)."""

    min_insync_replicas: int = 1


@dataclass(frozen=True)
class ControllerSettings(MinInsyncReplicasDefault):
    """Settings of the controller role (Kafka's names, unit last); `validate()` on construction.

    A node config nests it as `NodeConfig.controller`; its `min_insync_replicas` is always the
    broker's (one key, both roles).
    """

    broker_session_timeout_ms: int = 9000
    broker_heartbeat_interval_ms: int = 2000
    # how often leadership moves back to preferred replicas (the controller server's maintenance loop)
    leader_imbalance_check_interval_ms: int = 30_000
    producer_id_block_size: int = 1000
    # one create is one atomic batch applied on the raft thread: 10,000 partitions take
    # ~60 ms there; 20,000 keeps that stall far below raft_min_timeout_s (0.3 s)
    request_max_partitions: int = 20_000   # CreateTopics / CreatePartitions
    auto_leader_rebalance_enable: bool = True
    # fencing from fetch silence (issue 24, docs/AVAILABILITY.md part B): a broker another
    # broker reports silent (its fetches stopped) is fenced once this controller has had no
    # heartbeat from it for this long and its own probe cannot connect; 0 = off (only the
    # session timeout fences a silent broker)
    broker_silence_fence_ms: int = 1500
    # a silence report counts this long (reporters repeat theirs while the silence lasts)
    broker_silence_report_max_age_ms: int = 3000
    # Fencing at scale (issue 25). A broker's fencing changes every partition whose ISR holds
    # it (100,000 partition changes at 100,000 partitions on 3 brokers), but only those it
    # leads need a new leader to be writable again. When a fencing has more than
    # `fence_isr_removals_inline_max` ISR-only removals, the entry that fences the broker
    # holds just its leader changes and the ISR removals follow in the next entries (the
    # maintenance loop, `fence_followups`, written back to back); no entry of a fencing holds
    # more than `fence_batch_records_max` partition changes (about 60 bytes each pickled: far
    # below the 16 MiB raft frame cap, raft_frame_max_bytes). Kafka's 10,000
    # (maxRecordsPerBatch) was tried at 100,000 partitions (docs/SCALE.md, ninth round): the
    # first 10,000 leaderships were writable within 5 s, but the survivors, leading them and
    # serving their held produces, took the next entries tens of seconds later; kept at 50,000.
    fence_isr_removals_inline_max: int = 1000
    fence_batch_records_max: int = 50_000
    # A split fencing's ISR-only removals (the partitions the fenced broker only followed)
    # wait until every other live broker has the fencing entry (its feed requests or
    # heartbeats name an offset past it), at most this long after this controller saw the
    # fencing committed: written at once, their 66,666 records at 100,000 partitions took
    # the controllers' and the survivors' CPU while the survivors fetched and applied the
    # fencing's leader changes, which is what makes the fenced broker's partitions writable
    # again (issue 25). A broker names an offset past the fencing once it published it AND
    # the produces held for its new leaderships went on (MetadataView.update). At 3,000 the
    # wait ran out while the survivors were still answering those produces (they finish
    # 5-6 s after the fencing commits at 100,000 partitions on 2 cores), and the removals'
    # commit on the three controllers took CPU from them: kill -9 max 6.9-10.3 s in three
    # runs, 6.0 s with a longer wait (docs/SCALE.md, sixteenth round). What waiting costs:
    # the high watermark of a partition the fenced broker only followed stays where it was
    # until the removal commits (records written with acks=1 meanwhile are readable then);
    # acks=all writes to it do not wait for the removal (the leader drops a follower silent
    # for replica_fetch_silence_max_ms while acks=all produces wait for it). 0 = no wait.
    fence_isr_removals_wait_max_ms: int = 8000

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """ValueError naming the setting when one is out of range."""
        for name in ("broker_session_timeout_ms", "broker_heartbeat_interval_ms", "leader_imbalance_check_interval_ms",
                     "producer_id_block_size", "request_max_partitions",
                     "min_insync_replicas", "fence_batch_records_max"):
            value = getattr(self, name)
            if not _is_int(value) or value <= 0:
                raise ValueError(f"{name} must be an integer > 0, got {value!r}; fix {name} in the config")
        for name in ("broker_silence_fence_ms", "broker_silence_report_max_age_ms", "fence_isr_removals_inline_max",
                     "fence_isr_removals_wait_max_ms"):
            value = getattr(self, name)
            if not _is_int(value) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}; fix {name} in the config")
        if 0 < self.broker_silence_fence_ms and self.broker_silence_report_max_age_ms <= 0:
            raise ValueError("broker_silence_report_max_age_ms must be > 0 while broker_silence_fence_ms is on; "
                             "fix broker_silence_report_max_age_ms in the config")


def _unclean_election_enabled(t) -> bool:
    return t.configs.get("unclean.leader.election.enable", "false").lower() == "true"


def validate_topic_name(name: Any) -> str:
    if not isinstance(name, str) or not name:
        raise KraftlogError(ErrorCode.INVALID_TOPIC_EXCEPTION, "topic name must be a non-empty string")
    if name in (".", ".."):
        raise KraftlogError(ErrorCode.INVALID_TOPIC_EXCEPTION, f"topic name {name!r} is not allowed; pick another name")
    if len(name) > TOPIC_NAME_LENGTH_MAX:
        raise KraftlogError(
            ErrorCode.INVALID_TOPIC_EXCEPTION,
            f"topic name is {len(name)} characters long; use at most {TOPIC_NAME_LENGTH_MAX}",
        )
    if not TOPIC_NAME_RE.match(name):
        raise KraftlogError(
            ErrorCode.INVALID_TOPIC_EXCEPTION,
            f"topic name {name!r} has characters outside [a-zA-Z0-9._-]; use only those",
        )
    return name


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _require_int(v: Any, what: str, minimum: int = 0) -> int:
    if not _is_int(v) or v < minimum:
        raise KraftlogError(ErrorCode.INVALID_REQUEST, f"{what} must be an integer >= {minimum}, got {v!r}")
    return v


def _config_map(configs: Any, allow_null: bool) -> dict:
    if configs is None:
        return {}
    if not isinstance(configs, dict):
        raise KraftlogError(ErrorCode.INVALID_CONFIG, "configs must be an object of string keys to string values")
    out = {}
    for k, v in configs.items():
        if not isinstance(k, str):
            raise KraftlogError(ErrorCode.INVALID_CONFIG, f"config key {k!r} must be a string")
        if v is None and allow_null:
            out[k] = None
            continue
        if isinstance(v, bool):
            v = "true" if v else "false"
        elif isinstance(v, (int, float)):
            v = str(v)
        if not isinstance(v, str):
            raise KraftlogError(ErrorCode.INVALID_CONFIG, f"config {k}: value must be a string, got {v!r}")
        out[k] = v
    return out


def _next_state(t, p: PartitionRegistration, replicas, isr, leader, elr, last_known_elr, adding,
                removing) -> PartitionChangeRecord:
    """The PartitionChangeRecord moving partition `p` of topic `t` to this state: the leader
    epoch bumped exactly when the leader changes, the partition epoch always. Built without
    the frozen dataclass's `__init__` (33,334 of them in one fencing at 100,000 partitions)."""
    return frozen_instance(PartitionChangeRecord, {   # every field, in field order
        "topic": t.name,
        "topic_id": t.topic_id,
        "partition": p.partition,
        "replicas": replicas,
        "isr": isr,
        "leader": leader,
        "leader_epoch": p.leader_epoch + 1 if leader != p.leader else p.leader_epoch,
        "partition_epoch": p.partition_epoch + 1,
        "elr": elr,
        "last_known_elr": last_known_elr,
        "adding_replicas": adding,
        "removing_replicas": removing,
    })


class QuorumController:
    """Decides metadata changes. Methods return lists of records (empty = nothing to do)."""

    def __init__(self, settings: Optional[ControllerSettings] = None, rng: Optional[random.Random] = None,
                 new_topic_id: Optional[Callable[[], str]] = None):
        self.settings = settings or ControllerSettings()
        self.rng = rng or random.Random()
        self.new_topic_id = new_topic_id or (lambda: uuid.UUID(int=self.rng.getrandbits(128), version=4).hex)
        self.sessions: dict[int, int] = {}  # broker id -> last heartbeat (ms)
        # unclean recovery: (topic, partition) -> broker id -> (broker epoch, last leader
        # epoch, log end offset), as last reported in a heartbeat (soft state, re-reported)
        self.log_reports: dict[tuple, dict[int, tuple]] = {}
        # fencing from fetch silence (soft state, part B): the last heartbeat this controller
        # itself received per broker (a fresh lease from `reset_sessions` is not one), and
        # silence reports: target broker id -> reporter broker id -> when reported (ms)
        self.heartbeats_received: dict[int, int] = {}
        self.silence_reports: dict[int, dict[int, int]] = {}
        # fencing at scale (soft state): broker id -> the registration epoch fenced, for
        # brokers whose remaining ISR removals (and leader changes beyond one entry) are still
        # to be written (`fence_followups`). Added when the fencing is decided, before its
        # entry commits
        self.fence_pending: dict[int, int] = {}
        # of those, the brokers whose leader changes are all written, and when this
        # controller first saw each fencing committed: (image offset, ms), for
        # `fence_isr_removals_wait_max_ms`
        self._fence_leaders_moved: set[int] = set()
        self._fence_seen: dict[int, tuple[int, int]] = {}
        # broker id -> the highest metadata offset it has (its heartbeats, its feed requests)
        self.metadata_offsets: dict[int, int] = {}

    # ================================================================ helpers
    @staticmethod
    def _usable(image: MetadataImage, broker_id: int, excluded: Iterable[int] = ()) -> bool:
        return broker_id not in excluded and image.is_usable(broker_id)

    def _min_isr(self, t, replicas) -> int:
        """Effective min.insync.replicas of topic `t` (capped at the replication factor,
        as brokers cap it when gating the high watermark)."""
        raw = t.configs.get("min.insync.replicas")
        try:
            value = int(raw) if raw is not None else self.settings.min_insync_replicas
        except ValueError:
            value = self.settings.min_insync_replicas
        return effective_min_insync_replicas(value, len(replicas))

    def _change(self, t, p: PartitionRegistration, *, isr=None, leader=None, replicas=None,
                unclean: Optional[int] = None, elr_add: Iterable[int] = (),
                adding=None, removing=None, min_isr: Optional[int] = None) -> Optional[PartitionChangeRecord]:
        """The record moving `p` to the given ISR / leader / replicas, with its ELR derived:
        members leaving the ISR join the ELR while the new ISR is below min.insync.replicas
        (their log has every committed record: brokers hold the HW there); `unclean` is a
        broker restarting after an unclean shutdown, which is never eligible: while the ISR
        stays below min.insync.replicas, members lost that way are kept in `last_known_elr`
        (unclean recovery compares their logs; they stay there after it, so another unclean
        restart of its leader compares again; `elr_add`: replicas whose reported log equals
        the one unclean recovery elected; `min_isr`: `_min_isr(t, replicas)` when the caller
        already has it)."""
        new_isr = tuple(p.isr if isr is None else isr)
        new_leader = p.leader if leader is None else leader
        new_replicas = tuple(p.replicas if replicas is None else replicas)
        new_adding = tuple(p.adding_replicas if adding is None else adding)
        new_removing = tuple(p.removing_replicas if removing is None else removing)
        if len(new_isr) >= (self._min_isr(t, new_replicas) if min_isr is None else min_isr):
            new_elr: tuple = ()
            new_lke: tuple = ()
        else:
            cand = (set(p.elr) | set(p.isr) | set(elr_add)) - set(new_isr) - {unclean}
            new_elr = tuple(r for r in new_replicas if r in cand)
            lke = set(p.last_known_elr)
            if unclean is not None and (unclean in p.isr or unclean in p.elr):
                lke.add(unclean)
            new_lke = tuple(r for r in new_replicas if r in lke)
        if (new_isr == p.isr and new_leader == p.leader and new_replicas == p.replicas
                and new_elr == p.elr and new_lke == p.last_known_elr
                and new_adding == p.adding_replicas and new_removing == p.removing_replicas):
            return None
        return _next_state(t, p, new_replicas, new_isr, new_leader, new_elr, new_lke, new_adding, new_removing)

    def _elect(self, image: MetadataImage, replicas, isr, excluded=(), included=()) -> int:
        for r in replicas:
            if r in isr and (r in included or self._usable(image, r, excluded)) and r not in excluded:
                return r
        return NO_LEADER

    def _broker(self, image: MetadataImage, broker_id: Any, broker_epoch: Any):
        _require_int(broker_id, "broker_id")
        _require_int(broker_epoch, "broker_epoch", minimum=-1)
        b = image.brokers.get(broker_id)
        if b is None:
            raise KraftlogError(
                ErrorCode.STALE_BROKER_EPOCH,
                f"broker {broker_id} is not registered; register it first (POST /controller/v1/brokers/register)",
            )
        if b.epoch != broker_epoch:
            raise KraftlogError(
                ErrorCode.STALE_BROKER_EPOCH,
                f"broker {broker_id} epoch {broker_epoch} is stale (current {b.epoch}); register again",
                broker_epoch=b.epoch,
            )
        return b

    def _remove_broker_changes(self, image: MetadataImage, broker_id: int, unclean: bool = False,
                               led_only: bool = False, limit: Optional[int] = None) -> list:
        """Partition changes taking `broker_id` out of ISRs and leaderships (fencing,
        controlled shutdown, a restart). The last ISR member stays in the ISR with leader -1
        when no other eligible replica is usable, unless `unclean` (it restarted after an
        unclean shutdown): then it leaves the ISR and ELR too (see the module docstring).
        `led_only`: only those of the partitions it leads (a split fencing's first entry);
        `limit`: the first `limit` of them (in the same order), the walk stops there."""
        return self._removals(image, broker_id, unclean, led_only, limit)[0]

    def _removals(self, image: MetadataImage, broker_id: int, unclean: bool, led_only: bool,
                  limit: Optional[int]) -> tuple:
        """(`_remove_broker_changes`, how many partitions `led_only` skipped that `broker_id`
        is an ISR member of without leading them). One walk of the partitions; the usable
        brokers, each topic's unclean-election flag and its min.insync.replicas per
        replication factor are worked out once, not per partition (a fencing at 100,000
        partitions decides 33,334 leader changes in one call, with the GIL and the state
        machine's lock held)."""
        out: list = []
        isr_only = 0
        usable = {b.id for b in image.brokers.values() if not b.fenced and not b.in_controlled_shutdown}
        usable.discard(broker_id)
        unclean_id = broker_id if unclean else None
        for t in image.topics.values():
            unclean_election = None
            min_isr: dict = {}
            for p in t.partitions.values():
                isr = p.isr
                leads = p.leader == broker_id
                if not leads and broker_id not in isr and not (unclean and broker_id in p.elr):
                    continue
                if led_only and not leads:
                    if broker_id in isr:
                        isr_only += 1
                    continue
                replicas = p.replicas
                new_isr = tuple(r for r in isr if r != broker_id)
                if new_isr and p.leader in new_isr and p.leader in usable:
                    leader = p.leader
                else:
                    leader = next((r for r in replicas if r in new_isr and r in usable), NO_LEADER)
                    if leader == NO_LEADER:
                        elr = p.elr
                        leader = next((r for r in replicas if r in elr and r in usable), NO_LEADER)
                        if leader != NO_LEADER:
                            new_isr = (leader,)    # elected from the ELR
                if leader == NO_LEADER and not new_isr and not unclean:
                    new_isr = isr  # the last ISR member stays (it may lead again when back)
                if leader == NO_LEADER:
                    if unclean_election is None:
                        unclean_election = _unclean_election_enabled(t)
                    if unclean_election:
                        cand = next((r for r in replicas if r in usable), None)
                        if cand is not None:
                            leader, new_isr = cand, (cand,)
                rf = len(replicas)
                m = min_isr.get(rf)
                if m is None:
                    m = min_isr[rf] = self._min_isr(t, replicas)
                if len(new_isr) >= m and not p.elr and not p.last_known_elr:
                    # what `_change` returns here (no ELR before or after), built directly
                    if new_isr == isr and leader == p.leader:
                        continue
                    rec = _next_state(t, p, replicas, new_isr, leader, (), (), p.adding_replicas, p.removing_replicas)
                else:
                    rec = self._change(t, p, isr=new_isr, leader=leader, unclean=unclean_id, min_isr=m)
                if rec is not None:
                    out.append(rec)
                    if limit is not None and len(out) >= limit:
                        return out, isr_only
        return out, isr_only

    def _elect_leaderless(self, image: MetadataImage, extra_usable: Iterable[int] = ()) -> list:
        """Give a leader to every leaderless partition with a usable ISR member, else a
        usable ELR member (which becomes the ISR); then run unclean recovery; last, where
        the topic has unclean.leader.election.enable=true, any usable replica (the
        operator's way out of a partition whose eligible replicas are gone for good)."""
        included = tuple(extra_usable)
        out = []
        # the image's index of leaderless partitions (kept by replay): this runs every
        # maintenance round, and a walk of every partition held the GIL and the state
        # machine's lock against the raft thread for milliseconds per 10,000 partitions
        for t, p in image.leaderless_partitions():
            leader = self._elect(image, p.replicas, p.isr, included=included)
            isr = None
            if leader == NO_LEADER:
                leader = self._elect(image, p.replicas, p.elr, included=included)
                isr = (leader,) if leader != NO_LEADER else None
            same_log: tuple = ()
            if leader == NO_LEADER and p.awaiting_recovery:
                leader, same_log = self._recovery_choice(image, t.name, p, included)
                isr = (leader,) if leader != NO_LEADER else None
            if leader == NO_LEADER and _unclean_election_enabled(t):
                leader = next((r for r in p.replicas if r in included or image.is_usable(r)), NO_LEADER)
                isr = (leader,) if leader != NO_LEADER else None
            if leader != NO_LEADER:
                rec = self._change(t, p, leader=leader, isr=isr, elr_add=same_log)
                if rec is not None:
                    out.append(rec)
                    self.log_reports.pop((t.name, p.partition), None)
        return out

    def _recovery_choice(self, image: MetadataImage, topic: str, p: PartitionRegistration,
                         included: tuple = ()) -> tuple[int, tuple]:
        """Unclean recovery (KIP-966 "balanced"): once every last-known-ELR member is usable
        and reported its log for this partition in its current registration, the one with
        the highest (last leader epoch, log end offset) leads; replica order breaks ties.
        Until then -1: electing a shorter log would truncate committed records away. A
        single member has nothing to be compared with: it leads once usable. Also returns
        the other members whose log ends at the same (epoch, offset): by log matching they
        hold the same records, so they join the ELR (another unclean restart of the new
        leader must not leave it the only candidate)."""
        if len(p.last_known_elr) == 1:
            r = p.last_known_elr[0]
            return (r if r in included or image.is_usable(r) else NO_LEADER), ()
        reports = self.log_reports.get((topic, p.partition), {})
        best, best_key, keys = NO_LEADER, None, {}
        for r in p.last_known_elr:
            b = image.brokers.get(r)
            rep = reports.get(r)
            if b is None or not (r in included or image.is_usable(r)) or rep is None or rep[0] != b.epoch:
                return NO_LEADER, ()
            keys[r] = (rep[1], rep[2])
            if best_key is None or keys[r] > best_key:
                best, best_key = r, keys[r]
        return best, tuple(r for r, k in keys.items() if k == best_key and r != best)

    def record_log_reports(self, image: MetadataImage, broker_id: int, broker_epoch: int, reports: Any) -> None:
        """Keep what a heartbeat reported of the broker's logs for partitions awaiting
        unclean recovery: a list of {topic, partition, partition_epoch, last_epoch,
        log_end_offset}. Only reports made at the current partition epoch count: the broker
        then knew the partition leaderless, so its log no longer changes."""
        if not isinstance(reports, list):
            return
        for rep in reports[:10_000]:
            if not isinstance(rep, dict):
                continue
            topic, part = rep.get("topic"), rep.get("partition")
            last_epoch, leo = rep.get("last_epoch"), rep.get("log_end_offset")
            if not (isinstance(topic, str) and _is_int(part) and _is_int(last_epoch) and _is_int(leo)):
                continue
            p = image.partition(topic, part)
            if (p is None or not p.awaiting_recovery or broker_id not in p.last_known_elr
                    or rep.get("partition_epoch") != p.partition_epoch):
                continue
            self.log_reports.setdefault((topic, part), {})[broker_id] = (broker_epoch, last_epoch, leo)

    # ================================================================ topics
    def create_topic(self, image: MetadataImage, name: Any, partitions: Any, replication_factor: Any,
                     configs: Any = None) -> list:
        validate_topic_name(name)
        if name in image.topics:
            raise KraftlogError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists; delete it first or pick another name")
        if not _is_int(partitions) or partitions < 1:
            raise KraftlogError(ErrorCode.INVALID_PARTITIONS, f"partitions must be an integer >= 1, got {partitions!r}")
        if partitions > self.settings.request_max_partitions:
            raise KraftlogError(ErrorCode.INVALID_PARTITIONS,
                                f"at most {self.settings.request_max_partitions} partitions per request")
        live = {b: image.brokers[b].rack for b in image.placeable_broker_ids()}
        if not _is_int(replication_factor) or replication_factor < 1:
            raise KraftlogError(ErrorCode.INVALID_REPLICATION_FACTOR,
                                f"replication_factor must be an integer >= 1, got {replication_factor!r}")
        if replication_factor > len(live):
            raise KraftlogError(
                ErrorCode.INVALID_REPLICATION_FACTOR,
                f"replication factor {replication_factor} is larger than the {len(live)} available "
                f"(unfenced, not decommissioning) brokers; lower it or start more brokers",
            )
        cfg = _config_map(configs, allow_null=False)
        try:
            _validate_topic_configs(cfg)
        except ValueError as exc:
            raise KraftlogError(ErrorCode.INVALID_CONFIG, str(exc)) from None
        topic_id = self.new_topic_id()
        records: list = [TopicRecord(name=name, topic_id=topic_id)]
        for k in sorted(cfg):
            records.append(ConfigRecord("topic", name, k, cfg[k]))
        for p, replicas in enumerate(assign_replicas(live, partitions, replication_factor, self.rng)):
            records.append(PartitionRecord(name, topic_id, p, tuple(replicas), tuple(replicas), replicas[0], 0, 0))
        return records

    def delete_topic(self, image: MetadataImage, name: Any) -> list:
        t = image.topics.get(name) if isinstance(name, str) else None
        if t is None:
            raise KraftlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist; list topics with GET /v1/topics")
        internal_topics.check_deletion(t.name)
        return [RemoveTopicRecord(name=t.name, topic_id=t.topic_id)]

    def create_partitions(self, image: MetadataImage, name: Any, count: Any) -> list:
        t = image.topics.get(name) if isinstance(name, str) else None
        if t is None:
            raise KraftlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist")
        internal_topics.check_partition_change(t.name)
        current = len(t.partitions)
        if not _is_int(count) or count <= current:
            raise KraftlogError(ErrorCode.INVALID_PARTITIONS,
                                f"count is the new total number of partitions and must be > {current}, got {count!r}")
        if count - current > self.settings.request_max_partitions:
            raise KraftlogError(ErrorCode.INVALID_PARTITIONS,
                                f"at most {self.settings.request_max_partitions} new partitions per request")
        rf = len(t.partitions[0].replicas) if 0 in t.partitions else 1
        live = {b: image.brokers[b].rack for b in image.placeable_broker_ids()}
        if rf > len(live):
            raise KraftlogError(ErrorCode.INVALID_REPLICATION_FACTOR,
                                f"topic has replication factor {rf} but only {len(live)} brokers are available")
        assignment = assign_replicas(live, count - current, rf, self.rng, start_partition_id=current)
        return [
            PartitionRecord(t.name, t.topic_id, current + i, tuple(r), tuple(r), r[0], 0, 0)
            for i, r in enumerate(assignment)
        ]

    def alter_configs(self, image: MetadataImage, name: Any, configs: Any) -> list:
        t = image.topics.get(name) if isinstance(name, str) else None
        if t is None:
            raise KraftlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist")
        changes = _config_map(configs, allow_null=True)
        internal_topics.check_config_change(t.name, changes)
        merged = dict(t.configs)
        for k, v in changes.items():
            if v is None:
                merged.pop(k, None)
            else:
                merged[k] = v
        try:
            _validate_topic_configs(merged)
        except ValueError as exc:
            raise KraftlogError(ErrorCode.INVALID_CONFIG, str(exc)) from None
        return [ConfigRecord("topic", t.name, k, changes[k]) for k in sorted(changes) if t.configs.get(k) != changes[k]]

    # ================================================================ brokers
    def register_broker(self, image: MetadataImage, broker_id: Any, incarnation_id: Any, url: Any,
                        rack: Any = None, now_ms: int = 0, timestamp_ms: Optional[int] = None,
                        clean_shutdown: Any = True, kafka_address: Any = None) -> list:
        """Same incarnation = idempotent retry ([]); new incarnation = restart: the new
        registration starts fenced and the old incarnation's ISR memberships and
        leaderships are removed in the same batch. `clean_shutdown=False` (the broker's logs
        were not closed cleanly: its unflushed tail may be lost) also removes it from the
        ISRs it was the last member of and from every ELR (KIP-966)."""
        _require_int(broker_id, "broker_id")
        if not isinstance(incarnation_id, str) or not incarnation_id:
            raise KraftlogError(ErrorCode.INVALID_REQUEST, "incarnation_id must be a non-empty string (a fresh uuid per process start)")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise KraftlogError(ErrorCode.INVALID_REQUEST, f"url must be the broker's http(s) URL, got {url!r}")
        if rack is not None and not isinstance(rack, str):
            raise KraftlogError(ErrorCode.INVALID_REQUEST, "rack must be a string or null")
        if kafka_address is not None and (not isinstance(kafka_address, str)
                                          or not kafka_address.rpartition(":")[2].isdigit()):
            raise KraftlogError(ErrorCode.INVALID_REQUEST,
                                f"kafka_address must be the broker's Kafka listener as host:port or null, "
                                f"got {kafka_address!r}")
        if broker_id in image.decommissioned:
            raise KraftlogError(ErrorCode.POLICY_VIOLATION,
                                f"broker {broker_id} is decommissioned; recommission it first "
                                f"(kraftlog broker recommission {broker_id}) or give this node a new id")
        self.sessions[broker_id] = now_ms
        self.heartbeats_received[broker_id] = now_ms
        b = image.brokers.get(broker_id)
        if b is not None and b.incarnation_id == incarnation_id:
            return []
        if not isinstance(clean_shutdown, bool):
            raise KraftlogError(ErrorCode.INVALID_REQUEST, "clean_shutdown must be true or false")
        records: list = []
        if b is not None and (not b.fenced or not clean_shutdown):
            records.extend(self._remove_broker_changes(image, broker_id, unclean=not clean_shutdown))
        stamp = now_ms if timestamp_ms is None else timestamp_ms
        records.append(RegisterBrokerRecord(broker_id, incarnation_id, -1, url, rack, True, stamp, kafka_address))
        return records

    def heartbeat(self, image: MetadataImage, broker_id: Any, broker_epoch: Any, metadata_offset: Any,
                  now_ms: int, want_shutdown: bool = False, log_reports: Any = None) -> list:
        """Renews the session lease; unfences a fenced broker that caught up with metadata
        (offset past its registration); drives controlled shutdown when asked; keeps the
        broker's log reports for partitions awaiting unclean recovery (and elects once
        they suffice)."""
        b = self._broker(image, broker_id, broker_epoch)
        if not _is_int(metadata_offset):
            raise KraftlogError(ErrorCode.INVALID_REQUEST, "metadata_offset must be an integer (the records applied)")
        self.sessions[broker_id] = now_ms
        self.heartbeats_received[broker_id] = now_ms
        self.note_metadata_offset(broker_id, metadata_offset)
        if log_reports:
            self.record_log_reports(image, broker_id, b.epoch, log_reports)
        if want_shutdown or b.in_controlled_shutdown:
            return self.controlled_shutdown(image, broker_id, broker_epoch)
        if b.fenced and metadata_offset > b.epoch:
            records: list = [UnfenceBrokerRecord(broker_id, b.epoch)]
            records.extend(self._elect_leaderless(image, extra_usable=(broker_id,)))
            return records
        if log_reports and not b.fenced:
            return self._elect_leaderless(image)
        return []

    def controlled_shutdown(self, image: MetadataImage, broker_id: Any, broker_epoch: Any) -> list:
        """One atomic batch: mark the broker in controlled shutdown, move its leaderships to
        other ISR members, drop it from ISRs that have other members (a partition where it
        is the last ISR member becomes leaderless), and fence it. It then leads nothing and
        may stop (`should_shutdown`)."""
        b = self._broker(image, broker_id, broker_epoch)
        records: list = []
        if not b.in_controlled_shutdown:
            records.append(BrokerRegistrationChangeRecord(broker_id, b.epoch, in_controlled_shutdown=True))
        records.extend(self._remove_broker_changes(image, broker_id))
        if not b.fenced:
            records.append(FenceBrokerRecord(broker_id, b.epoch))
        return records

    @staticmethod
    def leaderships(image: MetadataImage, broker_id: int) -> list:
        return [(t.name, p.partition) for t in image.topics.values() for p in t.partitions.values()
                if p.leader == broker_id]

    @staticmethod
    def should_shutdown(image: MetadataImage, broker_id: int) -> bool:
        b = image.brokers.get(broker_id)
        return b is not None and b.in_controlled_shutdown and not QuorumController.leaderships(image, broker_id)

    def fence_broker(self, image: MetadataImage, broker_id: int) -> list:
        """The entry fencing `broker_id`: FenceBrokerRecord plus the removal of the broker from
        every ISR and leadership, in one batch, unless that holds more than
        `fence_isr_removals_inline_max` ISR-only removals or `fence_batch_records_max`
        changes: then the batch is FenceBrokerRecord plus the partitions it leads (at most
        `fence_batch_records_max`), so they become writable after one entry of that size,
        and `fence_followups` writes the rest (each record still changes one partition whole)."""
        b = image.brokers.get(broker_id)
        if b is None or b.fenced:
            return []
        limit = self.settings.fence_batch_records_max
        # one walk builds the leader changes and counts the ISR-only removals that follow
        # (counted, not built: the first entry of a split fencing builds only the leader changes)
        led, isr_only = self._removals(image, broker_id, False, True, None)
        if isr_only <= self.settings.fence_isr_removals_inline_max and len(led) + isr_only <= limit:
            return [FenceBrokerRecord(broker_id, b.epoch)] + self._remove_broker_changes(image, broker_id)
        self.fence_pending[broker_id] = b.epoch
        return [FenceBrokerRecord(broker_id, b.epoch)] + led[:limit]

    def fence_followups(self, image: MetadataImage, now_ms: Optional[int] = None) -> list:
        """The next entry of a split fencing (see `fence_broker`): for the first fenced broker
        of `fence_pending` that still leads or is in some ISR with other members, at most
        `fence_batch_records_max` of those changes, leader changes first; [] when none is
        left. A broker whose changes are all written, or that registered again (another
        epoch), leaves `fence_pending`. One whose fencing entry has not committed yet (the
        image still shows that registration unfenced) stays: issue 25, a maintenance round
        run while the first entry was being committed dropped it, and the partitions beyond
        that entry kept the dead broker as their leader. With `now_ms`, the ISR-only
        removals wait for the other live brokers (`fence_isr_removals_wait_max_ms`)."""
        limit = self.settings.fence_batch_records_max
        for broker_id, epoch in sorted(self.fence_pending.items()):
            b = image.brokers.get(broker_id)
            if b is not None and b.epoch == epoch and not b.fenced:
                continue   # its fencing is not committed yet (or was not: then nothing follows)
            if b is not None and b.epoch == epoch:
                if broker_id not in self._fence_leaders_moved:
                    records = self._remove_broker_changes(image, broker_id, led_only=True, limit=limit)
                    if records:
                        return records
                    self._fence_leaders_moved.add(broker_id)   # fenced, it leads nothing again
                if self._isr_removals_wait(image, broker_id, now_ms):
                    continue
                records = self._remove_broker_changes(image, broker_id, limit=limit)
                if records:
                    return records
            del self.fence_pending[broker_id]
            self._fence_leaders_moved.discard(broker_id)
            self._fence_seen.pop(broker_id, None)
        return []

    def note_metadata_offset(self, broker_id: Any, offset: Any) -> None:
        """Broker `broker_id` has the metadata before `offset` (a heartbeat's
        metadata_offset, or the `after` of its feed request): `_isr_removals_wait`."""
        if _is_int(broker_id) and _is_int(offset) and offset > self.metadata_offsets.get(broker_id, -1):
            self.metadata_offsets[broker_id] = offset

    def _isr_removals_wait(self, image: MetadataImage, broker_id: int, now_ms: Optional[int]) -> bool:
        """True while the ISR-only removals of fenced `broker_id` should wait: some other
        live broker has not reached the offset at which this controller first saw the
        fencing committed, and `fence_isr_removals_wait_max_ms` has not passed since."""
        wait_ms = self.settings.fence_isr_removals_wait_max_ms
        if not wait_ms or now_ms is None:
            return False
        offset, since = self._fence_seen.setdefault(broker_id, (image.offset, now_ms))
        if now_ms - since >= wait_ms:
            return False
        return any(self.metadata_offsets.get(o.id, -1) < offset for o in image.brokers.values()
                   if o.id != broker_id and not o.fenced and not o.in_controlled_shutdown)

    def fence_unreachable(self, image: MetadataImage, broker_id: Any, broker_epoch: Any) -> list:
        """Fence a broker whose process is gone (a peer reported it and the controller's own
        probe was refused), without waiting for its lease to expire. Only the incarnation
        that was probed (`broker_epoch`) is fenced: a restarted broker is left alone."""
        b = image.brokers.get(broker_id) if _is_int(broker_id) else None
        if b is None or b.fenced or b.epoch != broker_epoch:
            return []
        return self.fence_broker(image, broker_id)

    # ---------------------------------------------------------------- fencing from silence
    def report_silent(self, image: MetadataImage, reporter_id: Any, reporter_epoch: Any, target_id: Any,
                      now_ms: int) -> bool:
        """A live broker reports that `target_id` went silent (its fetches, or its answers to
        ours, stopped). Kept for `broker_silence_report_max_age_ms`; True when it counts (a
        registered, unfenced target other than the reporter). The reporter must be a live
        registration (STALE_BROKER_EPOCH otherwise: a fenced or cut-off broker's view does not count)."""
        r = image.brokers.get(reporter_id) if _is_int(reporter_id) else None
        if r is None or r.fenced or r.epoch != reporter_epoch:
            raise KraftlogError(ErrorCode.STALE_BROKER_EPOCH,
                                f"broker {reporter_id} with epoch {reporter_epoch} is not a live registered "
                                "broker; register first")
        b = image.brokers.get(target_id) if _is_int(target_id) else None
        if b is None or b.fenced or target_id == reporter_id:
            return False
        self.silence_reports.setdefault(target_id, {})[reporter_id] = now_ms
        return True

    def note_alive(self, image: MetadataImage, broker_id: Any, broker_epoch: Any, now_ms: int) -> bool:
        """A broker's process says it is alive while its event loop is busy (issue 25: its
        stall watchdog thread sends this when the loop has not turned for a while, e.g. while
        it applies another broker's fencing at 30,000 partitions). It counts as a heartbeat
        for the silence rule only (`silent_brokers`: a busy broker is not fenced as cut off or
        stopped, as a Kafka broker's heartbeat thread keeps it registered while its request
        handlers are busy); it renews no lease and unfences nothing. True when it counted (a
        live registration of that epoch)."""
        b = image.brokers.get(broker_id) if _is_int(broker_id) else None
        if b is None or b.fenced or b.epoch != broker_epoch:
            return False
        self.heartbeats_received[broker_id] = max(now_ms, self.heartbeats_received.get(broker_id, now_ms))
        return True

    def _heartbeat_silence_ms(self, broker_id: int, now_ms: int) -> Optional[int]:
        """How long this controller has had no heartbeat from `broker_id`; None: it has
        received none since it became active (the brokers were talking to its predecessor)."""
        last = self.heartbeats_received.get(broker_id)
        return None if last is None else now_ms - last

    def silent_brokers(self, image: MetadataImage, now_ms: int) -> list[int]:
        """Brokers to probe before fencing them for silence (part B): unfenced, reported
        silent by at least one other unfenced broker within `broker_silence_report_max_age_ms`,
        and no heartbeat received here for `broker_silence_fence_ms` (or none at all since
        this controller became active). The shell fences one only if its probe cannot
        connect either (`fence_silent`): a broker busy under load still heartbeats and
        accepts connections, a one-way broker-to-broker link loss leaves its heartbeats up."""
        limit = self.settings.broker_silence_fence_ms
        if limit <= 0:
            return []
        max_age = self.settings.broker_silence_report_max_age_ms
        out = []
        for target, reports in list(self.silence_reports.items()):
            b = image.brokers.get(target)
            fresh = {r: t for r, t in reports.items() if now_ms - t <= max_age}
            if fresh:
                self.silence_reports[target] = fresh
            else:
                del self.silence_reports[target]
            if b is None or b.fenced:
                self.silence_reports.pop(target, None)
                continue
            if not any(r in image.brokers and not image.brokers[r].fenced for r in fresh):
                continue   # only fenced reporters: their view does not count
            silence = self._heartbeat_silence_ms(target, now_ms)
            if silence is None or silence >= limit:
                out.append(target)
        return sorted(out)

    def silence_reason(self, broker_id: int, now_ms: int) -> str:
        """Why `broker_id` counts as silent (for the decision log)."""
        reporters = sorted(self.silence_reports.get(broker_id, {}))
        silence = self._heartbeat_silence_ms(broker_id, now_ms)
        hb = ("no heartbeat received since this controller became active" if silence is None
              else f"no heartbeat for {silence} ms")
        return (f"reported silent by broker(s) {reporters}, {hb} "
                f"(broker_silence_fence_ms={self.settings.broker_silence_fence_ms})")

    def fence_silent(self, image: MetadataImage, broker_id: Any, broker_epoch: Any, now_ms: int) -> list:
        """Fence `broker_id` (incarnation `broker_epoch`) when it still counts as silent
        (`silent_brokers`) now that the shell's probe could not connect to it; [] when a
        heartbeat came in meanwhile, it was fenced already, or it registered again."""
        b = image.brokers.get(broker_id) if _is_int(broker_id) else None
        if b is None or b.fenced or b.epoch != broker_epoch or broker_id not in self.silent_brokers(image, now_ms):
            return []
        return self.fence_broker(image, broker_id)

    # ---------------------------------------------------------------- leases
    def reset_sessions(self, image: MetadataImage, now_ms: int) -> None:
        """A new active controller grants every registered broker a fresh lease; heartbeats
        and silence reports its predecessor received are not known here."""
        self.sessions = {b: now_ms for b in image.brokers}
        self.heartbeats_received = {}
        self.silence_reports = {}
        # a predecessor may have died between the entries of a split fencing: look once
        self.fence_pending = {b.id: b.epoch for b in image.brokers.values() if b.fenced}
        self._fence_leaders_moved = set()
        self._fence_seen = {}
        self.metadata_offsets = {}

    def expired_brokers(self, image: MetadataImage, now_ms: int) -> list[int]:
        timeout = self.settings.broker_session_timeout_ms
        out = []
        for b in image.brokers.values():
            if b.fenced:
                continue
            last = self.sessions.setdefault(b.id, now_ms)
            if now_ms - last > timeout:
                out.append(b.id)
        return sorted(out)

    def maintenance(self, image: MetadataImage, now_ms: int, rebalance: bool = False) -> list:
        """Periodic work of the active controller, one batch: fence the first expired
        broker (one per batch keeps batches small), else the next entry of a split fencing
        (`fence_followups`), else elect leaders for leaderless partitions, else (when
        `rebalance`) preferred leader election."""
        expired = self.expired_brokers(image, now_ms)
        if expired:
            return self.fence_broker(image, expired[0])
        records = self.fence_followups(image, now_ms)
        if records:
            return records
        records = self._elect_leaderless(image)
        if records:
            return records
        records = self.complete_reassignments(image) or self.drain_step(image)
        if records:
            return records
        if rebalance and self.settings.auto_leader_rebalance_enable:
            return self.elect_preferred_leaders(image)
        return []

    # ================================================================ partitions
    def alter_partition(self, image: MetadataImage, broker_id: Any, broker_epoch: Any, topic: Any, partition: Any,
                        leader_epoch: Any, partition_epoch: Any, new_isr: Any,
                        new_isr_broker_epochs: Any = None) -> list:
        """An ISR change proposed by the partition leader (Kafka AlterPartition).
        `new_isr_broker_epochs` ({broker id: epoch}, KIP-903) names the registration whose
        fetches the leader counted; a member that has registered again since is refused
        (its new process may have lost what the old one had fetched)."""
        self._broker(image, broker_id, broker_epoch)
        rec = self._alter_partition_change(image, broker_id, topic, partition, leader_epoch, partition_epoch,
                                           new_isr, new_isr_broker_epochs)
        if rec is None:
            return []
        return [rec] + self._throttle_cleanup(image, [rec])

    def alter_partitions(self, image: MetadataImage, broker_id: Any, broker_epoch: Any, items: Any) -> tuple:
        """AlterPartition for many partitions of one leader in one controller write (issue 25:
        a leader of thousands of partitions changes their ISRs in one round trip, not one
        each). `items`: [{topic, partition, leader_epoch, partition_epoch, new_isr,
        new_isr_broker_epochs?}], each checked as `alter_partition` checks it. Returns
        (records, {item index: KraftlogError}): a refused item changes nothing and does not
        stop the others; a stale broker epoch or a malformed body refuses the whole batch."""
        self._broker(image, broker_id, broker_epoch)
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise KraftlogError(ErrorCode.INVALID_REQUEST, "partitions must be a list of objects "
                                "{topic, partition, leader_epoch, partition_epoch, new_isr}")
        if len(items) > ALTER_PARTITIONS_MAX:
            raise KraftlogError(ErrorCode.INVALID_REQUEST, f"at most {ALTER_PARTITIONS_MAX} partitions per "
                                "AlterPartition request; split the batch")
        records: list = []
        errors: dict = {}
        seen: set = set()
        for i, it in enumerate(items):
            key = (it.get("topic"), it.get("partition"))
            try:
                if key in seen:
                    raise KraftlogError(ErrorCode.INVALID_REQUEST,
                                        f"partition {key[0]}-{key[1]} is listed twice; send one ISR per partition")
                seen.add(key)
                rec = self._alter_partition_change(image, broker_id, it.get("topic"), it.get("partition"),
                                                   it.get("leader_epoch"), it.get("partition_epoch"),
                                                   it.get("new_isr"), it.get("new_isr_broker_epochs"))
            except KraftlogError as e:
                errors[i] = e
                continue
            if rec is not None:
                records.append(rec)
        if records:
            records += self._throttle_cleanup(image, records)
        return records, errors

    def _alter_partition_change(self, image: MetadataImage, broker_id: Any, topic: Any, partition: Any,
                                leader_epoch: Any, partition_epoch: Any, new_isr: Any,
                                new_isr_broker_epochs: Any) -> Optional[PartitionChangeRecord]:
        """The PartitionChangeRecord of one AlterPartition (None: nothing changes); the
        leader's registration is checked by the caller."""
        t = image.topics.get(topic) if isinstance(topic, str) else None
        p = t.partitions.get(partition) if t is not None and _is_int(partition) else None
        if p is None:
            raise KraftlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"partition {topic}-{partition} does not exist")
        _require_int(leader_epoch, "leader_epoch")
        _require_int(partition_epoch, "partition_epoch")
        if leader_epoch < p.leader_epoch:
            raise KraftlogError(ErrorCode.FENCED_LEADER_EPOCH,
                                f"leader epoch {leader_epoch} is older than {p.leader_epoch}; refresh metadata",
                                **p.to_json(), partition_epoch=p.partition_epoch)
        if leader_epoch > p.leader_epoch:
            raise KraftlogError(ErrorCode.UNKNOWN_LEADER_EPOCH,
                                f"leader epoch {leader_epoch} is newer than the controller's {p.leader_epoch}; retry later")
        if p.leader != broker_id:
            raise KraftlogError(ErrorCode.NOT_LEADER_OR_FOLLOWER,
                                f"broker {broker_id} is not the leader of {topic}-{partition} (leader {p.leader})",
                                leader_id=p.leader)
        if partition_epoch != p.partition_epoch:
            raise KraftlogError(ErrorCode.INVALID_UPDATE_VERSION,
                                f"partition epoch {partition_epoch} is not the current {p.partition_epoch}; refresh metadata and retry",
                                **p.to_json(), partition_epoch=p.partition_epoch)
        if not isinstance(new_isr, list) or not all(_is_int(r) for r in new_isr) or len(set(new_isr)) != len(new_isr):
            raise KraftlogError(ErrorCode.INVALID_REQUEST, "new_isr must be a list of distinct broker ids")
        if broker_id not in new_isr:
            raise KraftlogError(ErrorCode.INVALID_REQUEST, "new_isr must contain the leader")
        epochs = new_isr_broker_epochs if isinstance(new_isr_broker_epochs, dict) else {}
        for r in new_isr:
            claimed = epochs.get(str(r), epochs.get(r, -1))
            b = image.brokers.get(r)
            if r not in p.isr and _is_int(claimed) and claimed >= 0 and b is not None and b.epoch != claimed:
                raise KraftlogError(ErrorCode.INELIGIBLE_REPLICA,
                                    f"broker {r} registered again (epoch {b.epoch}) since the fetches that made it "
                                    f"look in sync (epoch {claimed}); it cannot join the ISR of {topic}-{partition} "
                                    "until it fetched as its new process")
            if r not in p.replicas:
                raise KraftlogError(ErrorCode.INELIGIBLE_REPLICA, f"broker {r} is not a replica of {topic}-{partition}")
            if r not in p.isr and not image.is_usable(r):
                raise KraftlogError(ErrorCode.INELIGIBLE_REPLICA,
                                    f"broker {r} is fenced or shutting down and cannot join the ISR of {topic}-{partition}")
        ordered = tuple(r for r in p.replicas if r in new_isr)
        done = self._completion(image, dataclasses.replace(p, isr=ordered)) if p.reassigning else None
        return self._change(t, p, **done) if done is not None else self._change(t, p, isr=ordered)

    def elect_preferred_leaders(self, image: MetadataImage, partitions: Optional[list] = None) -> list:
        """Move leadership to the preferred (first) replica where it is in the ISR and usable."""
        out = []
        wanted = None if partitions is None else {(tp[0], tp[1]) for tp in partitions}
        for t in image.topics.values():
            for p in t.partitions.values():
                if wanted is not None and (t.name, p.partition) not in wanted:
                    continue
                pref = p.preferred_leader
                if pref != p.leader and pref in p.isr and image.is_usable(pref):
                    rec = self._change(t, p, leader=pref)
                    if rec is not None:
                        out.append(rec)
        return out

    # ================================================================ reassignment (KIP-455)
    def _completion(self, image: MetadataImage, p: PartitionRegistration, started: bool = False) -> Optional[dict]:
        """`_change` arguments completing `p`'s reassignment, or None while some target
        replica is not in the ISR yet, or no target replica could lead (see
        metadata_quorum/reassignment.py for the rules)."""
        target = p.target_replicas
        if not (p.reassigning or started) or not target or not all(r in p.isr for r in target):
            return None
        usable = [r for r in target if image.is_usable(r)]
        if not usable:
            return None   # wait: completing now would leave the partition leaderless
        if image.is_usable(target[0]):
            leader = target[0]
        elif p.leader in usable:
            leader = p.leader
        else:
            leader = usable[0]
        return {"replicas": target, "isr": target, "leader": leader, "adding": (), "removing": ()}

    def _move(self, image: MetadataImage, t, p: PartitionRegistration, target: tuple) -> Optional[PartitionChangeRecord]:
        """The record starting (or replacing) the move of `p` to `target`, completed at once
        when the ISR already holds every target replica (a reorder, a shrink)."""
        if tuple(target) == p.replicas and not p.reassigning:
            return None   # already there: nothing moves, leadership stays
        replicas, adding, removing = reassignment.moving_replicas(p, target)
        isr = reassignment.ordered(replicas, p.isr)
        if not isr:
            raise KraftlogError(ErrorCode.INVALID_REQUEST,
                                f"moving {t.name}-{p.partition} to {list(target)} would leave no in-sync replica "
                                "(its only in-sync replicas are not in the original or target replicas); cancel first")
        leader = p.leader
        if leader not in isr or not image.is_usable(leader):
            leader = self._elect(image, replicas, isr)
        moving = dataclasses.replace(p, replicas=replicas, isr=isr, leader=leader,
                                     adding_replicas=adding, removing_replicas=removing)
        done = self._completion(image, moving, started=True)
        if done is not None:
            return self._change(t, p, **done)
        return self._change(t, p, replicas=replicas, isr=isr, leader=leader, adding=adding, removing=removing)

    def _cancel(self, image: MetadataImage, t, p: PartitionRegistration) -> Optional[PartitionChangeRecord]:
        """The record returning `p` to its original replicas (None: nothing moves). Raises
        when no original replica is in the ISR (cancelling would lose committed records)."""
        if not p.reassigning:
            return None
        original = p.original_replicas
        isr = reassignment.ordered(original, p.isr)
        if not isr:
            raise KraftlogError(ErrorCode.INVALID_REQUEST,
                                f"cannot cancel the move of {t.name}-{p.partition}: none of its original replicas "
                                f"{list(original)} is in sync (ISR {list(p.isr)}); let the move complete")
        leader = p.leader if p.leader in isr and image.is_usable(p.leader) else self._elect(image, original, isr)
        if leader == NO_LEADER and p.leader in isr:
            leader = p.leader
        return self._change(t, p, replicas=original, isr=isr, leader=leader, adding=(), removing=())

    def _throttle_cleanup(self, image: MetadataImage, records: list, throttle: Optional[int] = None) -> list:
        """Config records of the replication throttle after `records`: set it to `throttle`
        (when given and some move still runs), delete it once no reassignment runs: a
        throttle lives exactly as long as the moves it served."""
        after = {(r.topic, r.partition): bool(r.adding_replicas or r.removing_replicas)
                 for r in records if isinstance(r, PartitionChangeRecord)}
        running = (any(after.get((name, p.partition), True) for name, p in image.reassignments())
                   or any(after.values()))
        defaults = image.broker_configs.get(reassignment.CLUSTER_DEFAULT, {})
        if running:
            if throttle is None:
                return []
            return [ConfigRecord("broker", reassignment.CLUSTER_DEFAULT, k, str(throttle))
                    for k in reassignment.THROTTLE_KEYS if defaults.get(k) != str(throttle)]
        return [ConfigRecord("broker", reassignment.CLUSTER_DEFAULT, k, None)
                for k in reassignment.THROTTLE_KEYS if k in defaults]

    def alter_partition_reassignments(self, image: MetadataImage, doc: Any) -> list:
        """Kafka's AlterPartitionReassignments: one atomic batch starting (or, for `replicas:
        null`, cancelling) every listed move, plus the throttle when given. Invalid input
        changes nothing (KraftlogError naming the problem)."""
        moves, throttle = reassignment.parse_request(image, doc)
        records: list = []
        for m in moves:
            t = image.topics[m.topic]
            p = t.partitions[m.partition]
            rec = self._cancel(image, t, p) if m.target is None else self._move(image, t, p, m.target)
            if rec is not None:
                records.append(rec)
        return records + self._throttle_cleanup(image, records, throttle)

    def cancel_reassignments(self, image: MetadataImage, partitions: Optional[list] = None) -> list:
        """Cancel every running move (or those of `partitions`, [(topic, partition)]): the
        original replicas come back, the throttle goes."""
        wanted = None if partitions is None else {(tp[0], tp[1]) for tp in partitions}
        records = []
        for name, p in image.reassignments():
            if wanted is None or (name, p.partition) in wanted:
                rec = self._cancel(image, image.topics[name], p)
                if rec is not None:
                    records.append(rec)
        return records + self._throttle_cleanup(image, records)

    def complete_reassignments(self, image: MetadataImage) -> list:
        """Complete every move whose target replicas are all in the ISR (also the ones
        decided by a previous active controller)."""
        records = []
        for name, p in image.reassignments():
            done = self._completion(image, p)
            if done is not None:
                rec = self._change(image.topics[name], p, **done)
                if rec is not None:
                    records.append(rec)
        if records:
            records += self._throttle_cleanup(image, records)
        return records

    # ================================================================ decommission
    def _require_broker_id(self, image: MetadataImage, broker_id: Any) -> int:
        _require_int(broker_id, "broker id")
        if broker_id not in image.brokers and broker_id not in image.decommissioned:
            raise KraftlogError(ErrorCode.INVALID_REQUEST,
                                f"broker {broker_id} is not registered; use an id from GET /v1/brokers")
        return broker_id

    def _drain_moves(self, image: MetadataImage, broker_id: int) -> list:
        records = []
        for name, part, target in reassignment.drain_targets(image, broker_id):
            t = image.topics[name]
            rec = self._move(image, t, t.partitions[part], target)
            if rec is not None:
                records.append(rec)
        return records

    def decommission_broker(self, image: MetadataImage, broker_id: Any) -> list:
        """Cordon `broker_id` (state draining: no new placements) and start moving every
        replica it holds away, in one batch; the maintenance loop (`drain_step`) finishes the
        moves and then removes its registration. Refused (POLICY_VIOLATION, nothing
        changed) when some partition would have no broker left to take the replica."""
        self._require_broker_id(image, broker_id)
        state = image.broker_state(broker_id)
        if state == "decommissioned":
            return []
        if state == "active" and not any(b != broker_id for b in image.placeable_broker_ids()):
            raise KraftlogError(ErrorCode.POLICY_VIOLATION,
                                f"cannot decommission broker {broker_id}: no other active broker would be left; "
                                "add a broker first")
        records: list = []
        if state != "draining":
            records.append(BrokerMembershipRecord(broker_id, "draining"))
        # decide the moves as if the broker were already cordoned
        cordoned = _with_state(image, broker_id, "draining")
        records.extend(self._drain_moves(cordoned, broker_id))
        return records

    def recommission_broker(self, image: MetadataImage, broker_id: Any) -> list:
        """Cancel a decommission: the broker is active again (takes new replicas, may
        register again), and the moves taking replicas off it are cancelled."""
        self._require_broker_id(image, broker_id)
        if image.broker_state(broker_id) == "active":
            return []
        moves = [(name, p.partition) for name, p in image.reassignments() if broker_id in p.removing_replicas]
        records: list = [BrokerMembershipRecord(broker_id, "active")]
        if moves:
            records.extend(self.cancel_reassignments(image, moves))
        return records

    def drain_step(self, image: MetadataImage) -> list:
        """Maintenance of draining brokers: start the moves still missing (a move was
        cancelled, a partition created before the cordon), and unregister a broker that
        holds no replica any more (state decommissioned)."""
        for broker_id in sorted(b for b, st in image.broker_states.items() if st == "draining"):
            if image.replica_count(broker_id) == 0:
                return [BrokerMembershipRecord(broker_id, "decommissioned")]
            try:
                records = self._drain_moves(image, broker_id)
            except KraftlogError:
                continue   # no broker can take a replica now (one is fenced): retried later
            if records:
                return records
        return []

    # ================================================================ producer ids
    def allocate_producer_ids(self, image: MetadataImage, broker_id: Any, broker_epoch: Any) -> tuple[list, int, int]:
        self._broker(image, broker_id, broker_epoch)
        first = image.next_producer_id
        size = self.settings.producer_id_block_size
        return [ProducerIdsRecord(broker_id, broker_epoch, first + size)], first, size


def _with_state(image: MetadataImage, broker_id: int, state: str) -> MetadataImage:
    """A shallow view of `image` with `broker_id` in `state` (for deciding moves in the same
    batch as the cordon; the image itself is never mutated)."""
    view = MetadataImage.__new__(MetadataImage)
    view.__dict__.update(image.__dict__)
    view.broker_states = dict(image.broker_states)
    view.broker_states[broker_id] = state
    return view
