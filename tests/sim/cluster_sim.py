"""A seeded, deterministic simulation of kraftlog's pure cores wired as a cluster.

What runs for real: `partitions.log.Log` (one per broker, in a temp dir), the broker's pure
replica core `partitions.replication.replica_state.ReplicaState` (the very code
`ReplicaManager` drives: role changes, appends, follower fetch positions, the HW and the
acks=all waiters it completes or fails, follower appends and truncation) with its
`Partition`s, the follower's `truncation_step` (KIP-279), the pure
`metadata_quorum.controller.QuorumController` deciding records and
`metadata_quorum.state_machine.MetadataStateMachine` applying them (the raft layer is
replaced by direct, ordered application; a controller failover is a new controller object
with fresh soft state and a new epoch, as after a raft election).

What is simulated: time (`now_ms`), a network between brokers, the controller and one
producer (loss, random delay = reordering, cut links), broker crashes (kill -9: the
process state is gone, the files stay, sometimes with a torn tail, the log is recovered
on restart) and restarts with a new incarnation that registers over the network (so the
restarted broker sees the old incarnation's metadata first), controller failovers. What is left
here is the IO shell's part (the replica manager's futures and the fetcher's requests
become messages): metadata goes to `apply_leader_and_isr`, a new follower asks the leader
for its epoch end offset and truncates there, then fetches; the leader proposes the ISR
changes the core suggests through AlterPartition; the `Effects` the core returns say which
producers to answer.

Invariants are checked after every step (see `check_invariants`); the first violation
raises `SimulationFailure` carrying the seed and the step, so
`KRAFTLOG_SIM_SEED=<seed> pytest tests/sim` replays it exactly. At the end the network
heals, every broker restarts, the cluster converges, and the producer history goes
through the chaos history checker (no acknowledged write lost, no duplicates, ...).
"""
from __future__ import annotations

import collections
import contextlib
import heapq
import logging
import os
import random
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any, Optional

from partitions.errors import KraftlogError
from metadata_quorum.controller import ControllerSettings, QuorumController
from metadata_quorum.records import LeaderChangeRecord, entry_items
from metadata_quorum.state_machine import MetadataStateMachine
from partitions.log.config import LogConfig
from partitions.log.log import Log
from partitions.log.record_batch import Record, build_batch, decode_batches
from partitions.log import errors as log_errors
from partitions.log.protocols import TopicPartition
from partitions.replication.fetcher_state import truncation_step
from partitions.replication.partition import Partition
from partitions.replication.replica_state import Effects, LeaderAndIsr, ReplicaState
from tests.chaos.harness.checker import check as check_history
from tests.chaos.harness.history import History

TOPIC = "t"
TP = TopicPartition(TOPIC, 0)
CONTROLLER = 0
PRODUCER = -1


class SimulationFailure(AssertionError):
    pass


@dataclass(eq=False)
class AckWaiter:
    """A produce request waiting for the HW (the token the replica core keeps)."""

    op: Any
    offsets: list[int]
    deadline_ms: int


@dataclass
class SimConfig:
    """Named knobs of one simulation run (time in ms, probabilities per event)."""

    brokers: int = 3
    min_insync_replicas: int = 2
    steps: int = 2000
    step_ms: int = 10
    message_loss: float = 0.02
    delay_ms_max: int = 60
    fault_probability: float = 0.01
    produce_probability: float = 0.3
    fetch_interval_ms: int = 20
    heartbeat_interval_ms: int = 100
    isr_check_interval_ms: int = 50
    metadata_push_interval_ms: int = 50
    maintenance_interval_ms: int = 100
    replica_lag_time_max_ms: int = 500
    # the leader drops an ISR member silent this long while acks=all produces wait for it
    # (the broker's replica_fetch_silence_max_ms, on by default there too); None: off
    replica_fetch_silence_max_ms: Optional[int] = 150
    session_timeout_ms: int = 900
    produce_timeout_ms: int = 1500
    # Kafka's rule: the HW never passes the LEO of a member of the leader's ISR. Off, only
    # the consequence (acknowledged records lost after a leader change) is checked. On by
    # default since the leader counts pending ISR expansions (Kafka's "maximal ISR");
    # see tests/sim/test_regression_isr_expansion_hw.py.
    check_hw_within_isr: bool = True
    # a leader asks again when its AlterPartition got no answer within this time (as the
    # broker's _isr_loop does since tests/chaos/test_regression_alter_partition_retry.py)
    alter_partition_retry_ms: int = 300
    # a crash tears the last bytes of the active segment (power loss / torn write) with this
    # probability, the only ISR member included (KIP-966: the ELR still has every committed
    # record), as long as one other ISR/ELR/last-known-ELR member is intact (not torn since
    # it was last in the ISR): losing every copy is a double fault no replication survives
    torn_tail_probability: float = 0.3
    # a restarted broker ignores partition state until the metadata holds its new
    # registration (the broker's incarnation gate, 6c3f54a; off = the race of
    # tests/chaos/test_regression_restarted_leader_truncates_followers.py)
    incarnation_gate: bool = True
    # a broker restarting after a crash registers with clean_shutdown=False, so it never
    # leads from a shrunken ISR on its own (KIP-966; off = the bug of chaos seeds 505/606,
    # tests/sim/test_regression_torn_last_isr_member.py)
    report_unclean_shutdowns: bool = True
    # AlterPartition names the registration whose fetches made each member look in sync and
    # the controller refuses re-registered ones (KIP-903; off = a leader counting the fetches
    # of a follower's previous process adds the restarted follower, shorter log and all, to
    # the ISR: simulation seed 60 at fault_probability=0.02)
    isr_broker_epochs: bool = True
    # issue 24 part B: brokers report a peer silent this long (a follower whose fetches
    # stopped, a leader that stopped answering) and the controller fences a reported broker it
    # had no heartbeat from for `broker_silence_fence_ms` once its probe fails (in the
    # simulation: the broker is down or its links with the controller are cut); part D: a
    # leader without an answered heartbeat for the session minus one heartbeat interval and
    # with a silent follower suspends its leadership. None: both off
    replica_silence_report_ms: Optional[int] = 100
    broker_silence_fence_ms: int = 150


@dataclass
class SimBroker:
    id: int
    dir: str
    alive: bool = True
    incarnation: int = 0
    broker_epoch: int = -1
    log: Optional[Log] = None
    core: Optional[ReplicaState] = None   # the broker process's replica core (production code)
    part: Optional[Partition] = None      # its one partition (the core's object)
    meta_offset: int = 0
    needs_truncation: bool = False
    inflight_until: int = -1          # one fetch / epoch request at a time
    pending_alter_epoch: int = -1
    pending_alter_until: int = -1
    registered: bool = False
    last_register_ms: int = -10**9
    last_fetch_ms: int = -10**9
    last_hb_ms: int = -10**9
    last_isr_ms: int = -10**9
    torn: bool = False                # tail torn at a crash, not in the ISR since
    last_leader_answer_ms: int = 0    # follower: when its leader last answered (issue 24 B)
    last_hb_ok_ms: int = 0            # when the controller last answered a heartbeat (issue 24 D)
    reported: dict = field(default_factory=dict)   # peer -> when reported silent


@contextlib.contextmanager
def _no_fsync():
    """The simulation tests logic, not the disk: fsync is a no-op while it runs."""
    import partitions.log.segment as segment

    saved = (segment._fdatasync, os.fsync)
    segment._fdatasync = lambda fd: None
    os.fsync = lambda fd: None
    log = logging.getLogger("partitions.log")   # torn tails are expected here: no warnings
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        segment._fdatasync, os.fsync = saved
        log.setLevel(level)


class SimClock:
    """The simulation's virtual time as a `partitions.clock.Clock` (both clocks are `now`)."""

    def __init__(self, sim: "Simulation") -> None:
        self._sim = sim

    def now_ms(self) -> int:
        return self._sim.now

    def monotonic_ms(self) -> int:
        return self._sim.now


class Simulation:
    """One seeded run. `run()` returns a summary dict or raises SimulationFailure."""

    def __init__(self, seed: int, config: Optional[SimConfig] = None, root: Optional[str] = None):
        self.seed = seed
        self.cfg = config or SimConfig()
        self.rng = random.Random(seed)
        self.now = 0
        self.clock = SimClock(self)
        self.step_no = 0
        self._own_root = root is None
        self.root = root or tempfile.mkdtemp(prefix=f"kraftlog-sim-{seed}-")
        self.net: list = []           # heap of (deliver_at, seq, src, dst, kind, payload)
        self.seq = 0
        self.cut: set[tuple[int, int]] = set()
        self.history = History(clock=lambda: self.now / 1000.0)
        self.value_no = 0
        self.stats: dict[str, int] = {}
        self.trace: collections.deque = collections.deque(maxlen=200)
        # invariant bookkeeping
        self.epoch_leader: dict[int, int] = {}      # leader epoch -> broker that led it
        self.was_awaiting_recovery = False
        self.hw_seen: dict[tuple[int, int], int] = {}  # (broker, leader epoch) -> HW
        self.committed: dict[int, str] = {}          # offset -> value acknowledged to the producer
        self.broker_epochs: dict[int, int] = {}
        self.last_partition_epoch = -1
        self.last_leader_epoch = -1
        self.verified: dict[tuple[int, int], int] = {}
        # metadata
        self.sm = MetadataStateMachine("sim")
        self.controller_epoch = 0
        self.controller: QuorumController
        self.last_maintenance = 0
        self.last_push = 0

    # ================================================================ plumbing
    def count(self, what: str, n: int = 1) -> None:
        self.stats[what] = self.stats.get(what, 0) + n

    def note(self, event: str) -> None:
        self.trace.append(f"t={self.now} {event}")

    def fail(self, message: str) -> None:
        tail = "\n  ".join(list(self.trace)[-40:])
        raise SimulationFailure(f"[seed {self.seed} step {self.step_no} t={self.now}ms] {message}\n"
                                f"last events:\n  {tail}\n"
                                f"replay: KRAFTLOG_SIM_SEED={self.seed} KRAFTLOG_SIM_STEPS={self.cfg.steps} "
                                f".venv/bin/python -m pytest -q tests/sim")

    @property
    def image(self):
        return self.sm.image

    def propose(self, records: list) -> bool:
        if not records:
            return True
        entry = {"request_id": None, "controller_epoch": self.controller_epoch,
                 "records": entry_items(records)}
        res = self.sm.apply([entry])[0]
        self.count("metadata_batches")
        return bool(res.get("ok"))

    def new_controller(self) -> None:
        """A controller failover: fresh soft state (sessions), next epoch, leader change record."""
        self.controller_epoch += 1
        silence = self.cfg.replica_silence_report_ms
        settings = ControllerSettings(broker_session_timeout_ms=self.cfg.session_timeout_ms,
                                      auto_leader_rebalance_enable=False,
                                      broker_silence_fence_ms=self.cfg.broker_silence_fence_ms if silence else 0,
                                      broker_silence_report_max_age_ms=3 * (silence or 100))
        self.controller = QuorumController(settings, random.Random(self.rng.getrandbits(32)))
        assert self.propose([LeaderChangeRecord(1, self.controller_epoch)])
        self.controller.reset_sessions(self.image, self.now)

    def send(self, src: int, dst: int, kind: str, payload: Any) -> None:
        if (src, dst) in self.cut or self.rng.random() < self.cfg.message_loss:
            self.count("messages_lost")
            return
        at = self.now + self.rng.randint(1, self.cfg.delay_ms_max)
        self.seq += 1
        # a message to a broker travels on a connection to one process incarnation
        inc = self.brokers[dst].incarnation if dst > 0 else 0
        heapq.heappush(self.net, (at, self.seq, src, (dst, inc), kind, payload))

    def broker(self, b: int) -> SimBroker:
        return self.brokers[b]

    def reg(self):
        return self.image.partition(TOPIC, 0)

    # ================================================================ setup
    def setup(self) -> None:
        self.brokers = {b: SimBroker(b, os.path.join(self.root, f"b{b}", f"{TOPIC}-0"))
                        for b in range(1, self.cfg.brokers + 1)}
        self.new_controller()
        for b in self.brokers.values():
            self.start_broker(b)
            self.register(b)
            self.propose(self.controller.heartbeat(self.image, b.id, b.broker_epoch, self.image.offset, self.now))
        records = self.controller.create_topic(self.image, TOPIC, 1, self.cfg.brokers,
                                               {"min.insync.replicas": str(self.cfg.min_insync_replicas)})
        assert self.propose(records)
        self.push_metadata(force=True)

    def start_broker(self, b: SimBroker) -> None:
        b.alive = True
        b.incarnation += 1
        b.log = Log.open(b.dir, LogConfig(segment_bytes=4096), clock=self.clock)
        b.core = ReplicaState(b.id, min_isr_for=lambda topic: self.cfg.min_insync_replicas)
        b.part = b.core.add_replica(TP, b.log)
        b.needs_truncation = False
        b.inflight_until = -1
        b.pending_alter_epoch = -1
        b.meta_offset = 0
        b.registered = False
        b.broker_epoch = -1
        b.last_register_ms = -10**9
        b.last_hb_ok_ms = b.last_leader_answer_ms = self.now
        b.reported = {}
        self.note(f"b{b.id} starts: LEO {b.log.log_end_offset}, partition {self.reg()}")

    def incarnation_id(self, b: SimBroker) -> str:
        return f"inc-{b.id}-{b.incarnation}"

    def register(self, b: SimBroker) -> int:
        """The controller side of a registration (idempotent for the same incarnation)."""
        records = self.controller.register_broker(self.image, b.id, self.incarnation_id(b), f"http://b{b.id}",
                                                  None, self.now,
                                                  clean_shutdown=b.incarnation == 0 or not self.cfg.report_unclean_shutdowns)
        assert self.propose(records)
        reg = self.image.brokers[b.id]
        if b.alive and reg.incarnation_id == self.incarnation_id(b):
            b.registered, b.broker_epoch = True, reg.epoch
        return reg.epoch

    def crash_broker(self, b: SimBroker) -> None:
        b.alive = False
        self.note(f"b{b.id} crashes (LEO {b.log.log_end_offset})")
        b.log.close_without_flush()   # the producers waiting on it will time out
        self.count("broker_crashes")
        reg = self.reg()
        if reg is not None:
            for o in reg.isr:   # back in the ISR as its current process: has every committed record
                ob, registered = self.brokers[o], self.image.brokers.get(o)
                if ob.alive and registered is not None and registered.incarnation_id == self.incarnation_id(ob):
                    ob.torn = False
        eligible = set(reg.isr) | set(reg.elr) | set(reg.last_known_elr) if reg else set()
        intact = [o for o in eligible - {b.id} if not self.brokers[o].torn]
        if self.rng.random() < self.cfg.torn_tail_probability and intact:
            segs = sorted(f for f in os.listdir(b.dir) if f.endswith(".log"))
            path = os.path.join(b.dir, segs[-1]) if segs else None
            if path and os.path.getsize(path) > 0:
                cut = self.rng.randint(1, min(30, os.path.getsize(path)))
                with open(path, "r+b") as f:
                    f.truncate(os.path.getsize(path) - cut)
                self.count("torn_tails")
                b.torn = True
                if b.id in reg.isr and len(reg.isr) == 1:
                    self.count("torn_tails_of_last_isr_member")
                self.note(f"b{b.id}: last {cut} bytes of {segs[-1]} torn")

    # ================================================================ metadata
    def push_metadata(self, force: bool = False) -> None:
        """Brokers long-poll the controller; modelled as pushes of the partition state
        (lossy, delayed, reorderable: brokers ignore stale epochs)."""
        reg = self.reg()
        if reg is None:
            return
        state = (tuple(reg.replicas), tuple(reg.isr), reg.leader, reg.leader_epoch, reg.partition_epoch,
                 self.image.offset, {bid: br.incarnation_id for bid, br in self.image.brokers.items()})
        for b in self.brokers:
            self.send(CONTROLLER, b, "metadata", state)

    def apply_metadata(self, b: SimBroker, state) -> None:
        replicas, isr, leader, leader_epoch, partition_epoch, offset, incarnations = state
        b.meta_offset = max(b.meta_offset, offset)
        # the broker's incarnation gate: a leadership in metadata that lacks this process's
        # registration is the previous incarnation's (the core does not take it up)
        registered = not self.cfg.incarnation_gate or incarnations.get(b.id) == self.incarnation_id(b)
        before = (b.part.leader_id, b.part.leader_epoch, b.part.partition_epoch)
        effects = b.core.apply_leader_and_isr(
            TP, LeaderAndIsr(leader, leader_epoch, tuple(replicas), tuple(isr), partition_epoch),
            now_ms=self.now, registered=registered)
        if b.part.leader_id != before[0]:
            b.last_leader_answer_ms = self.now   # a new leader: its silence counts from now
        if (b.part.leader_id, b.part.leader_epoch, b.part.partition_epoch) != before:
            self.note(f"b{b.id} applies metadata {state} (LEO {b.log.log_end_offset}, HW {b.part.high_watermark})")
        self.carry_out(b, effects)

    def carry_out(self, b: SimBroker, effects: Effects) -> None:
        """What the replica manager does with the core's Effects, as messages."""
        for w in effects.completed:
            for o, v in zip(w.offsets, w.op.value["values"]):
                self.committed[o] = v
            self.send(b.id, PRODUCER, "produce_ok", (w.op.id, w.offsets))
        for w, error in effects.failed:  # written on this leader: the outcome is unknown
            self.send(b.id, PRODUCER, "produce_unknown", (w.op.id, f"{error.code.name} after append"))
        if TP in effects.start_truncation:
            b.needs_truncation = True
            b.inflight_until = -1

    # ================================================================ broker behaviour
    def broker_tick(self, b: SimBroker) -> None:
        part = b.part
        if not b.registered:
            if self.now - b.last_register_ms >= self.cfg.heartbeat_interval_ms:
                b.last_register_ms = self.now
                self.send(b.id, CONTROLLER, "register", (b.id, self.incarnation_id(b)))
        elif self.now - b.last_hb_ms >= self.cfg.heartbeat_interval_ms:
            b.last_hb_ms = self.now
            self.send(b.id, CONTROLLER, "heartbeat", (b.id, b.broker_epoch, b.meta_offset, b.part.partition_epoch,
                                                      b.log.latest_epoch, b.log.log_end_offset))
        if part.is_leader and self.now - b.last_isr_ms >= self.cfg.isr_check_interval_ms:
            b.last_isr_ms = self.now
            # the broker's path: proposed additions count for the HW until metadata answers
            changes = b.core.isr_changes(self.now, lambda topic: self.cfg.replica_lag_time_max_ms,
                                          replica_fetch_silence_max_ms=self.cfg.replica_fetch_silence_max_ms)
            new_isr = changes[0][1] if changes else None
            if new_isr is not None and (b.pending_alter_epoch != part.partition_epoch
                                        or self.now >= b.pending_alter_until):
                b.pending_alter_epoch = part.partition_epoch
                b.pending_alter_until = self.now + self.cfg.alter_partition_retry_ms
                epochs = part.broker_epochs(new_isr) if self.cfg.isr_broker_epochs else None
                self.send(b.id, CONTROLLER, "alter", (b.id, b.broker_epoch, part.leader_epoch,
                                                       part.partition_epoch, new_isr, epochs))
        if not part.is_leader and part.leader_id > 0 and self.now >= b.inflight_until \
                and self.now - b.last_fetch_ms >= self.cfg.fetch_interval_ms:
            b.last_fetch_ms = self.now
            b.inflight_until = self.now + 4 * self.cfg.delay_ms_max
            if b.needs_truncation:
                self.send(b.id, part.leader_id, "epoch_req", (part.leader_epoch, b.log.latest_epoch))
            else:
                self.send(b.id, part.leader_id, "fetch", (part.leader_epoch, b.log.log_end_offset, b.broker_epoch))
        if part.is_leader:
            self.expire_waiters(b)
        if self.cfg.replica_silence_report_ms and b.registered:
            self.silence_tick(b)

    def silence_tick(self, b: SimBroker) -> None:
        """Issue 24 parts B and D on one broker: report silent peers (at most once per
        interval each) and suspend the leadership while isolated."""
        limit = self.cfg.replica_silence_report_ms
        part = b.part
        silent = dict(b.core.silent_followers(self.now, limit))
        if not part.is_leader and part.leader_id > 0 and self.now - b.last_leader_answer_ms > limit:
            silent[part.leader_id] = self.now - b.last_leader_answer_ms
        for target in silent:
            if target != b.id and self.now - b.reported.get(target, -10**9) >= limit:
                b.reported[target] = self.now
                self.send(b.id, CONTROLLER, "silent", (b.id, b.broker_epoch, target))
        if part.is_leader:
            was = TP in b.core.suspended
            self.carry_out(b, b.core.update_isolation(
                self.now, self.now - b.last_hb_ok_ms,
                leader_lease_ms=self.cfg.session_timeout_ms - self.cfg.heartbeat_interval_ms,
                replica_silence_report_ms=limit))
            if (TP in b.core.suspended) != was:
                self.note(f"b{b.id} leadership {'suspended' if not was else 'resumed'} (isolation)")
                self.count("leaderships_suspended" if not was else "leaderships_resumed")

    def fence_silent_brokers(self) -> None:
        """The controller's side of part B: probe every broker it counts as silent (the probe
        fails when the broker is down or cut from the controller) and fence it then."""
        for target in self.controller.silent_brokers(self.image, self.now):
            t = self.brokers[target]
            if t.alive and (CONTROLLER, target) not in self.cut and (target, CONTROLLER) not in self.cut:
                continue
            epoch = self.image.brokers[target].epoch
            if self.propose(self.controller.fence_silent(self.image, target, epoch, self.now)):
                self.note(f"controller fences b{target} for silence")
                self.count("fenced_for_silence")

    def expire_waiters(self, b: SimBroker) -> None:
        for w in b.core.ack_waiters(TP):
            if self.now >= w.deadline_ms:
                b.core.remove_ack_waiter(TP, w)
                self.send(b.id, PRODUCER, "produce_unknown", (w.op.id, "REQUEST_TIMED_OUT"))

    # ================================================================ message handling
    def deliver(self, src: int, dst: int, kind: str, payload: Any) -> None:
        self.count(f"msg_{kind}")
        if kind not in ("heartbeat", "metadata", "produce", "produce_ok") and not (kind == "fetch_resp" and not payload[2]):
            self.note(f"{src}->{dst} {kind} {payload if kind != 'fetch_resp' else payload[:2] + payload[3:]}")
        if dst == CONTROLLER:
            return self.controller_receive(src, kind, payload)
        if dst == PRODUCER:
            return self.producer_receive(kind, payload)
        b = self.broker(dst)
        if not b.alive:
            return
        part, lg = b.part, b.log
        if src == part.leader_id:
            b.last_leader_answer_ms = self.now
        if kind == "metadata":
            self.apply_metadata(b, payload)
        elif kind == "hb_ok":
            b.last_hb_ok_ms = self.now
        elif kind == "registered":
            inc, epoch = payload
            if inc == self.incarnation_id(b) and not b.registered:
                b.registered, b.broker_epoch = True, epoch
                self.note(f"b{b.id} registered: broker epoch {epoch}")
        elif kind == "produce":
            op = payload
            if not part.is_leader:
                return self.send(b.id, PRODUCER, "produce_fail", (op.id, "NOT_LEADER_OR_FOLLOWER"))
            batch = build_batch([Record(None, v.encode(), timestamp=self.now) for v in op.value["values"]])
            try:
                info, effects = b.core.append_as_leader(TP, batch, required_min_isr=self.cfg.min_insync_replicas)
            except KraftlogError as e:   # NOT_ENOUGH_REPLICAS: nothing written
                return self.send(b.id, PRODUCER, "produce_fail", (op.id, e.code.name))
            self.carry_out(b, effects)
            waiter = AckWaiter(op, list(range(info.first_offset, info.last_offset + 1)),
                               self.now + self.cfg.produce_timeout_ms)
            self.carry_out(b, b.core.add_ack_waiter(TP, waiter, info.last_offset))
        elif kind == "epoch_req":
            leader_epoch, epoch = payload
            try:
                answer = b.core.epoch_end_offset(TP, epoch, leader_epoch)
            except KraftlogError:
                return self.send(b.id, src, "error", (leader_epoch,))
            self.send(b.id, src, "epoch_resp", (leader_epoch, answer))
        elif kind == "fetch":
            leader_epoch, offset, follower_broker_epoch = payload
            b.core.fetch_request_from(src, self.now)   # as ReplicaManager does for every fetch request
            if part.is_leader and part.leader_epoch == leader_epoch and offset > lg.log_end_offset:
                # cannot happen after truncation: the follower is ahead
                self.fail(f"broker {src} fetches offset {offset} beyond leader {b.id}'s LEO {lg.log_end_offset} "
                          f"in epoch {leader_epoch}")
            try:
                res, effects = b.core.replica_read(TP, replica_id=src, offset=offset, leader_epoch=leader_epoch,
                                                   max_bytes=2048, now_ms=self.now,
                                                   broker_epoch=follower_broker_epoch)
            except KraftlogError:
                return self.send(b.id, src, "error", (leader_epoch,))
            self.carry_out(b, effects)
            self.send(b.id, src, "fetch_resp", (leader_epoch, offset, res.records, res.high_watermark))
        elif kind == "error":
            if not part.is_leader and payload[0] == part.leader_epoch:
                b.inflight_until = -1
        elif kind == "epoch_resp":
            leader_epoch, (epoch, end) = payload
            if part.is_leader or part.leader_epoch != leader_epoch or not b.needs_truncation:
                return
            b.inflight_until = -1
            # the fetcher's KIP-279 step: not done = truncate, then ask again for our new latest epoch
            offset, done = truncation_step(lg.log_end_offset, lg.end_offset_for_epoch, epoch, end)
            b.core.follower_truncate(TP, leader_epoch, offset)
            if not done:
                return
            b.needs_truncation = False
            self.note(f"b{b.id} truncated to {lg.log_end_offset}")
            self.count("truncations")
        elif kind == "fetch_resp":
            leader_epoch, offset, data, hw = payload
            if part.is_leader or part.leader_epoch != leader_epoch or b.needs_truncation \
                    or offset != lg.log_end_offset:
                return
            b.inflight_until = -1
            try:
                b.core.follower_append(TP, leader_epoch, data, hw)
            except (log_errors.OffsetMismatchError, log_errors.CorruptRecordError):
                b.needs_truncation = True   # the leader's batches do not continue our log

    def controller_receive(self, src: int, kind: str, payload: Any) -> None:
        try:
            if kind == "register":
                bid, inc = payload
                b = self.brokers[bid]
                if inc == self.incarnation_id(b):
                    self.send(CONTROLLER, bid, "registered", (inc, self.register(b)))
                return
            if kind == "heartbeat":
                bid, epoch, offset, partition_epoch, last_epoch, leo = payload
                report = [{"topic": TOPIC, "partition": 0, "partition_epoch": partition_epoch,
                           "last_epoch": last_epoch, "log_end_offset": leo}]
                self.propose(self.controller.heartbeat(self.image, bid, epoch, offset, self.now, log_reports=report))
                if self.cfg.replica_silence_report_ms:   # (no extra message, no extra rng draw when off)
                    self.send(CONTROLLER, bid, "hb_ok", None)
            elif kind == "silent":
                reporter, epoch, target = payload
                self.controller.report_silent(self.image, reporter, epoch, target, self.now)
            elif kind == "alter":
                bid, epoch, leader_epoch, partition_epoch, new_isr, epochs = payload
                ok = self.propose(self.controller.alter_partition(self.image, bid, epoch, TOPIC, 0, leader_epoch,
                                                                  partition_epoch, new_isr, epochs))
                self.count("alter_partition_ok" if ok else "alter_partition_conflict")
        except KraftlogError as e:
            self.count(f"controller_{e.code.name if hasattr(e.code, 'name') else e.code}")

    def producer_receive(self, kind: str, payload: Any) -> None:
        op = self.history.ops[payload[0]]
        if op.type is not None:
            return
        if kind == "produce_ok":
            self.history.ok(op, offsets=payload[1])
        elif kind == "produce_fail":
            self.history.fail(op, payload[1])
        else:
            self.history.info(op, payload[1])

    # ================================================================ producer & faults
    def produce(self) -> None:
        reg = self.reg()
        target = reg.leader if reg.leader > 0 else self.rng.choice(list(self.brokers))
        if self.rng.random() < 0.1:  # stale client metadata
            target = self.rng.choice(list(self.brokers))
        self.value_no += 1
        op = self.history.invoke("producer", "produce", topic=TOPIC, partition=0,
                                 values=[f"v{self.value_no}"], idempotent=False)
        op._deadline = self.now + 2 * self.cfg.produce_timeout_ms  # type: ignore[attr-defined]
        self.send(PRODUCER, target, "produce", op)

    def producer_timeouts(self) -> None:
        for op in self.history.ops:
            if op.type is None and self.now >= getattr(op, "_deadline", 10**18):
                self.history.info(op, "client timeout")

    def inject_fault(self) -> None:
        alive = [b for b in self.brokers.values() if b.alive]
        dead = [b for b in self.brokers.values() if not b.alive]
        kind = self.rng.choice(["crash", "restart", "cut", "heal", "isolate", "controller_failover", "heal"])
        if kind == "crash" and len(alive) > 1:
            self.crash_broker(self.rng.choice(alive))
        elif kind == "restart" and dead:
            self.start_broker(self.rng.choice(dead))
            self.count("broker_restarts")
        elif kind == "cut":
            a, b = self.rng.sample([CONTROLLER] + list(self.brokers), 2)
            self.cut.add((a, b))
            self.count("links_cut")
        elif kind == "isolate":
            x = self.rng.choice(list(self.brokers))
            for y in [CONTROLLER, PRODUCER] + list(self.brokers):
                if y != x:
                    self.cut.update({(x, y), (y, x)})
            self.count("isolations")
        elif kind == "heal":
            self.cut.clear()
        elif kind == "controller_failover":
            self.new_controller()
            self.count("controller_failovers")

    # ================================================================ invariants
    def check_invariants(self) -> None:
        reg = self.reg()
        if reg is not None:
            if not set(reg.isr) <= set(reg.replicas) or not set(reg.elr) <= set(reg.replicas):
                self.fail(f"ISR {reg.isr} or ELR {reg.elr} is not a subset of replicas {reg.replicas}")
            if set(reg.isr) & set(reg.elr):
                self.fail(f"ISR {reg.isr} and ELR {reg.elr} overlap")
            if not reg.isr and not reg.elr and not (reg.leader == -1 and reg.last_known_elr):
                self.fail(f"ISR and ELR are empty but the partition is not awaiting unclean recovery: {reg}")
            if len(reg.isr) >= self.cfg.min_insync_replicas and reg.elr:
                self.fail(f"ELR {reg.elr} kept while the ISR {reg.isr} has min.insync.replicas members")
            if reg.leader != -1 and reg.leader not in reg.isr:
                self.fail(f"leader {reg.leader} not in ISR {reg.isr}")
            if reg.leader_epoch < self.last_leader_epoch or reg.partition_epoch < self.last_partition_epoch:
                self.fail(f"epochs went backwards: leader epoch {reg.leader_epoch}, partition epoch "
                          f"{reg.partition_epoch} after {self.last_leader_epoch}, {self.last_partition_epoch}")
            self.last_leader_epoch, self.last_partition_epoch = reg.leader_epoch, reg.partition_epoch
            if reg.awaiting_recovery:
                self.was_awaiting_recovery = True
            elif self.was_awaiting_recovery and reg.leader != -1:
                self.was_awaiting_recovery = False
                self.count("unclean_recoveries")
            if reg.leader != -1:
                prev = self.epoch_leader.setdefault(reg.leader_epoch, reg.leader)
                if prev != reg.leader:
                    self.fail(f"two leaders in leader epoch {reg.leader_epoch}: {prev} and {reg.leader}")
        for bid, br in self.image.brokers.items():
            if br.epoch < self.broker_epochs.get(bid, -1):
                self.fail(f"broker {bid} epoch went backwards: {br.epoch} < {self.broker_epochs[bid]}")
            self.broker_epochs[bid] = br.epoch
        for b in self.brokers.values():
            if not b.alive or not b.part.is_leader:
                continue
            part = b.part
            prev = self.epoch_leader.setdefault(part.leader_epoch, b.id)
            if prev != b.id:
                self.fail(f"brokers {prev} and {b.id} both lead leader epoch {part.leader_epoch}")
            key = (b.id, part.leader_epoch)
            if part.high_watermark < self.hw_seen.get(key, 0):
                self.fail(f"leader {b.id} HW went backwards in epoch {part.leader_epoch}: "
                          f"{part.high_watermark} < {self.hw_seen[key]}")
            self.hw_seen[key] = part.high_watermark
            if part.high_watermark > b.log.log_end_offset:
                self.fail(f"leader {b.id} HW {part.high_watermark} above its LEO {b.log.log_end_offset}")
            for r in (part.isr if self.cfg.check_hw_within_isr else ()):
                f = self.brokers.get(r)
                if r == b.id or f is None or not f.alive or f.part.is_leader \
                        or f.part.leader_epoch != part.leader_epoch or f.needs_truncation:
                    continue
                registered = self.image.brokers.get(r)
                if reg is not None and (r not in reg.isr or registered is None
                                        or registered.incarnation_id != self.incarnation_id(f)):
                    # not electable as this process: the controller already dropped it from the
                    # ISR, or it restarted (maybe with a torn tail) and its registration will
                    # drop it; the leader's metadata lags, not its HW rule
                    continue
                if part.high_watermark > f.log.log_end_offset:
                    self.fail(f"leader {b.id} HW {part.high_watermark} above ISR member {r}'s LEO "
                              f"{f.log.log_end_offset} (epoch {part.leader_epoch})")
            if reg is not None and reg.leader == b.id and reg.leader_epoch == part.leader_epoch:
                self.check_committed_on(b)

    def check_committed_on(self, b: SimBroker) -> None:
        """Every acknowledged record is in the current leader's log at its offset."""
        key = (b.id, b.part.leader_epoch)
        start = self.verified.get(key, 0)
        pending = sorted(o for o in self.committed if o >= start)
        if not pending:
            return
        lg = b.log
        if pending[-1] >= lg.log_end_offset:
            o = next(o for o in pending if o >= lg.log_end_offset)
            self.fail(f"acknowledged record {self.committed[o]!r} at offset {o} is missing on leader {b.id} "
                      f"(epoch {b.part.leader_epoch}, LEO {lg.log_end_offset}): committed data lost")
        got = {r.offset: r.value.decode() for r in decode_batches(lg.read(pending[0], 10**7).records)}
        for o in pending:
            if got.get(o) != self.committed[o]:
                self.fail(f"acknowledged record {self.committed[o]!r} at offset {o} reads {got.get(o)!r} on "
                          f"leader {b.id} (epoch {b.part.leader_epoch})")
        self.verified[key] = pending[-1] + 1

    # ================================================================ the loop
    def step(self) -> None:
        self.step_no += 1
        self.now += self.cfg.step_ms
        while self.net and self.net[0][0] <= self.now:
            _, _, src, (dst, inc), kind, payload = heapq.heappop(self.net)
            if dst > 0 and inc != self.brokers[dst].incarnation:
                self.count("messages_to_dead_incarnation")
                continue
            self.deliver(src, dst, kind, payload)
            self.check_invariants()
        if self.now - self.last_maintenance >= self.cfg.maintenance_interval_ms:
            self.last_maintenance = self.now
            self.propose(self.controller.maintenance(self.image, self.now))
            if self.cfg.replica_silence_report_ms:
                self.fence_silent_brokers()
        if self.now - self.last_push >= self.cfg.metadata_push_interval_ms:
            self.last_push = self.now
            self.push_metadata()
        for b in self.brokers.values():
            if b.alive:
                self.broker_tick(b)
        self.producer_timeouts()
        self.check_invariants()

    def run(self) -> dict:
        with _no_fsync():
            try:
                self.setup()
                for _ in range(self.cfg.steps):
                    if self.rng.random() < self.cfg.fault_probability:
                        self.inject_fault()
                    if self.rng.random() < self.cfg.produce_probability:
                        self.produce()
                    self.step()
                self.heal_and_converge()
                return self.final_check()
            except SimulationFailure:
                raise
            except AssertionError as e:   # an invariant() of the product code fired
                self.fail(f"invariant of the product code: {e}")
            finally:
                for b in getattr(self, "brokers", {}).values():
                    if b.log is not None and not b.log.closed:
                        b.log.close_without_flush()
                if self._own_root:
                    shutil.rmtree(self.root, ignore_errors=True)

    def heal_and_converge(self, max_steps: int = 3000) -> None:
        self.cut.clear()
        self.cfg.message_loss = 0.0
        for b in self.brokers.values():
            if not b.alive:
                self.start_broker(b)
        for _ in range(max_steps):
            self.step()
            reg = self.reg()
            alive = list(self.brokers.values())
            if reg.leader > 0 and len(reg.isr) == len(alive) and not self.net_has_produce() and all(
                    b.log.log_end_offset == self.brokers[reg.leader].log.log_end_offset
                    and b.part.leader_epoch == reg.leader_epoch for b in alive) \
                    and self.brokers[reg.leader].part.high_watermark == self.brokers[reg.leader].log.log_end_offset \
                    and all(op.type is not None for op in self.history.ops):
                return
        self.fail(f"the healed cluster did not converge within {max_steps} steps: partition {self.reg()}, LEOs "
                  f"{[(b.id, b.log.log_end_offset, b.part.leader_epoch) for b in self.brokers.values()]}")

    def net_has_produce(self) -> bool:
        return any(m[4] == "produce" for m in self.net)

    def final_check(self) -> dict:
        reg = self.reg()
        leader = self.brokers[reg.leader]
        records = [(r.offset, r.value.decode()) for r in decode_batches(leader.log.read(0, 10**8).records)] \
            if leader.log.log_end_offset else []
        for b in self.brokers.values():
            other = [(r.offset, r.value.decode()) for r in decode_batches(b.log.read(0, 10**8).records)] \
                if b.log.log_end_offset else []
            if other != records:
                self.fail(f"replica {b.id} differs from leader {leader.id} after convergence")
        op = self.history.invoke("checker", "fetch", topic=TOPIC, partition=0, offset=0, final=True)
        self.history.ok(op, records=[list(r) for r in records], high_watermark=leader.part.high_watermark)
        result = check_history(self.history)
        if not result.valid:
            self.fail("history checker: " + result.summary(limit=5))
        summary = dict(self.stats)
        summary.update(seed=self.seed, steps=self.step_no, records=len(records), acknowledged=len(self.committed),
                       leader_epochs=reg.leader_epoch, **{k: v for k, v in result.stats.items()
                                                           if k.startswith("produce_")})
        return summary
