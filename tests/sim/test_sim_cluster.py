"""Seeded cluster simulation of the pure cores (see tests/sim/cluster_sim.py).

`make test` runs a few seeds of a few thousand steps (about a second each). Long mode:
    KRAFTLOG_SIM_SEEDS=500 KRAFTLOG_SIM_STEPS=20000 .venv/bin/python -m pytest -q tests/sim
Replay one failure (the seed is printed in the failure message):
    KRAFTLOG_SIM_SEED=1234 KRAFTLOG_SIM_STEPS=3000 .venv/bin/python -m pytest -q tests/sim/test_sim_cluster.py
"""
from __future__ import annotations

import os
import random

import pytest

from partitions.replication.partition import Partition
from partitions.replication.replica_state import ReplicaState
from tests.sim.cluster_sim import SimConfig, Simulation, SimulationFailure

DEFAULT_SEEDS = [11, 23, 42, 97, 314, 2718]
STEPS = int(os.environ.get("KRAFTLOG_SIM_STEPS", "2500"))


def _seeds() -> list[int]:
    if os.environ.get("KRAFTLOG_SIM_SEED"):
        return [int(os.environ["KRAFTLOG_SIM_SEED"])]
    n = int(os.environ.get("KRAFTLOG_SIM_SEEDS", "0"))
    if n:
        base = random.SystemRandom().randrange(10**9)
        return [base + i for i in range(n)]
    return DEFAULT_SEEDS


@pytest.mark.parametrize("seed", _seeds())
def test_simulated_cluster_keeps_every_invariant(seed, tmp_path):
    summary = Simulation(seed, SimConfig(steps=STEPS), root=str(tmp_path)).run()
    # the run exercised what it claims to: faults, leader changes, acknowledged writes
    assert summary["acknowledged"] > 0, summary
    assert summary["produce_ok"] > 0, summary


def test_same_seed_same_run(tmp_path):
    a = Simulation(5, SimConfig(steps=800), root=str(tmp_path / "a")).run()
    b = Simulation(5, SimConfig(steps=800), root=str(tmp_path / "b")).run()
    assert a == b


def test_faults_happen_and_leaders_change(tmp_path):
    totals: dict[str, int] = {}
    for seed in range(3):
        s = Simulation(seed, SimConfig(steps=3000, fault_probability=0.03), root=str(tmp_path / str(seed)))
        for k, v in s.run().items():
            if isinstance(v, int):
                totals[k] = totals.get(k, 0) + v
    assert totals["broker_crashes"] > 0 and totals["controller_failovers"] > 0, totals
    assert totals["messages_lost"] > 0 and totals["truncations"] > 0, totals
    assert totals["leader_epochs"] > 0, totals


def test_a_leader_ignoring_its_isr_is_caught(tmp_path, monkeypatch):
    """The invariants bite: a HW that ignores followers loses acknowledged records."""
    def hw_ignoring_isr(self):
        if not self.is_leader or self.local_log_end_offset <= self.high_watermark:
            return False
        self.high_watermark = self.local_log_end_offset
        return True

    monkeypatch.setattr(Partition, "maybe_increment_high_watermark", hw_ignoring_isr)
    failures = 0
    for seed in range(6):
        try:
            Simulation(seed, SimConfig(steps=2500, fault_probability=0.03, check_hw_within_isr=True),
                       root=str(tmp_path / str(seed))).run()
        except SimulationFailure as e:
            failures += 1
            assert f"seed {seed}" in str(e) and "KRAFTLOG_SIM_SEED=" in str(e)
    assert failures >= 3


def test_failure_message_names_the_seed_and_replay_command(tmp_path):
    sim = Simulation(77, SimConfig(steps=10), root=str(tmp_path))
    with pytest.raises(SimulationFailure) as err:
        sim.fail("planted")
    assert "seed 77" in str(err.value) and "KRAFTLOG_SIM_SEED=77" in str(err.value)


def test_without_the_incarnation_gate_a_restarted_leader_is_caught(tmp_path):
    """Seed 71: a leader restarts (torn tail) and, before its new registration is in the
    metadata, resumes its old incarnation's leadership with a reset high watermark: the
    bug of tests/chaos/test_regression_restarted_leader_truncates_followers.py."""
    with pytest.raises(SimulationFailure, match="HW went backwards|acknowledged record"):
        Simulation(71, SimConfig(steps=600, incarnation_gate=False, replica_fetch_silence_max_ms=None,
                                      replica_silence_report_ms=None),
                   root=str(tmp_path / "off")).run()
    Simulation(71, SimConfig(steps=600, replica_fetch_silence_max_ms=None, replica_silence_report_ms=None), root=str(tmp_path / "on")).run()


def test_a_broken_hw_rule_in_the_replica_core_fails_a_seed(tmp_path, monkeypatch):
    """The simulation has no replication rules of its own: it drives the broker's replica core
    (partitions/replication/replica_state.py). A core whose leader commits on its own write,
    whatever its ISR, fails a seed that passes with the real core (DEFAULT_SEEDS)."""
    real_append = ReplicaState.append_as_leader

    def append_committed_at_once(self, tp, batches, **kwargs):
        info, effects = real_append(self, tp, batches, **kwargs)
        part, lg = self.replica(tp)
        part.high_watermark = lg.log_end_offset          # the broken rule: no ISR member counts
        self._high_watermark_changed(tp, effects)
        return info, effects

    monkeypatch.setattr(ReplicaState, "append_as_leader", append_committed_at_once)
    with pytest.raises(SimulationFailure, match="above ISR member|committed data lost"):
        Simulation(11, SimConfig(steps=STEPS), root=str(tmp_path)).run()
