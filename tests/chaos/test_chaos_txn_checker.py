"""The chaos checker's transaction rules (issue 18): planted histories of transactional
producers and read_committed readers, good and bad (a half-visible transaction, an aborted
read, a committed transaction lost, a read above the LSO, a reader passing over a committed
record)."""
from __future__ import annotations

from tests.chaos.harness.checker import TXN_ANOMALY_KINDS, check
from tests.chaos.harness.history import History

A, B = "txn-a", "txn-b"


class Builder:
    def __init__(self):
        self.h = History(clock=iter(range(10_000)).__next__)

    def txn(self, records, offsets=None, outcome="commit", txid="t0"):
        """records: [(topic, partition, value)]; outcome commit / abort / fail / info."""
        op = self.h.invoke("txn-producer-0", "txn", txid=txid, records=[list(r) for r in records],
                           intent="abort" if outcome == "abort" else "commit", txn=True)
        offs = [[t, p, o] for (t, p, _), o in zip(records, offsets or [None] * len(records))]
        if outcome in ("commit", "abort"):
            self.h.ok(op, committed=outcome == "commit", offsets=offs)
        elif outcome == "fail":
            self.h.fail(op, "records: BROKER_NOT_AVAILABLE")
        else:
            self.h.info(op, "end: timeout")
        return op

    def read(self, topic, partition, records, offset=0, next_offset=None, lso=None, final=False):
        op = self.h.invoke("final-reader" if final else f"txn-consumer-{topic}-{partition}", "fetch", topic=topic,
                           partition=partition, offset=offset, final=final, txn=True,
                           isolation_level="read_committed")
        end = next_offset if next_offset is not None else (records[-1][0] + 1 if records else offset)
        self.h.ok(op, records=[list(r) for r in records], high_watermark=end, next_offset=end,
                  last_stable_offset=end if lso is None else lso)
        return op

    def check(self):
        return check(self.h)


def kinds(result):
    return set(result.by_kind())


def _good(b: Builder):
    """t1 committed over A-0, A-1, B-0 (offsets 0, 0, 0); t2 aborted over A-0, B-0 (its
    records at 1, 1 plus markers: read_committed passes over 1..2); t3 unknown and visible
    (A-0 3, B-0 3), t4 unknown and invisible (aborted by the coordinator), t5 failed."""
    b.txn([(A, 0, "x1"), (A, 1, "y1"), (B, 0, "z1")], [0, 0, 0])
    b.txn([(A, 0, "x2"), (B, 0, "z2")], [1, 1], outcome="abort")
    b.txn([(A, 0, "x3"), (B, 0, "z3")], outcome="info")
    b.txn([(A, 1, "y4"), (B, 0, "z4")], outcome="info")
    b.txn([(A, 1, "y5")], outcome="fail")
    b.read(A, 0, [(0, "x1")], next_offset=1)
    b.read(A, 0, [(3, "x3")], offset=1, next_offset=5)
    b.read(A, 0, [(0, "x1"), (3, "x3")], next_offset=5, final=True)
    b.read(A, 1, [(0, "y1")], next_offset=6, final=True)
    b.read(B, 0, [(0, "z1"), (3, "z3")], next_offset=7, final=True)


def test_good_transactional_history_is_valid():
    b = Builder()
    _good(b)
    r = b.check()
    assert r.valid, r.summary()
    assert r.stats["transactions_committed"] == 1 and r.stats["transactions_aborted"] == 2
    assert r.stats["transactions_unknown"] == 2 and r.stats["txn_committed_records_checked"] == 3


def test_half_visible_committed_transaction_is_reported():
    b = Builder()
    b.txn([(A, 0, "x1"), (B, 0, "z1")], [0, 0])
    b.read(A, 0, [(0, "x1")], next_offset=2, final=True)
    b.read(B, 0, [], next_offset=2, final=True)      # z1's partition shows nothing of it
    r = b.check()
    assert kinds(r) == {"half-visible-transaction"}, r.summary()
    assert "z1" in r.anomalies[0].message


def test_half_visible_transaction_of_unknown_outcome_is_reported():
    b = Builder()
    b.txn([(A, 0, "x1"), (A, 1, "y1"), (B, 0, "z1")], outcome="info")
    b.read(A, 0, [(0, "x1")], final=True)
    b.read(A, 1, [(0, "y1")], final=True)
    b.read(B, 0, [], next_offset=2, final=True)
    assert kinds(b.check()) == {"half-visible-transaction"}


def test_reader_passing_over_a_committed_record_is_half_visible():
    """The live reader of A-0 moved past offset 0 without x1, which the final read has."""
    b = Builder()
    b.txn([(A, 0, "x1"), (B, 0, "z1")], [0, 0])
    b.read(A, 0, [], offset=0, next_offset=2)
    b.read(A, 0, [(0, "x1")], next_offset=2, final=True)
    b.read(B, 0, [(0, "z1")], next_offset=2, final=True)
    r = b.check()
    assert kinds(r) == {"half-visible-transaction"}, r.summary()
    assert "passed over [(0, 'x1')]" in r.anomalies[0].message


def test_aborted_read_is_reported():
    b = Builder()
    b.txn([(A, 0, "x1"), (B, 0, "z1")], [0, 0], outcome="abort")
    b.read(A, 0, [(0, "x1")], next_offset=2)          # a read_committed reader saw aborted data
    b.read(A, 0, [], next_offset=2, final=True)
    b.read(B, 0, [], next_offset=2, final=True)
    r = b.check()
    assert "aborted-read" in kinds(r), r.summary()


def test_read_of_a_transaction_that_never_committed_is_an_aborted_read():
    b = Builder()
    b.txn([(A, 0, "x1")], outcome="fail")
    b.read(A, 0, [(0, "x1")], final=True)
    assert kinds(b.check()) == {"aborted-read"}


def test_lost_committed_transaction_and_read_above_lso():
    b = Builder()
    b.txn([(A, 0, "x1"), (B, 0, "z1")], [0, 0])
    b.txn([(A, 0, "x2")], outcome="info")
    b.read(A, 0, [(3, "x2")], offset=2, next_offset=4, lso=2)   # above its own LSO
    b.read(A, 0, [(3, "x2")], next_offset=4, final=True)
    b.read(B, 0, [], next_offset=2, final=True)
    r = b.check()
    assert kinds(r) == {"lost-transaction", "read-above-lso"}, r.summary()


def test_duplicate_and_phantom_transactional_reads():
    b = Builder()
    b.txn([(A, 0, "x1")], [0])
    b.read(A, 0, [(0, "x1"), (1, "x1"), (2, "nope")], final=True)
    assert kinds(b.check()) == {"value-at-two-offsets", "phantom-read", "half-visible-transaction"}


def test_every_transaction_kind_is_planted():
    planted = {"aborted-read", "half-visible-transaction", "lost-transaction", "read-above-lso"}
    assert planted == set(TXN_ANOMALY_KINDS)
