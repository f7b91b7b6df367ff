"""Issue 24 measures a fault by itself: before the next fault the harness waits until the
cluster has recovered from the last one (harness/settle.py, Schedule.settle), records the
recovery time, and the report shows it per fault class next to the window, with the faults
that started after an unsettled one flagged and kill-several split by what it killed."""
from tests.chaos.harness.history import History
from tests.chaos.harness.nemesis import FaultRecord, Schedule
from tests.chaos.harness.report import windows_by_fault_kind, windows_table
from tests.chaos.harness.settle import SettleSnapshot, fault_class, unsettled_reasons


def _metadata(isr=(1, 2, 3), fenced=(), leader=1):
    return {"brokers": [{"id": i, "fenced": i in fenced} for i in (1, 2, 3)],
            "topics": [{"name": "chaos", "partitions": [
                {"partition": 0, "leader": leader, "replicas": [1, 2, 3], "isr": list(isr)},
                {"partition": 1, "leader": 2, "replicas": [2, 3, 1], "isr": [2, 3, 1]}]}]}


def _snapshot(**kw) -> SettleSnapshot:
    base = dict(broker_ids=[1, 2, 3], processes_up={(r, i): True for r in ("controller", "broker") for i in (1, 2, 3)},
                healthy_brokers={1, 2, 3}, active_controller=2, metadata=_metadata())
    base.update(kw)
    return SettleSnapshot(**base)


def test_settled_needs_processes_unfenced_brokers_full_isrs_and_an_active_controller():
    assert unsettled_reasons(_snapshot()) == []
    up = {**_snapshot().processes_up, ("broker", 3): False}
    assert unsettled_reasons(_snapshot(processes_up=up, healthy_brokers={1, 2})) == [
        "broker 3 not running", "broker 3 not answering /healthz"]
    assert unsettled_reasons(_snapshot(active_controller=None)) == ["no active controller"]
    assert unsettled_reasons(_snapshot(metadata=None)) == ["active controller 2 gave no metadata"]
    assert unsettled_reasons(_snapshot(metadata=_metadata(fenced=(3,)))) == ["broker 3 fenced"]
    md = _metadata()
    md["brokers"] = md["brokers"][:2]
    assert unsettled_reasons(_snapshot(metadata=md)) == ["broker 3 not registered"]
    assert unsettled_reasons(_snapshot(metadata=_metadata(isr=(1, 2)))) == ["chaos-0 ISR [1, 2] lacks [3]"]
    assert unsettled_reasons(_snapshot(metadata=_metadata(leader=-1))) == ["chaos-0 has no leader"]


class _FakeCluster:
    """Unsettled (broker 3 fenced) for the first `polls_unsettled` snapshots."""

    def __init__(self, polls_unsettled: int):
        self.left = polls_unsettled
        self.polls = 0

    def settle_snapshot(self):
        self.polls += 1
        self.left -= 1
        return _snapshot(metadata=_metadata(fenced=(3,))) if self.left >= 0 else _snapshot()


class _Clock:
    def __init__(self, t=10.0):
        self.t = t
        self.waits = []

    def __call__(self):
        return self.t

    def wait(self, s):
        self.waits.append(round(s, 3))
        self.t += s
        return False


def test_settle_waits_for_recovery_and_records_it_then_keeps_the_quiet_time_as_a_minimum():
    sched, clock = Schedule(seed=1, settle_max_s=60.0, settle_poll_s=0.5), _Clock()
    rec = FaultRecord("kill-broker", "kill -9 broker 3", 5.0, 10.0)
    sched.settle(_FakeCluster(polls_unsettled=8), rec, quiet_s=1.0, clock=clock, wait=clock.wait)
    assert rec.settled is True and rec.recovery_s == 4.0 and clock.t == 14.0   # 8 polls of 0.5 s, no extra quiet
    rec2, clock2 = FaultRecord("pause-broker", "SIGSTOP broker 1", 5.0, 10.0), _Clock()
    sched.settle(_FakeCluster(polls_unsettled=0), rec2, quiet_s=1.5, clock=clock2, wait=clock2.wait)
    assert rec2.settled is True and rec2.recovery_s == 0.0 and clock2.t == 11.5   # the rest of the quiet time


def test_settle_is_bounded_and_says_what_was_missing():
    sched, clock = Schedule(seed=1, settle_max_s=3.0, settle_poll_s=0.5), _Clock()
    rec = FaultRecord("lost-tail", "broker 3", 5.0, 10.0)
    sched.settle(_FakeCluster(polls_unsettled=1000), rec, quiet_s=1.0, clock=clock, wait=clock.wait)
    assert rec.settled is False and rec.recovery_s is None and rec.unsettled == ["broker 3 fenced"]
    assert clock.t == 13.0
    no_wait = Schedule(seed=1, settle_max_s=0)
    rec3, clock3, fake = FaultRecord("kill-broker", "broker 1", 5.0, 10.0), _Clock(), _FakeCluster(5)
    no_wait.settle(fake, rec3, quiet_s=1.0, clock=clock3, wait=clock3.wait)
    assert rec3.settled is None and fake.polls == 0 and clock3.t == 11.0


def test_kill_several_is_split_by_what_it_killed():
    assert fault_class("kill-several", "kill -9 broker 1, broker 3") == "kill-several/2-brokers"
    assert fault_class("kill-several", "kill -9 broker 2, controller 1") == "kill-several/broker+controller"
    assert fault_class("kill-broker", "kill -9 broker 2") == "kill-broker"


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


def test_report_columns_recovery_unsettled_predecessors_and_the_excluded_class():
    h = _history({("t", 0): [float(t) for t in range(0, 41)]})
    f1 = FaultRecord("kill-several", "kill -9 broker 1, broker 2", 1.0, 2.0, settled=False, unsettled=["x"])
    f2 = FaultRecord("kill-broker", "kill -9 broker 3", 10.0, 11.0, settled=True, recovery_s=4.5)
    f3 = FaultRecord("kill-broker", "kill -9 broker 1", 20.0, 21.0, settled=True, recovery_s=2.5)
    f4 = FaultRecord("kill-several", "kill -9 broker 2, controller 1", 30.0, 31.0, settled=True, recovery_s=1.0)
    out = windows_by_fault_kind(h, [f1, f2, f3, f4])
    assert set(out) == {"kill-several/2-brokers", "kill-several/broker+controller", "kill-broker"}
    kb = out["kill-broker"]
    assert (kb["faults"], kb["recovery_max_s"], kb["recovery_p50_s"]) == (2, 4.5, 4.5)
    assert kb["after_unsettled"] == 1 and kb["after_unsettled_at"] == ["10.0s (1.00 s)"]
    two = out["kill-several/2-brokers"]
    assert two["not_settled"] == 1 and two["recovery_max_s"] is None and "min.insync.replicas=2" in two["excluded"]
    assert "excluded" not in out["kill-several/broker+controller"]
    table = "\n".join(windows_table(out))
    assert "| kill-several/2-brokers (excluded) | 1 |" in table
    assert "| kill-broker | 2 | 1.00 | 1.00 | 4.50 | 4.50 | 0 | 1 at 10.0s (1.00 s) |" in table


def test_settled_also_needs_an_acknowledged_write_on_every_partition_since_the_heal():
    from tests.chaos.harness.settle import AckTracker
    now = [0.0]
    h = History(clock=lambda: now[0])
    for t, p in [(1.0, 0), (1.0, 1), (2.0, 0), (2.0, 1), (12.0, 0)]:   # in time order, as a live history
        now[0] = t - 0.01
        op = h.invoke(f"writer-{p}", "produce", topic="t", partition=p, value=str(t))
        now[0] = t
        h.ok(op, offsets=[0])
    tracker = AckTracker(h)
    assert tracker.missing_since(10.0) == [("t", 1)]
    assert tracker.missing_since(1.5) == []
    sched, clock = Schedule(seed=1, settle_max_s=2.0, settle_poll_s=0.5), _Clock()
    rec = FaultRecord("kill-broker", "kill -9 broker 3", 5.0, 10.0)
    sched.settle(_FakeCluster(polls_unsettled=0), rec, quiet_s=1.0, clock=clock, wait=clock.wait,
                 writes=tracker.missing_since)
    assert rec.settled is False and rec.unsettled == ["t-1 no acknowledged write since the heal"]
