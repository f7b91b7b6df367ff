"""The chaos report's longest window without an acknowledged write per fault kind (issue 24),
on a hand-made history: a fault's span runs to the next fault's start, gaps are per partition
and clipped to the span; and the combined-host isolation is a nemesis kind."""
from tests.chaos.harness.history import History
from tests.chaos.harness.nemesis import ALL_NEMESES, FaultRecord, IsolateHost
from tests.chaos.harness.report import windows_by_fault_kind


def _history(acks: dict) -> History:
    now = [0.0]
    h = History(clock=lambda: now[0])
    for (topic, p), times in acks.items():
        for t in times:
            now[0] = t - 0.01
            op = h.invoke(f"writer-{p}", "produce", topic=topic, partition=p, value=f"{p}-{t}")
            now[0] = t
            h.ok(op, offsets=[0])
    return h


def test_longest_window_per_kind_is_per_partition_and_clipped_to_the_fault_span():
    acks = {("t", 0): [1, 2, 3, 4, 9, 10, 11, 12, 13, 14, 15, 19, 20],
            ("t", 1): [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 16, 20]}
    faults = [FaultRecord("isolate-host", "host 1", 4.0, 6.0),     # span 4..10: t-0 silent 4 -> 9
              FaultRecord("kill-broker", "broker 2", 10.0, 12.0),  # span 10..18: t-1 silent 11 -> 16
              FaultRecord("isolate-host", "host 2", 18.0, 19.0)]   # span 18..20: 1 s at most
    h = _history(acks)
    h.now = lambda: 40.0                     # the final reads, long after the writers stopped
    h.ok(h.invoke("final-reader", "fetch", topic="t", partition=0, offset=0), records=[])
    out = windows_by_fault_kind(h, faults)   # the last span ends with the last produce (20 s)
    assert out["isolate-host"]["faults"] == 2
    assert out["isolate-host"]["max_s"] == 5.0 and out["isolate-host"]["worst"] == "t-0 at 4.0s"
    assert out["kill-broker"]["max_s"] == 5.0 and out["kill-broker"]["worst"] == "t-1 at 10.0s"
    assert out["isolate-host"]["faults"] == 2 and out["isolate-host"]["max_s"] == 5.0


def test_isolate_host_is_a_nemesis_kind():
    assert ALL_NEMESES["isolate-host"] is IsolateHost
