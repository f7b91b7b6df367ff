"""Tiered storage's pure parts: topic config rules, remote segment views and plans, the
local retention gate, the chunk cache bound (no store, no sockets)."""
from __future__ import annotations

import pytest

from partitions.log.config import LogConfig, validate_topic_configs
from partitions.log.log import Log
from partitions.log.record_batch import Record, build_batch
from partitions.log.remote.chunk_cache import ChunkCache
from partitions.log.remote.metadata import (
    FINISHED,
    STARTED,
    RemoteLogSegmentMetadata,
    RemoteLogSegments,
    RemoteLogSegmentState,
    next_segments_to_copy,
    remote_segments_to_delete,
)


def md(base, end, *, seg="s", state=FINISHED, epoch=0, size=100, ts=0):
    return RemoteLogSegmentMetadata(topic="t", topic_id="id", partition=0, segment_id=f"{seg}{base}-{epoch}",
                                    base_offset=base, end_offset=end, max_timestamp_ms=ts, size_bytes=size,
                                    leader_epoch=epoch, broker_id=1, state=state)


def test_compacted_topics_refuse_remote_storage_with_a_clear_error():
    with pytest.raises(ValueError, match="compacted topics .* cannot use tiered storage"):
        validate_topic_configs({"remote.storage.enable": "true", "cleanup.policy": "compact"})
    with pytest.raises(ValueError, match="compacted"):
        validate_topic_configs({"remote.storage.enable": "true", "cleanup.policy": "compact,delete"})
    validate_topic_configs({"remote.storage.enable": "false", "cleanup.policy": "compact"})
    validate_topic_configs({"remote.storage.enable": "true", "cleanup.policy": "delete"})


def test_local_retention_defaults_to_the_total_and_may_not_exceed_it():
    cfg = LogConfig.from_topic_configs({"remote.storage.enable": "true", "retention.ms": "1000"})
    assert cfg.remote_storage_enable and cfg.local_retention_ms == -2 and cfg.effective_local_retention_ms == 1000
    with pytest.raises(ValueError, match="local.retention.bytes: 200 is larger than retention.bytes 100"):
        validate_topic_configs({"remote.storage.enable": "true", "local.retention.bytes": "200",
                                "retention.bytes": "100"})
    with pytest.raises(ValueError, match="local.retention.ms"):
        validate_topic_configs({"remote.storage.enable": "true", "local.retention.ms": "-1", "retention.ms": "5"})
    with pytest.raises(ValueError, match="local.retention.ms"):
        validate_topic_configs({"local.retention.ms": "-3"})
    assert LogConfig().to_topic_configs()["remote.storage.enable"] == "false"


def test_remote_segments_view_readable_duplicates_and_lookup():
    segs = RemoteLogSegments([md(0, 99), md(100, 199), md(100, 199, epoch=1), md(200, 299, state=STARTED)])
    assert [(s.base_offset, s.leader_epoch) for s in segs.readable()] == [(0, 0), (100, 0)]
    assert [(s.base_offset, s.leader_epoch) for s in segs.duplicates()] == [(100, 1)]
    assert segs.copied_end_offset() == 200 and segs.log_start_offset() == 0
    assert segs.find(150).base_offset == 100 and segs.find(250) is None
    segs.put(md(0, 99).with_state(RemoteLogSegmentState.DELETE_SEGMENT_FINISHED, 1))
    assert segs.log_start_offset() == 100
    assert RemoteLogSegments().copied_end_offset() == -1
    again = RemoteLogSegmentMetadata.from_json(md(5, 9, state=STARTED).to_json())
    assert again == md(5, 9, state=STARTED)


def test_a_new_leaders_overlapping_copy_never_makes_a_copy_with_unique_offsets_a_duplicate():
    """Leaders roll segments at their own boundaries: the dead leader copied [0, 3999], the new
    one holds [0, 4499] and [4500, 8999]. Whatever the order of the copies, every offset stays
    readable and only copies wholly inside another are deleted."""
    old = md(0, 3999, epoch=1)
    segs = RemoteLogSegments([old])
    todo = next_segments_to_copy([(0, 4500), (4500, 9000)], segs.copied_end_offset(), 10_000)
    assert todo == [(0, 4500), (4500, 9000)]          # the straddling segment is copied whole
    segs.put(md(4500, 8999, epoch=2))                   # the later one finished first
    assert segs.copied_end_offset() == 4000 and segs.duplicates() == []   # a gap: nothing to delete
    segs.put(md(0, 4499, epoch=2))
    assert [(s.base_offset, s.end_offset) for s in segs.readable()] == [(0, 4499), (4500, 8999)]
    assert segs.duplicates() == [old]                   # [0, 3999] is inside [0, 4499]
    assert segs.copied_end_offset() == 9000 and segs.log_start_offset() == 0
    # a copy that starts below the previous end but reaches further is readable, not a duplicate
    segs = RemoteLogSegments([md(0, 3999, epoch=1), md(3000, 6999, epoch=2)])
    assert segs.duplicates() == [] and segs.copied_end_offset() == 7000
    assert segs.find(3500).base_offset == 3000 and segs.find(100).base_offset == 0 and segs.find(7000) is None
    assert next_segments_to_copy([(3000, 7000), (7000, 9000)], segs.copied_end_offset(), 10_000) == [(7000, 9000)]


def test_copy_plan_only_closed_segments_below_the_high_watermark_not_yet_remote():
    closed = [(0, 100), (100, 200), (200, 300), (300, 400)]
    assert next_segments_to_copy(closed, -1, 1000) == closed
    assert next_segments_to_copy(closed, 200, 1000) == [(200, 300), (300, 400)]
    assert next_segments_to_copy(closed, 200, 350) == [(200, 300)]   # (300, 400) not all below the HW
    assert next_segments_to_copy(closed, 400, 1000) == []


def test_total_retention_plan_counts_remote_only_bytes_plus_local():
    segs = RemoteLogSegments([md(0, 99, size=100), md(100, 199, size=100), md(200, 299, size=100)])
    # local holds [200, ...) with 150 bytes: total = 100 + 100 + 150 = 350
    plan = remote_segments_to_delete(segs, local_size_bytes=150, local_start_offset=200, retention_ms=-1,
                                     retention_bytes=250, now_ms=0)
    assert [s.base_offset for s in plan] == [0]
    plan = remote_segments_to_delete(segs, local_size_bytes=150, local_start_offset=200, retention_ms=-1,
                                     retention_bytes=150, now_ms=0)
    assert [s.base_offset for s in plan] == [0, 100]   # never the segment the local log also holds
    old = RemoteLogSegments([md(0, 99, ts=0), md(100, 199, ts=5000)])
    plan = remote_segments_to_delete(old, local_size_bytes=0, local_start_offset=200, retention_ms=1000,
                                     retention_bytes=-1, now_ms=5500)
    assert [s.base_offset for s in plan] == [0]


def test_local_retention_of_a_tiered_log_deletes_only_copied_segments(tmp_path):
    cfg = LogConfig(segment_bytes=4096, remote_storage_enable=True, local_retention_bytes=4096, retention_ms=-1,
                    preallocate=False)
    lg = Log.open(tmp_path / "t-0", cfg)
    try:
        for i in range(40):
            lg.append_as_leader(build_batch([Record(None, b"x" * 500)]), 0)
        lg.update_high_watermark(lg.log_end_offset)
        n = lg.segment_count
        assert n > 4
        assert lg.apply_retention() == 0 and lg.log_start_offset == 0     # nothing remote yet
        third = lg.segments[3].base_offset
        lg.remote_copied_end_offset = third
        assert lg.apply_retention() == 3 and lg.log_start_offset == third  # only what is remote
        lg.remote_copied_end_offset = lg.segments[-1].base_offset
        lg.apply_retention()
        assert lg.size_bytes <= 4096 + 4096                               # down to the local tail
    finally:
        lg.close()


def test_chunk_cache_serves_ranges_and_stays_within_its_bound(tmp_path):
    data = bytes(range(256)) * 64   # 16 KiB file
    loads = []

    def load(start, end):
        loads.append((start, end))
        return data[start:end + 1]

    cache = ChunkCache(tmp_path / "c", chunk_bytes=1024, max_bytes=4096)
    assert cache.read("seg", "log", 1000, 100, len(data), load) == data[1000:1100]
    assert loads == [(0, 1023), (1024, 2047)]
    assert cache.read("seg", "log", 1000, 100, len(data), load) == data[1000:1100]
    assert len(loads) == 2 and cache.hits == 2                     # served from disk
    assert cache.read("seg", "log", 0, len(data), len(data), load) == data
    assert cache.size_bytes <= 4096 and len(list((tmp_path / "c").iterdir())) <= 4
    cache.evict_segment("seg")
    assert cache.size_bytes == 0


def test_topic_deletion_dooms_remote_data_of_topics_once_tiered(tmp_path):
    from types import SimpleNamespace as NS

    from partitions.log.remote.config import RemoteStorageConfig
    from partitions.log.remote.remote_log_manager import RemoteLogManager

    deleted = []
    store = NS(delete_partition_data=lambda topic, tid: deleted.append((topic, tid)) or 0)
    rlm = RemoteLogManager(RemoteStorageConfig(), store, NS(all_logs=lambda: []), 1, tmp_path / "c",
                           lambda t, p: None)
    try:
        tiered = {"remote.storage.enable": "true"}
        rlm.on_metadata(NS(topics={"a": NS(topic_id="A", configs=tiered), "b": NS(topic_id="B", configs=tiered),
                                   "plain": NS(topic_id="P", configs={})}))
        # b: tiering turned off (its remote data stays until the topic goes); a: re-created
        rlm.on_metadata(NS(topics={"a": NS(topic_id="A2", configs=tiered), "b": NS(topic_id="B", configs={}),
                                   "plain": NS(topic_id="P", configs={})}))
        rlm.run_once()
        assert deleted == [("a", "A")]
        rlm.on_metadata(NS(topics={"a": NS(topic_id="A2", configs=tiered)}))   # b and plain deleted
        rlm.run_once()
        assert deleted == [("a", "A"), ("b", "B")]
    finally:
        rlm.stop()


def test_a_remote_producer_snapshot_adds_only_producers_the_replica_does_not_know():
    from partitions.log.producer_state import BatchMetadata, ProducerStateEntry, ProducerStateManager
    import json
    psm = ProducerStateManager(None)
    mine = ProducerStateEntry(7, 3)
    mine.batches.append(BatchMetadata(10, 10, 5000, 5000, 1))
    psm.producers[7] = mine
    snapshot = json.dumps({"offset": 4000, "producers": [[7, 2, 0, [[0, 4, 0, 4, 0]]],
                                                          [9, 0, 0, [[0, 1, 100, 101, 0]]]]})
    assert psm.merge_snapshot(snapshot, below_offset=4000) == 1
    assert psm.producers[7] is mine                       # its own, newer, entry stays
    assert psm.producers[9].find_duplicate(0, 1) == BatchMetadata(0, 1, 100, 101, 0)
    with pytest.raises(ValueError, match="past"):
        psm.merge_snapshot(snapshot, below_offset=3999)


def test_delete_records_floor_hides_remote_offsets_below_it_and_dooms_whole_segments():
    segs = RemoteLogSegments([md(0, 99), md(100, 199), md(200, 299)], log_start_floor=150)
    assert segs.log_start_offset() == 150
    assert segs.find(149) is None and segs.find(150).base_offset == 100
    plan = remote_segments_to_delete(segs, local_size_bytes=100, local_start_offset=300, retention_ms=-1,
                                     retention_bytes=-1, now_ms=0)
    assert [s.base_offset for s in plan] == [0]          # wholly below the floor; [100, 199] straddles it
    segs.log_start_floor = 300                            # everything remote deleted: the local log starts it
    assert segs.log_start_offset() is None and segs.copied_end_offset() == 300
    assert [s.base_offset for s in remote_segments_to_delete(
        segs, local_size_bytes=100, local_start_offset=300, retention_ms=-1, retention_bytes=-1, now_ms=0)] == [0, 100, 200]
