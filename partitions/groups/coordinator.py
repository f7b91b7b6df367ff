"""GroupCoordinatorState: the groups and committed offsets of one `__consumer_offsets`
partition, as a pure state machine (KIP-848-style server-side assignment).

Membership protocol (one HTTP heartbeat shape for join, heartbeat and leave):
- join: a member arrives with its subscribed topics (member epoch 0). The group epoch is
  bumped and the target assignment recomputed by the group's assignor.
- heartbeat: the member reports the partitions it owns. The coordinator reconciles it
  towards its target: first it *revokes* partitions the member must give up (the answer
  is a smaller assignment; the member commits, stops fetching them and says so in its next
  heartbeat), then it *assigns* target partitions that no other member still owns or is
  still revoking, and the member's epoch becomes the target epoch. Hence no partition is
  ever owned by two members at once.
- leave, or no heartbeat for `session_timeout_ms` (or not revoking within
  `rebalance_timeout_ms`): the member is removed, the group epoch bumped, its partitions go
  to the others on their next heartbeats.

Fencing: a heartbeat from an unknown member is UNKNOWN_MEMBER_ID, one with an epoch the
coordinator did not give is FENCED_MEMBER_EPOCH (the member must rejoin with epoch 0). An
offset commit carrying a member id and epoch is accepted only for partitions that member
still owns (assigned or being revoked) with its current epoch (or an older epoch while it
still owns them); otherwise ILLEGAL_GENERATION, so a fenced or slow member cannot move a
partition's committed offset backwards behind its new owner. A commit without member id
is accepted only while the group has no members (admin / manually assigned consumers).

Offset retention (Kafka's offsets.retention.minutes, KIP-211): `expire_offsets` drops the
committed offsets of groups without members once they are `retention_ms` old, counted from
the later of the commit and the moment the group became empty (`empty_since_ms`, kept in
the group record); a group whose offsets are all gone, or an empty group without offsets
past retention, is deleted with them. Groups with members keep everything.

Persistence: every change returns records (`(key, value)` bytes, see records.py) that the
shell appends to this partition with acks=all; `replay(key, value, offset, now_ms)` applies a
record read back from the log, so a new leader rebuilds the same state. Offset commits are
applied only once written (`apply`); membership changes are applied at once and written
after (a failed write means the partition's leadership is being lost and the state is
dropped anyway). Time is always passed in (`now_ms`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from partitions.groups import records as rec
from partitions.groups.assignors import ASSIGNORS, DEFAULT_ASSIGNOR

TopicPartition = tuple[str, int]
Record = tuple[bytes, "bytes | None"]

GROUP_ID_MAX_CHARS = 249
COMMIT_METADATA_MAX_CHARS = 4096          # Kafka offset.metadata.max.bytes


class GroupError(Exception):
    """A refused group request; `code` is the Kafka error name (mapped to HTTP by the shell)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@dataclass
class GroupConfig:
    """Broker limits for groups (Kafka names with the unit last)."""

    session_timeout_ms: int = 45_000           # default session.timeout.ms of a member
    group_min_session_timeout_ms: int = 1_000  # joins asking for less are refused (INVALID_SESSION_TIMEOUT)
    group_max_session_timeout_ms: int = 300_000
    heartbeat_interval_ms: int = 3_000         # capped at a third of the member's session timeout
    rebalance_timeout_ms: int = 60_000         # a member must revoke within this, else it is removed
    group_max_size: int = 1_000                # members per group (GROUP_MAX_SIZE_REACHED)


@dataclass
class Member:
    member_id: str
    client_id: str
    subscribed_topics: tuple
    session_timeout_ms: int
    rebalance_timeout_ms: int
    member_epoch: int = 0
    assigned: frozenset = frozenset()
    pending_revocation: frozenset = frozenset()
    last_heartbeat_ms: int = 0
    revocation_started_ms: int = 0

    def owns(self) -> frozenset:
        return self.assigned | self.pending_revocation

    def to_dict(self) -> dict:
        return {"member_id": self.member_id, "client_id": self.client_id,
                "subscribed_topics": list(self.subscribed_topics),
                "session_timeout_ms": self.session_timeout_ms, "rebalance_timeout_ms": self.rebalance_timeout_ms,
                "member_epoch": self.member_epoch, "assigned": _tp_list(self.assigned),
                "pending_revocation": _tp_list(self.pending_revocation)}


@dataclass
class Group:
    group_id: str
    assignor: str = DEFAULT_ASSIGNOR
    group_epoch: int = 0
    target_epoch: int = 0
    members: dict = field(default_factory=dict)      # member_id -> Member
    target: dict = field(default_factory=dict)       # member_id -> frozenset of TopicPartition
    empty_since_ms: int = -1                         # when the last member left (-1: has members / never)

    @property
    def state(self) -> str:
        if not self.members:
            return "empty"
        for m in self.members.values():
            if m.pending_revocation or m.member_epoch != self.target_epoch or \
                    m.assigned != self.target.get(m.member_id, frozenset()):
                return "reconciling"
        return "stable"

    def to_dict(self) -> dict:
        return {"group": self.group_id, "assignor": self.assignor, "group_epoch": self.group_epoch,
                "target_epoch": self.target_epoch,
                "members": [self.members[m].to_dict() for m in sorted(self.members)],
                "target": {m: _tp_list(tps) for m, tps in sorted(self.target.items())},
                "empty_since_ms": self.empty_since_ms}


@dataclass
class OffsetAndMetadata:
    offset: int
    metadata: str = ""
    commit_timestamp_ms: int = 0
    record_offset: int = -1      # where in __consumer_offsets it was written (later wins)


@dataclass
class HeartbeatResult:
    """What a member is told: its id, epoch, the partitions it may consume now."""

    member_id: str
    member_epoch: int
    assignment: frozenset
    heartbeat_interval_ms: int
    session_timeout_ms: int = 0

    def to_json(self) -> dict:
        return {"member_id": self.member_id, "member_epoch": self.member_epoch,
                "heartbeat_interval_ms": self.heartbeat_interval_ms,
                "session_timeout_ms": self.session_timeout_ms,
                "assignment": [{"topic": t, "partition": p} for t, p in sorted(self.assignment)]}


def _tp_list(tps: Iterable[TopicPartition]) -> list:
    return [[t, p] for t, p in sorted(tps)]


def _tp_set(items) -> frozenset:
    return frozenset((str(t), int(p)) for t, p in items)


class GroupCoordinatorState:
    """Groups + committed offsets of one `__consumer_offsets` partition (see module doc).

    Invariants: within a group no partition is in two members' `owns()`; a member's epoch
    never exceeds the group's target epoch; committed offsets in the cache are exactly
    those written to the log, the latest record offset winning.
    """

    def __init__(self, config: GroupConfig | None = None, topics: dict | None = None) -> None:
        self.config = config or GroupConfig()
        self.topics: dict[str, int] = dict(topics or {})      # topic -> partition count
        self.groups: dict[str, Group] = {}
        self.offsets: dict[str, dict[TopicPartition, OffsetAndMetadata]] = {}

    # ---- metadata ----------------------------------------------------------------------

    def update_topics(self, topics: dict[str, int], now_ms: int) -> list[Record]:
        """New partition counts: groups subscribed to a changed topic get a new target."""
        old, self.topics = self.topics, dict(topics)
        changed = {t for t in set(old) | set(topics) if old.get(t) != topics.get(t)}
        out = []
        for g in self.groups.values():
            if any(changed & set(m.subscribed_topics) for m in g.members.values()):
                self._bump(g)
                out.append(self._group_record(g))
        return out

    def refresh_targets(self, now_ms: int) -> list[Record]:
        """After a load: groups whose target assignment does not cover exactly the current
        partitions of their subscriptions (topics changed while no coordinator ran) get a
        new target."""
        out = []
        for g in self.groups.values():
            if not g.members:
                continue
            universe = {(t, p) for m in g.members.values() for t in m.subscribed_topics
                        for p in range(self.topics.get(t, 0))}
            targeted = set().union(*g.target.values()) if g.target else set()
            if targeted != universe or set(g.target) != set(g.members):
                self._bump(g)
                out.append(self._group_record(g))
        return out

    # ---- membership --------------------------------------------------------------------

    def join(self, group_id: str, member_id: str, subscribed_topics: Iterable[str], now_ms: int, *,
             client_id: str = "", session_timeout_ms: int | None = None,
             rebalance_timeout_ms: int | None = None, assignor: str | None = None) -> tuple[HeartbeatResult, list]:
        """A member (new, or restarting with its old id) joins with epoch 0 and owns nothing."""
        cfg = self.config
        sto = cfg.session_timeout_ms if session_timeout_ms is None else session_timeout_ms
        if not cfg.group_min_session_timeout_ms <= sto <= cfg.group_max_session_timeout_ms:
            raise GroupError("INVALID_SESSION_TIMEOUT",
                             f"session_timeout_ms={sto} is outside the broker limits "
                             f"[{cfg.group_min_session_timeout_ms}, {cfg.group_max_session_timeout_ms}]")
        rto = cfg.rebalance_timeout_ms if rebalance_timeout_ms is None else rebalance_timeout_ms
        if rto < 1:
            raise GroupError("INVALID_REQUEST", "rebalance_timeout_ms must be >= 1")
        topics = tuple(sorted(set(subscribed_topics)))
        if not topics:
            raise GroupError("INVALID_REQUEST", "subscribed_topics: give at least one topic")
        g = self.groups.get(group_id)
        if assignor is not None and assignor not in ASSIGNORS:
            raise GroupError("UNSUPPORTED_ASSIGNOR",
                             f"assignor {assignor!r} is unknown; use one of {sorted(ASSIGNORS)}")
        if g is None:
            g = self.groups[group_id] = Group(group_id, assignor or DEFAULT_ASSIGNOR)
        elif assignor is not None and assignor != g.assignor:
            if g.members and set(g.members) != {member_id}:
                raise GroupError("INCONSISTENT_GROUP_PROTOCOL",
                                 f"group {group_id!r} uses the {g.assignor!r} assignor; join with that one "
                                 "(or omit it), or use another group id")
            g.assignor = assignor
        if member_id not in g.members and len(g.members) >= cfg.group_max_size:
            raise GroupError("GROUP_MAX_SIZE_REACHED",
                             f"group {group_id!r} already has {cfg.group_max_size} members")
        g.members[member_id] = Member(member_id, client_id, topics, sto, rto, member_epoch=0,
                                      last_heartbeat_ms=now_ms)
        g.empty_since_ms = -1
        self._bump(g)
        result = self._reconcile(g, g.members[member_id], frozenset(), now_ms)
        return result, [self._group_record(g)]

    def heartbeat(self, group_id: str, member_id: str, member_epoch: int, now_ms: int, *,
                  owned: Iterable[TopicPartition] | None = None,
                  subscribed_topics: Iterable[str] | None = None) -> tuple[HeartbeatResult, list]:
        g, m = self._member(group_id, member_id)
        owned_set = None if owned is None else _tp_set(owned)
        if member_epoch != m.member_epoch:
            # a lost answer: the member still uses an older epoch; fine while what it owns is its own
            if not (member_epoch < m.member_epoch and owned_set is not None and owned_set <= m.owns()):
                raise GroupError("FENCED_MEMBER_EPOCH",
                                 f"member {member_id} sent epoch {member_epoch} but its epoch is "
                                 f"{m.member_epoch}; drop your partitions and rejoin with member_epoch 0")
        m.last_heartbeat_ms = now_ms
        before = g.to_dict()
        if subscribed_topics is not None:
            topics = tuple(sorted(set(subscribed_topics)))
            if topics and topics != m.subscribed_topics:
                m.subscribed_topics = topics
                self._bump(g)
        result = self._reconcile(g, m, owned_set, now_ms)
        return result, ([self._group_record(g)] if g.to_dict() != before else [])

    def leave(self, group_id: str, member_id: str, now_ms: int) -> list[Record]:
        g, _ = self._member(group_id, member_id)
        return self._remove(g, member_id, now_ms)

    def expire(self, now_ms: int) -> list[tuple[str, str, list]]:
        """Remove members whose session expired or who did not revoke in time.
        -> [(group_id, member_id, records)]."""
        out = []
        for g in list(self.groups.values()):
            for m in list(g.members.values()):
                late = now_ms - m.last_heartbeat_ms > m.session_timeout_ms
                stuck = bool(m.pending_revocation) and now_ms - m.revocation_started_ms > m.rebalance_timeout_ms
                if late or stuck:
                    out.append((g.group_id, m.member_id, self._remove(g, m.member_id, now_ms)))
        return out

    def next_expiry_ms(self) -> int | None:
        """The earliest time at which `expire` may remove someone (for the shell's timer)."""
        times = []
        for g in self.groups.values():
            for m in g.members.values():
                times.append(m.last_heartbeat_ms + m.session_timeout_ms + 1)
                if m.pending_revocation:
                    times.append(m.revocation_started_ms + m.rebalance_timeout_ms + 1)
        return min(times) if times else None

    def _member(self, group_id: str, member_id: str) -> tuple[Group, Member]:
        g = self.groups.get(group_id)
        m = g.members.get(member_id) if g is not None else None
        if m is None:
            raise GroupError("UNKNOWN_MEMBER_ID",
                             f"member {member_id!r} is not in group {group_id!r} (left, or its session "
                             "expired); rejoin with member_epoch 0")
        return g, m

    def _remove(self, g: Group, member_id: str, now_ms: int) -> list[Record]:
        g.members.pop(member_id, None)
        if not g.members:
            g.empty_since_ms = now_ms
        self._bump(g)
        return [self._group_record(g)]

    def _bump(self, g: Group) -> None:
        """New group epoch and target assignment (the members' current ownership as input,
        so the sticky assignor moves as little as possible)."""
        g.group_epoch += 1
        subs = {mid: m.subscribed_topics for mid, m in g.members.items()}
        current = {mid: m.owns() for mid, m in g.members.items()}
        g.target = ASSIGNORS[g.assignor](subs, self.topics, current) if subs else {}
        g.target_epoch = g.group_epoch

    def _reconcile(self, g: Group, m: Member, owned: frozenset | None, now_ms: int) -> HeartbeatResult:
        if m.pending_revocation:
            if owned is not None and not (owned & m.pending_revocation):
                m.pending_revocation = frozenset()          # revocation acknowledged
            else:
                return self._result(m)
        target = g.target.get(m.member_id, frozenset())
        revoke = m.assigned - target
        if revoke:
            m.assigned = m.assigned & target
            m.pending_revocation = revoke
            m.revocation_started_ms = now_ms
            return self._result(m)
        taken = set()
        for other in g.members.values():
            if other is not m:
                taken |= other.owns()
        m.assigned = m.assigned | frozenset(tp for tp in target if tp not in taken)
        m.member_epoch = g.target_epoch
        return self._result(m)

    def _result(self, m: Member) -> HeartbeatResult:
        interval = max(1, min(self.config.heartbeat_interval_ms, m.session_timeout_ms // 3))
        return HeartbeatResult(m.member_id, m.member_epoch, m.assigned, interval, m.session_timeout_ms)

    def _group_record(self, g: Group) -> Record:
        return rec.group_key(g.group_id), rec.group_value(g.to_dict())

    # ---- offsets -----------------------------------------------------------------------

    def prepare_commit(self, group_id: str, offsets: list[tuple], now_ms: int, *,
                       member_id: str | None = None, member_epoch: int | None = None) -> list[Record]:
        """Validate a commit (fencing) and return its records; apply them once written.
        `offsets`: [(topic, partition, offset[, metadata])]."""
        g = self.groups.get(group_id)
        if member_id is None:
            if g is not None and g.members:
                raise GroupError("UNKNOWN_MEMBER_ID",
                                 f"group {group_id!r} has active members; commit with your member_id and "
                                 "member_epoch, or use a group with no members for manual commits")
        else:
            g, m = self._member(group_id, member_id)
            epoch = m.member_epoch if member_epoch is None else member_epoch
            if epoch > m.member_epoch:
                raise GroupError("FENCED_MEMBER_EPOCH",
                                 f"member epoch {epoch} is newer than the coordinator's {m.member_epoch}; "
                                 "rejoin the group")
            owns = m.owns()
            for t, p, *_ in offsets:
                if (t, p) not in owns:
                    raise GroupError("ILLEGAL_GENERATION",
                                     f"{t}-{p} is not assigned to member {member_id} (epoch {epoch}, current "
                                     f"{m.member_epoch}); it was revoked: do not commit it")
        out = []
        for entry in offsets:
            t, p, o = entry[0], entry[1], entry[2]
            meta = entry[3] if len(entry) > 3 and entry[3] is not None else ""
            if len(meta) > COMMIT_METADATA_MAX_CHARS:
                raise GroupError("OFFSET_METADATA_TOO_LARGE",
                                 f"metadata of {t}-{p} exceeds {COMMIT_METADATA_MAX_CHARS} characters")
            out.append((rec.offset_key(group_id, t, p), rec.offset_value(o, meta, now_ms)))
        return out

    def delete_group(self, group_id: str) -> list[Record]:
        """Forget an empty group and its committed offsets (Kafka DeleteGroups): the group is
        gone at once; its offsets once the returned tombstones are written and applied."""
        g = self.groups.get(group_id)
        if g is not None and g.members:
            raise GroupError("NON_EMPTY_GROUP",
                             f"group {group_id!r} has {len(g.members)} member(s); stop its consumers first")
        if g is None and group_id not in self.offsets:
            raise GroupError("GROUP_ID_NOT_FOUND", f"group {group_id!r} does not exist")
        self.groups.pop(group_id, None)
        out = [(rec.group_key(group_id), None)]
        out += [(rec.offset_key(group_id, t, p), None) for (t, p) in sorted(self.offsets.get(group_id, {}))]
        return out

    def expire_offsets(self, now_ms: int, retention_ms: int) -> list[Record]:
        """Tombstones for offsets past retention (see module doc); groups left with nothing
        are forgotten at once, their offsets once the tombstones are written and applied.
        The caller must not have commits of this partition in flight (a commit decided
        before this call but not yet applied would be deleted by these tombstones)."""
        out: list[Record] = []
        for gid in sorted(self.offsets):
            g = self.groups.get(gid)
            if g is not None and g.members:
                continue
            since = g.empty_since_ms if g is not None else -1
            offs = self.offsets[gid]
            expired = [tp for tp, om in sorted(offs.items())
                       if now_ms - max(om.commit_timestamp_ms, since) >= retention_ms]
            out += [(rec.offset_key(gid, t, p), None) for t, p in expired]
            if expired and len(expired) == len(offs) and g is not None:
                self.groups.pop(gid)
                out.append((rec.group_key(gid), None))
        for gid, g in sorted(self.groups.items()):
            if (not g.members and gid not in self.offsets and g.empty_since_ms >= 0
                    and now_ms - g.empty_since_ms >= retention_ms):
                self.groups.pop(gid)
                out.append((rec.group_key(gid), None))
        return out

    def fetch_offsets(self, group_id: str) -> list[tuple[str, int, OffsetAndMetadata]]:
        return [(t, p, om) for (t, p), om in sorted(self.offsets.get(group_id, {}).items())]

    def delete_topic_offsets(self, topic: str) -> list[Record]:
        """Tombstones for every committed offset of a deleted topic."""
        out = []
        for gid, offs in self.offsets.items():
            for (t, p) in sorted(offs):
                if t == topic:
                    out.append((rec.offset_key(gid, t, p), None))
        return out

    # ---- replay ------------------------------------------------------------------------

    def apply(self, records: list[Record], first_offset: int, now_ms: int) -> None:
        """Apply offset records just written at consecutive offsets from `first_offset`.
        Group records are skipped: membership changes were applied when decided (a later
        change may already be in memory; replaying an older snapshot would undo it)."""
        for i, (k, v) in enumerate(records):
            if k is not None and b'"type":"offset"' in k:
                self.replay(k, v, first_offset + i, now_ms)

    def replay(self, key: bytes | None, value: bytes | None, offset: int, now_ms: int) -> None:
        """Apply one record read from the log (in log order). Unknown keys are ignored."""
        if key is None:
            return
        try:
            k = rec.decode_key(key)
            v = rec.decode_value(value)
        except ValueError:
            return
        gid = k["group"]
        if k["type"] == "offset":
            tp = (k["topic"], int(k["partition"]))
            offs = self.offsets.setdefault(gid, {})
            cur = offs.get(tp)
            if cur is not None and cur.record_offset > offset:
                return
            if v is None:
                offs.pop(tp, None)
                if not offs:
                    self.offsets.pop(gid, None)
            else:
                offs[tp] = OffsetAndMetadata(int(v["offset"]), v.get("metadata", ""),
                                             int(v.get("commit_timestamp_ms", 0)), offset)
            return
        if v is None:
            self.groups.pop(gid, None)
            return
        old = self.groups.get(gid)
        g = Group(gid, v.get("assignor", DEFAULT_ASSIGNOR), int(v["group_epoch"]), int(v["target_epoch"]),
                  empty_since_ms=int(v.get("empty_since_ms", -1)))
        for d in v.get("members", []):
            prev = old.members.get(d["member_id"]) if old is not None else None
            g.members[d["member_id"]] = Member(
                d["member_id"], d.get("client_id", ""), tuple(d["subscribed_topics"]),
                int(d["session_timeout_ms"]), int(d["rebalance_timeout_ms"]), int(d["member_epoch"]),
                _tp_set(d["assigned"]), _tp_set(d["pending_revocation"]),
                # a new coordinator gives every member a fresh session
                prev.last_heartbeat_ms if prev is not None else now_ms,
                prev.revocation_started_ms if prev is not None else now_ms)
        g.target = {mid: _tp_set(tps) for mid, tps in v.get("target", {}).items()}
        self.groups[gid] = g

    # ---- views -------------------------------------------------------------------------

    def describe(self, group_id: str, now_ms: int) -> dict | None:
        g = self.groups.get(group_id)
        if g is None and group_id not in self.offsets:
            return None
        members = []
        if g is not None:
            for mid in sorted(g.members):
                m = g.members[mid]
                members.append(dict(m.to_dict(), target=_tp_list(g.target.get(mid, frozenset())),
                                    last_heartbeat_ms_ago=now_ms - m.last_heartbeat_ms))
        return {"group_id": group_id, "state": g.state if g is not None else "empty",
                "assignor": g.assignor if g is not None else DEFAULT_ASSIGNOR,
                "group_epoch": g.group_epoch if g is not None else 0, "members": members}

    def list_groups(self) -> list[dict]:
        ids = sorted(set(self.groups) | set(self.offsets))
        out = []
        for gid in ids:
            g = self.groups.get(gid)
            out.append({"group_id": gid, "state": g.state if g is not None else "empty",
                        "members": len(g.members) if g is not None else 0})
        return out
