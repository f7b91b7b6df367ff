"""KIP-890 part 1, the pure parts: the coordinator's verifyOnly answer
(TransactionCoordinatorState.verify_partitions) and the leader's VerificationCache/guard
over a real partition log's transaction index."""
from __future__ import annotations

import pytest

from partitions.errors import ErrorCode, KraftlogError
from partitions.log.config import LogConfig
from partitions.log.log import Log
from partitions.log.record_batch import BatchHeader, Record, build_batch
from partitions.log.transactions import build_marker_batch, build_transactional_batch
from partitions.transactions.coordinator import TransactionCoordinatorState
from partitions.transactions.verification import VerificationCache, transactional_producer

TP = ("t", 0)


def test_coordinator_verifies_only_partitions_of_the_ongoing_transaction():
    st = TransactionCoordinatorState(max_timeout_ms=60_000)
    st.apply(st.init("x", 10_000, new_producer_id=7, now_ms=0))
    # no transaction open: nothing is in it
    assert st.verify_partitions("x", 7, 0, [TP]) == {TP: ErrorCode.INVALID_TXN_STATE}
    st.apply(st.add_partitions("x", 7, 0, [TP], now_ms=1))
    assert st.verify_partitions("x", 7, 0, [TP, ("t", 1)]) == {TP: None, ("t", 1): ErrorCode.INVALID_TXN_STATE}
    for pid, epoch, code in ((7, -1, ErrorCode.PRODUCER_FENCED), (8, 0, ErrorCode.PRODUCER_FENCED),
                             (7, 1, ErrorCode.INVALID_PRODUCER_ID_MAPPING)):
        with pytest.raises(KraftlogError) as e:
            st.verify_partitions("x", pid, epoch, [TP])
        assert e.value.code is code
    st.apply(st.end("x", 7, 0, commit=True, now_ms=2))
    with pytest.raises(KraftlogError) as e:   # completing: its markers come next
        st.verify_partitions("x", 7, 0, [TP])
    assert e.value.code is ErrorCode.CONCURRENT_TRANSACTIONS
    st.apply(st.complete(st.txns["x"], now_ms=3))
    assert st.verify_partitions("x", 7, 0, [TP]) == {TP: ErrorCode.INVALID_TXN_STATE}   # a new one must add it
    with pytest.raises(KraftlogError) as e:
        st.verify_partitions("nobody", 7, 0, [TP])
    assert e.value.code is ErrorCode.INVALID_PRODUCER_ID_MAPPING


def test_transactional_producer_of_a_request():
    txn = BatchHeader.parse(build_transactional_batch([Record(None, b"v")], 5, 2))
    plain = BatchHeader.parse(build_batch([Record(None, b"v")]))
    marker = BatchHeader.parse(build_marker_batch(5, 2, commit=True))
    assert transactional_producer([plain, marker]) is None
    assert transactional_producer([plain, txn]) == (5, 2)
    with pytest.raises(ValueError, match="several producers"):
        transactional_producer([txn, BatchHeader.parse(build_transactional_batch([Record(None, b"v")], 6, 0))])


def test_cache_skips_open_transactions_and_verified_producers_until_a_marker(tmp_path):
    lg = Log.open(tmp_path / "t-0", LogConfig())
    cache = VerificationCache()
    idx = lg.transactions
    assert cache.needs_verification(TP, idx, 5, 0, leader_epoch=1)
    guard = cache.guard(idx, 5, 0, leader_epoch=1)
    assert guard.holds(lg.transactions, 1)
    cache.remember(TP, guard)
    assert not cache.needs_verification(TP, idx, 5, 0, 1)       # verified: later batches cost nothing
    assert cache.needs_verification(TP, idx, 5, 1, 1)           # another epoch is another producer
    assert cache.needs_verification(TP, idx, 6, 0, 1)
    assert cache.needs_verification(("t", 1), idx, 5, 0, 1)     # per partition
    assert cache.needs_verification(TP, idx, 5, 0, 2)           # a new leader epoch verifies again
    cache.remember(TP, cache.guard(idx, 5, 0, 1))
    lg.append_as_leader(build_transactional_batch([Record(None, b"a")], 5, 0), 1)
    assert not cache.needs_verification(TP, lg.transactions, 5, 0, 1)
    lg.append_as_leader(build_marker_batch(5, 0, commit=True), 1)   # the transaction ended
    assert cache.needs_verification(TP, lg.transactions, 5, 0, 1)
    assert cache.verifications == 2
    lg.append_as_leader(build_marker_batch(5, 1, commit=False), 1)   # epoch 1 seen: epoch 0 is fenced,
    assert not cache.needs_verification(TP, lg.transactions, 5, 0, 1)   # the log refuses it by itself


def test_guard_taken_before_the_request_fails_when_a_marker_slips_in(tmp_path):
    lg = Log.open(tmp_path / "t-0", LogConfig())
    cache = VerificationCache()
    guard = cache.guard(lg.transactions, 5, 0, leader_epoch=1)
    lg.append_as_leader(build_marker_batch(5, 0, commit=False), 1)   # e.g. aborted on timeout meanwhile
    assert not guard.holds(lg.transactions, 1)
    other = cache.guard(lg.transactions, 6, 0, leader_epoch=1)
    lg.append_as_leader(build_marker_batch(5, 0, commit=False), 1)   # another producer's marker
    assert other.holds(lg.transactions, 1)
    assert not other.holds(lg.transactions, 2)


def test_cache_is_bounded_per_partition(tmp_path):
    lg = Log.open(tmp_path / "t-0", LogConfig())
    cache = VerificationCache(max_entries_per_partition=2)
    for pid in (1, 2, 3):
        cache.remember(TP, cache.guard(lg.transactions, pid, 0, 1))
    assert cache.needs_verification(TP, lg.transactions, 1, 0, 1)      # the oldest went
    assert not cache.needs_verification(TP, lg.transactions, 3, 0, 1)
