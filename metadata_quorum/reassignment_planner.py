"""A deterministic, pure planner of partition reassignments ("add brokers", "remove brokers",
"rebalance"), emitting Kafka's reassignment JSON (KIP-455, `kafka-reassign-partitions`).

Input: the current assignment `{(topic, partition): [replica ids, leader first]}`, the brokers
(`BrokerSpec`: id, rack, optional `capacity_bytes`), optional partition sizes in bytes.

Hard goals (a plan that cannot meet them raises KraftlogError saying why):
  * the replication factor of every partition is kept;
  * rack awareness: no rack holds more than ceil(RF / racks) replicas of a partition (so, when
    there are at least RF racks, no two replicas of a partition share a rack); a broker
    without a rack counts as a rack of its own;
  * no broker ends above its `capacity_bytes` (sizes missing count as 0);
  * removed brokers (and ids not among the brokers) hold nothing.

Soft goals, best effort, in this order: replicas per broker within 1, bytes per broker within
10% of the mean (`BYTES_TOLERANCE`), leaders (first replicas) per broker within 1. Moves are
kept few: a replica moves only to repair a hard goal or to narrow a gap of 2 or more (bytes:
to shrink the gap), and leaders are balanced by reordering replica lists, never by moving data.

A cordoned (draining) broker keeps its replicas but receives none and is left out of the
balance. Only partitions of `topics` (all when None) may change; loads count every partition, so the
goals are per broker across the cluster. Same input, same plan: every choice breaks ties by
broker id and (topic, partition). Pure: no IO, no clock, no randomness.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional, Sequence

from partitions.errors import ErrorCode, KraftlogError

TopicPartition = tuple[str, int]
BYTES_TOLERANCE = 0.10       # soft goal: every broker's bytes within 10% of the mean
MAX_ROUNDS = 100_000         # a bound on improving steps (each strictly lowers a potential)
FIXED_POINT_ROUNDS = 10      # rounds of the soft goals until one changes nothing

MODES = ("add-brokers", "remove-brokers", "rebalance")


@dataclass(frozen=True)
class BrokerSpec:
    """A broker as the planner sees it: `rack` None = a rack of its own; `capacity_bytes`
    None = unbounded; `cordoned` (draining): it keeps its replicas but gets no new one and
    is left out of the balance."""
    id: int
    rack: Optional[str] = None
    capacity_bytes: Optional[int] = None
    cordoned: bool = False

    @property
    def rack_key(self) -> str:
        return self.rack if self.rack is not None else f"\x00broker-{self.id}"


def _err(message: str, code: ErrorCode = ErrorCode.INVALID_REQUEST) -> KraftlogError:
    return KraftlogError(code, message)


class _State:
    """The working assignment and per-broker loads (replicas, bytes, leaders)."""

    def __init__(self, assignment: Mapping[TopicPartition, Sequence[int]], brokers: dict[int, BrokerSpec],
                 eligible: list[int], sizes: Mapping[TopicPartition, int]) -> None:
        self.assignment = {tp: list(r) for tp, r in assignment.items()}
        self.brokers = brokers
        self.eligible = eligible
        self.sizes = sizes
        self.replicas = {b: 0 for b in eligible}
        self.bytes = {b: 0 for b in eligible}
        self.leaders = {b: 0 for b in eligible}
        for tp, reps in self.assignment.items():
            for i, b in enumerate(reps):
                self._count(b, tp, i == 0, +1)
        racks = {brokers[b].rack_key for b in eligible}
        self.n_racks = max(1, len(racks))

    def size(self, tp: TopicPartition) -> int:
        return max(0, int(self.sizes.get(tp, 0)))

    def _count(self, b: int, tp: TopicPartition, leader: bool, sign: int) -> None:
        if b in self.replicas:
            self.replicas[b] += sign
            self.bytes[b] += sign * self.size(tp)
            if leader:
                self.leaders[b] += sign

    def max_per_rack(self, rf: int) -> int:
        return math.ceil(rf / self.n_racks)

    def rack_ok(self, reps: Sequence[int]) -> bool:
        counts: dict[str, int] = {}
        for b in reps:
            k = self.brokers[b].rack_key if b in self.brokers else f"\x00unknown-{b}"
            counts[k] = counts.get(k, 0) + 1
        return max(counts.values(), default=0) <= self.max_per_rack(len(reps))

    def fits(self, b: int, tp: TopicPartition) -> bool:
        cap = self.brokers[b].capacity_bytes
        return cap is None or self.bytes[b] + self.size(tp) <= cap

    def over_capacity(self, b: int) -> bool:
        cap = self.brokers[b].capacity_bytes
        return cap is not None and self.bytes[b] > cap

    def can_place(self, tp: TopicPartition, index: int, dst: int) -> bool:
        """May replica `index` of `tp` move to `dst` (hard goals hold for the result)?"""
        reps = self.assignment[tp]
        if dst in reps or not self.fits(dst, tp):
            return False
        trial = list(reps)
        trial[index] = dst
        return self.rack_ok(trial)

    def move(self, tp: TopicPartition, index: int, dst: int) -> None:
        reps = self.assignment[tp]
        src = reps[index]
        self._count(src, tp, index == 0, -1)
        reps[index] = dst
        self._count(dst, tp, index == 0, +1)

    def swap_leader(self, tp: TopicPartition, index: int) -> None:
        reps = self.assignment[tp]
        old, new = reps[0], reps[index]
        if old in self.leaders:
            self.leaders[old] -= 1
        if new in self.leaders:
            self.leaders[new] += 1
        reps[0], reps[index] = new, old

    def dst_order(self) -> list[int]:
        """Destinations, emptiest first (replicas, then bytes, then id)."""
        return sorted(self.eligible, key=lambda b: (self.replicas[b], self.bytes[b], b))


def plan_reassignment(assignment: Mapping[TopicPartition, Sequence[int]], brokers: Iterable[BrokerSpec], *,
                      mode: str = "rebalance", broker_ids: Iterable[int] = (),
                      topics: Optional[Iterable[str]] = None,
                      sizes: Optional[Mapping[TopicPartition, int]] = None) -> dict:
    """The reassignment (Kafka's JSON: `{"version": 1, "partitions": [{"topic", "partition",
    "replicas"}]}`, only partitions that change, sorted) meeting the hard goals and
    approaching the soft ones; see the module docstring. `mode`: "add-brokers" (`broker_ids`
    are new brokers to fill), "remove-brokers" (`broker_ids` end with no replica) or
    "rebalance"."""
    target = plan_assignment(assignment, brokers, mode=mode, broker_ids=broker_ids, topics=topics, sizes=sizes)
    return to_reassignment_json(assignment, target)


def plan_assignment(assignment: Mapping[TopicPartition, Sequence[int]], brokers: Iterable[BrokerSpec], *,
                    mode: str = "rebalance", broker_ids: Iterable[int] = (),
                    topics: Optional[Iterable[str]] = None,
                    sizes: Optional[Mapping[TopicPartition, int]] = None) -> dict[TopicPartition, list[int]]:
    """The whole target assignment (every partition) of `plan_reassignment`."""
    if mode not in MODES:
        raise _err(f"unknown mode {mode!r}; use one of {', '.join(MODES)}")
    by_id: dict[int, BrokerSpec] = {}
    for b in brokers:
        if b.id in by_id:
            raise _err(f"broker {b.id} is listed twice; give each broker once")
        by_id[b.id] = b
    ids = sorted(set(int(i) for i in broker_ids))
    unknown = [i for i in ids if i not in by_id]
    if unknown:
        raise _err(f"unknown broker id(s) {unknown}; known brokers: {sorted(by_id)} (kraftlog cluster status "
                   "or GET /v1/brokers lists them)")
    if mode != "rebalance" and not ids:
        raise _err(f"{mode} needs broker ids (e.g. --{mode} 4,5)")
    removed = set(ids) if mode == "remove-brokers" else set()
    holders = {b for b in by_id if b not in removed}          # may keep replicas
    eligible = sorted(b for b in holders if not by_id[b].cordoned)   # may receive them
    wanted = None if topics is None else set(topics)
    movable = sorted(tp for tp in assignment if wanted is None or tp[0] in wanted)
    if wanted is not None:
        missing = sorted(wanted - {t for t, _ in assignment})
        if missing:
            raise _err(f"unknown topic(s) {missing}; kraftlog topic list shows the topics",
                       ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    for tp in movable:
        reps = assignment[tp]
        if len(reps) > len(holders):
            raise _err(f"{tp[0]}-{tp[1]} has replication factor {len(reps)} but only {len(holders)} broker(s) "
                       f"would remain ({sorted(holders)}); remove fewer brokers or add brokers first",
                       ErrorCode.INVALID_REPLICATION_FACTOR)
    st = _State(assignment, by_id, eligible, sizes or {})
    _repair(st, movable, holders)
    # the soft goals, again until a round changes nothing: a bytes move can leave a replica
    # move worth making, so the plan is a fixed point (planning the planned cluster proposes
    # nothing, a property test checks it)
    for _ in range(FIXED_POINT_ROUNDS):
        before = {tp: list(r) for tp, r in st.assignment.items()}
        _balance_replicas(st, movable)
        if any(st.size(tp) for tp in movable):
            _balance_bytes(st, movable)
        _balance_leaders(st, movable)
        if st.assignment == before:
            break
    return st.assignment


def _repair(st: _State, movable: list[TopicPartition], eligible: set[int]) -> None:
    """Hard goals: replicas off removed/unknown brokers (`eligible`: those that may keep
    theirs), duplicate replicas, rack spread, capacity."""
    for tp in movable:
        reps = st.assignment[tp]
        for i, b in enumerate(reps):
            if b not in eligible or reps.index(b) != i:
                _place_elsewhere(st, tp, i, reason=f"broker {b} cannot keep it")
        if not st.rack_ok(reps):
            # move the replicas of crowded racks (last ones first: the leader stays if it can)
            for i in reversed(range(len(reps))):
                if st.rack_ok(reps):
                    break
                rack = st.brokers[reps[i]].rack_key
                if sum(1 for b in reps if st.brokers[b].rack_key == rack) > st.max_per_rack(len(reps)):
                    _place_elsewhere(st, tp, i, reason="its racks are crowded", rack_fix=True)
            if not st.rack_ok(reps):
                raise _err(f"no rack-aware placement for {tp[0]}-{tp[1]}: add brokers in other racks")
    for b in st.eligible:
        # over capacity: move its largest movable replicas away until it fits
        cands = sorted((tp for tp in movable if b in st.assignment[tp]), key=lambda tp: (-st.size(tp), tp))
        for tp in cands:
            if not st.over_capacity(b):
                break
            i = st.assignment[tp].index(b)
            for dst in st.dst_order():
                if st.can_place(tp, i, dst):
                    st.move(tp, i, dst)
                    break
        if st.over_capacity(b):
            raise _err(f"broker {b} holds {st.bytes[b]} bytes, above its capacity "
                       f"{st.brokers[b].capacity_bytes}, and no other broker has room; add brokers or capacity")


def _place_elsewhere(st: _State, tp: TopicPartition, i: int, *, reason: str, rack_fix: bool = False) -> None:
    """Move replica `i` of `tp` to the emptiest broker that can take it, the least crowded
    racks first (rack_fix: only where the racks get less crowded; else the rack pass after
    repairs what remains)."""
    reps = st.assignment[tp]
    before = _rack_excess(st, reps)
    options = []
    for rank, dst in enumerate(st.dst_order()):
        if dst in reps or not st.fits(dst, tp):
            continue
        trial = list(reps)
        trial[i] = dst
        excess = _rack_excess(st, trial)
        if excess < before or not rack_fix:
            options.append((excess, rank, dst))
    if not options:
        raise _err(f"no broker can take a replica of {tp[0]}-{tp[1]} ({reason}): every other broker already "
                   "holds it, is in a crowded rack or has no capacity left; add brokers or capacity")
    st.move(tp, i, min(options)[2])


def _rack_excess(st: _State, reps: Sequence[int]) -> int:
    cap = st.max_per_rack(len(reps))
    counts: dict[str, int] = {}
    for b in reps:
        k = st.brokers[b].rack_key if b in st.brokers else f"\x00unknown-{b}"
        counts[k] = counts.get(k, 0) + 1
    return sum(max(0, c - cap) for c in counts.values())


def _balance_replicas(st: _State, movable: list[TopicPartition]) -> None:
    """Soft goal: replicas per broker within 1. Each move goes from a broker with at least 2
    more replicas than its destination (the sum of squares strictly drops: it terminates)."""
    for _ in range(MAX_ROUNDS):
        if not _one_replica_move(st, movable):
            return


def _one_replica_move(st: _State, movable: list[TopicPartition]) -> bool:
    srcs = sorted(st.eligible, key=lambda b: (-st.replicas[b], -st.bytes[b], b))
    dsts = st.dst_order()
    for src in srcs:
        for dst in dsts:
            if st.replicas[src] - st.replicas[dst] < 2:
                break
            # the partition to move: followers before leaders (no leadership change), larger
            # ones first when bytes matter on the heavier side
            heavier = st.bytes[src] > st.bytes[dst]
            cands = sorted((tp for tp in movable if src in st.assignment[tp]),
                           key=lambda tp: (st.assignment[tp][0] == src,
                                           -st.size(tp) if heavier else st.size(tp), tp))
            for tp in cands:
                i = st.assignment[tp].index(src)
                if st.can_place(tp, i, dst):
                    st.move(tp, i, dst)
                    return True
    return False


def bytes_balanced(loads: Mapping[int, int], tolerance: float = BYTES_TOLERANCE) -> bool:
    """Every broker's bytes within `tolerance` of the mean."""
    if not loads:
        return True
    mean = sum(loads.values()) / len(loads)
    return all(abs(v - mean) <= tolerance * mean for v in loads.values())


def _balance_bytes(st: _State, movable: list[TopicPartition]) -> None:
    """Soft goal: bytes within 10% of the mean, without breaking replicas-within-1: a swap of
    two partitions between a heavy and a light broker (counts unchanged) or a single move
    when the heavy broker holds more replicas. Each step strictly shrinks the gap between
    the pair, so the sum of squared bytes drops and it terminates."""
    for _ in range(MAX_ROUNDS):
        if bytes_balanced(st.bytes) or not _one_bytes_step(st, movable):
            return


def _one_bytes_step(st: _State, movable: list[TopicPartition]) -> bool:
    heavy_first = sorted(st.eligible, key=lambda b: (-st.bytes[b], b))
    light_first = sorted(st.eligible, key=lambda b: (st.bytes[b], b))
    for h in heavy_first:
        for lt in light_first:
            gap = st.bytes[h] - st.bytes[lt]
            if gap <= 0:
                break
            on_h = [tp for tp in movable if h in st.assignment[tp] and lt not in st.assignment[tp]]
            if st.replicas[h] > st.replicas[lt]:
                # one move: the best size below the gap (the pair's gap shrinks)
                for tp in sorted(on_h, key=lambda tp: (abs(gap - 2 * st.size(tp)), tp)):
                    s = st.size(tp)
                    if 0 < s < gap:
                        i = st.assignment[tp].index(h)
                        if st.can_place(tp, i, lt):
                            st.move(tp, i, lt)
                            return True
            on_l = [tp for tp in movable if lt in st.assignment[tp] and h not in st.assignment[tp]]
            best = None
            for p in on_h:
                for q in on_l:
                    d = st.size(p) - st.size(q)
                    if 0 < d < gap:
                        score = (abs(gap - 2 * d), p, q)
                        if best is None or score < best[0]:
                            best = (score, p, q)
            if best is not None:
                _, p, q = best
                ip, iq = st.assignment[p].index(h), st.assignment[q].index(lt)
                if st.can_place(p, ip, lt) and st.can_place(q, iq, h):
                    st.move(p, ip, lt)
                    st.move(q, iq, h)
                    return True
                # the best pair breaks a hard goal: try the others in order
                pairs = sorted(((abs(gap - 2 * (st.size(p) - st.size(q))), p, q) for p in on_h for q in on_l
                                if 0 < st.size(p) - st.size(q) < gap))
                for _, p, q in pairs:
                    ip, iq = st.assignment[p].index(h), st.assignment[q].index(lt)
                    if st.can_place(p, ip, lt):
                        st.move(p, ip, lt)
                        if st.can_place(q, iq, h):
                            st.move(q, iq, h)
                            return True
                        st.move(p, ip, h)   # undo
    return False


def _balance_leaders(st: _State, movable: list[TopicPartition]) -> None:
    """Soft goal: leaders within 1, by making another replica of a partition its first (no
    data moves). Each step takes one leadership from a broker with the most leaders along the
    shortest chain of partitions (a leads p1 where b is a replica, b leads p2 where c is ...)
    to a broker with at least 2 fewer; brokers inside the chain keep their count. The sum of
    squared leader counts strictly drops, so it terminates."""
    for _ in range(MAX_ROUNDS):
        if not _one_leader_chain(st, movable):
            return


def _one_leader_chain(st: _State, movable: list[TopicPartition]) -> bool:
    for src in sorted(st.eligible, key=lambda b: (-st.leaders[b], b)):
        # breadth-first over brokers; edge a -> b through a partition a leads with b a replica
        prev: dict[int, tuple[int, TopicPartition, int]] = {}
        frontier, seen = [src], {src}
        found = None
        while frontier and found is None:
            nxt = []
            for a in frontier:
                for tp in movable:
                    reps = st.assignment[tp]
                    if reps[0] != a:
                        continue
                    for i, b in enumerate(reps[1:], 1):
                        if b in seen or b not in st.leaders:
                            continue
                        seen.add(b)
                        prev[b] = (a, tp, i)
                        if st.leaders[src] - st.leaders[b] >= 2:
                            found = b
                            break
                        nxt.append(b)
                    if found is not None:
                        break
                if found is not None:
                    break
            frontier = sorted(nxt)
        if found is None:
            continue
        chain = []
        b = found
        while b != src:
            a, tp, i = prev[b]
            chain.append((tp, i))
            b = a
        for tp, i in chain:
            st.swap_leader(tp, i)
        return True
    return False


def to_reassignment_json(current: Mapping[TopicPartition, Sequence[int]],
                         target: Mapping[TopicPartition, Sequence[int]]) -> dict:
    """Kafka's reassignment JSON of the partitions whose replica list differs (order counts:
    the first replica is the preferred leader)."""
    parts = [{"topic": t, "partition": p, "replicas": list(target[(t, p)])}
             for (t, p) in sorted(target) if list(target[(t, p)]) != list(current.get((t, p), ()))]
    return {"version": 1, "partitions": parts}


def assignment_from_metadata(doc: Mapping) -> dict[TopicPartition, list[int]]:
    """`{(topic, partition): replicas}` of a `/v1/metadata` document (internal topics too)."""
    return {(t["name"], int(p["partition"])): [int(r) for r in p["replicas"]]
            for t in doc.get("topics", []) for p in t.get("partitions", [])}


def brokers_from_metadata(doc: Mapping, capacities: Optional[Mapping[int, int]] = None) -> list[BrokerSpec]:
    """BrokerSpecs of a `/v1/metadata` or `/v1/brokers` document; decommissioned brokers are
    left out, draining ones are cordoned."""
    out = []
    for b in doc.get("brokers", []):
        if b.get("state") == "decommissioned":
            continue
        bid = int(b["id"])
        out.append(BrokerSpec(bid, b.get("rack") or None, (capacities or {}).get(bid),
                              cordoned=b.get("state") == "draining"))
    return out
