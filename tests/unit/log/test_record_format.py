"""Both records section formats in one log (issue 20): Kafka clients' batches stored as sent
(attribute bit 7 clear) next to columnar ones (bit 7 set); compaction of a Kafka-format log;
the record format file and the in-place upgrade of log dirs written before bit 7."""
from __future__ import annotations

import struct

import pytest
from crc32c import crc32c
from kafka.record.default_records import DefaultRecordBatchBuilder

from partitions.clock import ManualClock
from partitions.log.cleaner import LogCleaner
from partitions.log.config import LogConfig
from partitions.log.log import Log
from partitions.log.log_manager import LogManager
from partitions.log.record_batch import (ATTRIBUTES_OFFSET, COLUMNAR_MASK, CRC_OFFSET, BatchHeader, Record,
                                         build_batch, decode_batches, iter_batches)
from partitions.log.record_format import (RECORD_FORMAT_FILE, RECORD_FORMAT_VERSION, LogDirFormatError,
                                          ensure_log_dir_format)

pytestmark = pytest.mark.usefixtures("no_fsync")

CFG = LogConfig(cleanup_policy="compact", segment_bytes=600, delete_retention_ms=1000, min_cleanable_dirty_ratio=0.1)


def _kafka_batch(items, ts: int, codec: int = 0) -> bytes:
    """A batch as a Kafka client builds it (kafka-python's builder): Kafka's varint records."""
    b = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=False, producer_id=-1,
                                  producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for i, (k, v) in enumerate(items):
        b.append(i, timestamp=ts, key=k, value=v, headers=[])
    return bytes(b.build())


def _all(lg):
    return [r for r in decode_batches(lg.read(lg.log_start_offset, 10**8).records) if r.offset >= lg.log_start_offset]


def _replay(records):
    state = {}
    for r in records:
        if r.value is None:
            state.pop(r.key, None)
        else:
            state[r.key] = r.value
    return state


def test_compaction_of_a_kafka_format_log_keeps_the_latest_value_per_key(tmp_path):
    clock = ManualClock(10_000)
    lg = Log.open(tmp_path / "k-0", CFG, clean_shutdown=True, clock=clock)
    sent = []
    for i in range(30):
        items = [(b"k%d" % (i % 5), b"v%d" % i), (b"k%d" % ((i + 1) % 5), b"w%d" % i)]
        batch = _kafka_batch(items, clock.now_ms(), codec=(0, 1, 4)[i % 3])
        sent.append(batch)
        lg.append_as_leader(batch, 0)
    sent.append(_kafka_batch([(b"only", b"once")], clock.now_ms()))   # a batch the cleaner keeps whole
    lg.append_as_leader(sent[-1], 0)
    lg.roll()
    lg.update_high_watermark(lg.log_end_offset)
    stored = [bytes(b) for _h, b in iter_batches(lg.read(0, 10**8).records)]
    assert [s[16:] for s in stored] == [s[16:] for s in sent]   # byte for byte after the leader's stamps
    before = _all(lg)
    stats = LogCleaner(clock=clock).clean(lg)
    assert stats and not stats.aborted and stats.segments_cleaned >= 1
    after = _all(lg)
    assert _replay(after) == _replay(before)
    assert len({r.key for r in after}) == len(after) == 6
    originals = {r.offset: r.value for r in before}
    assert all(originals[r.offset] == r.value for r in after)   # offsets preserved
    kept = [bytes(b) for _h, b in iter_batches(lg.read(lg.log_start_offset, 10**8).records)]
    assert sent[-1][16:] in [b[16:] for b in kept]                # untouched batch kept as sent
    assert any(BatchHeader.parse(b).is_columnar for b in kept)    # rewritten batches are columnar


def _strip_bit7(path) -> int:
    """Rewrite a segment file as a kraftlog before issue 20 wrote it (columnar, bit 7 clear)."""
    data = bytearray(path.read_bytes())
    pos = n = 0
    while pos < len(data):
        h = BatchHeader.parse(data, pos)
        struct.pack_into(">h", data, pos + ATTRIBUTES_OFFSET, h.attributes & ~COLUMNAR_MASK)
        struct.pack_into(">I", data, pos + CRC_OFFSET, crc32c(bytes(data[pos + ATTRIBUTES_OFFSET:pos + h.size])))
        pos += h.size
        n += 1
    path.write_bytes(bytes(data))
    return n


def test_a_log_dir_from_before_bit_7_is_upgraded_in_place_and_reads_the_same(tmp_path):
    d = tmp_path / "d1"
    m = LogManager([str(d)], LogConfig(), clock=ManualClock())
    m.open_all()
    assert (d / RECORD_FORMAT_FILE).read_text().strip() == str(RECORD_FORMAT_VERSION)
    lg = m.get_or_create("t", 0)
    for i in range(3):
        lg.append_as_leader(build_batch([Record(b"k%d" % i, b"v%d" % i, (("h", b"x"),), 5), Record(None, None)]), 0)
    lg.update_high_watermark(lg.log_end_offset)
    want = [(r.offset, r.key, r.value, r.headers) for r in _all(lg)]
    m.close()
    # make it an old dir: no format file, every batch columnar with bit 7 clear
    (d / RECORD_FORMAT_FILE).unlink()
    segments = list((d / "t-0").glob("*.log"))
    assert sum(_strip_bit7(s) for s in segments) == 3
    sizes = {s: s.stat().st_size for s in segments}
    assert ensure_log_dir_format(d) == 3
    assert {s: s.stat().st_size for s in segments} == sizes      # in place: no size change
    assert ensure_log_dir_format(d) == 0                           # idempotent
    (d / RECORD_FORMAT_FILE).unlink()
    for s in segments:
        _strip_bit7(s)
    m2 = LogManager([str(d)], LogConfig(), clock=ManualClock())   # the broker's path
    m2.open_all()
    assert [(r.offset, r.key, r.value, r.headers) for r in _all(m2.get("t", 0))] == want
    m2.close()
    (d / RECORD_FORMAT_FILE).write_text("3\n")
    with pytest.raises(LogDirFormatError, match="newer kraftlog"):
        LogManager([str(d)], LogConfig(), clock=ManualClock())
