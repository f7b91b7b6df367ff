"""The reassignment replication throttle: token buckets, which replicas it applies to, and
the leader's replica fetch honouring it (real logs, no sockets, a manual clock)."""
from metadata_quorum.image import MetadataImage
from metadata_quorum.records import ConfigRecord, PartitionRecord, RegisterBrokerRecord, TopicRecord
from partitions.clock import ManualClock
from partitions.log import record_batch as rb
from partitions.log.config import LogConfig
from partitions.replication.replica_manager import ACKS_LEADER, ReplicaManager
from partitions.replication.replica_state import ReplicaFetchRequest
from partitions.replication.replication_throttle import ReplicationThrottle, TokenBucket
from test_replica_fetcher import DiskLogManager as _DiskLogManager


class DiskLogManager(_DiskLogManager):
    """Real logs in a directory (topic configs are not what these tests are about)."""

    def update_config(self, topic, config):
        pass

RATE = 10_000


def moving_image(rate=RATE, isr=(1, 2)):
    """Partition t-0 moving from [1, 2] to [1, 3] (3 adding); t-1 not moving, replicas [1, 3]."""
    img = MetadataImage("c")
    for b in (1, 2, 3):
        img.replay(RegisterBrokerRecord(b, f"i{b}", -1, f"http://b{b}", None, False))
    img.replay(TopicRecord("t", "tid"))
    img.replay(PartitionRecord("t", "tid", 0, (1, 3, 2), tuple(isr), 1, 1, 1, adding_replicas=(3,),
                               removing_replicas=(2,)))
    img.replay(PartitionRecord("t", "tid", 1, (1, 3), (1, 3), 1, 1, 1))
    if rate is not None:
        for k in ("leader.replication.throttled.rate", "follower.replication.throttled.rate"):
            img.replay(ConfigRecord("broker", "", k, str(rate)))
    return img


def test_token_bucket_refills_at_the_rate_caps_the_burst_and_pays_back_overdraws():
    b = TokenBucket(burst_s=0.5)
    b.set_rate(1000, 0)
    assert b.available(0) == 0
    assert b.available(200) == 200
    assert b.available(10_000) == 500            # at most burst_s worth saved up
    b.consume(1500, 10_000)                      # one big batch overdraws
    assert b.available(10_000) == 0 and b.wait_ms(10_000) == 1001
    assert b.available(11_002) >= 1


def test_only_adding_replicas_outside_the_isr_are_throttled_and_only_while_configured():
    t = ReplicationThrottle(broker_id=3)
    t.update(moving_image(), 0)
    assert t.leader_limit("t", 0, 3, 0) == 0               # the copy of the new replica 3
    assert t.leader_limit("t", 0, 2, 0) is None            # an in-sync follower: never throttled
    assert t.leader_limit("t", 1, 3, 0) is None            # a partition that does not move
    assert t.follower_throttled("t", 0) and not t.follower_throttled("t", 1)
    t.update(moving_image(isr=(1, 2, 3)), 0)               # 3 joined the ISR
    assert t.leader_limit("t", 0, 3, 0) is None and not t.follower_throttled("t", 0)
    t.update(moving_image(rate=None), 0)                   # the moves ended: the config is gone
    assert t.leader_limit("t", 0, 3, 0) is None and not t.follower_throttled("t", 0)


async def test_leader_sends_a_throttled_replica_no_more_than_the_rate(tmp_path):
    clock = ManualClock()
    rm = ReplicaManager(1, DiskLogManager(tmp_path), request_timeout_ms=2000, clock=clock,
                        default_log_config_factory=lambda c: LogConfig())
    img = moving_image()
    await rm.apply_metadata(img)
    value = b"x" * 1000
    for _ in range(100):                                    # 100 batches of ~1 KB on each partition
        for p in (0, 1):
            await rm.append("t", p, rb.build_batch([rb.Record(None, value)]), acks=ACKS_LEADER)
    end = rm.logs[("t", 0)].log_end_offset

    async def fetch(replica, partition, offset):
        [res] = await rm.replica_fetch(replica, [ReplicaFetchRequest("t", partition, offset, 1, 0)],
                                       max_bytes=1 << 20, partition_max_bytes=1 << 20)
        return res

    # not throttled: the in-sync follower of the moving partition, and the partition that does not move
    assert (await fetch(2, 0, 0)).next_offset == end
    assert (await fetch(3, 1, 0)).next_offset == end
    # the adding replica: nothing until the bucket fills, then about RATE bytes per second
    offset, copied = 0, 0
    assert (await fetch(3, 0, 0)).records == b""
    for _ in range(20):                                     # 2 s in steps of 100 ms
        clock.advance(100)
        res = await fetch(3, 0, offset)
        copied += len(res.records)
        offset = res.next_offset
    assert 0.75 * 2 * RATE <= copied <= 1.25 * 2 * RATE, copied
    for lg in rm.log_manager.logs.values():
        lg.close()


async def test_the_copying_follower_leaves_throttled_partitions_out_while_its_bucket_is_empty(tmp_path):
    from partitions.replication.replica_fetcher import ReplicaFetcherManager
    from test_replica_fetcher import DirectTransport, wait_for

    clock = ManualClock()
    (tmp_path / "1").mkdir()
    (tmp_path / "3").mkdir()
    rms = {b: ReplicaManager(b, DiskLogManager(tmp_path / str(b)), request_timeout_ms=2000, clock=clock,
                             default_log_config_factory=lambda c: LogConfig()) for b in (1, 3)}
    img = moving_image(rate=None)
    img.replay(ConfigRecord("broker", "", "follower.replication.throttled.rate", str(RATE)))  # follower side only
    transport = DirectTransport({"http://b1": rms[1]})
    fetcher = ReplicaFetcherManager(rms[3], transport, 3, fetch_wait_max_ms=20, backoff_ms=10, clock=clock,
                                   partition_max_bytes=2000)   # ~2 batches per answer: the bucket, not one answer, bounds the copy
    try:
        for rm in rms.values():
            await rm.apply_metadata(img)
        for _ in range(20):
            for p in (0, 1):
                await rms[1].append("t", p, rb.build_batch([rb.Record(None, b"x" * 1000)]), acks=ACKS_LEADER)
        end = rms[1].logs[("t", 0)].log_end_offset
        fetcher.sync(img)
        # the partition that does not move is copied; the move's copy waits for tokens
        await wait_for(lambda: rms[3].logs[("t", 1)].log_end_offset == end)
        assert rms[3].logs[("t", 0)].log_end_offset == 0
        assert all(("t", 0) not in f for f in transport.fetches)
        clock.advance(1000)                      # RATE / 2 bytes (the burst) become available
        await wait_for(lambda: rms[3].logs[("t", 0)].log_end_offset > 0)
        await wait_for(lambda: rms[3].throttle.follower.available(clock.monotonic_ms()) == 0)
        copied = rms[3].logs[("t", 0)].log_end_offset
        assert copied <= 8, f"the follower copied {copied} batches of 1 KB on a burst of {RATE // 2} bytes"
        rounds = 1
        while rms[3].logs[("t", 0)].log_end_offset < end:   # each second of the clock buys the next bytes
            clock.advance(1000)
            rounds += 1
            await wait_for(lambda: rms[3].logs[("t", 0)].log_end_offset == end
                           or rms[3].throttle.follower.available(clock.monotonic_ms()) == 0)
            assert rounds < 40
        assert rounds >= 20_000 // (RATE // 2), rounds     # 20 KB at a burst of RATE / 2 per round
    finally:
        await fetcher.close()
        for rm in rms.values():
            for lg in rm.log_manager.logs.values():
                lg.close()
