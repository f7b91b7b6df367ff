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
                           could not verify it: the cluster never healed), or a committed
                           group partition has no final fetch of committed offsets while
                           others have one
- `lost-latest-value`      compacted partition: a key's latest acknowledged write is gone
                           from the final read and no later record of the key is there,
                           though that write was no tombstone (nor was any write of the key
                           with an unknown outcome)
- `tombstone-removed-early` compacted partition: as above, the key's latest write was a
                           tombstone, but the final read began before delete.retention.ms
                           had passed since that tombstone was sent
- `final-committed-offset` the final fetch of committed offsets (after healing, committers
                           stopped) is not the group partition's latest acknowledged commit
                           (nor a later commit of unknown outcome)

Compacted partitions (produce ops with `compacted`: `keys`, `tombstones` and a unique
write id per record in `values`; fetched records are [offset, write id, key, value]): the
cleaner may remove any record a later record of its key supersedes, and a tombstone once
delete.retention.ms has passed, so `lost-write` does not apply; instead, per key, the
latest acknowledged write must be in the final read at its offset, or a later record of
that key must be (a write whose outcome was unknown), or the key is absent because the
latest write there was a tombstone (acknowledged, or of unknown outcome) sent at least
delete.retention.ms before the final read began. Reads must still return each write id
at one offset only, with its own key and value (`phantom-read` otherwise).

Transactions (`txn` ops and read_committed fetches marked `txn`, see
`check_transactions`): `aborted-read`, `half-visible-transaction`, `lost-transaction`,
`read-above-lso` (TXN_ANOMALY_KINDS); phantom, duplicate and non-monotonic reads there
reuse the names above.

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
    "lost-latest-value", "tombstone-removed-early", "final-committed-offset",
)
TXN_ANOMALY_KINDS = ("aborted-read", "half-visible-transaction", "lost-transaction", "read-above-lso")


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
        elif op.f == "fetch" and op.type == OK and not op.value.get("txn"):
            fetches[op.key].append(op)

    stats = defaultdict(int)
    for op in history.ops:
        stats[f"{op.f}_{op.type or 'pending'}"] += 1

    for key in sorted(set(produces) | set(fetches), key=lambda k: (str(k[0]), k[1] if k[1] is not None else -1)):
        _check_partition(key, produces.get(key, []), fetches.get(key, []), report, stats)
    _check_group_offsets(history, report)
    check_transactions(history, report, stats)
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

    # compacted partitions: write id -> (key, tombstone)
    written: dict[str, tuple] = {}
    for op in produces:
        for v, k, t in zip(op.value.get("values", []), op.value.get("keys") or [], op.value.get("tombstones") or []):
            written[v] = (k, bool(t))

    for op in fetches:
        records = op.result.get("records") or []
        hw = op.result.get("high_watermark")
        prev = None
        for rec in records:
            off, v = rec[0], rec[1]
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
            elif len(rec) >= 4 and v in written:
                k, tombstone = written[v]
                if rec[2] != k or (rec[3] is None) != tombstone:
                    report("phantom-read", key, f"write {v!r} (key {k!r}{', a tombstone' if tombstone else ''}) "
                                                f"read at offset {off} as key {rec[2]!r} value {rec[3]!r}", sent + [op])

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
        for rec in op.result.get("records") or []:
            final_map.setdefault(rec[0], rec[1])
    if any(op.value.get("compacted") for op in produces):
        if not final:
            for op in produces:
                if op.type == OK:
                    report("no-final-read", key, f"acknowledged compacted write {op.value['values']} at offsets "
                                                 f"{op.result.get('offsets')} was never verified", [op])
            return
        _check_compacted(key, produces, final, final_map, written, report, stats)
        return
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


def _check_compacted(key, produces: list[Op], final: list[Op], final_map: dict[int, str], written: dict,
                     report, stats) -> None:
    """Per key: the latest acknowledged write survives compaction (see the module docstring)."""
    latest: dict[str, tuple[int, str, Op]] = {}      # key -> (offset, write id, op) of the latest ok write
    acked = 0
    for op in produces:
        if op.type != OK:
            continue
        for v, o in zip(op.value.get("values", []), op.result.get("offsets") or []):
            if o is None or v not in written:
                continue
            acked += 1
            k = written[v][0]
            if k not in latest or o > latest[k][0]:
                latest[k] = (o, v, op)
    unknown_tombstones: dict[str, list[Op]] = defaultdict(list)
    for op in produces:
        if op.type in (INFO, None):   # unknown outcome, or still pending when the workload stopped
            for v in op.value.get("values", []):
                if v in written and written[v][1]:
                    unknown_tombstones[written[v][0]].append(op)
    # the highest offset of each key in the final read
    final_latest: dict[str, int] = {}
    for off, v in final_map.items():
        if v in written:
            k = written[v][0]
            final_latest[k] = max(off, final_latest.get(k, -1))
    final_start = min(op.invoke_time for op in final)
    stats["compacted_keys_checked"] += len(latest)
    stats["compacted_acknowledged_values"] += acked
    stats["compacted_final_records"] += len(final_map)
    for k, (o, v, op) in sorted(latest.items()):
        if final_latest.get(k, -1) >= o:
            if final_map.get(o) not in (None, v):
                report("lost-latest-value", key, f"key {k!r}: its latest acknowledged write {v!r} at offset {o}: "
                                                 f"the final read holds {final_map.get(o)!r} there", [op] + final)
            continue
        candidates = ([op] if written[v][1] else []) + unknown_tombstones.get(k, [])
        if not candidates:
            found = "missing" if k not in final_latest else f"last at offset {final_latest[k]}"
            report("lost-latest-value", key, f"key {k!r}: its latest acknowledged write {v!r} (offset {o}, no "
                                             f"tombstone) is gone from the final read (key {found})", [op] + final)
            continue
        expired = [c for c in candidates
                   if c.invoke_time + c.value.get("delete_retention_ms", 0) / 1000.0 <= final_start]
        if not expired:
            report("tombstone-removed-early", key,
                   f"key {k!r}: the tombstone {v!r} (offset {o}) is gone from the final read, which began "
                   f"{final_start - op.invoke_time:.3f} s after it was sent (delete.retention.ms "
                   f"{op.value.get('delete_retention_ms')})", candidates + final)
        else:
            stats["compacted_tombstones_expired"] += 1
    # what compaction removed, as the final read shows it
    for op in produces:
        if op.type != OK:
            continue
        for v, o in zip(op.value.get("values", []), op.result.get("offsets") or []):
            if o is not None and v in written and final_map.get(o) is None and latest.get(written[v][0], (None,))[0] != o:
                stats["compacted_superseded_removed"] += 1


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
    _check_final_committed(history, by_key, report)


def _check_final_committed(history: History, by_key: dict, report) -> None:
    """The final fetch of committed offsets (after healing, committers stopped) returns the
    latest acknowledged commit of each group partition (or a later commit whose outcome was
    unknown): compaction of `__consumer_offsets` and coordinator moves lost nothing."""
    finals = [op for op in history.ops if op.f == "read_committed" and op.value.get("final") and op.type == OK]
    if not finals:
        return
    groups_with_final = {op.value["group"] for op in finals}
    unknown: dict[tuple, list[Op]] = defaultdict(list)
    for op in history.ops:
        if op.f == "commit" and op.type in (INFO, None):   # unknown, or pending when the committers stopped
            unknown[(op.value["group"], op.value["topic"], op.value["partition"])].append(op)
    for gkey, ops in by_key.items():
        group, topic, partition = gkey
        commits = [o for o in ops if o.f == "commit"]
        mine = [o for o in finals if (o.value["group"], o.value["topic"], o.value["partition"]) == gkey]
        if not commits:
            continue
        if not mine:
            if group in groups_with_final:
                report("no-final-read", (topic, partition),
                       f"group {group!r}: no final fetch of its committed offset", commits[-1:])
            continue
        last = max(commits, key=lambda o: o.value["offset"])
        later_unknown = {o.value["offset"] for o in unknown.get(gkey, []) if o.value["offset"] > last.value["offset"]}
        final = max(mine, key=lambda o: o.complete_index)
        got = final.result.get("offset")
        if got != last.value["offset"] and got not in later_unknown:
            report("final-committed-offset", (topic, partition),
                   f"group {group!r}: the final fetch of committed offsets gave {got}, the latest acknowledged "
                   f"commit was {last.value['offset']}", [last, final])


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


def check_transactions(history: History, report, stats) -> None:
    """Atomic visibility of transactions to read_committed readers.

    A `txn` op (value: txid, records [[topic, partition, value]], intent) is committed when ok
    with `committed` true, aborted when ok with `committed` false or `fail` (no commit was
    ever sent), unknown otherwise (`info`, or pending when the workload stopped).
    - every record a read_committed fetch returns belongs to a transaction that wrote it to
      that partition (`phantom-read`), not an aborted one (`aborted-read`), lies below the
      last stable offset the answer reported (`read-above-lso`), and each value is read at one
      offset only (`value-at-two-offsets`); offsets rise within an answer;
    - the final read (healed, nothing open, LSO = HW) holds every record of a committed
      transaction, once, at its acknowledged offset (`lost-transaction` when none is there,
      `half-visible-transaction` when some are), all or none of an unknown one
      (`half-visible-transaction`);
    - a read_committed reader sees what the final read sees: a fetch answering
      [offset, next_offset) returned exactly the final read's records in that range (a
      committed record passed over, or a record read that the final read lacks, means the
      reader saw part of a transaction: `half-visible-transaction`)."""
    import bisect
    txns = [op for op in history.ops if op.f == "txn"]
    fetches = [op for op in history.ops if op.f == "fetch" and op.type == OK and op.value.get("txn")]
    if not txns and not fetches:
        return
    owner: dict[tuple, tuple] = {}                       # (topic, partition, value) -> txn op
    for op in txns:
        for t, p, v in op.value.get("records", []):
            owner[(t, p, v)] = op

    def status(op: Op) -> str:
        if op.type == OK:
            return "committed" if op.result.get("committed") else "aborted"
        return "aborted" if op.type == FAIL else "unknown"

    for op in txns:
        stats[f"transactions_{status(op)}"] += 1
    final_by_tp: dict[tuple, dict[int, str]] = defaultdict(dict)
    finals: dict[tuple, list[Op]] = defaultdict(list)
    seen_at: dict[tuple, set] = defaultdict(set)          # (topic, partition, value) -> offsets read
    for op in fetches:
        key = op.key
        lso = op.result.get("last_stable_offset")
        prev = None
        for off, v in op.result.get("records") or []:
            if prev is not None and off <= prev:
                report("non-monotonic-read", key, f"offset {off} after {prev} in one read_committed fetch", [op])
            prev = off
            if lso is not None and off >= lso:
                report("read-above-lso", key, f"record {v!r} at offset {off} returned with last stable offset "
                                              f"{lso}", [op])
            txn = owner.get((key[0], key[1], v))
            if txn is None:
                report("phantom-read", key, f"value {v!r} at offset {off} was never written to this partition "
                                            "by a transaction", [op])
                continue
            if status(txn) == "aborted":
                report("aborted-read", key, f"value {v!r} at offset {off} belongs to an aborted transaction",
                       [txn, op])
            seen_at[(key[0], key[1], v)].add(off)
            if op.value.get("final"):
                final_by_tp[key].setdefault(off, v)
        if op.value.get("final"):
            finals[key].append(op)
        stats["txn_records_read"] += len(op.result.get("records") or [])
    for (t, p, v), offs in seen_at.items():
        if len(offs) > 1:
            report("value-at-two-offsets", (t, p), f"transactional value {v!r} at offsets {sorted(offs)}",
                   [owner[(t, p, v)]])

    final_values = {(tp[0], tp[1], v): off for tp, m in final_by_tp.items() for off, v in m.items()}
    for op in txns:
        st = status(op)
        records = op.value.get("records", [])
        if st == "aborted" or not records:
            continue
        tps = {(t, p) for t, p, _ in records}
        if any(tp not in finals for tp in tps):
            if st == "committed":
                report("no-final-read", (records[0][0], records[0][1]),
                       f"committed transaction {op.value.get('txid')} op {op.id} was never verified", [op])
            continue
        present = [r for r in records if (r[0], r[1], r[2]) in final_values]
        if st == "committed":
            stats["txn_committed_records_checked"] += len(records)
            acked = {(t, p, v): o for (t, p, v), (_, _, o) in zip(records, op.result.get("offsets") or [])}
            moved = [(r[2], acked.get(tuple(r)), final_values[tuple(r)]) for r in present
                     if acked.get(tuple(r)) not in (None, final_values[tuple(r)])]
            if not present:
                report("lost-transaction", (records[0][0], records[0][1]),
                       f"committed transaction {op.value.get('txid')} op {op.id}: none of its {len(records)} "
                       "records is in the final read_committed read", [op])
            elif len(present) < len(records) or moved:
                missing = [r for r in records if r not in present]
                report("half-visible-transaction", (records[0][0], records[0][1]),
                       f"committed transaction {op.value.get('txid')} op {op.id}: final read lacks {missing}"
                       f"{'; at other offsets than acknowledged: ' + str(moved) if moved else ''}", [op])
        elif 0 < len(present) < len(records):
            missing = [r for r in records if r not in present]
            report("half-visible-transaction", (records[0][0], records[0][1]),
                   f"transaction {op.value.get('txid')} op {op.id} of unknown outcome: the final read holds "
                   f"{len(present)} of its {len(records)} records, not {missing}", [op])

    # live readers against the final read, range by range
    final_offsets = {tp: sorted(m) for tp, m in final_by_tp.items()}
    for op in fetches:
        key = op.key
        if op.value.get("final") or key not in finals or op.result.get("next_offset") is None:
            continue
        lo, hi = op.value.get("offset", 0), op.result["next_offset"]
        offs = final_offsets.get(key, [])
        expected = {o: final_by_tp[key][o] for o in offs[bisect.bisect_left(offs, lo):bisect.bisect_left(offs, hi)]}
        got = {off: v for off, v in op.result.get("records") or []}
        if expected != got:
            skipped = sorted(set(expected) - set(got))[:5]
            extra = sorted(set(got) - set(expected))[:5]
            report("half-visible-transaction", key,
                   f"read_committed fetch of [{lo}, {hi}) differs from the final read there: passed over "
                   f"{[(o, expected[o]) for o in skipped]}, read {[(o, got[o]) for o in extra]} the final read "
                   "lacks", [op] + finals[key][:1])
