"""Helpers for the partition log tests (a uniquely named module: importable from any test dir)."""
from __future__ import annotations

from partitions.log.record_batch import Record, build_batch


def make_batch(n: int = 1, *, value: bytes = b"v", ts: int = 1000, key: bytes | None = None, **kw) -> bytes:
    """A batch of `n` records (values value+index, timestamps ts..ts+n-1)."""
    return build_batch([Record(key, value + b"%d" % i, timestamp=ts + i) for i in range(n)], **kw)
