"""The log cleaner and transactions (Kafka's CleanedTransactionMetadata): aborted records
removed, markers removed once their transaction is gone and delete.retention.ms passed,
read_committed answers unchanged, the aborted-transaction index consistent after cleaning."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from partitions.clock import ManualClock
from partitions.log.cleaner import MARKER_HORIZONS, LogCleaner
from partitions.log.config import LogConfig
from partitions.log.log import Log
from partitions.log.record_batch import Record, build_batch, decode_batches, iter_batches
from partitions.log.transactions import (
    TXN_INDEX_SUFFIX,
    TransactionIndex,
    build_marker_batch,
    build_transactional_batch,
    decode_txn_index,
    filter_read_committed,
)

RETENTION_MS = 1_000
pytestmark = pytest.mark.usefixtures("no_fsync")   # logical properties, not the disk


def _config(segment_bytes: int = 300) -> LogConfig:
    return LogConfig(cleanup_policy="compact", segment_bytes=segment_bytes, delete_retention_ms=RETENTION_MS)


def read_committed(lg: Log) -> list[tuple[int, bytes | None, bytes | None]]:
    lg.update_high_watermark(lg.log_end_offset)
    start, lso = lg.log_start_offset, lg.last_stable_offset()
    info = lg.read(start, 1 << 24, max_offset=lso)
    data, _ = filter_read_committed(info.records, start, lso, lg.aborted_transactions(start, lso))
    return [(r.offset, r.key, r.value) for r in decode_batches(data)]


def compacted_view(records) -> tuple[dict, list]:
    """What compaction must preserve: the latest value of every key, every keyless record."""
    latest = {}
    keyless = []
    for o, k, v in records:
        if k is None:
            keyless.append((o, v))
        else:
            latest[k] = (o, v)
    return latest, keyless


def all_batches(lg: Log) -> list:
    return [h for h, _ in iter_batches(lg.read(lg.log_start_offset, 1 << 24).records, validate=False)]


def markers(lg: Log) -> list[tuple[int, int]]:
    return [(h.base_offset, h.producer_id) for h in all_batches(lg) if h.is_control]


def index_files(lg: Log) -> list:
    return sorted(e for f in lg.dir.iterdir() if f.name.endswith(TXN_INDEX_SUFFIX)
                  for e in decode_txn_index(f.read_bytes()))


def assert_index_consistent(lg: Log) -> None:
    """The live index equals a rebuild from the log, and the `.txnindex` files hold it."""
    rebuilt = TransactionIndex.rebuild(lg.segments, lg.log_start_offset, None, lg.high_watermark)
    assert lg.transactions.aborted == rebuilt.aborted
    assert lg.transactions.ongoing == rebuilt.ongoing
    assert index_files(lg) == sorted(lg.transactions.aborted)


def txn(pid, records, epoch=0):
    return build_transactional_batch([Record(k, v) for k, v in records], pid, epoch)


def test_aborted_records_go_then_their_marker_after_delete_retention(tmp_path):
    clock = ManualClock()
    lg = Log.open(tmp_path / "t-0", _config(), clock=clock)
    lg.append_as_leader(build_batch([Record(b"a", b"a0")]), 0)               # 0
    lg.append_as_leader(txn(7, [(b"a", b"aborted-a"), (b"b", b"aborted-b")]), 0)   # 1-2
    lg.append_as_leader(txn(8, [(b"c", b"c-committed")]), 0)                 # 3
    lg.append_as_leader(build_marker_batch(7, 0, commit=False), 0)           # 4
    lg.append_as_leader(build_marker_batch(8, 0, commit=True), 0)            # 5
    lg.append_as_leader(build_batch([Record(b"d", b"d0")]), 0)               # 6
    lg.roll()
    lg.update_high_watermark(lg.log_end_offset)
    before = read_committed(lg)
    assert [v for _, _, v in before] == [b"a0", b"c-committed", b"d0"]
    assert index_files(lg) and lg.aborted_transactions(0, 7)

    cleaner = LogCleaner(clock=clock)
    stats = cleaner.clean(lg)
    assert stats.aborted_records_removed == 2 and stats.markers_removed == 0
    values = [r.value for r in decode_batches(lg.read(0, 1 << 20).records)]
    assert b"aborted-a" not in values and b"aborted-b" not in values
    assert read_committed(lg) == before
    # the aborted transaction has no records left: no index entry, no file; the ABORT marker
    # stays for delete.retention.ms, the COMMIT one too (c-committed is still there)
    assert lg.aborted_transactions(0, 100) == [] and index_files(lg) == []
    assert markers(lg) == [(4, 7), (5, 8)]
    assert (lg.dir / MARKER_HORIZONS).exists()
    assert_index_consistent(lg)

    clock.advance(RETENTION_MS - 1)
    assert cleaner.clean(lg) is None or markers(lg) == [(4, 7), (5, 8)]
    clock.advance(1)
    assert cleaner.needs_cleaning(lg)                     # the marker's horizon is due
    stats = cleaner.clean(lg)
    assert stats.markers_removed == 1
    assert markers(lg) == [(5, 8)]                        # the committed one keeps its record
    assert read_committed(lg) == before
    assert lg.last_stable_offset() == lg.log_end_offset   # nothing hangs
    assert_index_consistent(lg)

    # the committed record superseded: its transaction is gone, its marker goes after retention
    lg.append_as_leader(build_batch([Record(b"c", b"c1")]), 0)
    lg.roll()
    lg.update_high_watermark(lg.log_end_offset)
    cleaner.clean(lg)
    clock.advance(RETENTION_MS)
    cleaner.clean(lg)
    assert markers(lg) == []
    assert [v for _, _, v in read_committed(lg)] == [b"a0", b"d0", b"c1"]
    lg.close()
    reopened = Log.open(tmp_path / "t-0", _config(), clock=clock)   # recovery agrees
    assert reopened.transactions.ongoing == {} and reopened.aborted_transactions(0, 100) == []
    reopened.close()


def test_marker_kept_while_a_batch_of_its_transaction_is_kept(tmp_path):
    """A transaction split by an uncleanable tail keeps its marker: cleaning stops at the
    open transaction of another producer, so its records there stay, and so does the marker."""
    clock = ManualClock()
    lg = Log.open(tmp_path / "t-0", _config(segment_bytes=10_000), clock=clock)
    lg.append_as_leader(txn(1, [(b"k", b"1")]), 0)                           # 0
    lg.append_as_leader(build_marker_batch(1, 0, commit=True), 0)            # 1
    lg.roll()
    lg.update_high_watermark(lg.log_end_offset)
    cleaner = LogCleaner(clock=clock)
    for _ in range(3):
        cleaner.clean(lg)
        clock.advance(RETENTION_MS)
    assert markers(lg) == [(1, 1)]                        # its record is the latest of k
    assert [v for _, _, v in read_committed(lg)] == [b"1"]
    lg.close()


@st.composite
def histories(draw):
    """Appends of up to 3 transactional producers and plain records, commits and aborts,
    rolls; some transactions left open at the end."""
    ops = []
    open_txns: set[int] = set()
    for _ in range(draw(st.integers(5, 40))):
        kind = draw(st.sampled_from(["plain", "txn", "txn", "end", "roll"]))
        key = draw(st.sampled_from([b"k0", b"k1", b"k2", b"k3", b"k4"]))
        if kind == "plain":
            ops.append(("plain", key))
        elif kind == "txn":
            pid = draw(st.integers(1, 3))
            open_txns.add(pid)
            ops.append(("txn", pid, key, draw(st.integers(1, 3))))
        elif kind == "end" and open_txns:
            pid = draw(st.sampled_from(sorted(open_txns)))
            open_txns.discard(pid)
            ops.append(("end", pid, draw(st.booleans())))
        else:
            ops.append(("roll",))
    return ops


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=histories(), passes=st.integers(1, 4))
def test_cleaning_keeps_read_committed_and_drops_aborted_records(tmp_path_factory, ops, passes):
    clock = ManualClock()
    d = tmp_path_factory.mktemp("txn-clean") / "t-0"
    lg = Log.open(d, _config(segment_bytes=250), clock=clock)
    aborted_values: set[bytes] = set()
    pending: dict[int, list[bytes]] = {}
    n = 0
    for op in ops:
        if op[0] == "plain":
            lg.append_as_leader(build_batch([Record(op[1], b"p%d" % n)]), 0)
            n += 1
        elif op[0] == "txn":
            _, pid, key, count = op
            vals = [b"t%d-%d" % (pid, n + i) for i in range(count)]
            n += count
            pending.setdefault(pid, []).extend(vals)
            lg.append_as_leader(txn(pid, [(key, v) for v in vals]), 0)
        elif op[0] == "end":
            _, pid, commit = op
            lg.append_as_leader(build_marker_batch(pid, 0, commit=commit), 0)
            if not commit:
                aborted_values.update(pending.get(pid, []))
            pending.pop(pid, None)
        else:
            lg.roll()
    lg.roll()
    lg.update_high_watermark(lg.log_end_offset)
    before = read_committed(lg)
    lso = lg.last_stable_offset()
    cleaner = LogCleaner(clock=clock)
    for _ in range(passes):
        cleaner.clean(lg)
        clock.advance(RETENTION_MS)
    after = read_committed(lg)
    assert compacted_view(after) == compacted_view(before)
    assert set(after) <= set(before)
    assert lg.last_stable_offset() == lso                 # no transaction opened or closed by cleaning
    # below the first unstable offset (what the cleaner may touch) no aborted record is left
    batches = [(h, b) for h, b in iter_batches(lg.read(0, 1 << 24).records, validate=False)]
    left = {r.value for h, b in batches if h.base_offset < lso for r in decode_batches(b)}
    assert not left & aborted_values
    assert_index_consistent(lg)
    lg.close()
    reopened = Log.open(d, _config(segment_bytes=250), clock=clock)   # recovery rebuilds the same
    reopened.update_high_watermark(reopened.log_end_offset)
    assert reopened.last_stable_offset() == lso
    assert read_committed(reopened) == after
    reopened.close()
