"""A full replica fetch of thousands of partitions reads them in chunks, letting the event
loop serve between chunks (issue 25: one 3,334-partition read held a broker's loop for
seconds, so heartbeats and other fetch answers missed their deadlines)."""
from metadata_quorum.image import MetadataImage
from metadata_quorum.records import PartitionRecord, RegisterBrokerRecord, TopicRecord
from partitions.log.record_batch import Record, build_batch
from partitions.replication import replica_manager as rm_mod
from partitions.replication.replica_manager import ReplicaManager
from partitions.replication.replica_state import ReplicaFetchRequest
from tests.unit.replication.fake_log import MemoryLogManager
from tests.unit.replication.loop_turns import LoopTurns

N = 20


async def test_full_session_fetch_yields_between_chunks_and_reads_everything(monkeypatch):
    monkeypatch.setattr(rm_mod, "READ_CHUNK_PARTITIONS", 4)
    img = MetadataImage("c")
    for b in (1, 2):
        img.replay(RegisterBrokerRecord(b, f"i{b}", -1, f"http://b{b}", None, False))
    img.replay(TopicRecord("t", "tid"))
    for p in range(N):
        img.replay(PartitionRecord("t", "tid", p, (1, 2), (1, 2), 1, 1, 1))
    rm = ReplicaManager(1, MemoryLogManager())
    await rm.apply_metadata(img)
    for p in range(N):
        await rm.append("t", p, build_batch([Record(None, b"v")]), acks=1)
    async with LoopTurns() as turns:
        before = turns.count
        sid, err, answered = await rm.replica_fetch_session(
            2, 0, 0, [ReplicaFetchRequest("t", p, 0, 1) for p in range(N)], [], max_bytes=8 << 20,
            partition_max_bytes=1 << 20, max_wait_ms=0)
        during = turns.count - before
    assert err is None and sid
    assert sorted(k[1] for k, res in answered if res.records) == list(range(N))
    assert during >= N // 4 - 1          # the loop ran between the chunks
