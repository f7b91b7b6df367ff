"""Tiered storage against a real SeaweedFS (S3): the remote log manager over a real `Log`.

Each test drives `RemoteLogManager.run_once()` (the pass its thread runs) with the
partition's leadership given by the test, so the copier, the two-tier retention, remote
reads, topic deletion and a dead leader's orphans are checked step by step against the
real store.
"""
from __future__ import annotations

import time

import pytest

from partitions.log.config import LogConfig
from partitions.log.log import Log
from partitions.log.record_batch import Record, build_batch, decode_batches
from partitions.log.remote.config import RemoteStorageConfig
from partitions.log.remote.metadata import RemoteLogSegmentMetadata, RemoteLogSegmentState, new_segment_id
from partitions.log.remote.remote_log_manager import Leadership, RemoteLogManager
from partitions.log.remote.s3 import S3RemoteStorage
from partitions.log.remote.storage import LogSegmentData
from tests.rigs.seaweedfs import seaweedfs_store

pytestmark = pytest.mark.integration

BUCKET = "kraftlog-tiered-test"
TOPIC_ID = "t0pic1d"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    with seaweedfs_store(str(tmp_path_factory.mktemp("weed"))) as s:
        yield s


class OneLog:
    """A LogManager stand-in holding one log (the remote log manager only lists logs)."""

    def __init__(self, lg):
        self.lg = lg

    def all_logs(self):
        return [self.lg]


def _cfg(store, **kw) -> RemoteStorageConfig:
    s = store.broker_settings(BUCKET)
    s.pop("remote_storage_enable")
    s["remote_storage_request_timeout_ms"] = 5000   # a loaded machine: fewer spurious timeouts
    return RemoteStorageConfig(remote_storage_enable=True, **{**s, "remote_fetch_chunk_bytes": 64 * 1024,
                                                              "remote_fetch_cache_max_bytes": 1 << 20, **kw})


def _make(tmp_path, store, name, *, log_config: LogConfig, leader_epoch=0, prefix=""):
    lg = Log.open(tmp_path / f"{name}-0", log_config)
    cfg = _cfg(store, remote_storage_s3_prefix=prefix or name)
    state = {"leader": Leadership(True, leader_epoch, 0, TOPIC_ID)}

    def leadership(topic, partition):
        info = state["leader"]
        info.high_watermark = lg.high_watermark
        return info

    rlm = RemoteLogManager(cfg, S3RemoteStorage(cfg), OneLog(lg), 1, tmp_path / f"cache-{name}", leadership)
    return lg, rlm, state


def _settle(rlm, lg, what="every closed segment copied", timeout_s=60.0):
    """Run passes until every closed segment is remote (a pass may fail on a loaded machine:
    it is retried as the manager's thread would)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        rlm.run_once()
        if lg.remote_copied_end_offset == lg.segments[-1].base_offset and not rlm.metrics.copy_lag_segments.get(
                (lg.topic, lg.partition)):
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out: {what}")


def _produce(lg, n_batches, per_batch=20, value_bytes=200, start=0):
    for i in range(n_batches):
        recs = [Record(key=None, value=f"{start + i * per_batch + j:08d}".encode().ljust(value_bytes, b"x"))
                for j in range(per_batch)]
        lg.append_as_leader(build_batch(recs), leader_epoch=0)
    lg.update_high_watermark(lg.log_end_offset)


def _read_all(lg, rlm, start=0):
    """Consume from `start` to the log end: remote below the local log start, local above."""
    values, offset = [], start
    while offset < lg.high_watermark:
        if offset < lg.log_start_offset:
            got = rlm.read(lg.topic, lg.partition, offset, 64 * 1024)
            assert got is not None and got.records, f"nothing remote at {offset}"
            data, nxt = got.records, got.next_offset
        else:
            res = lg.read(offset, 64 * 1024)
            data, nxt = res.records, res.next_offset
        for r in decode_batches(data):
            if r.offset >= offset:
                values.append((r.offset, r.value[:8]))
        offset = nxt
    return values


TIERED = LogConfig(segment_bytes=16 * 1024, remote_storage_enable=True, local_retention_bytes=40 * 1024,
                   retention_ms=-1, preallocate=False)


def test_copy_local_tail_and_read_everything_in_order(tmp_path, store):
    lg, rlm, _ = _make(tmp_path, store, "copy", log_config=TIERED)
    try:
        _produce(lg, 60)   # 60 x 20 records of ~200 B: ~ 270 KB, ~17 segments
        n_segments = lg.segment_count
        assert lg.apply_retention() == 0, "nothing is remote yet: local retention must keep every segment"
        _settle(rlm, lg)
        remote = rlm.remote_segments(lg.topic, lg.partition)
        assert len(remote) == n_segments - 1            # every closed segment, not the active one
        assert lg.remote_copied_end_offset == lg.segments[-1].base_offset
        lg.apply_retention()   # (the manager already trims right after copying)
        assert lg.size_bytes <= 40 * 1024 + 16 * 1024 and lg.segment_count < n_segments
        assert lg.log_start_offset > 0
        assert rlm.remote_log_start_offset(lg.topic, lg.partition) == 0
        values = _read_all(lg, rlm)
        assert [o for o, _ in values] == list(range(lg.log_end_offset))
        assert [int(v) for _, v in values] == list(range(lg.log_end_offset))
        m = rlm.metrics.snapshot()
        assert m["copied_segments_total"] == n_segments - 1 and m["copied_bytes_total"] > 200_000
        assert m["fetch_requests_total"] > 0 and m["fetch_errors_total"] == 0
        # a read from the middle of a remote batch returns that whole batch first
        got = rlm.read(lg.topic, lg.partition, 105, 1)
        first = decode_batches(got.records)
        assert first[0].offset == 100 and first[-1].offset == 119 and got.next_offset == 120
    finally:
        rlm.stop()
        lg.close()


def test_delete_records_below_the_local_log_start_deletes_from_the_store_for_every_leader(tmp_path, store):
    """DeleteRecords under the local log start of a tiered log: the floor is in the store, no
    offset below it is read again (by this leader or the next), and the remote segments
    wholly below it go."""
    lg, rlm, state = _make(tmp_path, store, "delrec", log_config=TIERED, prefix="delrec")
    try:
        _produce(lg, 60)
        _settle(rlm, lg)
        lg.apply_retention()
        remote = rlm.remote_segments(lg.topic, lg.partition)
        floor = remote[2].base_offset + 5          # inside the third remote segment
        assert floor < lg.log_start_offset
        assert rlm.delete_records(lg.topic, lg.partition, TOPIC_ID, floor) == floor
        assert rlm.read(lg.topic, lg.partition, floor - 1, 1024) is None
        assert _read_all(lg, rlm, floor)[0][0] >= floor - 20    # whole batches from the floor's batch on
        rlm.run_once()                                     # the leader's pass deletes [0], [1] from the store
        gone = {remote[0].segment_id, remote[1].segment_id}
        assert not any(seg in k for k in store.keys(BUCKET, "delrec/") for seg in gone)
        assert any(remote[2].segment_id in k for k in store.keys(BUCKET, "delrec/"))
        # a new leader (fresh manager) lists the floor from the store
        cfg = _cfg(store, remote_storage_s3_prefix="delrec")
        other = RemoteLogManager(cfg, S3RemoteStorage(cfg), OneLog(lg), 2, tmp_path / "cache-other",
                                 lambda t, p: Leadership(True, 1, lg.high_watermark, TOPIC_ID))
        other.run_once()
        assert other.remote_log_start_offset(lg.topic, lg.partition) == floor
        assert other.read(lg.topic, lg.partition, floor - 1, 1024) is None
        other.stop()
    finally:
        rlm.stop()
        lg.close()


def test_list_offsets_by_time_finds_records_that_only_the_store_holds(tmp_path, store):
    lg, rlm, _ = _make(tmp_path, store, "bytime", log_config=TIERED, prefix="bytime")
    try:
        t0 = 1_700_000_000_000
        for b in range(60):   # record n has timestamp t0 + 10 n
            lg.append_as_leader(build_batch([Record(None, b"v" * 200, timestamp=t0 + 10 * (b * 20 + j))
                                             for j in range(20)]), leader_epoch=0)
        lg.update_high_watermark(lg.log_end_offset)
        _settle(rlm, lg)
        lg.apply_retention()
        assert lg.log_start_offset > 300
        assert lg.offset_for_timestamp(t0 + 10 * 137 - 5) == lg.log_start_offset   # the local answer is wrong
        assert rlm.offset_for_timestamp(lg.topic, lg.partition, t0 + 10 * 137 - 5) == 137
        assert rlm.offset_for_timestamp(lg.topic, lg.partition, t0) == 0
        assert rlm.offset_for_timestamp(lg.topic, lg.partition, t0 + 10 * 5000) is None   # later than every record
    finally:
        rlm.stop()
        lg.close()


def test_read_committed_over_remote_data_drops_a_transaction_aborted_in_a_remote_segment(tmp_path, store):
    """The transaction index goes to the store with its segment: once local retention removed
    the segment (and the local index forgot the abort), a read_committed read of the remote
    records still drops the aborted ones."""
    from partitions.log import transactions as txn
    lg, rlm, _ = _make(tmp_path, store, "txnidx", log_config=TIERED, prefix="txnidx")
    pid = 4242
    try:
        _produce(lg, 5)   # offsets 0-99
        lg.append_as_leader(txn.build_transactional_batch([Record(None, b"aborted-%d" % i) for i in range(20)],
                                                          pid, 0), leader_epoch=0)   # 100-119
        lg.append_as_leader(txn.build_marker_batch(pid, 0, False), leader_epoch=0)   # ABORT at 120
        _produce(lg, 55, start=1000)
        lg.update_high_watermark(lg.log_end_offset)
        _settle(rlm, lg)
        lg.apply_retention()
        assert lg.log_start_offset > 121 and lg.aborted_transactions(0, 200) == []
        aborted = rlm.aborted_transactions(lg.topic, lg.partition, 0, 200)
        assert [(a.producer_id, a.first_offset, a.last_offset) for a in aborted] == [(pid, 100, 120)]
        assert rlm.aborted_transactions(lg.topic, lg.partition, 121, 200) == []
        got = rlm.read(lg.topic, lg.partition, 90, 64 * 1024)
        data, _ = txn.filter_read_committed(got.records, 90, lg.high_watermark, aborted)
        values = [r.value for r in decode_batches(data, skip_control=True)]
        assert values and not any(v.startswith(b"aborted") for v in values)
        assert any(v.startswith(b"aborted") for v in (r.value for r in decode_batches(got.records)))
    finally:
        rlm.stop()
        lg.close()


def test_new_leader_lists_remote_and_cleans_a_dead_leaders_orphan(tmp_path, store):
    lg, rlm, state = _make(tmp_path, store, "orphan", log_config=TIERED, prefix="orphan")
    try:
        _produce(lg, 20)
        _settle(rlm, lg)
        copied = rlm.remote_segments(lg.topic, lg.partition)
        assert copied
        # a leader killed mid-copy left COPY_SEGMENT_STARTED metadata and part of the files
        orphan = RemoteLogSegmentMetadata(
            topic=lg.topic, topic_id=TOPIC_ID, partition=0, segment_id=new_segment_id(),
            base_offset=copied[-1].base_offset, end_offset=copied[-1].end_offset, max_timestamp_ms=0,
            size_bytes=10, leader_epoch=0, broker_id=2)
        rlm.storage.put_segment_metadata(orphan)
        rlm.storage.copy_log_segment_data(orphan, LogSegmentData(b"x" * 10, b"", b"", b"", b""))
        assert any(orphan.segment_id in k for k in store.keys(BUCKET, "orphan/"))
        # a new leader epoch: the manager lists the store again and removes the orphan
        state["leader"] = Leadership(True, 1, 0, TOPIC_ID)
        deadline = time.monotonic() + 60
        while any(orphan.segment_id in k for k in store.keys(BUCKET, "orphan/")) and time.monotonic() < deadline:
            rlm.run_once()
        assert not any(orphan.segment_id in k for k in store.keys(BUCKET, "orphan/"))
        again = rlm.remote_segments(lg.topic, lg.partition)
        assert [s.segment_id for s in again] == [s.segment_id for s in copied]   # none lost, none twice
        listed = rlm.storage.list_segments(lg.topic, TOPIC_ID, 0)
        assert sorted(s.segment_id for s in listed) == sorted(s.segment_id for s in copied)
        assert all(s.state == RemoteLogSegmentState.COPY_SEGMENT_FINISHED for s in listed)
    finally:
        rlm.stop()
        lg.close()


def test_segment_states_are_separate_objects_and_a_finished_entry_without_data_is_never_listed(store):
    """Each state is its own object, written once (a SeaweedFS under load served an overwritten
    object's older content); a FINISHED write that lands after its segment was removed (a
    timed-out PUT a paused store applied late) names no data and is never listed."""
    storage = S3RemoteStorage(_cfg(store, remote_storage_s3_prefix="states"))
    seg = RemoteLogSegmentMetadata(topic="st", topic_id=TOPIC_ID, partition=0, segment_id=new_segment_id(),
                                   base_offset=0, end_offset=9, max_timestamp_ms=0, size_bytes=10,
                                   leader_epoch=0, broker_id=1)
    storage.put_segment_metadata(seg)
    assert [m.state for m in storage.list_segments("st", TOPIC_ID, 0)] == [RemoteLogSegmentState.COPY_SEGMENT_STARTED]
    storage.copy_log_segment_data(seg, LogSegmentData(b"x" * 10, b"", b"", b"", b""))
    done = seg.with_state(RemoteLogSegmentState.COPY_SEGMENT_FINISHED, 1)
    storage.put_segment_metadata(done)
    meta = sorted(k.rsplit("/", 1)[1] for k in store.keys(BUCKET, "states/") if "/_metadata/" in k)
    assert meta == [f"{seg.segment_id}.finished.json", f"{seg.segment_id}.started.json"]
    assert storage.list_segments("st", TOPIC_ID, 0) == [done]
    # removed (DELETE_SEGMENT_STARTED, data, DELETE_SEGMENT_FINISHED): nothing of it is left
    storage.put_segment_metadata(seg.with_state(RemoteLogSegmentState.DELETE_SEGMENT_STARTED, 2))
    assert [m.state for m in storage.list_segments("st", TOPIC_ID, 0)] == [RemoteLogSegmentState.DELETE_SEGMENT_STARTED]
    storage.delete_log_segment_data(seg)
    storage.put_segment_metadata(seg.with_state(RemoteLogSegmentState.DELETE_SEGMENT_FINISHED, 3))
    assert store.keys(BUCKET, "states/") == [] and storage.list_segments("st", TOPIC_ID, 0) == []
    # the late FINISHED write lands now: no data under it, so it is not a readable segment
    storage.put_segment_metadata(done)
    assert storage.list_segments("st", TOPIC_ID, 0) == []


@pytest.fixture
def own_store(tmp_path):
    """A store this test stops and restarts (the leak guard counts the restart as the test's)."""
    with seaweedfs_store(str(tmp_path)) as s:
        yield s


def test_store_down_keeps_local_segments_then_copy_catches_up(tmp_path, own_store):
    store = own_store
    lg, rlm, _ = _make(tmp_path, store, "down", log_config=TIERED, prefix="down")
    try:
        _produce(lg, 10)
        _settle(rlm, lg)
        before = len(rlm.remote_segments(lg.topic, lg.partition))
        store.stop()
        try:
            _produce(lg, 40, start=lg.log_end_offset)      # produce goes on while the store is down
            t0 = time.monotonic()
            rlm.run_once()
            assert time.monotonic() - t0 < 10
            assert rlm.metrics.snapshot()["copy_errors_total"] >= 1
            assert rlm.metrics.snapshot()["copy_lag_segments"][(lg.topic, 0)] > 0
            lg.apply_retention()
            assert lg.log_start_offset <= max(0, lg.remote_copied_end_offset), "an uncopied segment was deleted locally"
        finally:
            store.server.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and lg.remote_copied_end_offset < lg.segments[-1].base_offset:
            rlm.run_once()
            time.sleep(0.3)
        assert len(rlm.remote_segments(lg.topic, lg.partition)) > before
        assert lg.remote_copied_end_offset == lg.segments[-1].base_offset
        lg.apply_retention()
        values = _read_all(lg, rlm)
        assert [int(v) for _, v in values] == list(range(lg.log_end_offset))   # nothing lost
    finally:
        rlm.stop()
        lg.close()


def test_total_retention_and_topic_deletion_delete_from_the_store(tmp_path, store):
    cfg = LogConfig(segment_bytes=16 * 1024, remote_storage_enable=True, local_retention_bytes=32 * 1024,
                    retention_bytes=100 * 1024, retention_ms=-1, preallocate=False)
    lg, rlm, _ = _make(tmp_path, store, "total", log_config=cfg, prefix="total")
    try:
        _produce(lg, 60)
        _settle(rlm, lg)      # copy everything closed
        lg.apply_retention()  # local tail only
        deadline = time.monotonic() + 60   # total retention: remote segments beyond retention.bytes go
        while not rlm.metrics.snapshot()["deleted_segments_total"] and time.monotonic() < deadline:
            rlm.run_once()
        remote = rlm.remote_segments(lg.topic, lg.partition)
        remote_only = sum(s.size_bytes for s in remote if s.base_offset < lg.log_start_offset)
        assert remote_only + lg.size_bytes < 100 * 1024 + 16 * 1024
        assert rlm.remote_log_start_offset(lg.topic, lg.partition) > 0
        assert rlm.metrics.snapshot()["deleted_segments_total"] > 0
        keys = store.keys(BUCKET, "total/")
        assert len([k for k in keys if k.endswith(".log")]) == len(remote)
        # the remote log start is readable, below it is gone
        start = rlm.remote_log_start_offset(lg.topic, lg.partition)
        assert rlm.read(lg.topic, 0, start, 1024).records
        assert rlm.read(lg.topic, 0, start - 1, 1024) is None

        class Topic:
            def __init__(self, tid, configs):
                self.topic_id, self.configs = tid, configs

        class Image:
            def __init__(self, topics):
                self.topics = topics

        rlm.on_metadata(Image({lg.topic: Topic(TOPIC_ID, {"remote.storage.enable": "true"})}))
        rlm.on_metadata(Image({}))   # topic deleted (its local log goes too)
        lg.close()
        deadline = time.monotonic() + 60
        while store.keys(BUCKET, "total/") and time.monotonic() < deadline:
            rlm.run_once()
        assert store.keys(BUCKET, "total/") == []
    finally:
        rlm.stop()
        lg.close()
