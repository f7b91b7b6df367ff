"""The record format version of a log dir, and the in-place upgrade of older log dirs.

Since issue 20 a stored batch's records section is either Kafka's varint records (attribute
bit 7 clear: a Kafka client's batch, kept byte for byte) or kraftlog's columnar layout (bit 7
set, `record_batch.COLUMNAR_MASK`). Log dirs written before that hold only columnar batches
with bit 7 clear, which a reader would take for Kafka's format. So every log dir carries a
`record-format` file naming its version:

- no file and no partition dirs: a fresh log dir; the file is written (version 2).
- no file but partition dirs: a version 1 dir. `ensure_log_dir_format` sets bit 7 on every
  batch of every segment file in place (attributes and the CRC-32C only: sizes, offsets and
  indexes are unchanged), then writes the file. Idempotent: a crash part way reruns on the
  next start and only touches batches still without bit 7 (all of them columnar, as no Kafka
  batch lands in a dir before the file exists). A corrupt or partial batch is left for log
  recovery, which truncates there as before.
- a version above 2: written by a newer kraftlog; refused with `LogDirFormatError`.

Segments already in the remote tier (tiered storage) are not rewritten: upload them again
from an upgraded broker, or read them with the broker version that wrote them.
"""
from __future__ import annotations

import os
import struct
from pathlib import Path

from crc32c import crc32c as _crc32c

from .errors import CorruptRecordError
from .record_batch import (ATTRIBUTES_OFFSET, COLUMNAR_MASK, CRC_OFFSET, H_ATTRIBUTES, H_BATCH_LENGTH, H_CRC,
                           H_MAGIC, LOG_OVERHEAD, MAGIC)
from .segment import scan_raw_batches

RECORD_FORMAT_FILE = "record-format"
RECORD_FORMAT_VERSION = 2  # 1: every batch columnar, bit 7 clear; 2: bit 7 says columnar


class LogDirFormatError(RuntimeError):
    """A log dir this broker cannot read (written by a newer kraftlog)."""


def upgrade_segment_file(path: Path) -> int:
    """Set bit 7 (columnar) on every whole, CRC-valid batch of a version 1 segment file that
    lacks it, recomputing its CRC in place (the log's batch walker, segment.scan_raw_batches,
    finds the batches). Stops at a partial or corrupt batch: log recovery truncates there.
    Returns the number of batches changed."""
    changed = 0
    fd = os.open(path, os.O_RDWR)
    try:
        for pos, h in scan_raw_batches(fd, 0, os.fstat(fd).st_size):
            if h[H_MAGIC] != MAGIC:
                break
            if h[H_ATTRIBUTES] & COLUMNAR_MASK:
                continue
            batch = bytearray(os.pread(fd, LOG_OVERHEAD + h[H_BATCH_LENGTH], pos))
            if _crc32c(memoryview(batch)[ATTRIBUTES_OFFSET:]) != h[H_CRC]:
                break
            struct.pack_into(">h", batch, ATTRIBUTES_OFFSET, h[H_ATTRIBUTES] | COLUMNAR_MASK)
            struct.pack_into(">I", batch, CRC_OFFSET, _crc32c(memoryview(batch)[ATTRIBUTES_OFFSET:]))
            os.pwrite(fd, bytes(batch[CRC_OFFSET:ATTRIBUTES_OFFSET + 2]), pos + CRC_OFFSET)   # CRC, attributes
            changed += 1
    except CorruptRecordError:
        pass   # a torn tail: log recovery truncates it
    finally:
        os.close(fd)
    return changed


def ensure_log_dir_format(log_dir: Path) -> int:
    """Make `log_dir` a version 2 log dir (see the module docstring). Returns the number of
    batches upgraded (0 for a fresh or current dir). Raises LogDirFormatError for a dir
    written by a newer kraftlog."""
    log_dir = Path(log_dir)
    marker = log_dir / RECORD_FORMAT_FILE
    if marker.exists():
        text = marker.read_text().strip()
        try:
            version = int(text)
        except ValueError:
            raise LogDirFormatError(f"{marker} holds {text!r}, not a record format version: "
                                    f"restore it (this kraftlog writes {RECORD_FORMAT_VERSION})") from None
        if version > RECORD_FORMAT_VERSION:
            raise LogDirFormatError(
                f"log dir {log_dir} has record format {version}, written by a newer kraftlog; this broker "
                f"reads formats up to {RECORD_FORMAT_VERSION}: run the newer version or use another log dir")
        if version == RECORD_FORMAT_VERSION:
            return 0
    changed = 0
    for sub in sorted(log_dir.iterdir()) if log_dir.exists() else ():
        if not sub.is_dir():
            continue
        for seg in sorted(sub.glob("*.log*")):
            if seg.is_file():
                n = upgrade_segment_file(seg)
                if n:
                    with open(seg, "rb") as f:
                        os.fsync(f.fileno())
                changed += n
    tmp = log_dir / (RECORD_FORMAT_FILE + ".tmp")
    with open(tmp, "w") as f:
        f.write(f"{RECORD_FORMAT_VERSION}\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, marker)
    fd = os.open(log_dir, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return changed


__all__ = ["RECORD_FORMAT_FILE", "RECORD_FORMAT_VERSION", "LogDirFormatError", "ensure_log_dir_format",
           "upgrade_segment_file"]
