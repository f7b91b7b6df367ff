"""Server-side partition assignors (KIP-848: the coordinator computes the assignment).

An assignor maps members (id -> subscribed topics) and topic partition counts to a target
assignment {member_id: frozenset((topic, partition))}. Invariants checked by the tests:
every partition of a subscribed topic goes to exactly one member subscribed to that topic;
results are deterministic (sorted iteration, no randomness).

- `range`: per topic, members subscribed to it (sorted) get contiguous ranges, the first
  `n % k` one extra partition (Kafka's RangeAssignor).
- `roundrobin`: every (topic, partition) in order dealt to the subscribed members in turn.
- `sticky` (the default, Kafka's "uniform" server assignor): keep each partition with its
  current owner when that owner still subscribes to it and stays within balance, then give
  the rest to the least loaded eligible member, then move partitions from members holding
  two or more above an eligible member until balanced.
"""
from __future__ import annotations

from typing import Callable, Mapping

TopicPartition = tuple[str, int]
Assignment = dict[str, frozenset]

DEFAULT_ASSIGNOR = "sticky"


def _eligible(members: Mapping[str, tuple], topic: str) -> list[str]:
    return sorted(m for m, topics in members.items() if topic in topics)


def _subscribed_topics(members: Mapping[str, tuple], topics: Mapping[str, int]) -> list[str]:
    return sorted({t for ts in members.values() for t in ts if topics.get(t, 0) > 0})


def range_assign(members: Mapping[str, tuple], topics: Mapping[str, int],
                 current: Mapping[str, frozenset] | None = None) -> Assignment:
    out: dict[str, set] = {m: set() for m in members}
    for t in _subscribed_topics(members, topics):
        ms = _eligible(members, t)
        n, k = topics[t], len(ms)
        per, extra = divmod(n, k)
        p = 0
        for i, m in enumerate(ms):
            count = per + (1 if i < extra else 0)
            out[m].update((t, q) for q in range(p, p + count))
            p += count
    return {m: frozenset(s) for m, s in out.items()}


def roundrobin_assign(members: Mapping[str, tuple], topics: Mapping[str, int],
                      current: Mapping[str, frozenset] | None = None) -> Assignment:
    out: dict[str, set] = {m: set() for m in members}
    order = sorted(members)
    i = 0
    for t in _subscribed_topics(members, topics):
        for p in range(topics[t]):
            while t not in members[order[i % len(order)]]:
                i += 1
            out[order[i % len(order)]].add((t, p))
            i += 1
    return {m: frozenset(s) for m, s in out.items()}


def sticky_assign(members: Mapping[str, tuple], topics: Mapping[str, int],
                  current: Mapping[str, frozenset] | None = None) -> Assignment:
    current = current or {}
    out: dict[str, set] = {m: set() for m in members}
    all_tps = [(t, p) for t in _subscribed_topics(members, topics) for p in range(topics[t])]
    eligible = {t: _eligible(members, t) for t in {tp[0] for tp in all_tps}}
    # balance quota: with uniform subscriptions, ceil(partitions / members)
    n_members = max(1, len([m for m in members if any(topics.get(t, 0) for t in members[m])]))
    quota = -(-len(all_tps) // n_members)
    owner = {}
    for m in sorted(current):
        if m not in members:
            continue
        for tp in sorted(current[m]):
            if tp in owner or tp[0] not in members[m] or tp[1] >= topics.get(tp[0], 0):
                continue
            if len(out[m]) < quota:
                owner[tp] = m
                out[m].add(tp)
    for tp in all_tps:
        if tp in owner:
            continue
        m = min(eligible[tp[0]], key=lambda x: (len(out[x]), x))
        owner[tp] = m
        out[m].add(tp)
    # rebalance (only matters with mixed subscriptions): move while someone is 2+ above a peer
    moved = True
    while moved:
        moved = False
        for tp in sorted(owner, key=lambda x: (-len(out[owner[x]]), x)):
            src = owner[tp]
            dst = min(eligible[tp[0]], key=lambda x: (len(out[x]), x))
            if len(out[src]) - len(out[dst]) >= 2:
                out[src].discard(tp)
                out[dst].add(tp)
                owner[tp] = dst
                moved = True
                break
    return {m: frozenset(s) for m, s in out.items()}


ASSIGNORS: dict[str, Callable[..., Assignment]] = {
    "range": range_assign,
    "roundrobin": roundrobin_assign,
    "sticky": sticky_assign,
}
