"""The transaction coordinator's pure state machine (partitions/transactions/coordinator.py)."""
from __future__ import annotations

import pytest

from partitions.errors import ErrorCode, KraftlogError
from partitions.transactions.coordinator import (
    TransactionCoordinatorState,
    TxnState,
    decode,
    partition_for,
    record,
)


def written(st: TransactionCoordinatorState, md):
    """What the shell does: write the record, then apply; replaying the record gives the same."""
    k, v = record(md)
    assert decode(k, v) == (md.transactional_id, md)
    st.apply(md)
    return md


def test_init_begin_commit_complete():
    st = TransactionCoordinatorState(max_timeout_ms=60_000)
    md = written(st, st.init("t", 10_000, new_producer_id=42, now_ms=0))
    assert (md.producer_id, md.producer_epoch, md.state) == (42, 0, TxnState.EMPTY)
    md = written(st, st.add_partitions("t", 42, 0, [("a", 0), ("b", 1)], now_ms=5))
    assert md.state is TxnState.ONGOING and md.partitions == (("a", 0), ("b", 1)) and md.start_ms == 5
    assert st.add_partitions("t", 42, 0, [("a", 0)], now_ms=6) is None   # nothing new: no write
    md = written(st, st.add_offsets("t", 42, 0, "g", [("in", 0, 17)], now_ms=7))
    assert md.offsets == (("g", "in", 0, 17),) and md.partitions == (("a", 0), ("b", 1))
    md = written(st, st.end("t", 42, 0, commit=True, now_ms=8))
    assert md.state is TxnState.PREPARE_COMMIT and st.pending_completions() == [md]
    with pytest.raises(KraftlogError) as e:
        st.add_partitions("t", 42, 0, [("c", 0)], now_ms=9)
    assert e.value.code is ErrorCode.CONCURRENT_TRANSACTIONS
    assert st.end("t", 42, 0, commit=True, now_ms=9) == md               # retry: wait for it
    with pytest.raises(KraftlogError) as e:
        st.end("t", 42, 0, commit=False, now_ms=9)
    assert e.value.code is ErrorCode.INVALID_TXN_STATE
    md = written(st, st.complete(md, now_ms=10))
    assert md.state is TxnState.COMPLETE_COMMIT and md.partitions == () and md.offsets == ()
    assert st.end("t", 42, 0, commit=True, now_ms=11) is None            # retried commit: done
    assert st.pending_completions() == []


def test_init_fences_and_aborts_what_the_old_epoch_left_open():
    st = TransactionCoordinatorState(max_timeout_ms=60_000)
    written(st, st.init("t", 10_000, 42, 0))
    written(st, st.add_partitions("t", 42, 0, [("a", 0)], 1))
    md = st.init("t", 10_000, 99, 2)
    assert (md.producer_id, md.producer_epoch, md.state) == (42, 1, TxnState.PREPARE_ABORT)
    assert md.partitions == (("a", 0),)                 # the markers go there
    written(st, md)
    for call in (lambda: st.add_partitions("t", 42, 0, [("a", 0)], 3),
                 lambda: st.end("t", 42, 0, True, 3)):
        with pytest.raises(KraftlogError) as e:
            call()
        assert e.value.code is ErrorCode.PRODUCER_FENCED
    with pytest.raises(KraftlogError) as e:
        st.init("t", 10_000, 99, 3)                     # still completing the abort
    assert e.value.code is ErrorCode.CONCURRENT_TRANSACTIONS
    written(st, st.complete(md, 4))
    md = written(st, st.init("t", 10_000, 99, 5))
    assert (md.producer_id, md.producer_epoch, md.state) == (42, 2, TxnState.EMPTY)


def test_timeout_is_bounded_and_expiry_aborts_with_a_bumped_epoch():
    st = TransactionCoordinatorState(max_timeout_ms=1000)
    with pytest.raises(KraftlogError) as e:
        st.init("t", 5000, 1, 0)
    assert e.value.code is ErrorCode.INVALID_TRANSACTION_TIMEOUT
    written(st, st.init("t", 500, 1, 0))
    written(st, st.add_partitions("t", 1, 0, [("a", 0)], 100))
    assert st.next_expiry_ms() == 600
    assert st.expired(600) == []
    (md,) = st.expired(601)
    assert (md.state, md.producer_epoch) == (TxnState.PREPARE_ABORT, 1)


def test_replay_rebuilds_state_and_partition_mapping_is_stable():
    st = TransactionCoordinatorState(60_000)
    log = []
    for md in (st.init("x", 1000, 7, 0),):
        log.append(record(md)); st.apply(md)
    md = st.add_partitions("x", 7, 0, [("a", 3)], 1)
    log.append(record(md)); st.apply(md)
    md = st.end("x", 7, 0, False, 2)
    log.append(record(md)); st.apply(md)
    again = TransactionCoordinatorState(60_000)
    for k, v in log + [(b"junk", b"x")]:
        again.replay(k, v)
    assert again.txns == st.txns
    assert [m.state for m in again.pending_completions()] == [TxnState.PREPARE_ABORT]
    assert partition_for("x", 50) == partition_for("x", 50) and 0 <= partition_for("x", 50) < 50
