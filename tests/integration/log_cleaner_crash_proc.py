"""A process that appends to a compacted log and cleans it in a loop (for kill -9 tests).

    python log_cleaner_crash_proc.py LOG_DIR            append + clean in a loop until killed
    python log_cleaner_crash_proc.py LOG_DIR once       one cleaning pass, then print "ops <n>"

With CRASH_AFTER_FS_OPS=N the process dies (os._exit, as abrupt as kill -9 for the file
system) just before its (N+1)th os.replace / os.unlink / os.rename / os.fsync after
opening the log: every step of a swap and of the checkpoint writes can be hit exactly.

Batch i (BATCH_RECORDS records, keys and tombstones from a Random(i)) lands at offsets
[i * BATCH_RECORDS, (i + 1) * BATCH_RECORDS); each round appends ROUND_BATCHES batches,
fsyncs them, then runs a cleaner pass. Prints "ready <next batch>" once open and
"pass <next batch> <segments cleaned>" after each pass.
"""
import random
import sys

from partitions.log.cleaner import LogCleaner
from partitions.log.config import LogConfig
from partitions.log.log import Log
from partitions.log.record_batch import Record, build_batch

CFG = LogConfig(cleanup_policy="compact", segment_bytes=700, delete_retention_ms=0, index_interval_bytes=128)
BATCH_RECORDS = 5
ROUND_BATCHES = 4
KEYS = 15


def batch_items(i: int) -> list[tuple[bytes, bytes | None]]:
    rng = random.Random(i)
    return [(b"k%d" % rng.randrange(KEYS), None if rng.random() < 0.15 else b"v%d.%d" % (i, j))
            for j in range(BATCH_RECORDS)]


def written_until(end_offset: int) -> list[tuple[int, bytes, bytes | None]]:
    out = []
    for i in range(end_offset // BATCH_RECORDS):
        out.extend((i * BATCH_RECORDS + j, k, v) for j, (k, v) in enumerate(batch_items(i)))
    return out


def _die_after_fs_ops(n: int) -> list:
    import os

    count = [0]

    def wrap(fn):
        def op(*args, **kwargs):
            if count[0] >= n:
                os._exit(137)
            count[0] += 1
            return fn(*args, **kwargs)
        return op

    for name in ("replace", "unlink", "rename", "fsync"):
        setattr(os, name, wrap(getattr(os, name)))
    return count


def clean_once(log_dir: str, quiet: bool = False) -> int:
    import os

    lg = Log.open(log_dir, CFG, clean_shutdown=False)
    count = _die_after_fs_ops(int(os.environ.get("CRASH_AFTER_FS_OPS", str(1 << 30))))
    lg.update_high_watermark(lg.log_end_offset)  # the data is fsynced: all of it is committed
    stats = LogCleaner().clean(lg)
    assert stats is not None and not stats.aborted
    if not quiet:
        print("ops", count[0], flush=True)
    return count[0]


def main(log_dir: str) -> None:
    lg = Log.open(log_dir, CFG, clean_shutdown=False)
    cleaner = LogCleaner()
    i = lg.log_end_offset // BATCH_RECORDS
    assert lg.log_end_offset == i * BATCH_RECORDS
    print("ready", i, flush=True)
    while True:
        for _ in range(ROUND_BATCHES):
            lg.append_as_leader(build_batch([Record(k, v) for k, v in batch_items(i)]), 0)
            i += 1
        lg.update_high_watermark(lg.log_end_offset)
        lg.flush()
        stats = cleaner.clean(lg)
        print("pass", i, stats.segments_cleaned if stats else 0, flush=True)


if __name__ == "__main__":
    if sys.argv[2:] == ["once"]:
        clean_once(sys.argv[1])
    else:
        main(sys.argv[1])
