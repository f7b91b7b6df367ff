"""When has the cluster recovered from a fault ("settled")? Pure: no IO; the cluster
(`ChaosCluster.settle_snapshot`) gathers the inputs, `Schedule.settle` polls.

Issue 24 measures availability "after any single fault": a fault must not start while the
previous one is still being recovered from (e.g. the broker it killed still restarting),
or two faults add up (two brokers down at once) and the window is not one fault's.

Settled means all of:
- every process (controllers and brokers) running and not paused;
- an active controller, whose metadata is the reference below;
- every broker answers /healthz, is registered and not fenced;
- every partition of every topic has its whole replica set in its ISR and a leader;
- (with an `AckTracker`) every partition the workload writes to has had an acknowledged
  write since the heal.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class SettleSnapshot:
    """What the harness saw at one instant. `processes_up`: (role, id) -> running and not
    paused; `healthy_brokers`: brokers whose /healthz answered 200; `active_controller`:
    its id or None; `metadata`: the active controller's /controller/v1/metadata body (None
    if it did not answer)."""

    broker_ids: list
    processes_up: dict = field(default_factory=dict)
    healthy_brokers: set = field(default_factory=set)
    active_controller: Optional[int] = None
    metadata: Optional[dict] = None


def unsettled_reasons(s: SettleSnapshot, limit: int = 4) -> list[str]:
    """Why the cluster is not settled yet ([] = settled). At most `limit` ISR reasons are
    listed (the first ones, by topic and partition) plus a count of the others."""
    out = [f"{role} {i} not running" for (role, i), up in sorted(s.processes_up.items()) if not up]
    out += [f"broker {i} not answering /healthz" for i in s.broker_ids if i not in s.healthy_brokers]
    if s.active_controller is None:
        return out + ["no active controller"]
    if s.metadata is None:
        return out + [f"active controller {s.active_controller} gave no metadata"]
    registered = {b["id"]: b for b in s.metadata.get("brokers", [])}
    for i in s.broker_ids:
        if i not in registered:
            out.append(f"broker {i} not registered")
        elif registered[i].get("fenced"):
            out.append(f"broker {i} fenced")
    short = []
    for t in s.metadata.get("topics", []):
        for p in t.get("partitions", []):
            missing = sorted(set(p["replicas"]) - set(p["isr"]))
            if missing:
                short.append(f"{t['name']}-{p['partition']} ISR {sorted(p['isr'])} lacks {missing}")
            elif p.get("leader", -1) < 0:
                short.append(f"{t['name']}-{p['partition']} has no leader")
    out += short[:limit]
    if len(short) > limit:
        out.append(f"{len(short) - limit} more partitions short of their replicas")
    return out


def fault_class(kind: str, description: str) -> str:
    """The row a fault is reported in: its kind, except kill-several, split by what it
    killed: `kill-several/2-brokers` (two brokers: 2 of every partition's 3 replicas) or
    `kill-several/broker+controller`. Read from the description ("kill -9 broker 1,
    controller 2"), so old reports classify too."""
    if kind != "kill-several":
        return kind
    brokers = description.count("broker ")
    return "kill-several/2-brokers" if brokers >= 2 else "kill-several/broker+controller"


EXCLUDED_CLASSES = {
    "kill-several/2-brokers": "kills 2 of the 3 replicas of every partition (replication factor 3, "
                              "min.insync.replicas=2): acks=all cannot succeed until one of the two is "
                              "restarted and back in the ISR, as if every replica needed were gone",
}


class AckTracker:
    """Which partitions the workload writes to have had no acknowledged write since a time:
    a fault has not been recovered from while a writer is still failing, even once the
    metadata looks healed (the writer may still be following it). Reads `history` (appended
    by the workload's thread) incrementally: the partitions written so far are collected
    once, and each query scans the events back to `since` only."""

    def __init__(self, history, f: str = "produce"):
        self.h = history
        self.f = f
        self.keys: set = set()
        self._seen_ops = 0

    def missing_since(self, since: float) -> list:
        ops = self.h.ops
        n = len(ops)
        for op in ops[self._seen_ops:n]:
            if op.f == self.f and op.key[0] is not None:
                self.keys.add(op.key)
        self._seen_ops = n
        acked: set = set()
        events = self.h.events
        for k in range(len(events) - 1, -1, -1):
            ev = events[k]
            if ev.get("time", 0.0) < since:
                break
            if ev["type"] == "ok":
                op = ops[ev["op"]]
                if op.f == self.f:
                    acked.add(op.key)
        return sorted(self.keys - acked, key=str)
