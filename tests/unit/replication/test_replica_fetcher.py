"""ReplicaFetcherManager between two ReplicaManagers in one process (real logs, no sockets):
one batched request per leader, exact copies, HW propagation, acks=all completed by the
follower's fetch, truncation on a new epoch, stale epochs fenced, ISR decisions."""
import asyncio

import pytest

from partitions.errors import ErrorCode, KraftlogError
from metadata_quorum.image import MetadataImage
from metadata_quorum.records import FenceBrokerRecord, PartitionRecord, RegisterBrokerRecord, TopicRecord
from partitions.log import record_batch as rb
from partitions.log.config import LogConfig
from partitions.log.log import Log
from partitions.replication.replica_fetcher import ReplicaFetcherManager
from partitions.replication.replica_manager import ACKS_ALL, ACKS_LEADER, ReplicaManager
from partitions.replication.replica_state import ReplicaFetchRequest
from http_api.broker.replica_client import PartitionData


class DiskLogManager:
    def __init__(self, root) -> None:
        self.root = root
        self.logs = {}

    def get_or_create(self, topic, p, config):
        key = (topic, p)
        if key not in self.logs:
            self.logs[key] = Log.open(self.root / f"{topic}-{p}", config or LogConfig())
        return self.logs[key]

    def partitions(self):
        return sorted(self.logs)

    def delete_log(self, topic, p):
        lg = self.logs.pop((topic, p), None)
        if lg is not None:
            lg.delete()

    def update_config(self, topic, config):
        for (t, _), lg in self.logs.items():
            if t == topic and config is not None:
                lg.update_config(config)


class DirectTransport:
    """The follower's transport calling the leader's ReplicaManager directly."""

    def __init__(self, leaders: dict) -> None:
        self.leaders = leaders   # url -> ReplicaManager
        self.fetches: list[list[tuple[str, int]]] = []

    async def fetch(self, url, replica_id, broker_epoch, partitions, *, max_bytes, partition_max_bytes, max_wait_ms):
        self.fetches.append([(p["topic"], p["partition"]) for p in partitions])
        rm = self.leaders[url]
        reqs = [ReplicaFetchRequest(p["topic"], p["partition"], p["offset"], p["leader_epoch"], p["high_watermark"])
                for p in partitions]
        res = await rm.replica_fetch(replica_id, reqs, max_bytes=max_bytes, partition_max_bytes=partition_max_bytes,
                                     max_wait_ms=max_wait_ms)
        out = []
        for (t, p, *_), r in zip(reqs, res):
            if isinstance(r, KraftlogError):
                out.append(PartitionData(t, p, error=r))
            else:
                out.append(PartitionData(t, p, r.records, r.high_watermark, r.log_start_offset, r.log_end_offset))
        return out

    async def epoch_end_offsets(self, url, replica_id, partitions):
        rm = self.leaders[url]
        out = []
        for p in partitions:
            try:
                e, end = rm.epoch_end_offset(p["topic"], p["partition"], p["epoch"], p["leader_epoch"])
                out.append((p["topic"], p["partition"], e, end, None))
            except KraftlogError as err:
                out.append((p["topic"], p["partition"], -1, -1, err))
        return out


def image(leader: int, epoch: int, partitions=2, isr=(1, 2)):
    img = MetadataImage("c")
    img.replay(RegisterBrokerRecord(1, "i1", -1, "http://b1", None, False))
    img.replay(RegisterBrokerRecord(2, "i2", -1, "http://b2", None, False))
    img.replay(TopicRecord("t", "tid"))
    for p in range(partitions):
        img.replay(PartitionRecord("t", "tid", p, (1, 2), tuple(isr), leader, epoch, epoch))
    return img


def batch(*values):
    return rb.build_batch([rb.Record(None, v) for v in values])


async def wait_for(pred, timeout=3.0):
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not pred():
        assert loop.time() < end, "condition not reached"
        await asyncio.sleep(0.005)


@pytest.fixture
async def pair(tmp_path):
    (tmp_path / "1").mkdir()
    (tmp_path / "2").mkdir()
    rms = {b: ReplicaManager(b, DiskLogManager(tmp_path / str(b)), request_timeout_ms=2000,
                             default_log_config_factory=lambda c: LogConfig()) for b in (1, 2)}
    transport = DirectTransport({"http://b1": rms[1], "http://b2": rms[2]})
    fetchers = {b: ReplicaFetcherManager(rms[b], transport, b, fetch_wait_max_ms=100, backoff_ms=10) for b in (1, 2)}

    async def apply(img):
        for b in (1, 2):
            await rms[b].apply_metadata(img)
            fetchers[b].sync(img)
    yield rms, fetchers, transport, apply
    for f in fetchers.values():
        await f.close()
    for rm in rms.values():
        for lg in rm.log_manager.logs.values():
            lg.close()


async def test_one_request_per_leader_copies_exactly_and_propagates_hw(pair):
    rms, fetchers, transport, apply = pair
    await apply(image(leader=1, epoch=1))
    t0 = asyncio.create_task(rms[1].append("t", 0, batch(b"a", b"b"), acks=ACKS_ALL, timeout_ms=2000))
    t1 = asyncio.create_task(rms[1].append("t", 1, batch(b"c"), acks=ACKS_ALL, timeout_ms=2000))
    await asyncio.wait_for(asyncio.gather(t0, t1), 2)   # completed by the follower's fetches
    # batched per leader (the empty ones are broker 1's keep-alives to broker 2, which it follows nothing from)
    assert all(sorted(f) == [("t", 0), ("t", 1)] for f in transport.fetches if f)
    for p in (0, 1):
        leader_log, follower_log = rms[1].logs[("t", p)], rms[2].logs[("t", p)]
        await wait_for(lambda: rms[2].partitions[("t", p)].high_watermark == leader_log.log_end_offset)
        assert follower_log.read(0, 1 << 20).records == leader_log.read(0, 1 << 20).records
        assert follower_log.high_watermark == leader_log.high_watermark


async def test_acks_all_waits_while_the_follower_is_not_fetching(pair):
    rms, fetchers, transport, apply = pair
    await apply(image(leader=1, epoch=1))
    await fetchers[2].close()
    with pytest.raises(KraftlogError) as e:
        await rms[1].append("t", 0, batch(b"x"), acks=ACKS_ALL, timeout_ms=100)
    assert e.value.code is ErrorCode.REQUEST_TIMED_OUT
    # the leader proposes dropping the silent follower once the lag time passed
    changes = rms[1].isr_changes(replica_lag_time_max_ms=0)
    assert sorted((p.partition, isr) for p, isr in changes) == [(0, [1]), (1, [1])]


async def test_topic_lag_config_overrides_the_broker_default(pair):
    rms, fetchers, transport, apply = pair
    img = image(leader=1, epoch=1)
    img.topics["t"].configs["replica.lag.time.max.ms"] = "3600000"
    await apply(img)
    await fetchers[2].close()
    assert rms[1].isr_changes(replica_lag_time_max_ms=0) == []


async def test_new_leader_epoch_truncates_the_divergent_tail(pair):
    rms, fetchers, transport, apply = pair
    await apply(image(leader=1, epoch=1, partitions=1))
    await rms[1].append("t", 0, batch(b"committed"), acks=ACKS_ALL, timeout_ms=2000)
    await fetchers[2].close()                         # broker 2 stops fetching
    await rms[1].append("t", 0, batch(b"lost", b"lost"), acks=ACKS_LEADER)
    fetchers[2].closed = False
    await apply(image(leader=2, epoch=2, partitions=1))  # broker 2 leads epoch 2 (unclean for "lost")
    await rms[2].append("t", 0, batch(b"new"), acks=ACKS_LEADER)
    await wait_for(lambda: rms[1].logs[("t", 0)].log_end_offset == 2
                   and rms[1].logs[("t", 0)].latest_epoch == 2)
    assert rms[1].logs[("t", 0)].read(0, 1 << 20).records == rms[2].logs[("t", 0)].read(0, 1 << 20).records
    values = [r.value for r in rb.decode_batches(rms[1].logs[("t", 0)].read(0, 1 << 20).records)]
    assert values == [b"committed", b"new"]


async def test_internal_routes_fence_stale_epochs_and_non_replicas(pair):
    rms, fetchers, transport, apply = pair
    await apply(image(leader=1, epoch=3, partitions=1))
    res = await rms[1].replica_fetch(2, [("t", 0, 0, 2, -1)], max_bytes=1000, partition_max_bytes=1000)
    assert res[0].code is ErrorCode.FENCED_LEADER_EPOCH
    res = await rms[1].replica_fetch(2, [("t", 0, 0, 4, -1)], max_bytes=1000, partition_max_bytes=1000)
    assert res[0].code is ErrorCode.UNKNOWN_LEADER_EPOCH
    res = await rms[1].replica_fetch(7, [("t", 0, 0, 3, -1)], max_bytes=1000, partition_max_bytes=1000)
    assert res[0].code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    with pytest.raises(KraftlogError) as e:
        rms[1].epoch_end_offset("t", 0, 3, leader_epoch=2)
    assert e.value.code is ErrorCode.FENCED_LEADER_EPOCH


async def test_follower_fsyncs_before_acknowledging_on_a_flush_messages_topic(pair):
    rms, fetchers, transport, apply = pair
    for rm in rms.values():
        rm._config_factory = lambda c: LogConfig(flush_messages=1)
    await apply(image(leader=1, epoch=1, partitions=1))
    await rms[1].append("t", 0, batch(b"a", b"b"), acks=ACKS_ALL, timeout_ms=2000)
    # the follower's next fetch acknowledged the records, after its fsync
    assert rms[2].logs[("t", 0)].recovery_point == 2
    assert rms[2].logs[("t", 0)].log_end_offset == 2


async def test_a_broker_that_follows_nothing_from_a_live_peer_keeps_its_silence_clock_fresh(pair):
    """Keep-alives (REPLICA_KEEPALIVE_INTERVAL_MS): broker 1 follows nothing from broker 2, so
    it sends broker 2 an empty fetch request every interval. When a new topic led by broker 2
    appears and broker 1 has not applied it yet, broker 2's silence rules find broker 1's
    recent requests and do not count it silent (the first create on a fresh cluster shrank
    thousands of ISRs without them). A broker with a fetcher for the peer sends none, and a
    fenced peer gets none."""
    from partitions.log.protocols import TopicPartition
    from partitions.replication.replica_fetcher import REPLICA_KEEPALIVE_INTERVAL_MS
    from partitions.replication.replica_state import LeaderAndIsr
    rms, fetchers, transport, apply = pair
    await apply(image(leader=1, epoch=1))          # 2 follows 1; 1 follows nothing from 2
    await wait_for(lambda: fetchers[1].keepalives_sent >= 2, 2 * REPLICA_KEEPALIVE_INTERVAL_MS / 1000 + 2)
    assert fetchers[2].keepalives_sent == 0 and 1 not in fetchers[1].fetchers and 1 in fetchers[2].fetchers
    # broker 2 leads a new partition; broker 1 has not applied it (no fetch of it yet)
    new = TopicPartition("new", 0)
    rms[2].core.add_replica(new, rms[2].log_manager.get_or_create("new", 0, LogConfig()))
    rms[2].core.apply_leader_and_isr(new, LeaderAndIsr(2, 0, (1, 2), (1, 2), 0), now_ms=rms[2]._clock_ms())
    await asyncio.sleep(1.8)                        # past a 1.5 s silence limit
    assert rms[2].core.silent_followers(rms[2]._clock_ms(), 1500) == {}
    assert rms[2]._clock_ms() - rms[2].core.fetch_requests_ms[1] <= REPLICA_KEEPALIVE_INTERVAL_MS + 500
    # broker 2 fenced: broker 1 stops sending it keep-alives
    img = image(leader=1, epoch=1)
    img.replay(FenceBrokerRecord(2, img.brokers[2].epoch))
    fetchers[1].sync(img)
    await asyncio.sleep(0)
    sent = fetchers[1].keepalives_sent
    await asyncio.sleep(3 * REPLICA_KEEPALIVE_INTERVAL_MS / 1000)
    assert fetchers[1].keepalives_sent == sent and fetchers[1]._keepalives == {}
