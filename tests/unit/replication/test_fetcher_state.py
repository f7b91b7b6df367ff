"""Pure fetcher decisions: per-leader partition phases and the KIP-279 truncation loop."""
from hypothesis import given, settings, strategies as st

from partitions.log.leader_epoch_cache import LeaderEpochCache
from partitions.replication.fetcher_state import FETCHING, TRUNCATING, LeaderFetchState, truncation_step


def test_new_partition_or_new_epoch_starts_truncating():
    s = LeaderFetchState(2, "http://b2")
    assert s.set_partition("t", 0, 5) is True
    assert s.partitions[("t", 0)].phase == TRUNCATING
    s.truncated("t", 0, 5)
    assert s.partitions[("t", 0)].phase == FETCHING
    assert s.set_partition("t", 0, 5) is False          # same epoch: keeps fetching
    assert s.partitions[("t", 0)].phase == FETCHING
    assert s.set_partition("t", 0, 6) is True           # new leader epoch: find the divergence again
    assert s.partitions[("t", 0)].phase == TRUNCATING


def test_stale_answers_do_not_change_a_newer_epoch():
    s = LeaderFetchState(2, "http://b2")
    s.set_partition("t", 0, 6)
    s.truncated("t", 0, 5)          # answer to a request made under epoch 5
    assert s.partitions[("t", 0)].phase == TRUNCATING
    s.truncated("t", 0, 6)
    s.must_truncate("t", 0, 5)
    assert s.partitions[("t", 0)].phase == FETCHING
    s.must_truncate("t", 0, 6)
    assert s.partitions[("t", 0)].phase == TRUNCATING


def test_back_off_delays_one_partition_only():
    s = LeaderFetchState(2, "http://b2")
    for p in (0, 1):
        s.set_partition("t", p, 1)
        s.truncated("t", p, 1)
    s.back_off("t", 0, now_ms=1000, backoff_ms=200)
    assert [x.partition for x in s.ready(FETCHING, 1100)] == [1]
    assert s.next_retry_ms() == 1200
    assert sorted(x.partition for x in s.ready(FETCHING, 1200)) == [0, 1]
    s.remove("t", 0)
    assert list(s.partitions) == [("t", 1)]


# ---- truncation: a model of logs as the epoch of each offset ------------------------------

def cache_of(epochs: list[int]) -> LeaderEpochCache:
    entries = []
    for off, e in enumerate(epochs):
        if not entries or entries[-1][0] != e:
            entries.append((e, off))
    return LeaderEpochCache(None, entries)


def end_for(epochs: list[int]):
    c = cache_of(epochs)
    return lambda epoch: c.end_offset_for_epoch(epoch, len(epochs))


def resolve(follower: list[int], leader: list[int]) -> list[int]:
    """The fetcher's loop: ask, truncate, until done; returns the truncated follower log."""
    f = list(follower)
    for _ in range(50):
        if not f:
            return f
        latest = f[-1]
        le, lend = end_for(leader)(latest)
        offset, done = truncation_step(len(f), end_for(f), le, lend)
        del f[offset:]
        if done:
            return f
    raise AssertionError("truncation loop did not converge")


def test_same_epoch_truncates_to_the_shorter_end():
    # follower wrote 3 more records in epoch 2 than the leader has of epoch 2, leader moved to 3
    assert resolve([1, 1, 2, 2, 2, 2, 2], [1, 1, 2, 2, 3, 3]) == [1, 1, 2, 2]


def test_follower_epoch_unknown_to_leader_is_cut_back_then_resolved():
    # follower led epoch 2 alone (never replicated); the leader went from 1 straight to 3
    assert resolve([1, 1, 1, 2, 2], [1, 1, 3, 3, 3]) == [1, 1]


def test_follower_ahead_in_the_leaders_epoch_keeps_only_what_the_leader_has():
    assert resolve([1, 1, 1], [1]) == [1]
    assert resolve([1], [1, 1, 1]) == [1]      # behind: nothing to truncate


def test_leader_without_common_epoch_means_start_over():
    assert resolve([5, 5], []) == []
    assert truncation_step(2, end_for([5, 5]), -1, -1) == (0, True)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(1, 4), st.sets(st.integers(0, 2))), min_size=1,
                max_size=12))
def test_any_leader_history_truncates_exactly_to_the_common_prefix(steps):
    """Replicas take turns leading (each epoch has one leader; followers that sync copy the
    leader after resolving). Resolving never keeps a divergent record and never drops a
    shared one: the result is exactly the longest common prefix."""
    logs = {r: [] for r in range(3)}
    epoch = 0
    for leader, appends, syncing in steps:
        epoch += 1
        # the new leader does not sync first: its log may lack records others have (their
        # uncommitted tails), which is what resolving must throw away
        logs[leader].extend([epoch] * appends)
        for f in syncing - {leader}:
            kept = resolve(logs[f], logs[leader])
            common = 0
            while (common < min(len(logs[f]), len(logs[leader]))
                   and logs[f][common] == logs[leader][common]):
                common += 1
            assert kept == logs[leader][:len(kept)], "kept a record the leader does not have"
            assert len(kept) == common, "dropped a record shared with the leader"
            logs[f] = list(logs[leader])
