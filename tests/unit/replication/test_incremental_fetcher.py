"""The follower side of replica fetching without a walk per poll (issue 25): the pure
state's changed keys and indexes, the session's request built from them, and a fetcher
that looks only at partitions that changed."""
import asyncio

from partitions.replication import replica_fetcher
from partitions.replication.fetch_session import FollowerSession
from partitions.replication.fetcher_state import FETCHING, TRUNCATING, LeaderFetchState
from partitions.replication.replica_manager import ACKS_ALL
from tests.unit.replication.test_replica_fetch_session import PARTITIONS, caught_up, pair  # noqa: F401
from tests.unit.replication.test_replica_fetcher import batch, image


def test_every_change_of_a_partition_is_reported_once():
    st = LeaderFetchState(1, "http://b1")
    st.set_partition("t", 0, 3)
    st.set_partition("t", 1, 3)
    assert st.take_changed(0) == {("t", 0), ("t", 1)}
    assert st.take_changed(0) == set()                        # reported once
    st.set_partition("t", 0, 3)                               # same epoch: no change
    st.truncated("t", 0, 3)
    st.log_changed("t", 1)
    st.log_changed("u", 9)                                    # not followed: ignored
    assert st.take_changed(0) == {("t", 0), ("t", 1)}
    st.must_truncate("t", 0, 3)
    st.remove("t", 1)
    assert st.take_changed(0) == {("t", 0), ("t", 1)}
    assert ("t", 1) not in st.partitions


def test_truncating_index_follows_the_phase():
    st = LeaderFetchState(1, "http://b1")
    for p in range(4):
        st.set_partition("t", p, 0)
    st.truncated("t", 1, 0)
    st.truncated("t", 2, 0)
    st.must_truncate("t", 2, 0)
    assert st.truncating == {("t", 0), ("t", 2), ("t", 3)}
    assert {(s.topic, s.partition) for s in st.ready(TRUNCATING, 0)} == st.truncating
    assert [(s.topic, s.partition) for s in st.ready(FETCHING, 0)] == [("t", 1)]
    st.remove("t", 0)
    st.set_partition("t", 1, 5)                               # new epoch: truncating again
    assert st.truncating == {("t", 1), ("t", 2), ("t", 3)}


def test_expired_back_off_is_reported_as_a_change_and_cleared():
    st = LeaderFetchState(1, "http://b1")
    st.set_partition("t", 0, 0)
    st.set_partition("t", 1, 0)
    st.truncated("t", 0, 0)
    st.truncated("t", 1, 0)
    st.take_changed(0)
    st.back_off("t", 0, 1000, 200)
    st.back_off("t", 1, 1000, 500)
    assert st.next_retry_ms() == 1200
    assert st.take_changed(1000) == {("t", 0), ("t", 1)}     # the back-off itself
    assert st.ready(FETCHING, 1100) == []
    assert st.take_changed(1100) == set()
    assert st.take_changed(1250) == {("t", 0)}               # its retry time came
    assert st.partitions[("t", 0)].retry_at_ms == 0
    assert st.next_retry_ms() == 1500
    assert st.take_changed(1600) == {("t", 1)}
    assert st.next_retry_ms() is None


def test_session_request_from_candidates_equals_the_full_comparison():
    a, b = FollowerSession(), FollowerSession()
    wanted = {("t", p): (10, 1) for p in range(50)}
    for s in (a, b):
        s.build(wanted)
        s.answered(7)
    wanted2 = dict(wanted)
    wanted2[("t", 3)] = (11, 1)                                # appended
    wanted2[("t", 4)] = (10, 2)                                # new epoch
    del wanted2[("t", 5)]                                      # backing off: forgotten
    wanted2[("u", 0)] = (0, 0)                                 # new
    full = a.build(wanted2)
    inc = b.build(wanted2, candidates={("t", 3), ("t", 4), ("t", 5), ("u", 0), ("t", 6)})
    assert sorted(full[2]) == sorted(inc[2]) == [("t", 3), ("t", 4), ("u", 0)]
    assert full[3] == inc[3] == [("t", 5)]
    assert full[:2] == inc[:2]


async def test_fetcher_looks_only_at_partitions_that_changed(pair, monkeypatch):  # noqa: F811
    monkeypatch.setattr(replica_fetcher, "FOLLOWER_RESYNC_MS", 10 ** 9)   # no safety-net walk in this test
    rms, fetchers, transport, apply = pair
    await apply(image(leader=1, epoch=1, partitions=PARTITIONS))
    for p in range(PARTITIONS):
        await rms[1].append("t", p, batch(b"x"), acks=1)
    await caught_up(rms)
    looked = []
    real = rms[2].follower_partition

    def counting(topic, partition, leader_epoch):
        looked.append((topic, partition))
        return real(topic, partition, leader_epoch)
    rms[2].follower_partition = counting
    n, na = len(transport.fetches), len(transport.answers)   # a poll may be in flight: answers lag
    for p in (7, 9, 7):
        await asyncio.wait_for(rms[1].append("t", p, batch(b"y"), acks=ACKS_ALL, timeout_ms=3000), 4)
    polls = len(transport.fetches) - n
    assert polls >= 3
    # every answered partition is read once to apply it; beyond that, each poll looks only at
    # the partition whose fetch offset moved (a walk would look at all 12 per poll)
    answered = sum(len(a) for a in transport.answers[na:])
    assert len(looked) - answered <= 2 * polls < PARTITIONS * polls, (len(looked), answered, polls)
    await caught_up(rms)
    assert rms[2].logs[("t", 7)].log_end_offset == 3
