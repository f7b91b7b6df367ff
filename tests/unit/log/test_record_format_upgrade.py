"""The in-place upgrade of one version 1 segment file (record_format.upgrade_segment_file)
where the file does not end cleanly: whole batches before a torn tail or a corrupt batch are
upgraded, the rest is left byte for byte for log recovery to truncate."""
from __future__ import annotations

import struct

from crc32c import crc32c

from partitions.log.record_batch import (ATTRIBUTES_OFFSET, COLUMNAR_MASK, CRC_OFFSET, BatchHeader, Record,
                                         build_batch, validate_batch)
from partitions.log.record_format import upgrade_segment_file


def _v1_batch(i: int) -> bytes:
    """A columnar batch as kraftlog wrote it before bit 7 (bit 7 clear, CRC over that)."""
    data = bytearray(build_batch([Record(b"k%d" % i, b"v%d" % i), Record(None, b"w")], base_offset=2 * i))
    attrs = BatchHeader.parse(data).attributes & ~COLUMNAR_MASK
    struct.pack_into(">h", data, ATTRIBUTES_OFFSET, attrs)
    struct.pack_into(">I", data, CRC_OFFSET, crc32c(bytes(data[ATTRIBUTES_OFFSET:])))
    return bytes(data)


def _columnar_and_valid(data: bytes) -> bool:
    validate_batch(data)
    return BatchHeader.parse(data).is_columnar


def test_batches_before_a_torn_tail_are_upgraded_and_the_tail_is_left_as_it_is(tmp_path):
    batches = [_v1_batch(i) for i in range(3)]
    tail = _v1_batch(3)[:40]                      # a partial batch: header and a little more
    seg = tmp_path / "00000000000000000000.log"
    seg.write_bytes(b"".join(batches) + tail)
    assert upgrade_segment_file(seg) == 3
    data = seg.read_bytes()
    assert len(data) == sum(map(len, batches)) + len(tail)
    pos = 0
    for b in batches:
        assert _columnar_and_valid(data[pos:pos + len(b)])
        assert data[pos + ATTRIBUTES_OFFSET + 2:pos + len(b)] == b[ATTRIBUTES_OFFSET + 2:]   # only CRC + attributes
        pos += len(b)
    assert data[pos:] == tail
    assert upgrade_segment_file(seg) == 0          # idempotent: every whole batch has bit 7


def test_the_upgrade_stops_at_a_corrupt_batch_and_leaves_it_and_the_rest_unchanged(tmp_path):
    batches = [_v1_batch(i) for i in range(4)]
    bad = bytearray(batches[1])
    bad[-1] ^= 0xFF                                 # a flipped payload byte: its CRC fails
    batches[1] = bytes(bad)
    seg = tmp_path / "00000000000000000000.log"
    seg.write_bytes(b"".join(batches))
    assert upgrade_segment_file(seg) == 1
    data = seg.read_bytes()
    n0 = len(batches[0])
    assert _columnar_and_valid(data[:n0])
    assert data[n0:] == b"".join(batches[1:])
