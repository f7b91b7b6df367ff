"""A follower truncating thousands of partitions after a leader change lets the event loop
serve between small chunks of truncations (issue 25: each cuts a segment file and rewrites
the leader-epoch checkpoint; one pass over 10,000 partitions stalled brokers for seconds)."""
from collections import Counter

from partitions.replication import replica_fetcher
from partitions.replication.replica_manager import ACKS_ALL, ACKS_LEADER
from tests.unit.replication.loop_turns import LoopTurns
from tests.unit.replication.test_replica_fetcher import batch, image, pair, wait_for  # noqa: F401


async def test_divergent_tails_are_truncated_in_chunks_between_loop_turns(pair, monkeypatch):  # noqa: F811
    monkeypatch.setattr(replica_fetcher, "FETCHER_CHUNK_TRUNCATIONS", 2)
    rms, fetchers, transport, apply = pair
    n = 12
    await apply(image(leader=1, epoch=1, partitions=n))
    for p in range(n):
        await rms[1].append("t", p, batch(b"committed"), acks=ACKS_ALL, timeout_ms=5000)
    await fetchers[2].close()                                  # broker 2 stops fetching
    for p in range(n):
        await rms[1].append("t", p, batch(b"lost"), acks=ACKS_LEADER)
    turns = LoopTurns()
    at_tick = Counter()
    real = rms[1].follower_truncate

    def truncate(topic, partition, leader_epoch, offset):
        at_tick[turns.count] += 1
        return real(topic, partition, leader_epoch, offset)
    rms[1].follower_truncate = truncate
    async with turns:
        fetchers[2].closed = False
        await apply(image(leader=2, epoch=2, partitions=n))    # broker 1 must drop its unreplicated tails
        await wait_for(lambda: all(rms[1].logs[("t", p)].log_end_offset == 1 for p in range(n)), timeout=20)
    assert sum(at_tick.values()) == n
    assert max(at_tick.values()) <= 2, at_tick                  # never more than a chunk per loop turn
