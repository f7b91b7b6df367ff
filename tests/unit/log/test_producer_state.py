"""Idempotent producer state: duplicates, sequence order, epoch fencing, rebuild on open."""
from __future__ import annotations

import pytest
from logtest_helpers import make_batch

from partitions.clock import ManualClock
from partitions.log.config import LogConfig
from partitions.log.errors import InvalidProducerEpochError, OutOfOrderSequenceError
from partitions.log.log import Log
from partitions.log.producer_state import PRODUCER_STATE_SNAPSHOT, in_sequence, last_sequence


def _open(tmp_path, clean=False):
    return Log.open(tmp_path / "t-0", LogConfig(segment_bytes=500), clean_shutdown=clean, clock=ManualClock())


def _pb(seq, n=2, pid=7, epoch=0):
    return make_batch(n, producer_id=pid, producer_epoch=epoch, base_sequence=seq)


def test_sequence_helpers_wrap():
    assert last_sequence(2**31 - 2, 3) == 1
    assert in_sequence(2**31 - 1, 0) and in_sequence(4, 5) and not in_sequence(4, 6)


def test_duplicate_batch_returns_original_offsets_and_writes_nothing(tmp_path):
    lg = _open(tmp_path)
    first = lg.append_as_leader(_pb(0), 0)
    lg.append_as_leader(_pb(2), 0)
    size = lg.size_bytes
    dup = lg.append_as_leader(_pb(0), 0)
    assert dup.duplicate and (dup.first_offset, dup.last_offset) == (first.first_offset, first.last_offset)
    assert lg.size_bytes == size and lg.log_end_offset == 4


def test_only_last_five_batches_are_remembered(tmp_path):
    lg = _open(tmp_path)
    for i in range(6):
        lg.append_as_leader(_pb(2 * i), 0)
    cached = lg.append_as_leader(_pb(2), 0)  # batch 2 of 6: still cached
    assert cached.duplicate and cached.first_offset == 2
    evicted = lg.append_as_leader(_pb(0), 0)  # evicted: a duplicate whose offsets are unknown
    assert evicted.duplicate and (evicted.first_offset, evicted.last_offset) == (-1, -1)
    assert lg.log_end_offset == 12


def test_any_batch_at_or_below_the_last_sequence_is_a_duplicate(tmp_path):
    """A retried Spark task re-sends more than 5 old batches, in the same order."""
    lg = _open(tmp_path)
    for i in range(10):
        lg.append_as_leader(_pb(2 * i), 0)
    size = lg.size_bytes
    for i in range(10):
        info = lg.append_as_leader(_pb(2 * i), 0)
        assert info.duplicate and info.num_records == 2
        assert (info.first_offset >= 0) == (i >= 5)
    assert lg.size_bytes == size and lg.log_end_offset == 20
    assert lg.append_as_leader(_pb(3, n=1), 0).duplicate  # inside old ranges: still below the last one
    assert not lg.append_as_leader(_pb(20), 0).duplicate
    assert lg.log_end_offset == 22


def test_partial_overlap_or_gap_stays_out_of_order(tmp_path):
    lg = _open(tmp_path)
    for i in range(7):
        lg.append_as_leader(_pb(2 * i), 0)  # sequences 0..13
    with pytest.raises(OutOfOrderSequenceError, match="expected 14"):
        lg.append_as_leader(_pb(12, n=4), 0)  # 12..15 straddles the last sequence
    with pytest.raises(OutOfOrderSequenceError, match="expected 14"):
        lg.append_as_leader(_pb(16), 0)
    with pytest.raises(OutOfOrderSequenceError):
        lg.append_as_leader(_pb(0, n=20), 0)  # 0..19 overlaps and skips ahead
    assert lg.log_end_offset == 14


def test_a_request_of_only_duplicates_answers_their_span(tmp_path):
    lg = _open(tmp_path)
    lg.append_as_leader(_pb(0) + _pb(2), 0)
    lg.append_as_leader(_pb(4), 0)
    info = lg.append_as_leader(_pb(0) + _pb(2), 0)
    assert info.duplicate and (info.first_offset, info.last_offset, info.num_records) == (0, 3, 4)


def test_duplicates_followed_by_new_batches_in_one_request_are_refused(tmp_path):
    """Answering such a request as a duplicate would drop the new batches."""
    lg = _open(tmp_path)
    lg.append_as_leader(_pb(0), 0)
    with pytest.raises(OutOfOrderSequenceError, match="already-appended"):
        lg.append_as_leader(_pb(0) + _pb(2), 0)
    with pytest.raises(OutOfOrderSequenceError, match="already-appended"):
        lg.append_as_leader(_pb(0) + make_batch(1), 0)
    with pytest.raises(OutOfOrderSequenceError, match="already-appended"):
        lg.append_as_leader(_pb(0) + _pb(0, pid=8), 0)
    with pytest.raises(OutOfOrderSequenceError, match="already-appended"):
        lg.append_as_leader(make_batch(1) + _pb(0), 0)
    assert lg.log_end_offset == 2
    assert not lg.append_as_leader(_pb(2), 0).duplicate


def test_out_of_order_sequence_is_refused(tmp_path):
    lg = _open(tmp_path)
    lg.append_as_leader(_pb(0), 0)
    with pytest.raises(OutOfOrderSequenceError, match="expected 2"):
        lg.append_as_leader(_pb(5), 0)
    assert lg.log_end_offset == 2


def test_stale_epoch_is_fenced_and_new_epoch_restarts_at_zero(tmp_path):
    lg = _open(tmp_path)
    lg.append_as_leader(_pb(0, epoch=3), 0)
    with pytest.raises(InvalidProducerEpochError):
        lg.append_as_leader(_pb(2, epoch=2), 0)
    with pytest.raises(OutOfOrderSequenceError, match="starts at 0"):
        lg.append_as_leader(_pb(2, epoch=4), 0)
    assert not lg.append_as_leader(_pb(0, epoch=4), 0).duplicate


def test_unknown_producer_and_plain_batches_are_accepted(tmp_path):
    lg = _open(tmp_path)
    assert lg.append_as_leader(_pb(40, pid=99), 0).first_offset == 0
    assert lg.append_as_leader(make_batch(1), 0).first_offset == 2
    assert lg.append_as_leader(make_batch(1), 0).first_offset == 3  # no producer id: never a duplicate


def test_several_batches_of_one_producer_in_one_append(tmp_path):
    lg = _open(tmp_path)
    lg.append_as_leader(_pb(0) + _pb(2), 0)
    with pytest.raises(OutOfOrderSequenceError):
        lg.append_as_leader(_pb(4) + _pb(7), 0)
    assert lg.log_end_offset == 4


@pytest.mark.parametrize("clean", [False, True])
def test_state_is_rebuilt_on_open(tmp_path, clean):
    lg = _open(tmp_path)
    for i in range(4):
        lg.append_as_leader(_pb(2 * i), 0)
    if clean:
        lg.close()
        assert (tmp_path / "t-0" / PRODUCER_STATE_SNAPSHOT).exists()
    else:
        lg.close_without_flush()
    lg = _open(tmp_path, clean=clean)
    assert not (tmp_path / "t-0" / PRODUCER_STATE_SNAPSHOT).exists()  # consumed
    dup = lg.append_as_leader(_pb(4), 0)
    assert dup.duplicate and dup.first_offset == 4
    with pytest.raises(OutOfOrderSequenceError):
        lg.append_as_leader(_pb(9), 0)
    assert lg.append_as_leader(_pb(8), 0).first_offset == 8


def test_truncation_forgets_truncated_batches(tmp_path):
    lg = _open(tmp_path)
    for i in range(3):
        lg.append_as_leader(_pb(2 * i), 0)
    lg.truncate_to(4)
    assert lg.producer_state.last_entry(7).last_seq == 3
    assert not lg.append_as_leader(_pb(4), 0).duplicate


def test_follower_appends_update_state(tmp_path):
    leader = Log.open(tmp_path / "l-0", LogConfig(), clock=ManualClock())
    leader.append_as_leader(_pb(0), 0)
    follower = Log.open(tmp_path / "f-0", LogConfig(), clock=ManualClock())
    follower.append_as_follower(leader.read(0, 10**6).records)
    assert follower.producer_state.last_entry(7).last_offset == 1
    assert follower.append_as_leader(_pb(0), 1).duplicate  # after becoming leader


def test_idle_producers_expire(tmp_path):
    lg = _open(tmp_path)
    lg.append_as_leader(make_batch(2, ts=1000, producer_id=7, producer_epoch=0, base_sequence=0), 0)
    lg.append_as_leader(make_batch(2, ts=5000, producer_id=8, producer_epoch=0, base_sequence=0), 0)
    assert lg.remove_expired_producers(now_ms=6000, expiration_ms=2000) == 1
    assert lg.producer_state.last_entry(7) is None and lg.producer_state.last_entry(8) is not None
    # an expired producer is unknown again: any sequence is accepted
    assert not lg.append_as_leader(_pb(9, pid=7), 0).duplicate


def test_a_first_batch_arriving_after_a_later_one_is_refused_not_an_old_duplicate(tmp_path):
    # an unknown producer's first batch is accepted at any sequence; if that was a later
    # batch (it overtook the first on another connection), the first is out of order: a
    # duplicate answer would acknowledge records that are never written
    lg = _open(tmp_path)
    lg.append_as_leader(_pb(54, n=12), 0)
    with pytest.raises(OutOfOrderSequenceError):
        lg.append_as_leader(_pb(0, n=54), 0)
    assert lg.log_end_offset == 12


def test_an_old_duplicate_at_or_above_the_first_sequence_seen_is_still_answered_unwritten(tmp_path):
    lg = _open(tmp_path)
    for i in range(7):
        lg.append_as_leader(_pb(2 * i), 0)
    dup = lg.append_as_leader(_pb(0), 0)    # older than the 5 cached batches, seen from 0
    assert dup.duplicate and dup.first_offset == -1 and lg.log_end_offset == 14


@pytest.mark.parametrize("clean", [True, False])
def test_the_first_sequence_seen_survives_reopening(tmp_path, clean):
    lg = _open(tmp_path)
    lg.append_as_leader(_pb(54, n=12), 0)
    lg.close() if clean else lg.close_without_flush()
    lg = _open(tmp_path, clean=clean)
    assert lg.producer_state.producers[7].start_seq == 54
    with pytest.raises(OutOfOrderSequenceError):
        lg.append_as_leader(_pb(0, n=54), 0)
