"""The controller's decision log at scale: a write of thousands of partition changes logs
DECISION_LOG_PARTITION_LINES_MAX lines and one line counting the rest (issue 25); fencing
lines are never left out (issue 24)."""
import logging

from metadata_quorum.controller_server import DECISION_LOG_PARTITION_LINES_MAX, _log_decisions
from metadata_quorum.records import FenceBrokerRecord, PartitionChangeRecord


def test_a_large_write_logs_a_bounded_number_of_partition_lines(caplog):
    caplog.set_level(logging.INFO, logger="kraftlog.controller")
    n = 3 * DECISION_LOG_PARTITION_LINES_MAX
    records = [FenceBrokerRecord(broker_id=1, broker_epoch=5)]
    before = {}
    for p in range(n):
        new_leader = 2 if p % 2 else 3
        records.append(PartitionChangeRecord("t", "id", p, (1, 2, 3), (new_leader,), new_leader, 1, 1))
        before[("t", p)] = (1, (1, 2, 3), (), (1, 2, 3))
    _log_decisions(records, before, "the probe was refused")
    lines = [r.getMessage() for r in caplog.records]
    assert sum(1 for m in lines if m.startswith("fenced broker 1 ")) == 1
    assert sum(1 for m in lines if m.startswith("t-")) == DECISION_LOG_PARTITION_LINES_MAX
    summary = [m for m in lines if m.startswith("... and ")]
    rest = n - DECISION_LOG_PARTITION_LINES_MAX
    assert summary == [f"... and {rest} more partition changes in the same write "
                       f"(leader 1 -> 2: {rest // 2}, leader 1 -> 3: {rest // 2}): the probe was refused"], summary


def test_a_small_write_logs_every_partition_line(caplog):
    caplog.set_level(logging.INFO, logger="kraftlog.controller")
    records = [PartitionChangeRecord("t", "id", p, (1, 2), (1,), 1, 0, 1) for p in range(5)]
    _log_decisions(records, {("t", p): (1, (1, 2), (), (1, 2)) for p in range(5)}, "AlterPartition from leader 1")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [f"t-{p}: isr [1, 2] -> [1]: AlterPartition from leader 1" for p in range(5)]
