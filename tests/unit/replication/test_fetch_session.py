"""Incremental replica fetch sessions (KIP-227), the pure core: the leader's session cache
(add / change / forget partitions, dirty partitions, answer filtering, epochs, eviction, a
restarted follower's fresh session) and the follower's side (what a request names, when it
starts over with a full fetch)."""
import pytest

from partitions.replication.fetch_session import (INVALID_EPOCH, NO_SESSION, SESSION_NOT_FOUND, UNSENT,
                                                  FetchSessionCache, FollowerSession)

A, B, C = ("t", 0), ("t", 1), ("t", 2)


def full(cache, replica=2, now=0, parts=((A, 0, 1), (B, 5, 1))):
    return cache.new_session(replica, list(parts), now)


def test_full_fetch_creates_a_session_holding_its_partitions():
    cache = FetchSessionCache()
    s = full(cache)
    assert s.session_id != NO_SESSION and s.replica_id == 2
    assert {k: (c.fetch_offset, c.leader_epoch) for k, c in s.partitions.items()} == {A: (0, 1), B: (5, 1)}
    cache.answered(s)
    assert s.epoch == 1 and cache.lookup(s.session_id, 1, 2, 10) is s


def test_incremental_adds_changes_and_forgets_and_reads_only_named_plus_changed():
    cache = FetchSessionCache()
    s = full(cache)
    cache.answered(s)
    assert cache.partition_changed(A) == [s.session_id]   # an append on A while nobody is parked
    keys = cache.update(s, [(C, 7, 2), (B, 6, 1)], forgotten=[])
    assert keys == [C, B, A]                       # named first, then the changed one, each once
    assert (s.partitions[B].fetch_offset, s.partitions[C].leader_epoch) == (6, 2)
    assert s.dirty == set()
    assert cache.update(s, [], forgotten=[A]) == []   # nothing named, nothing changed: nothing to read
    assert A not in s.partitions
    assert cache.partition_changed(A) == []        # forgotten: no longer wakes this session
    assert cache.partition_changed(C) == [s.session_id]


def test_forgotten_dirty_partition_is_not_read():
    cache = FetchSessionCache()
    s = full(cache)
    cache.partition_changed(B)
    assert cache.update(s, [], forgotten=[B]) == []


def test_answer_holds_only_records_errors_or_news_of_the_high_watermark():
    cache = FetchSessionCache()
    s = full(cache)
    assert s.wants_answer(A, has_records=False, error=False, high_watermark=0, log_start_offset=0)  # never told
    s.told(A, 0, 0)
    assert not s.wants_answer(A, has_records=False, error=False, high_watermark=0, log_start_offset=0)
    assert s.wants_answer(A, has_records=False, error=False, high_watermark=3, log_start_offset=0)
    assert s.wants_answer(A, has_records=False, error=False, high_watermark=0, log_start_offset=2)
    assert s.wants_answer(A, has_records=True, error=False, high_watermark=0, log_start_offset=0)
    assert s.wants_answer(A, has_records=False, error=True, high_watermark=0, log_start_offset=0)
    # named again (the follower's offset moved): answered whatever it holds
    cache.update(s, [(A, 4, 1)], [])
    assert s.partitions[A].high_watermark_sent == UNSENT
    assert s.wants_answer(A, has_records=False, error=False, high_watermark=0, log_start_offset=0)


def test_held_back_partition_is_read_again():
    cache = FetchSessionCache()
    s = full(cache)
    s.still_changed(B)
    assert cache.take_dirty(s) == [B]
    assert cache.take_dirty(s) == []


def test_epochs_must_follow_one_by_one_else_the_session_is_gone():
    cache = FetchSessionCache()
    s = full(cache)
    sid = s.session_id
    cache.answered(s)
    cache.answered(s)
    assert cache.lookup(sid, 2, 2, 1) is s
    cache.answered(s)
    assert cache.lookup(sid, 2, 2, 2) == INVALID_EPOCH     # a replayed or lost request
    assert cache.lookup(sid, 3, 2, 3) == SESSION_NOT_FOUND  # removed: start over with a full fetch
    assert cache.partition_changed(A) == []


def test_unknown_session_or_another_replicas_session_is_not_found():
    cache = FetchSessionCache()
    s = full(cache, replica=2)
    cache.answered(s)
    assert cache.lookup(s.session_id + 100, 1, 2, 0) == SESSION_NOT_FOUND
    assert cache.lookup(s.session_id, 1, 3, 0) == SESSION_NOT_FOUND


def test_restarted_follower_gets_a_fresh_session_replacing_its_old_one():
    cache = FetchSessionCache()
    old = full(cache, replica=2)
    other = full(cache, replica=3)
    new = full(cache, replica=2, parts=((C, 0, 1),))
    assert new.session_id not in (old.session_id, other.session_id)
    assert set(cache.sessions) == {other.session_id, new.session_id}
    assert cache.lookup(old.session_id, 1, 2, 0) == SESSION_NOT_FOUND
    assert cache.partition_changed(A) == [other.session_id]   # the old session's index entries are gone
    assert cache.partition_changed(C) == [new.session_id]


def test_least_recently_used_session_is_evicted_when_full():
    cache = FetchSessionCache(sessions_max=2)
    s2 = full(cache, replica=2, now=0)
    s3 = full(cache, replica=3, now=5)
    cache.answered(s2)
    cache.answered(s3)
    cache.lookup(s2.session_id, 1, 2, 10)   # s2 used later than s3
    s4 = full(cache, replica=4, now=20)
    assert set(cache.sessions) == {s2.session_id, s4.session_id}
    assert cache.lookup(s3.session_id, 1, 3, 21) == SESSION_NOT_FOUND


def test_idle_sessions_are_evicted():
    cache = FetchSessionCache(idle_ms=1000)
    s2 = full(cache, replica=2, now=0)
    s3 = full(cache, replica=3, now=900)
    assert cache.evict_idle(1500) == [s2.session_id]
    assert set(cache.sessions) == {s3.session_id}
    with pytest.raises(ValueError):
        FetchSessionCache(sessions_max=0)


def test_progress_refresh_is_due_once_per_interval():
    s = full(FetchSessionCache())
    assert s.due_for_refresh(0, 250)
    assert not s.due_for_refresh(100, 250)
    assert s.due_for_refresh(250, 250)


def test_follower_names_only_changes_once_the_session_exists():
    f = FollowerSession()
    sid, epoch, named, forgotten = f.build({A: (0, 1), B: (5, 1)})
    assert (sid, epoch, sorted(named), forgotten) == (NO_SESSION, 0, [A, B], [])
    assert f.answered(42)
    sid, epoch, named, forgotten = f.build({A: (3, 1), B: (5, 1), C: (0, 1)})
    assert (sid, epoch, sorted(named), forgotten) == (42, 1, [A, C], [])
    assert f.answered(42)
    sid, epoch, named, forgotten = f.build({A: (3, 1), C: (0, 2)})
    assert (sid, epoch, named, forgotten) == (42, 2, [C], [B])
    assert f.answered(42)
    assert f.sent == {A: (3, 1), C: (0, 2)}
    assert (f.full_fetches, f.incremental_fetches) == (1, 2)


def test_follower_starts_over_after_a_session_error_or_a_failed_request():
    f = FollowerSession()
    f.build({A: (0, 1)})
    f.answered(7)
    f.build({A: (0, 1)})
    assert not f.answered(7, SESSION_NOT_FOUND)   # the leader restarted: nothing was read
    assert f.build({A: (0, 1)})[:2] == (NO_SESSION, 0)
    f.answered(8)
    f.build({A: (1, 1)})
    f.reset()                                     # the request failed or was cancelled
    sid, epoch, named, _ = f.build({A: (1, 1)})
    assert (sid, epoch, named) == (NO_SESSION, 0, [A])


def test_follower_of_a_leader_without_sessions_keeps_fetching_in_full():
    f = FollowerSession()
    f.build({A: (0, 1), B: (0, 1)})
    assert f.answered(None)                       # no session_id in the answer
    sid, epoch, named, forgotten = f.build({A: (0, 1), B: (0, 1)})
    assert (sid, epoch, sorted(named)) == (NO_SESSION, 0, [A, B])
