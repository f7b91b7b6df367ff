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


class _SilentTransport:
    """A leader that never answers: the fetchers only hold state in this test."""

    supports_fetch_sessions = True

    async def fetch(self, *a, **kw):
        await asyncio.Event().wait()

    async def epoch_end_offsets(self, *a, **kw):
        await asyncio.Event().wait()


def _three_broker_image(leaders: dict, epochs: dict, extra_broker_url: str | None = None):
    from metadata_quorum.image import MetadataImage
    from metadata_quorum.records import PartitionRecord, RegisterBrokerRecord, TopicRecord
    img = MetadataImage("c")
    for b in (1, 2, 3):
        url = extra_broker_url if (b == 3 and extra_broker_url) else f"http://b{b}"
        img.replay(RegisterBrokerRecord(b, f"i{b}", -1, url, None, False))
    img.replay(TopicRecord("t", "tid"))
    for p, leader in leaders.items():
        img.replay(PartitionRecord("t", "tid", p, (1, 2, 3), (1, 2, 3), leader, epochs[p], epochs[p]))
    return img


def _fetcher_view(fm) -> dict:
    return {k: (leader_id, s.leader_epoch) for leader_id, f in fm.fetchers.items()
            for k, s in f.state.partitions.items()}


async def test_sync_looks_only_at_role_changes_and_matches_a_full_sync():
    import random
    from partitions.replication.replica_fetcher import ReplicaFetcherManager
    from partitions.replication.replica_manager import ReplicaManager
    from tests.unit.replication.fake_log import MemoryLogManager
    rng = random.Random(25)
    n = 40
    rm = ReplicaManager(1, MemoryLogManager())
    fm = ReplicaFetcherManager(rm, _SilentTransport(), 1)
    full_walks = []
    real = rm.followed_partitions
    rm.followed_partitions = lambda: full_walks.append(1) or real()
    leaders = {p: rng.choice((1, 2, 3)) for p in range(n)}
    epochs = {p: 0 for p in range(n)}
    try:
        img = _three_broker_image(leaders, epochs)
        await rm.apply_metadata(img)
        fm.sync(img)
        assert len(full_walks) == 1                         # the first sync walks everything
        for _ in range(30):                                 # leaders move: partial syncs only
            for p in rng.sample(range(n), 3):
                leaders[p] = rng.choice((1, 2, 3))
                epochs[p] += 1
            img = _three_broker_image(leaders, epochs)
            await rm.apply_metadata(img)
            fm.sync(img)
            expected = {("t", p): (leaders[p], epochs[p]) for p in range(n) if leaders[p] != 1}
            assert _fetcher_view(fm) == expected
            assert set(fm.fetchers) == {leaders[p] for p in range(n) if leaders[p] != 1}
        assert len(full_walks) == 1
        img = _three_broker_image(leaders, epochs, extra_broker_url="http://b3-moved")
        await rm.apply_metadata(img)
        fm.sync(img)                                        # an address changed: a full sync
        assert len(full_walks) == 2
        if 3 in fm.fetchers:
            assert fm.fetchers[3].state.leader_url == "http://b3-moved"
    finally:
        await fm.close()


async def test_full_walk_of_the_followed_partitions_yields_between_chunks(monkeypatch):
    from partitions.replication.replica_fetcher import ReplicaFetcherManager
    from partitions.replication.replica_manager import ReplicaManager
    from tests.unit.replication.fake_log import MemoryLogManager
    from tests.unit.replication.loop_turns import LoopTurns
    monkeypatch.setattr(replica_fetcher, "FETCHER_CHUNK_PARTITIONS", 4)
    n = 20
    rm = ReplicaManager(1, MemoryLogManager())
    fm = ReplicaFetcherManager(rm, _SilentTransport(), 1)
    img = _three_broker_image({p: 2 for p in range(n)}, {p: 0 for p in range(n)})
    await rm.apply_metadata(img)
    fm.sync(img)
    f = fm.fetchers[2]
    f.task.cancel()                    # drive the walk by hand
    for p in range(n):
        f.state.truncated("t", p, 0)
    try:
        async with LoopTurns() as turns:
            before = turns.count
            assert await f._update_wanted(0, None, set()) is None     # no session yet: a full walk
            during = turns.count - before
    finally:
        await fm.close()
    assert sorted(f.wanted) == [("t", p) for p in range(n)]
    assert during >= n // 4 - 1


async def test_new_partitions_join_the_session_without_cancelling_its_poll(pair):  # noqa: F811
    rms, fetchers, transport, apply = pair
    fetchers[2].fetch_wait_max_ms = 300
    await apply(image(leader=1, epoch=1, partitions=4))
    for p in range(4):
        await rms[1].append("t", p, batch(b"x"), acks=1)
    await caught_up(rms, range(4))
    session = fetchers[2].fetchers[1].session
    assert session.full_fetches == 1
    await apply(image(leader=1, epoch=1, partitions=6))     # a topic grows: partitions 4 and 5 added
    await rms[1].append("t", 5, batch(b"y"), acks=1)
    await caught_up(rms, range(6))
    assert session.full_fetches == 1 and transport.session_errors == []   # no cancel, no full fetch


async def test_a_new_leader_epoch_does_not_cancel_the_parked_session_poll(pair):  # noqa: F811
    """A partition coming back at a new leader epoch (or leaving the fetcher) used to cancel
    the request in flight, and a cancelled session request costs a full fetch of every
    partition on both sides: at 100,000 partitions ISR and leader changes did that again and
    again. Now the change joins the next request (named again with its new epoch, or
    forgotten). The follower learns the new epoch while its poll is parked at the leader."""
    rms, fetchers, transport, apply = pair
    fetchers[2].fetch_wait_max_ms = 300
    await apply(image(leader=1, epoch=1, partitions=6))
    for p in range(6):
        await rms[1].append("t", p, batch(b"x"), acks=1)
    await caught_up(rms, range(6))
    session = fetchers[2].fetchers[1].session
    assert session.full_fetches == 1
    await asyncio.sleep(0.1)                                # the follower's poll is parked
    newer = image(leader=1, epoch=2, partitions=6)
    await rms[2].apply_metadata(newer)                      # the follower learns it first
    fetchers[2].sync(newer)
    await asyncio.sleep(0.1)
    await rms[1].apply_metadata(newer)
    fetchers[1].sync(newer)
    for p in range(6):
        await rms[1].append("t", p, batch(b"z"), acks=1)
    await caught_up(rms, range(6))
    assert session is fetchers[2].fetchers[1].session
    assert session.full_fetches == 1 and transport.session_errors == []   # no cancel, no full fetch


class _RefusingTransport:
    """A leader whose process is gone: every connection is refused."""

    supports_fetch_sessions = True

    def __init__(self) -> None:
        self.fetches: list = []   # partitions named by each request (0: empty, a probe or a keep-alive)
        self.accepting = False    # the leader is back: requests are answered (with nothing)

    async def fetch(self, url, replica_id, broker_epoch, partitions, **kw):
        self.fetches.append(len(partitions))
        if self.accepting:
            await asyncio.sleep(0.01)
            return []
        from partitions.errors import ErrorCode, KraftlogError
        raise KraftlogError(ErrorCode.BROKER_NOT_AVAILABLE, f"{url} refused the connection", refused=True)

    async def epoch_end_offsets(self, *a, **kw):
        await asyncio.Event().wait()


async def test_an_unreachable_leader_is_backed_off_as_a_whole_with_a_growing_back_off():
    """Issue 25: after a kill -9 at 100,000 partitions a survivor's fetcher for the dead
    leader backed off each of its 33,000 partitions, walked them again and sent a full
    request for all of them every 200 ms (a quarter of its loop while it applied the
    fencing). Now the fetcher waits as a whole, no partition is touched, and the back-off
    doubles up to REPLICA_FETCH_UNREACHABLE_BACKOFF_MAX_MS."""
    from partitions.replication.replica_fetcher import (REPLICA_FETCH_UNREACHABLE_BACKOFF_MAX_MS,
                                                        ReplicaFetcherManager)
    from partitions.replication.replica_manager import ReplicaManager
    from tests.unit.replication.fake_log import MemoryLogManager
    n = 300
    rm = ReplicaManager(1, MemoryLogManager())
    transport = _RefusingTransport()
    fm = ReplicaFetcherManager(rm, transport, 1, backoff_ms=100)
    try:
        img = _three_broker_image({p: 2 for p in range(n)}, {p: 0 for p in range(n)})
        await rm.apply_metadata(img)
        fm.sync(img)
        f = fm.fetchers[2]
        back_offs = []
        real = f.state.back_off
        f.state.back_off = lambda *a: back_offs.append(a) or real(*a)
        await asyncio.sleep(2.0)
        assert back_offs == [] and not f.state.backed_off      # no partition walk per failure
        attempts = len([k for k in transport.fetches if k == n]) + f.probes_sent
        # 100, 200, 400, 800, 1000 ms between attempts: 5-6 in 2 s (20 with a fixed 100 ms)
        assert 3 <= attempts <= 7, transport.fetches
        assert f.state.unreachable_backoff_ms == REPLICA_FETCH_UNREACHABLE_BACKOFF_MAX_MS
        # the first attempt names every partition; after its refusal only empty probes go
        # until the leader answers (no walk and no encoding of them all per attempt)
        assert [k for k in transport.fetches if k] == [n], transport.fetches
        assert f.probes_sent >= 2 and f.refused
        transport.accepting = True                              # a process listens again
        await asyncio.sleep(1.5)
        assert not f.refused and transport.fetches.count(n) >= 2, transport.fetches
    finally:
        await fm.close()
