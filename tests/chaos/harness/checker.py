"""The history checker: per partition, what a replicated commit log must never do.

Anomaly kinds (each reported with the operations involved):

- `lost-write`             an acknowledged (ok) produce is not in the final read at its offset
- `value-at-two-offsets`   a value produced once (never resent) is seen at two offsets
- `duplicate`              an idempotent producer's resent value is seen at two offsets
- `two-values-at-offset`   two different values observed at one offset (reads and acks)
- `non-monotonic-read`     offsets not strictly increasing within one fetch answer
- `phantom-read`           a value read that was never produced to that partition
- `failed-write-read`      a value read whose produce certainly failed (`fail`)
- `read-above-hw`          a fetch returned a record at or above the high watermark it reported
- `committed-offset-regression`  a group's committed offset read lower than one committed
                           (ok) or read before it
- `no-final-read`          an acknowledged write's partition has no final read (the run
                           could not verify it: the cluster never healed)

Values are unique per produce invocation; a retry after an unknown outcome re-sends the
same value (for idempotent producers) and is recorded as another invocation carrying it.
Non-idempotent producers never resend a value, so their unknown-outcome writes may or may
not appear, once.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Optional

from tests.chaos.harness.history import FAIL, INFO, OK, History, Op

ANOMALY_KINDS = (
    "lost-write", "value-at-two-offsets", "duplicate", "two-values-at-offset", "non-monotonic-read",
    "phantom-read", "failed-write-read", "read-above-hw", "committed-offset-regression", "no-final-read",
)


@dataclass
class Anomaly:
    kind: str
    topic: Optional[str]
    partition: Optional[int]
    message: str
    ops: list = field(default_factory=list)  # Op.brief() dicts

    def to_json(self) -> dict:
        return {"kind": self.kind, "topic": self.topic, "partition": self.partition, "message": self.message,
                "ops": self.ops}

    def __str__(self) -> str:
        return f"{self.kind} {self.topic}-{self.partition}: {self.message} (ops {[o['op'] for o in self.ops]})"


@dataclass
class CheckResult:
    anomalies: list[Anomaly]
    stats: dict

    @property
    def valid(self) -> bool:
        return not self.anomalies

    def by_kind(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for a in self.anomalies:
            out[a.kind] += 1
        return dict(out)

    def summary(self, limit: int = 20) -> str:
        lines = [f"{len(self.anomalies)} anomalies {self.by_kind()}; stats {self.stats}"]
        lines += [f"  {a}" for a in self.anomalies[:limit]]
        return "\n".join(lines)


def check(history: History, anomaly_limit_per_kind: int = 50) -> CheckResult:
    """Checks every partition of `history`; see the module docstring for the rules."""
    anomalies: list[Anomaly] = []
    counts: dict[str, int] = defaultdict(int)

    def report(kind, key, message, ops):
        counts[kind] += 1
        if counts[kind] <= anomaly_limit_per_kind:
            anomalies.append(Anomaly(kind, key[0], key[1], message, [o.brief() for o in ops]))

    produces: dict[tuple, list[Op]] = defaultdict(list)
    fetches: dict[tuple, list[Op]] = defaultdict(list)
    for op in history.ops:
        if op.f == "produce":
            produces[op.key].append(op)
        elif op.f == "fetch" and op.type == OK:
            fetches[op.key].append(op)

    stats = defaultdict(int)
    for op in history.ops:
        stats[f"{op.f}_{op.type or 'pending'}"] += 1

    for key in sorted(set(produces) | set(fetches), key=lambda k: (str(k[0]), k[1] if k[1] is not None else -1)):
        _check_partition(key, produces.get(key, []), fetches.get(key, []), report, stats)
    _check_group_offsets(history, report)
    stats = dict(stats)
    stats["anomalies_total"] = sum(counts.values())
    return CheckResult(anomalies, stats)


def _check_partition(key, produces: list[Op], fetches: list[Op], report, stats) -> None:
    # value -> the produce ops that sent it (more than one = resent)
    senders: dict[str, list[Op]] = defaultdict(list)
    for op in produces:
        for v in op.value.get("values", []):
            senders[v].append(op)
    # observations: value -> {offset: [ops]}, offset -> {value: [ops]}
    at_offsets: dict[str, dict[int, list[Op]]] = defaultdict(lambda: defaultdict(list))
    at_value: dict[int, dict[str, list[Op]]] = defaultdict(lambda: defaultdict(list))

    for op in produces:
        if op.type != OK:
            continue
        offsets = op.result.get("offsets") or []
        for v, o in zip(op.value.get("values", []), offsets):
            if o is None:
                continue
            at_offsets[v][o].append(op)
            at_value[o][v].append(op)
            stats["acknowledged_values"] += 1

    for op in fetches:
        records = op.result.get("records") or []
        hw = op.result.get("high_watermark")
        prev = None
        for off, v in records:
            if prev is not None and off <= prev:
                report("non-monotonic-read", key, f"offset {off} after {prev} in one fetch", [op])
            prev = off
            if hw is not None and off >= hw:
                report("read-above-hw", key, f"record at offset {off} returned with high watermark {hw}", [op])
            at_offsets[v][off].append(op)
            at_value[off][v].append(op)
            sent = senders.get(v)
            if not sent:
                report("phantom-read", key, f"value {v!r} at offset {off} was never produced to this partition", [op])
            elif all(s.type == FAIL for s in sent):
                report("failed-write-read", key, f"value {v!r} read at offset {off} but its produce failed",
                       sent + [op])

    for off, values in at_value.items():
        if len(values) > 1:
            ops = _uniq(o for vs in values.values() for o in vs)
            report("two-values-at-offset", key, f"offset {off} holds {sorted(values)}", ops)

    for v, offs in at_offsets.items():
        if len(offs) <= 1:
            continue
        sent = senders.get(v, [])
        ops = _uniq(sent + [o for os_ in offs.values() for o in os_])
        if len(sent) > 1:
            if any(s.value.get("idempotent") for s in sent):
                report("duplicate", key, f"idempotently resent value {v!r} at offsets {sorted(offs)}", ops)
            else:
                stats["allowed_duplicates"] += 1
        else:
            report("value-at-two-offsets", key, f"value {v!r} (produced once) at offsets {sorted(offs)}", ops)

    final = [op for op in fetches if op.value.get("final")]
    final_map: dict[int, str] = {}
    for op in final:
        for off, v in op.result.get("records") or []:
            final_map.setdefault(off, v)
    for op in produces:
        if op.type != OK:
            if op.type == INFO:
                stats["unknown_values"] += len(op.value.get("values", []))
            continue
        for v, o in zip(op.value.get("values", []), op.result.get("offsets") or []):
            if not final:
                report("no-final-read", key, f"acknowledged value {v!r} at offset {o} was never verified", [op])
                continue
            if final_map.get(o) != v:
                found = final_map.get(o)
                where = "is missing" if found is None else f"holds {found!r}"
                report("lost-write", key, f"acknowledged value {v!r} at offset {o}: the final read {where}",
                       [op] + final)


def _check_group_offsets(history: History, report) -> None:
    """Per (group, topic, partition): a read never returns less than an offset committed
    (ok) before the read was invoked, nor less than an earlier completed read returned.
    Assumes each group partition has one committer that commits non-decreasing offsets."""
    by_key: dict[tuple, list[Op]] = defaultdict(list)
    for op in history.ops:
        if op.f in ("commit", "read_committed") and op.type == OK:
            by_key[(op.value["group"], op.value["topic"], op.value["partition"])].append(op)
    for (group, topic, partition), ops in by_key.items():
        floor, floor_op = None, None  # highest offset known committed before "now"
        # walk events in history order: completions raise the floor, invocations compare
        timeline = sorted([(o.complete_index, "done", o) for o in ops] + [(o.invoke_index, "start", o) for o in ops],
                          key=lambda t: t[0])
        for _, what, op in timeline:
            if what == "start":
                if op.f == "read_committed":
                    op._floor = (floor, floor_op)  # type: ignore[attr-defined]
                continue
            got = op.value["offset"] if op.f == "commit" else op.result.get("offset")
            if op.f == "read_committed":
                need, need_op = op._floor  # type: ignore[attr-defined]
                if need is not None and (got is None or got < need):
                    report("committed-offset-regression", (topic, partition),
                           f"group {group!r} read committed offset {got} after {need} was committed/read",
                           [need_op, op])
            if got is not None and (floor is None or got > floor):
                floor, floor_op = got, op


def _uniq(ops) -> list[Op]:
    seen, out = set(), []
    for o in ops:
        if o.id not in seen:
            seen.add(o.id)
            out.append(o)
    return sorted(out, key=lambda o: o.id)


def unavailability_windows(history: History, min_gap_s: float = 1.0, f: str = "produce",
                           key: Optional[tuple] = None) -> list[tuple[float, float]]:
    """Intervals longer than `min_gap_s` without an `ok` completion of kind `f` (for one
    (topic, partition) `key`, or any), between the first invocation and the last completion."""
    ops = [op for op in history.ops if op.f == f and (key is None or op.key == key)]
    if not ops:
        return []
    oks = sorted(op.complete_time for op in ops if op.type == OK)
    start = min(op.invoke_time for op in ops)
    done = [op.complete_time for op in ops if op.type]
    end = max(done) if done else max(op.invoke_time for op in ops)
    points = [start] + oks + [end]
    return [(a, b) for a, b in zip(points, points[1:]) if b - a > min_gap_s]
