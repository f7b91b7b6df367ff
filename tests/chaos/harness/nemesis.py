"""Reusable faults ("nemeses") for a ChaosCluster. Each nemesis has `start(cluster, rng)`,
returning a description of what it did, and `stop(cluster)`, which undoes it (restart,
resume, heal). `Schedule` runs a seeded sequence of them and records fault windows.

Kinds:
- kill-broker / kill-active-controller / kill-several: kill -9, restart at stop
- pause-broker / pause-controller: SIGSTOP, SIGCONT at stop
- isolate-broker: one broker cut from the other brokers and the controllers, both ways
- blackhole-broker: the same links accept connections but forward nothing (timeouts)
- one-way-answers: answers on those links dropped (requests still served: outcomes
  unknown to the callers)
- one-way-control: a broker cannot reach the controllers (heartbeats lost) but serves data
- broker-partition: data plane split {i} | {others}; every broker still sees the controllers
- slow-links: 150-400 ms per chunk on one broker's links
- disk-full: broker restarted with RLIMIT_FSIZE just above its largest file (writes get
  EFBIG), restarted without the limit at stop
- lost-tail: a copy of a broker's logs is taken at start; at stop the broker is killed
  and restarted from that copy (what a power loss does to un-fsynced data)
- torn-tail: kill -9, the last segment of each partition cut mid-batch and garbage
  appended, restart (recovery must truncate the torn batch)
- clock-jump: one process's wall clock (time.time) jumps +-10 min..2 days, back at stop
  (clockshim/sitecustomize.py on the processes' PYTHONPATH: no product code involved)
- controller-partition: one controller (the active one 70% of the time) cut off from the
  other controllers, both ways: a minority | majority split of the raft quorum; brokers
  still reach every controller
- controller-one-way: one controller's raft messages to the others dropped while it still
  hears them (it keeps believing in a leader the majority replaced, or leads unheard)
- isolate-host: the combined-mode machine i (controller i + broker i, the active controller's
  70% of the time) goes silent: every link between it and the other machines is blackholed
  (connections hang, nothing forwarded, no RST): broker i's links to and from the other
  brokers and controllers, controller i's raft links and the other brokers' links to it, and
  the other controllers' probes of broker i; broker i still reaches controller i (same host).
  Clients keep their direct connections (as a client on that host would). Issue 24
"""
from __future__ import annotations

import glob
import os
import random
import shutil
import time
from dataclasses import dataclass, field
from typing import Optional


class Nemesis:
    name = "nemesis"

    def start(self, c, rng: random.Random) -> str:
        raise NotImplementedError

    def stop(self, c) -> None:
        pass


class KillBroker(Nemesis):
    name = "kill-broker"

    def start(self, c, rng):
        self.i = rng.choice(c.ids)
        c.kill("broker", self.i)
        return f"kill -9 broker {self.i}"

    def stop(self, c):
        c.restart("broker", self.i)


class KillActiveController(Nemesis):
    name = "kill-active-controller"

    def start(self, c, rng):
        self.i = c.active_controller() or rng.choice(c.ids)
        c.kill("controller", self.i)
        return f"kill -9 active controller {self.i}"

    def stop(self, c):
        c.restart("controller", self.i)


class KillSeveral(Nemesis):
    """A broker and a controller, or two brokers, at once (never a controller majority)."""

    name = "kill-several"

    def start(self, c, rng):
        b = rng.sample(c.ids, 2)
        if rng.random() < 0.5:
            self.victims = [("broker", b[0]), ("controller", c.active_controller() or b[1])]
        else:
            self.victims = [("broker", b[0]), ("broker", b[1])]
        for role, i in self.victims:
            c.kill(role, i)
        return "kill -9 " + ", ".join(f"{r} {i}" for r, i in self.victims)

    def stop(self, c):
        for role, i in self.victims:
            c.restart(role, i)


class Pause(Nemesis):
    def __init__(self, role: str):
        self.role = role
        self.name = f"pause-{role}"

    def start(self, c, rng):
        self.i = (c.active_controller() if self.role == "controller" and rng.random() < 0.7 else None) \
            or rng.choice(c.ids)
        c.pause(self.role, self.i)
        return f"SIGSTOP {self.role} {self.i}"

    def stop(self, c):
        c.resume(self.role, self.i)


class Links(Nemesis):
    """Network faults on one broker's links (rules per link on the proxies)."""

    def __init__(self, name: str):
        self.name = name

    def start(self, c, rng):
        self.i = i = rng.choice(c.ids)
        both = c.links_from(i) + c.links_to(i)
        if self.name == "isolate-broker":
            for proxy, src in both:
                proxy.cut(src)
            return f"broker {i} cut off from the other brokers and the controllers"
        if self.name == "blackhole-broker":
            for proxy, src in both:
                proxy.blackhole(src)
            return f"broker {i} blackholed (connections hang)"
        if self.name == "one-way-answers":
            for proxy, src in both:
                proxy.one_way(src, answers=False)
            return f"answers on broker {i}'s links dropped (requests delivered: outcomes unknown)"
        if self.name == "one-way-control":
            for proxy, src in c.control_links(i):
                proxy.cut(src)
            return f"broker {i} cannot reach the controllers (serves data, misses heartbeats)"
        if self.name == "broker-partition":
            others = [j for j in c.ids if j != i]
            for proxy, src in c.links_to(i) + [(c.broker_proxy[j], f"broker-{i}") for j in others]:
                proxy.cut(src)
            return f"data plane split {{{i}}} | {set(others)} (controllers see everyone)"
        if self.name == "slow-links":
            ms = rng.randint(150, 400)
            for proxy, src in both:
                proxy.slow(ms, src)
            return f"broker {i}'s links slowed by {ms} ms per chunk"
        raise ValueError(self.name)

    def stop(self, c):
        c.heal_network()


class DiskFull(Nemesis):
    """Restart a broker with RLIMIT_FSIZE just above its smallest active segment of a
    workload topic: appends to every partition fail with EFBIG within a few records (a
    full disk as the process sees it), small files (checkpoints) still fit."""

    name = "disk-full"
    headroom_bytes = 1024

    def start(self, c, rng):
        self.i = rng.choice(c.ids)
        active = []
        for d in glob.glob(os.path.join(c.broker_log_dir(self.i), "*-*")):
            if os.path.basename(d).startswith("__"):
                continue
            segs = sorted(glob.glob(os.path.join(d, "*.log")))
            if segs:
                active.append(os.path.getsize(segs[-1]))
        limit = max(16 * 1024, min(active or [0]) + self.headroom_bytes)
        c.restart("broker", self.i, fsize_limit_bytes=limit)
        return f"broker {self.i} restarted with RLIMIT_FSIZE={limit} (writes past it fail with EFBIG)"

    def stop(self, c):
        c.restart("broker", self.i)


class LostTail(Nemesis):
    name = "lost-tail"

    def start(self, c, rng):
        self.i = rng.choice(c.ids)
        self.copy = os.path.join(c.root, f"lost-tail-copy-{self.i}")
        c.copy_broker_logs(self.i, self.copy)
        return f"broker {self.i}: logs copied; it will restart from this copy"

    def stop(self, c):
        c.kill("broker", self.i)
        live = c.broker_log_dir(self.i)
        shutil.rmtree(live, ignore_errors=True)
        shutil.copytree(self.copy, live)
        shutil.rmtree(self.copy, ignore_errors=True)
        c.restart("broker", self.i)


class TornTail(Nemesis):
    name = "torn-tail"

    def start(self, c, rng):
        self.i = rng.choice(c.ids)
        c.kill("broker", self.i)
        torn = 0
        for d in glob.glob(os.path.join(c.broker_log_dir(self.i), "*-*")):
            segs = sorted(glob.glob(os.path.join(d, "*.log")))
            if not segs:
                continue
            last = segs[-1]
            size = os.path.getsize(last)
            if size > 100:
                cut = size - rng.randint(1, min(60, size - 1))
                with open(last, "r+b") as f:
                    f.truncate(cut)
                    f.seek(cut)
                    f.write(bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 40))))
                torn += 1
        c.restart("broker", self.i)
        return f"broker {self.i} killed, {torn} segment tails torn, restarted"


class ClockJump(Nemesis):
    """One process's wall clock jumps forwards or backwards (10 min .. 2 days: below the
    default retention.ms of 7 days, whose deletions a forward jump would legitimately
    trigger), then jumps back at stop."""

    name = "clock-jump"

    def start(self, c, rng):
        self.role, self.i = rng.choice(["broker", "broker", "controller"]), rng.choice(c.ids)
        offset = rng.choice([-1, 1]) * rng.uniform(600, 2 * 86400)
        c.set_clock_offset(self.role, self.i, offset)
        return f"{self.role} {self.i} wall clock jumps {offset / 3600:+.1f} h"

    def stop(self, c):
        c.set_clock_offset(self.role, self.i, 0.0)


class ControllerLinks(Nemesis):
    """Raft-link faults between one controller and the others (proxies per raft link)."""

    def __init__(self, name: str):
        self.name = name

    def start(self, c, rng):
        active = c.active_controller()
        self.i = i = active if active is not None and rng.random() < 0.7 else rng.choice(c.ids)
        others = [j for j in c.ids if j != i]
        self.affected = []
        for j in others:
            (to_j, src_i), (to_i, src_j) = c.raft_links(i, j)
            if self.name == "controller-partition":
                to_j.cut(src_i)
                to_i.cut(src_j)
            else:  # i's bytes to j dropped, j's bytes to i delivered, on either connection
                to_j.one_way(src_i, requests=False)
                to_i.one_way(src_j, answers=False)
            self.affected += [(to_j, src_i), (to_i, src_j)]
        role = "the active controller" if i == active else "controller"
        if self.name == "controller-partition":
            return f"{role} {i} cut off from controllers {others} (raft minority | majority; brokers reach all)"
        return f"{role} {i}'s raft messages to {others} dropped (it still hears them)"

    def stop(self, c):
        for proxy, src in self.affected:  # drop half-delivered streams: reconnect cleanly
            proxy.cut(src)
        c.heal_network()


class IsolateHost(Nemesis):
    """A whole combined-mode machine silently cut off (see the module docstring)."""

    name = "isolate-host"

    def start(self, c, rng):
        active = c.active_controller()
        self.i = i = active if active is not None and rng.random() < 0.7 else rng.choice(c.ids)
        others = [j for j in c.ids if j != i]
        self.affected = [(p, s) for p, s in c.links_from(i) if p is not c.ctl_proxy[i]] + c.links_to(i)
        self.affected += [(c.ctl_proxy[i], f"broker-{j}") for j in others]          # brokers -> controller i
        self.affected += [(c.broker_proxy[i], f"controller-{j}") for j in others]   # probes of broker i
        for j in others:
            self.affected += c.raft_links(i, j)
        for proxy, src in self.affected:
            proxy.blackhole(src)   # live and new connections hang: nothing forwarded, no RST
        role = "the active controller's" if i == active else "a"
        return f"{role} host {i} (controller {i} + broker {i}) silently cut off from hosts {others}"

    def stop(self, c):
        for proxy, src in self.affected:  # drop half-delivered streams: reconnect cleanly
            proxy.cut(src)
        c.heal_network()


ALL_NEMESES = {
    "kill-broker": KillBroker, "kill-active-controller": KillActiveController, "kill-several": KillSeveral,
    "pause-broker": lambda: Pause("broker"), "pause-controller": lambda: Pause("controller"),
    "isolate-broker": lambda: Links("isolate-broker"), "blackhole-broker": lambda: Links("blackhole-broker"),
    "one-way-answers": lambda: Links("one-way-answers"), "one-way-control": lambda: Links("one-way-control"),
    "slow-links": lambda: Links("slow-links"), "broker-partition": lambda: Links("broker-partition"),
    "disk-full": DiskFull, "lost-tail": LostTail,
    "torn-tail": TornTail, "clock-jump": ClockJump,
    "controller-partition": lambda: ControllerLinks("controller-partition"),
    "controller-one-way": lambda: ControllerLinks("controller-one-way"),
    "isolate-host": IsolateHost,
}


@dataclass
class FaultRecord:
    """One fault: `start` (injected) and `end` (healed) on the history's clock. After the
    heal `Schedule.settle` sets `settled` (the cluster recovered within `settle_max_s`),
    `recovery_s` (heal -> settled; None if it did not settle) and `unsettled` (what was
    still missing at the limit). `load1`: the machine's 1-minute load at the start."""

    kind: str
    description: str
    start: float
    end: float = -1.0
    error: Optional[str] = None
    settled: Optional[bool] = None
    recovery_s: Optional[float] = None
    unsettled: list = field(default_factory=list)
    load1: Optional[float] = None


@dataclass
class Schedule:
    """A seeded sequence of faults: `hold_s` with the fault active, then healed until the
    cluster has settled (`settle`, at most `settle_max_s`; 0 = no wait) and at least a
    drawn `quiet_s` has passed since the heal."""

    seed: int
    kinds: list = field(default_factory=lambda: list(ALL_NEMESES))
    hold_s: tuple = (2.0, 5.0)
    quiet_s: tuple = (2.0, 4.0)
    faults: list = field(default_factory=list)
    settle_max_s: float = 60.0
    settle_poll_s: float = 0.25

    def plan(self, count: int) -> list[str]:
        """`count` fault kinds in rounds: every kind once per round, each round in a seeded
        random order, so after k whole rounds every kind has exactly k faults."""
        rng = random.Random(self.seed)
        out: list[str] = []
        while len(out) < count:
            rnd = list(self.kinds)
            rng.shuffle(rnd)
            out += rnd
        return out[:count]

    def run_one(self, c, kind: str, rng: random.Random, clock, sleep) -> FaultRecord:
        nem = ALL_NEMESES[kind]()
        rec = FaultRecord(kind, "", clock(), load1=round(os.getloadavg()[0], 1))
        try:
            rec.description = nem.start(c, rng)
            sleep(rng.uniform(*self.hold_s))
        except Exception as e:  # a nemesis failing is reported, never hidden
            rec.error = f"start: {e.__class__.__name__}: {e}"
        try:
            nem.stop(c)
        except Exception as e:
            rec.error = (rec.error or "") + f" stop: {e.__class__.__name__}: {e}"
        rec.end = clock()
        self.faults.append(rec)
        return rec

    def settle(self, c, rec: FaultRecord, quiet_s: float, clock, wait, writes=None) -> None:
        """After `rec`'s heal: poll until the cluster has settled (harness/settle.py) or
        `settle_max_s` has passed since the heal, record that in `rec`, then wait out the
        rest of `quiet_s` (a minimum, counted from the heal). `wait(s)` sleeps and returns
        True when the run is being stopped (threading.Event.wait). `writes(since)`, if
        given: the partitions without an acknowledged write since `since` (AckTracker);
        settled also needs none."""
        from tests.chaos.harness.settle import unsettled_reasons
        healed = rec.end if rec.end >= 0 else clock()
        reasons: list = []
        while self.settle_max_s > 0:
            reasons = unsettled_reasons(c.settle_snapshot())
            if writes is not None:
                reasons += [f"{t}-{p} no acknowledged write since the heal" for t, p in writes(healed)]
            now = clock()
            if not reasons:
                rec.settled, rec.recovery_s = True, round(now - healed, 2)
                break
            if now - healed >= self.settle_max_s:
                rec.settled, rec.unsettled = False, reasons
                break
            if wait(min(self.settle_poll_s, healed + self.settle_max_s - now)):
                rec.settled, rec.unsettled = False, reasons + ["run stopped"]
                return
        rest = healed + quiet_s - clock()
        if rest > 0:
            wait(rest)

    def heal_all(self, c) -> None:
        """Every process running and resumed, every link healed."""
        c.heal_network()
        for (role, i), spec in c.procs.items():
            if spec.paused:
                c.resume(role, i)
            if not spec.alive() or spec.fsize_limit_bytes is not None:
                c.restart(role, i)
        time.sleep(0.1)
