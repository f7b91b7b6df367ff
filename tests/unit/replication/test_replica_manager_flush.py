"""ReplicaManager._flush (group commit) ends when the log is truncated below the offset
it waits for (a follower truncation or a leader change during an fsync)."""
import asyncio

from partitions.replication.replica_manager import ReplicaManager
from tests.unit.replication.fake_log import MemoryLogManager


class _TruncatedDuringFlush:
    """A log whose first fsync races with a truncation to offset 5."""

    closed = False

    def __init__(self):
        self.log_end_offset = 10
        self.recovery_point = 0
        self.flushes = 0

    def flush(self):
        self.flushes += 1
        self.log_end_offset = 5
        self.recovery_point = 5


async def test_flush_wait_ends_when_the_log_was_truncated_below_its_target():
    rm = ReplicaManager(1, MemoryLogManager(), default_log_config_factory=lambda c: None)
    lg = _TruncatedDuringFlush()
    await asyncio.wait_for(rm._flush(("t", 0), lg, 10), timeout=2)
    assert lg.flushes == 1
