"""A restarted broker's logs take their topic's configs from the first metadata image
(issue 24, found by the chaos harness): `LogManager.open_all` opens every log with the
broker's default config (no metadata yet), and the replica manager used to pass a topic's
configs on only when they *changed* later. A compacted topic's replica then stayed a
`delete` log after every restart: the follower refused the leader's batches that start
after a compaction gap ("follower append starts at offset 1037 but the log end offset is
1031") for as long as 30 s, so it stayed out of the ISR and the next fault took the
partition below min.insync.replicas; its cleaner and retention followed the wrong policy."""
from metadata_quorum.image import MetadataImage
from metadata_quorum.records import ConfigRecord, PartitionRecord, RegisterBrokerRecord, TopicRecord
from partitions.log import record_batch as rb
from partitions.log.config import LogConfig
from partitions.log.log_manager import LogManager
from partitions.replication.replica_manager import ReplicaManager


def _image() -> MetadataImage:
    img = MetadataImage("c")
    img.replay(RegisterBrokerRecord(1, "i1", -1, "http://b1", None, False))
    img.replay(RegisterBrokerRecord(2, "i2", -1, "http://b2", None, False))
    img.replay(TopicRecord("c", "tid"))
    img.replay(ConfigRecord("topic", "c", "cleanup.policy", "compact"))
    img.replay(ConfigRecord("topic", "c", "segment.bytes", "4096"))
    img.replay(PartitionRecord("c", "tid", 0, (2, 1), (2, 1), 2, 0, 0))   # broker 1 follows 2
    return img


def _follower_batch(base_offset: int) -> bytes:
    """A batch as the leader stored it (its offset and leader epoch)."""
    return rb.build_batch([rb.Record(b"k", b"v")], base_offset=base_offset, partition_leader_epoch=0)


async def test_a_restarted_brokers_logs_take_their_topic_configs_from_the_first_image(tmp_path):
    dirs = [str(tmp_path / "logs")]
    lm = LogManager(dirs, LogConfig())
    lg = lm.get_or_create("c", 0, LogConfig.from_topic_configs({"cleanup.policy": "compact"}))
    lg.append_as_follower(_follower_batch(0))
    lm.close()

    restarted = LogManager(dirs, LogConfig())   # the broker restarts: no metadata yet
    restarted.open_all()
    assert not restarted.get("c", 0).config.compact
    rm = ReplicaManager(1, restarted, request_timeout_ms=200)
    try:
        await rm.apply_metadata(_image())
        lg = restarted.get("c", 0)
        assert lg.config.compact and lg.config.segment_bytes == 4096
        # the leader's batch after a compaction gap (offsets 1-4 cleaned away) continues the log
        lg.append_as_follower(_follower_batch(5))
        assert lg.log_end_offset == 6
    finally:
        restarted.close()
