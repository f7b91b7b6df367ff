"""Issue 24: a silent network isolation of one combined-mode host (its active controller and
its broker together) must not stop any partition from taking acks=all writes for more than
3 s. Three network-namespace hosts (tests/rigs/netns.py), each running `kraftlog serve`
with its own config file; 3 partitions RF=3 min.insync.replicas=2; one idempotent acks=all
writer per partition following metadata; the host running the active controller (it also
leads a partition) is cut off for 20 s (packets dropped, no RST), then healed.

PENDING, NOT COLLECTED (its name has no test_ prefix): it fails today. Measured with
bench/availability_bench.py: 21.1-21.5 s per partition before the brokers' controller-client
fix (6b4ac42), 9.2-10.4 s after it; the rest waits for fencing faster than the 9 s broker
session (docs/AVAILABILITY.md, parts B and D). Rename it to tests/integration/
test_netns_isolation.py when it passes; run it now with
`python -m pytest tests/pending/netns_isolation_check.py`. Needs root (ip netns), like the bench.
"""
from __future__ import annotations

import os

import pytest

from bench.availability_bench import print_result, run_isolation

WINDOW_MAX_S = 3.0


@pytest.mark.timeout(600)
def test_isolating_the_active_controllers_host_keeps_every_partition_writable(tmp_path):
    assert os.geteuid() == 0, "this test builds network namespaces: run it as root"
    result = run_isolation(str(tmp_path), "controller", cut_s=20.0, warmup_s=3.0, after_s=12.0,
                           request_timeout_s=1.0)
    print_result(result)  # the timeline, for the failure report
    assert result.victim == result.active_before
    assert all(n > 0 for n in result.acked.values()), result.acked
    assert sum(result.lost.values()) == 0, f"acknowledged writes lost: {result.lost}"
    assert sum(result.duplicated.values()) == 0, f"duplicated writes: {result.duplicated}"
    windows = {p: round(w[0], 2) for p, w in result.windows.items()}
    assert all(w <= WINDOW_MAX_S for w in windows.values()), (
        f"longest window without an acknowledged write per partition {windows} s exceeds {WINDOW_MAX_S} s "
        f"(cut host {result.victim}, the active controller)")
