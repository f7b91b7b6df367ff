"""ReplicaManager: metadata application, acks, long-poll wake-ups, HW-bounded reads."""
import asyncio

import pytest

from partitions.errors import ErrorCode, KraftlogError
from metadata_quorum.image import MetadataImage
from metadata_quorum.records import (PartitionChangeRecord, PartitionRecord, RegisterBrokerRecord,
                                     RemoveTopicRecord, TopicRecord)
from partitions.log import record_batch as rb
from partitions.replication.replica_manager import ACKS_ALL, ACKS_LEADER, ReplicaManager
from tests.unit.replication.fake_log import MemoryLogManager


def image(replicas=(1,), isr=None, leader=1, epoch=0):
    img = MetadataImage("c")
    img.replay(RegisterBrokerRecord(1, "i1", -1, "http://b1", None, False))
    img.replay(RegisterBrokerRecord(2, "i2", -1, "http://b2", None, False))
    img.replay(TopicRecord("t", "tid"))
    img.replay(PartitionRecord("t", "tid", 0, tuple(replicas), tuple(isr or replicas), leader, epoch, epoch))
    return img


def batch(n=1, value=b"v"):
    return rb.build_batch([rb.Record(None, value) for _ in range(n)])


def manager():
    return ReplicaManager(1, MemoryLogManager(), default_log_config_factory=lambda c: None,
                          request_timeout_ms=200)


async def test_leader_append_and_fetch():
    rm = manager()
    await rm.apply_metadata(image())
    res = await rm.append("t", 0, batch(3), acks=ACKS_ALL)
    assert (res.first_offset, res.last_offset) == (0, 2)
    f = await rm.fetch("t", 0, 0, max_bytes=1 << 20)
    assert f.high_watermark == 3 and len(rb.decode_batches(f.records)) == 3


async def test_follower_answers_not_leader_with_leader_url():
    rm = manager()
    await rm.apply_metadata(image(replicas=(2, 1), leader=2))
    with pytest.raises(KraftlogError) as e:
        await rm.append("t", 0, batch(), acks=ACKS_LEADER)
    assert e.value.code is ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert e.value.extra == {"leader_id": 2, "leader_url": "http://b2"}


async def test_acks_all_waits_for_follower_then_completes():
    rm = manager()
    await rm.apply_metadata(image(replicas=(1, 2)))
    task = asyncio.create_task(rm.append("t", 0, batch(2), acks=ACKS_ALL, timeout_ms=5000))
    await asyncio.sleep(0)
    assert not task.done()
    rm.follower_fetched("t", 0, 2, 2)  # follower has offsets 0..1
    res = await asyncio.wait_for(task, 1)
    assert res.last_offset == 1
    assert rm.offsets("t", 0)["high_watermark"] == 2


async def test_acks_all_times_out_and_min_isr_refuses():
    rm = manager()
    await rm.apply_metadata(image(replicas=(1, 2)))
    with pytest.raises(KraftlogError) as e:
        await rm.append("t", 0, batch(), acks=ACKS_ALL, timeout_ms=50)
    assert e.value.code is ErrorCode.REQUEST_TIMED_OUT
    rm.min_insync_replicas = 3
    with pytest.raises(KraftlogError) as e:
        await rm.append("t", 0, batch(), acks=ACKS_ALL)
    assert e.value.code is ErrorCode.NOT_ENOUGH_REPLICAS


async def test_fetch_reads_only_below_high_watermark():
    rm = manager()
    await rm.apply_metadata(image(replicas=(1, 2)))
    await rm.append("t", 0, batch(2), acks=ACKS_LEADER)
    f = await rm.fetch("t", 0, 0, max_bytes=1 << 20)
    assert f.records == b"" and f.high_watermark == 0
    # written but not committed (HW < offset <= LEO): nothing yet, not out of range (a consumer
    # that read up to the old leader's HW must not be reset by a new leader's lower HW)
    f = await rm.fetch("t", 0, 1, max_bytes=1 << 20)
    assert f.records == b"" and f.high_watermark == 0
    with pytest.raises(KraftlogError) as e:
        await rm.fetch("t", 0, 3, max_bytes=1 << 20)
    assert e.value.code is ErrorCode.OFFSET_OUT_OF_RANGE


async def test_long_poll_is_woken_by_append_not_by_timeout():
    rm = manager()
    await rm.apply_metadata(image())
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    task = asyncio.create_task(rm.fetch("t", 0, 0, max_bytes=1 << 20, min_bytes=1, max_wait_ms=5000))
    await asyncio.sleep(0.05)
    assert not task.done() and rm.long_polls_waiting == 1
    await rm.append("t", 0, batch(), acks=ACKS_LEADER)
    f = await asyncio.wait_for(task, 1)
    assert f.records and loop.time() - t0 < 1
    assert rm.long_polls_waiting == 0


async def test_long_poll_returns_empty_after_max_wait_and_limit():
    rm = manager()
    rm.max_concurrent_long_polls = 1
    await rm.apply_metadata(image())
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    first = asyncio.create_task(rm.fetch("t", 0, 0, max_bytes=100, max_wait_ms=100))
    await asyncio.sleep(0)
    with pytest.raises(KraftlogError) as e:
        await rm.fetch("t", 0, 0, max_bytes=100, max_wait_ms=100)
    assert e.value.code is ErrorCode.THROTTLING_QUOTA_EXCEEDED
    f = await first
    assert f.records == b"" and 0.09 <= loop.time() - t0 < 1


async def test_leadership_change_and_topic_deletion():
    rm = manager()
    img = image(replicas=(1, 2))
    await rm.apply_metadata(img)
    waiting = asyncio.create_task(rm.append("t", 0, batch(), acks=ACKS_ALL, timeout_ms=5000))
    await asyncio.sleep(0)
    img.replay(PartitionChangeRecord("t", "tid", 0, (1, 2), (1, 2), 2, 1, 1))
    await rm.apply_metadata(img)
    with pytest.raises(KraftlogError) as e:
        await waiting
    assert e.value.code is ErrorCode.NOT_LEADER_OR_FOLLOWER
    img.replay(RemoveTopicRecord("t", "tid"))
    await rm.apply_metadata(img)
    assert rm.log_manager.deleted == [("t", 0)] and not rm.partitions
    with pytest.raises(KraftlogError) as e:
        rm.offsets("t", 0)
    assert e.value.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


async def test_delete_records_bounds():
    rm = manager()
    await rm.apply_metadata(image())
    await rm.append("t", 0, batch(5), acks=ACKS_LEADER)
    assert await rm.delete_records("t", 0, 3) == 3
    with pytest.raises(KraftlogError) as e:
        await rm.delete_records("t", 0, 6)
    assert e.value.code is ErrorCode.OFFSET_OUT_OF_RANGE
    with pytest.raises(KraftlogError) as e:
        await rm.fetch("t", 0, 2, max_bytes=100)
    assert e.value.code is ErrorCode.OFFSET_OUT_OF_RANGE


async def test_shutdown_answers_waiting_long_polls():
    rm = manager()
    await rm.apply_metadata(image())
    task = asyncio.create_task(rm.fetch("t", 0, 0, max_bytes=100, max_wait_ms=10_000))
    await asyncio.sleep(0.01)
    rm.begin_shutdown()
    f = await asyncio.wait_for(task, 1)
    assert f.records == b""


async def test_stale_log_of_an_older_topic_id_is_deleted(tmp_path):
    ids = str(tmp_path / "ids.json")
    lm = MemoryLogManager()
    rm = ReplicaManager(1, lm, default_log_config_factory=lambda c: None, topic_ids_path=ids)
    await rm.apply_metadata(image())
    await rm.append("t", 0, batch(3), acks=ACKS_LEADER)
    # broker restarts; meanwhile "t" was deleted and re-created (new topic id)
    rm2 = ReplicaManager(1, lm, default_log_config_factory=lambda c: None, topic_ids_path=ids)
    img = MetadataImage("c")
    img.replay(RegisterBrokerRecord(1, "i1", -1, "http://b1", None, False))
    img.replay(TopicRecord("t", "tid-2"))
    img.replay(PartitionRecord("t", "tid-2", 0, (1,), (1,), 1, 0, 0))
    await rm2.apply_metadata(img)
    assert lm.deleted == [("t", 0)]
    assert rm2.offsets("t", 0)["high_watermark"] == 0


async def test_stray_logs_removed_once_caught_up():
    lm = MemoryLogManager()
    lm.get_or_create("gone", 0, None)  # left on disk by a topic deleted while we were down
    rm = ReplicaManager(1, lm, default_log_config_factory=lambda c: None)
    img = image()
    await rm.apply_metadata(img)
    assert await rm.remove_stray_logs(img) == [("gone", 0)]
    assert lm.partitions() == [("t", 0)]


async def test_restarted_broker_does_not_serve_its_previous_incarnations_leadership():
    """Until the metadata holds this process's registration, a leadership naming this broker
    is the previous process's (which may have had a longer log): never act on it."""
    rm = ReplicaManager(1, MemoryLogManager(), default_log_config_factory=lambda c: None,
                        incarnation_id="new")
    old = image(replicas=(1, 2))                  # broker 1 registered as incarnation "i1"
    await rm.apply_metadata(old)
    assert not rm.partitions[("t", 0)].is_leader
    with pytest.raises(KraftlogError) as e:
        await rm.append("t", 0, batch(), acks=ACKS_LEADER)
    assert e.value.code is ErrorCode.NOT_LEADER_OR_FOLLOWER
    res = await rm.replica_fetch(2, [("t", 0, 0, 0, -1)], max_bytes=100, partition_max_bytes=100)
    assert res[0].code is ErrorCode.NOT_LEADER_OR_FOLLOWER
    new = image(replicas=(1, 2))
    new.replay(RegisterBrokerRecord(1, "new", -1, "http://b1", None, False))
    await rm.apply_metadata(new)
    assert rm.partitions[("t", 0)].is_leader


async def test_acks_all_fails_after_append_when_the_isr_shrank_below_min_isr():
    """Kafka's NOT_ENOUGH_REPLICAS_AFTER_APPEND: the HW passed the batch only because the
    ISR shrank below min.insync.replicas while the produce waited."""
    rm = ReplicaManager(1, MemoryLogManager(), default_log_config_factory=lambda c: None,
                        request_timeout_ms=2000, min_insync_replicas=2)
    await rm.apply_metadata(image(replicas=(1, 2)))
    task = asyncio.create_task(rm.append("t", 0, batch(), acks=ACKS_ALL))
    await asyncio.sleep(0)
    shrunk = image(replicas=(1, 2), isr=(1,))
    shrunk.replay(PartitionChangeRecord("t", "tid", 0, (1, 2), (1,), 1, 0, 1))
    await rm.apply_metadata(shrunk)
    with pytest.raises(KraftlogError) as e:
        await asyncio.wait_for(task, 1)
    assert e.value.code is ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND


@pytest.mark.parametrize("isr,elr,last_known_elr,waiting", [
    ([], [3], [], [3]),          # the last ISR member left uncleanly: the ELR member holds every committed record
    ([3], [], [2], [3]),         # a fenced last ISR member is kept in the ISR (KIP-966)
    ([], [], [1, 2], [1, 2]),    # unclean recovery waits for the last known ELR to report
])
def test_a_leaderless_partition_names_the_brokers_it_waits_for(isr, elr, last_known_elr, waiting):
    from types import SimpleNamespace
    from partitions.replication.replica_manager import ReplicaManager
    reg = SimpleNamespace(leader=-1, isr=isr, elr=elr, last_known_elr=last_known_elr)
    rm = ReplicaManager.__new__(ReplicaManager)
    rm._image = SimpleNamespace(partition=lambda topic, partition: reg)
    message = rm.no_leader_message("s", 0)
    assert f"waits for brokers {waiting}" in message and "unclean.leader.election.enable" in message
