"""Regression (found by the chaos long run, seed 505: 7 lost writes and 11 two-values-at-one-
offset; reproduced by seed 606 and here by simulation seed 48 at fault_probability=0.02; seed 22
before the ISR expansion rule of issue 24 (one-way-answers), seed 29 before the simulation drove
the production replica core):
the only ISR member loses its unflushed tail in a crash and leads again with the shorter
log, so the replicas that still had the committed records truncate to it.

Sequence (seed 606, broker logs): a record is acknowledged with ISR [3, 2, 1]; broker 3 is
killed and broker 2 cut off, so the ISR shrinks to [1]; broker 1 is killed and its tail
torn; restarted, it is the last ISR member, so the controller elects it again; broker 3
truncates to broker 1's log: the acknowledged record is gone.

Fixed with KIP-966 (metadata_quorum/controller.py, partitions/replication/partition.py):
the leader holds the high watermark while the ISR is below min.insync.replicas, replicas
leaving the ISR then join the ELR (eligible leader replicas: they hold every committed
record), and a broker registering after an unclean shutdown leaves every ISR and ELR; when
nothing eligible is left, the controller elects the longest log among the last known
eligible replicas once all of them reported it.
"""
from __future__ import annotations

import pytest

from tests.sim.cluster_sim import SimConfig, Simulation, SimulationFailure

SEED = 48


def _config(report_unclean_shutdowns: bool) -> SimConfig:
    return SimConfig(steps=3000, fault_probability=0.02, report_unclean_shutdowns=report_unclean_shutdowns,
                     replica_fetch_silence_max_ms=None,  # the seed reaches the bug with the rules of its time
                     replica_silence_report_ms=None)


def test_without_unclean_shutdown_reports_the_torn_last_isr_member_loses_committed_records(tmp_path):
    """The scenario still bites when brokers claim every shutdown was clean (the old rule:
    the last ISR member leads again, whatever its log lost)."""
    with pytest.raises(SimulationFailure, match="committed data lost"):
        Simulation(SEED, _config(False), root=str(tmp_path)).run()


def test_eligible_leader_replicas_keep_every_committed_record(tmp_path):
    summary = Simulation(SEED, _config(True), root=str(tmp_path)).run()
    assert summary["acknowledged"] > 0 and summary.get("torn_tails", 0) > 0, summary
