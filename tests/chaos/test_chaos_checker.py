"""The history checker catches every planted anomaly kind and accepts good histories,
including unknown-outcome writes that do or do not show up."""
from __future__ import annotations

import json

import pytest

from tests.chaos.harness.checker import ANOMALY_KINDS, check, unavailability_windows
from tests.chaos.harness.history import History

T = "t"
C = "c"   # a compacted topic


class Builder:
    """Small DSL over History for planted histories."""

    def __init__(self):
        self.h = History(clock=iter(range(10_000)).__next__)

    def produce(self, values, offsets=None, outcome="ok", partition=0, idempotent=False, process="p1"):
        op = self.h.invoke(process, "produce", topic=T, partition=partition, values=list(values),
                           idempotent=idempotent)
        if outcome == "ok":
            self.h.ok(op, offsets=list(offsets))
        elif outcome == "fail":
            self.h.fail(op, "NOT_ENOUGH_REPLICAS")
        elif outcome == "info":
            self.h.info(op, "timeout")
        return op

    def fetch(self, records, hw=None, offset=0, final=False, partition=0, process="c1"):
        op = self.h.invoke(process, "fetch", topic=T, partition=partition, offset=offset, final=final)
        hw = hw if hw is not None else (records[-1][0] + 1 if records else offset)
        self.h.ok(op, records=[list(r) for r in records], high_watermark=hw)
        return op

    def commit(self, offset, group="g", partition=0):
        op = self.h.invoke("g1", "commit", group=group, topic=T, partition=partition, offset=offset)
        self.h.ok(op)
        return op

    def read_committed(self, offset, group="g", partition=0):
        op = self.h.invoke("g2", "read_committed", group=group, topic=T, partition=partition)
        self.h.ok(op, offset=offset)
        return op

    def read_committed_final(self, offset, group="g", partition=0):
        op = self.h.invoke("final-reader", "read_committed", group=group, topic=T, partition=partition, final=True)
        self.h.ok(op, offset=offset)
        return op

    # compacted topic: a unique write id per record, keys, tombstones
    def cproduce(self, wid, key, offset=None, tombstone=False, outcome="ok", partition=0, retention_ms=5000):
        op = self.h.invoke("c1", "produce", topic=C, partition=partition, values=[wid], keys=[key],
                           tombstones=[tombstone], idempotent=False, compacted=True,
                           delete_retention_ms=retention_ms)
        if outcome == "ok":
            self.h.ok(op, offsets=[offset])
        elif outcome == "fail":
            self.h.fail(op, "NOT_ENOUGH_REPLICAS")
        else:
            self.h.info(op, "timeout")
        return op

    def cfetch(self, records, hw, final=False, partition=0, offset=0):
        """records: (offset, write id, key, value)."""
        op = self.h.invoke("c2" if not final else "final-reader", "fetch", topic=C, partition=partition,
                           offset=offset, final=final, compacted=True)
        self.h.ok(op, records=[list(r) for r in records], high_watermark=hw)
        return op

    def wait(self, ticks):
        """Let `ticks` seconds of history time pass (the planted clock moves one per event)."""
        for _ in range(ticks):
            self.h.now()

    def check(self):
        return check(self.h)


def kinds(result):
    return set(result.by_kind())


def test_good_history_with_unknown_outcomes_is_valid():
    b = Builder()
    b.produce(["a", "b"], [0, 1])
    b.produce(["c"], outcome="info")           # unknown, and it did happen
    b.produce(["d"], outcome="info")           # unknown, and it did not happen
    b.produce(["e"], outcome="fail")           # certainly failed, never seen
    b.produce(["f"], [3])
    b.fetch([(0, "a"), (1, "b")], hw=2)
    b.fetch([(2, "c"), (3, "f")], offset=2, hw=4)
    b.fetch([(0, "a"), (1, "b"), (2, "c"), (3, "f")], final=True)
    b.commit(2)
    b.read_committed(2)
    b.commit(4)
    b.read_committed(4)
    r = b.check()
    assert r.valid, r.summary()
    assert r.stats["produce_ok"] == 2 and r.stats["produce_info"] == 2 and r.stats["produce_fail"] == 1


def test_lost_acknowledged_write_is_reported_with_its_ops():
    b = Builder()
    w = b.produce(["a"], [0])
    b.produce(["b"], [1])
    fin = b.fetch([(0, "a")], final=True)   # b lost (truncated after a leader change)
    r = b.check()
    assert kinds(r) == {"lost-write"}
    a = r.anomalies[0]
    assert a.partition == 0 and "'b'" in a.message
    assert {o["op"] for o in a.ops} == {w.id + 1, fin.id}


def test_acknowledged_offset_overwritten_is_lost_and_two_values():
    b = Builder()
    b.produce(["a"], [0])
    b.produce(["x"], outcome="info")
    b.fetch([(0, "x")], final=True)
    assert kinds(b.check()) == {"lost-write", "two-values-at-offset"}


def test_two_values_at_one_offset_across_reads():
    b = Builder()
    b.produce(["a"], outcome="info")
    b.produce(["b"], outcome="info")
    b.fetch([(0, "a")])
    b.fetch([(0, "b")])
    assert kinds(b.check()) == {"two-values-at-offset"}


def test_value_produced_once_at_two_offsets():
    b = Builder()
    b.produce(["a"], [0])
    b.fetch([(0, "a"), (1, "a")], final=True)
    assert kinds(b.check()) == {"value-at-two-offsets"}


def test_idempotent_resend_duplicated_is_reported_and_plain_resend_is_allowed():
    b = Builder()
    b.produce(["a"], outcome="info", idempotent=True)
    b.produce(["a"], [1], idempotent=True)           # retry of the same value
    b.fetch([(0, "a"), (1, "a")], final=True)
    r = b.check()
    assert kinds(r) == {"duplicate"}

    b = Builder()
    b.produce(["a"], outcome="info", idempotent=False)
    b.produce(["a"], [1], idempotent=False)
    b.fetch([(0, "a"), (1, "a")], final=True)
    r = b.check()
    assert r.valid, r.summary()
    assert r.stats["allowed_duplicates"] == 1


def test_offsets_not_strictly_increasing_within_a_read():
    b = Builder()
    b.produce(["a", "b"], [0, 1])
    b.fetch([(1, "b"), (0, "a")], hw=2)
    b.fetch([(0, "a"), (1, "b")], final=True)
    assert kinds(b.check()) == {"non-monotonic-read"}


def test_phantom_read_of_a_value_never_written():
    b = Builder()
    b.produce(["a"], [0])
    b.fetch([(0, "a"), (1, "zzz")], final=True)
    assert kinds(b.check()) == {"phantom-read"}


def test_value_written_to_another_partition_is_a_phantom_here():
    b = Builder()
    b.produce(["a"], [0], partition=1)
    b.fetch([(0, "a")], final=True, partition=1)
    b.fetch([(0, "a")], final=True, partition=0)
    r = b.check()
    assert kinds(r) == {"phantom-read"} and r.anomalies[0].partition == 0


def test_read_of_a_certainly_failed_write():
    b = Builder()
    b.produce(["a"], outcome="fail")
    b.fetch([(0, "a")], final=True)
    assert kinds(b.check()) == {"failed-write-read"}


def test_record_above_the_high_watermark_it_reported():
    b = Builder()
    b.produce(["a", "b"], [0, 1])
    b.fetch([(0, "a"), (1, "b")], hw=1)
    b.fetch([(0, "a"), (1, "b")], final=True)
    r = b.check()
    assert kinds(r) == {"read-above-hw"} and "offset 1" in r.anomalies[0].message


def test_committed_offset_going_backwards():
    b = Builder()
    b.commit(5)
    b.read_committed(5)
    b.read_committed(3)
    r = b.check()
    assert kinds(r) == {"committed-offset-regression"}

    b = Builder()
    b.commit(7)
    b.read_committed(None)   # the commit vanished
    assert kinds(b.check()) == {"committed-offset-regression"}


def test_concurrent_commit_and_read_is_not_a_regression():
    b = Builder()
    h = b.h
    c = h.invoke("g1", "commit", group="g", topic=T, partition=0, offset=9)
    rd = h.invoke("g2", "read_committed", group="g", topic=T, partition=0)
    h.ok(rd, offset=None)   # the read began before the commit finished
    h.ok(c)
    assert b.check().valid


def test_unverified_acknowledged_write_without_final_read():
    b = Builder()
    b.produce(["a"], [0])
    assert kinds(b.check()) == {"no-final-read"}


def test_every_kind_is_covered_by_a_planted_history():
    planted = {"lost-write", "value-at-two-offsets", "duplicate", "two-values-at-offset", "non-monotonic-read",
               "phantom-read", "failed-write-read", "read-above-hw", "committed-offset-regression", "no-final-read",
               "lost-latest-value", "tombstone-removed-early", "final-committed-offset"}
    assert planted == set(ANOMALY_KINDS)


# ---------------------------------------------------------------------- compacted topics

def _compacted_history(b, final_records, wait=10):
    """k1 written three times, k2 twice then a tombstone, k3 once; offsets 0..6."""
    b.cproduce("w0", "k1", 0)
    b.cproduce("w1", "k2", 1)
    b.cproduce("w2", "k1", 2)
    b.cproduce("w3", "k3", 3)
    b.cproduce("w4", "k2", 4)
    b.cproduce("w5", "k1", 5)
    b.cproduce("w6", "k2", 6, tombstone=True)
    b.cfetch([(0, "w0", "k1", "a"), (1, "w1", "k2", "b"), (2, "w2", "k1", "c")], hw=3)
    b.wait(wait)
    return b.cfetch(final_records, hw=7, final=True)


def test_compacted_partition_after_cleaning_is_valid():
    # superseded writes removed, the latest of k1 and k3 kept, k2's latest (a tombstone
    # acknowledged 10+ s before the final read, delete.retention.ms 5 s) removed
    b = Builder()
    _compacted_history(b, [(3, "w3", "k3", "d"), (5, "w5", "k1", "f")])
    r = b.check()
    assert r.valid, r.summary()
    assert r.stats["compacted_keys_checked"] == 3 and r.stats["compacted_tombstones_expired"] == 1
    assert r.stats["compacted_superseded_removed"] == 4   # w0, w1, w2, w4: what compaction took


def test_compacted_partition_before_cleaning_is_valid_too():
    b = Builder()
    recs = [(0, "w0", "k1", "a"), (1, "w1", "k2", "b"), (2, "w2", "k1", "c"), (3, "w3", "k3", "d"),
            (4, "w4", "k2", "e"), (5, "w5", "k1", "f"), (6, "w6", "k2", None)]
    _compacted_history(b, recs, wait=0)
    r = b.check()
    assert r.valid, r.summary()
    assert r.stats.get("compacted_superseded_removed", 0) == 0


def test_compacted_latest_value_lost_is_reported():
    # negative control: k1's latest acknowledged value (w5 at 5) is gone, an older one kept
    b = Builder()
    _compacted_history(b, [(2, "w2", "k1", "c"), (3, "w3", "k3", "d")])
    r = b.check()
    assert kinds(r) == {"lost-latest-value"}
    [a] = r.anomalies
    assert "'k1'" in a.message and "'w5'" in a.message and a.topic == C

    b = Builder()   # k3, written once, gone altogether
    _compacted_history(b, [(5, "w5", "k1", "f")])
    r = b.check()
    assert kinds(r) == {"lost-latest-value"} and "'k3'" in r.anomalies[0].message


def test_compacted_key_absent_because_of_an_older_tombstone_is_still_lost():
    # k2's tombstone w6 came after w4; here k2's latest acknowledged write is a value
    b = Builder()
    b.cproduce("w0", "k2", 0, tombstone=True)
    b.cproduce("w1", "k2", 1)
    b.cproduce("w2", "k9", 2)
    b.wait(10)
    b.cfetch([(2, "w2", "k9", "x")], hw=3, final=True)
    assert kinds(b.check()) == {"lost-latest-value"}


def test_compacted_tombstone_removed_before_delete_retention_is_reported():
    b = Builder()
    _compacted_history(b, [(3, "w3", "k3", "d"), (5, "w5", "k1", "f")], wait=0)  # 1 s after the tombstone
    r = b.check()
    assert kinds(r) == {"tombstone-removed-early"} and "'k2'" in r.anomalies[0].message


def test_compacted_later_write_of_unknown_outcome_may_supersede_the_latest_acknowledged():
    b = Builder()
    b.cproduce("w0", "k1", 0)
    b.cproduce("w1", "k1", outcome="info")              # unknown, and it landed at 1
    b.cproduce("w2", "k2", 2)
    b.cfetch([(1, "w1", "k1", "b"), (2, "w2", "k2", "c")], hw=3, final=True)
    assert b.check().valid

    b = Builder()
    b.cproduce("w0", "k1", 0)
    b.cproduce("w1", "k1", outcome="info", tombstone=True)  # unknown tombstone, landed, expired
    b.cproduce("w2", "k2", 2)
    b.wait(10)
    b.cfetch([(2, "w2", "k2", "c")], hw=3, final=True)
    r = b.check()
    assert r.valid and r.stats["compacted_tombstones_expired"] == 1

    b = Builder()   # a failed (certainly not applied) tombstone explains nothing
    b.cproduce("w0", "k1", 0)
    b.cproduce("w1", "k1", outcome="fail", tombstone=True)
    b.cproduce("w2", "k2", 2)
    b.wait(10)
    b.cfetch([(2, "w2", "k2", "c")], hw=3, final=True)
    assert kinds(b.check()) == {"lost-latest-value"}


def test_compacted_record_with_another_key_or_value_than_its_write_is_a_phantom():
    b = Builder()
    b.cproduce("w0", "k1", 0)
    b.cproduce("w1", "k2", 1, tombstone=True)
    b.cfetch([(0, "w0", "k7", "a"), (1, "w1", "k2", None)], hw=2, final=True)
    assert kinds(b.check()) == {"phantom-read"}

    b = Builder()
    b.cproduce("w0", "k1", 0, tombstone=True)
    b.cfetch([(0, "w0", "k1", "resurrected")], hw=1, final=True)
    assert kinds(b.check()) == {"phantom-read"}


def test_compacted_acknowledged_writes_without_a_final_read():
    b = Builder()
    b.cproduce("w0", "k1", 0)
    assert kinds(b.check()) == {"no-final-read"}


def test_plain_topic_next_to_a_compacted_one_still_loses_nothing():
    # the compacted rules apply to the compacted partition only: a superseded record
    # missing there is fine, an acknowledged record missing from the plain topic is lost
    b = Builder()
    b.produce(["a"], [0])
    b.produce(["b"], [1])
    b.fetch([(0, "a")], final=True)
    b.cproduce("w0", "k1", 0)
    b.cproduce("w1", "k1", 1)
    b.cfetch([(1, "w1", "k1", "x")], hw=2, final=True)
    r = b.check()
    assert kinds(r) == {"lost-write"} and r.anomalies[0].topic == T


# ---------------------------------------------------------------------- final committed offsets

def test_final_committed_offsets_equal_the_latest_commit():
    b = Builder()
    b.commit(3)
    b.commit(8)
    b.commit(5, partition=1)
    b.read_committed_final(8)
    b.read_committed_final(5, partition=1)
    assert b.check().valid


def test_final_committed_offset_other_than_the_latest_commit_is_reported():
    b = Builder()
    b.commit(3)
    b.commit(8)
    b.read_committed_final(11)        # never committed
    r = b.check()
    assert kinds(r) == {"final-committed-offset"} and "gave 11" in r.anomalies[0].message

    b = Builder()
    b.commit(3)
    b.commit(8)
    b.read_committed_final(3)         # the latest commit lost (also a regression)
    assert kinds(b.check()) == {"final-committed-offset", "committed-offset-regression"}


def test_final_committed_offset_may_be_a_later_commit_of_unknown_outcome():
    b = Builder()
    b.commit(3)
    op = b.h.invoke("g1", "commit", group="g", topic=T, partition=0, offset=9)
    b.h.info(op, "timeout")
    b.read_committed_final(9)
    assert b.check().valid
    b.read_committed_final(3)   # the unknown commit read back, then gone
    assert kinds(b.check()) == {"committed-offset-regression"}


def test_final_committed_offset_may_be_a_commit_still_pending_when_the_committers_stopped():
    b = Builder()
    b.commit(3)
    b.h.invoke("g1", "commit", group="g", topic=T, partition=0, offset=7)   # never completed
    b.read_committed_final(7)
    assert b.check().valid


def test_committed_partition_without_its_final_fetch():
    b = Builder()
    b.commit(3)
    b.commit(4, partition=1)
    b.read_committed_final(3)
    assert kinds(b.check()) == {"no-final-read"}


def test_history_round_trips_through_json_lines(tmp_path):
    b = Builder()
    b.produce(["a"], [0])
    b.produce(["b"], [1])
    b.fetch([(0, "a")], final=True)
    path = tmp_path / "h.jsonl"
    b.h.dump(str(path))
    loaded = History.load(str(path))
    assert [json.dumps(e, sort_keys=True) for e in loaded.events] == [json.dumps(e, sort_keys=True) for e in b.h.events]
    assert kinds(check(loaded)) == {"lost-write"}


def test_unavailability_windows():
    h = History(clock=iter([0, 0, 1, 2, 3, 10, 11, 12]).__next__)
    for _ in range(3):
        op = h.invoke("p", "produce", topic=T, partition=0, values=["v"], idempotent=False)
        h.ok(op, offsets=[0])
    # invokes at 0, 2, 10; ok completions at 1, 3, 11 -> one gap of 8 s
    assert unavailability_windows(h, min_gap_s=2.0) == [(3, 11)]


@pytest.mark.parametrize("limit", [1, 3])
def test_anomaly_reports_are_capped_per_kind(limit):
    b = Builder()
    for i in range(5):
        b.produce([f"v{i}"], [i])
    b.fetch([], final=True, hw=0)
    r = check(b.h, anomaly_limit_per_kind=limit)
    assert len(r.anomalies) == limit and r.stats["anomalies_total"] == 5


def test_unavailability_windows_per_partition():
    h = History(clock=iter([0, 0, 1, 2, 3, 10, 11]).__next__)
    for p in (0, 1, 0):
        op = h.invoke("p", "produce", topic=T, partition=p, values=[f"v{p}"], idempotent=False)
        h.ok(op, offsets=[0])
    # partition 0: oks at 1 and 11 -> gap (1, 11); partition 1 alone has no gap
    assert unavailability_windows(h, min_gap_s=2.0, key=(T, 0)) == [(1, 11)]
    assert unavailability_windows(h, min_gap_s=2.0, key=(T, 1)) == []


def test_report_files_and_svg_are_well_formed(tmp_path):
    import xml.etree.ElementTree as ET

    from tests.chaos.harness.nemesis import FaultRecord
    from tests.chaos.harness.report import write_report

    b = Builder()
    b.produce(["a"], [0])
    b.produce(["b"], [1])
    b.fetch([(0, "a"), (1, "b")], final=True)
    faults = [FaultRecord("kill-broker", "kill -9 broker 1", 0.5, 1.5),
              FaultRecord("slow-links", "slow <&> links", 2.0, 3.0, error="start: boom")]
    figs = write_report(str(tmp_path), b.h, check(b.h), faults, {"seed": 1})
    assert figs["faults_total"] == 2 and figs["anomalies_total"] == 0
    assert figs["fault_errors"] == [{"kind": "slow-links", "error": "start: boom"}]
    root = ET.parse(tmp_path / "throughput_latency.svg").getroot()
    titles = [t.text for t in root.iter("{http://www.w3.org/2000/svg}title")]
    assert any("kill-broker" in t for t in titles) and any("slow-links" in t for t in titles)
    assert (tmp_path / "report.md").read_text().count("kill -9 broker 1") == 1
    assert History.load(str(tmp_path / "history.jsonl")).ops[0].value["values"] == ["a"]
