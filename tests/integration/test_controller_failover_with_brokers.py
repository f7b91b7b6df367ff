"""Controller failover together with real brokers (3 controllers + 3 brokers, all real
processes, RF=3, min.insync.replicas=2): while an acks=all producer writes, kill -9 the active
controller; once another one is active, kill -9 a partition leader. The new active controller
fences the dead broker and elects a new leader from the ISR (through the fast path: a peer
reports the refused connections, well before the broker's session would expire), writes go
on, and every acknowledged record is in the log exactly once, at its acknowledged offset.
The leader dies holding a write its (paused) followers do not have yet, so a write
acknowledged before every ISR member had it would be lost, every run."""
import os
import signal
import threading
import time

import pytest
from replication_helpers import BackgroundProducer, assert_acked_exactly_once_in_order

from tests.rigs.cluster import ReplicatedCluster, http

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]   # 6 processes; minutes at load 30+

SESSION_TIMEOUT_MS = 30_000   # a lease expiry would elect only after this; the fast path takes < 1 s
WAIT_S = 120                  # generous poll deadlines (2 shared cores): each poll ends once its condition holds


def _log_bytes(c: ReplicatedCluster, broker_id: int, topic: str = "cf", partition: int = 0) -> int:
    """Bytes in a broker's segment files of one partition (written with os.write: the file
    size is what the process has appended, whether or not it is flushed)."""
    d = os.path.join(c.base_dir, f"broker-{broker_id}", "logs", f"{topic}-{partition}")
    return sum(os.path.getsize(os.path.join(d, n)) for n in os.listdir(d) if n.endswith(".log"))


class _Probe:
    """One acks=all write of `value` to cf-0 at `url`, in a thread (it blocks until the ISR
    has it, or fails when the leader dies); `answer` = (status, body)."""

    def __init__(self, url: str, value: str) -> None:
        self.value = value
        self.answer: tuple = (None, None)
        self._thread = threading.Thread(target=self._send, args=(url,), daemon=True)

    def _send(self, url: str) -> None:
        self.answer = http("POST", url + "/v1/topics/cf/partitions/0/records", {"records": [{"value": self.value}]},
                           timeout=30)

    def start(self) -> None:
        self._thread.start()

    def join(self) -> None:
        if self._thread.ident is not None:
            self._thread.join(35)
            assert not self._thread.is_alive(), f"{self.value}: no answer within 35 s"


def _new_leader(c: ReplicatedCluster, topic: str, partition: int, victim: int):
    p = c.partition(topic, partition)
    return p if p["leader"] not in (victim, -1) else None


def test_kill_9_active_controller_then_a_partition_leader_loses_no_acknowledged_record(tmp_path):
    c = ReplicatedCluster(str(tmp_path), brokers=3, controllers=3, broker_config={"min_insync_replicas": 2},
                          controller_args=["--broker-session-timeout-ms", str(SESSION_TIMEOUT_MS)])
    prod = None
    try:
        c.start()
        c.create_topic("cf", partitions=2, replication_factor=3)
        prod = BackgroundProducer(c.urls, "cf", [0, 1]).start()
        for p in (0, 1):
            c.wait_for(lambda: len(prod.acked[p]) >= 10, WAIT_S, f"10 writes to cf-{p} acknowledged")

        # 1. kill -9 the active controller: another one takes over, the brokers follow it
        old_active = c.controllers.wait_active(WAIT_S)
        controller_killed_at = time.monotonic()
        c.controllers.kill(old_active)
        new_active = c.controllers.wait_active(WAIT_S, exclude=(old_active,))
        assert new_active != old_active
        n = prod.count()
        prod.wait_acked(n + 20, WAIT_S)
        # every broker follows the new controller's metadata log
        for b in (1, 2, 3):
            c.wait_for(lambda: http("GET", c.url(b) + "/v1/metadata")[1]["controller_id"] == new_active, WAIT_S,
                       f"broker {b} to see controller {new_active} in its metadata")

        # 2. kill -9 the leader of partition 0 while it holds a write its followers do not have
        #    (they are paused, still in the ISR): an acks=all that answered before the followers
        #    had the write would lose it here; then the new active controller elects a new leader
        before = c.partition("cf", 0)
        victim = before["leader"]
        followers = [r for r in before["isr"] if r != victim]
        assert len(followers) == 2, before
        for f in followers:
            c.signal(f, signal.SIGSTOP)
        # A follower's fetch parked on the leader before the pause is answered by the first
        # append after it (the answer waits in the paused follower's socket and is applied on
        # SIGCONT); what the leader appends after that answer stays on the leader alone.
        # Two acks=all probes, the second sent once the first append is on the leader's disk.
        probes = [_Probe(c.url(victim), f"probe-{i}") for i in (1, 2)]
        try:
            probes[0].start()
            c.wait_for(lambda: _log_bytes(c, victim) > max(_log_bytes(c, f) for f in followers), WAIT_S,
                       f"broker {victim}'s log of cf-0 ahead of its paused followers'")
            ahead = _log_bytes(c, victim)
            probes[1].start()
            c.wait_for(lambda: _log_bytes(c, victim) > ahead, WAIT_S, f"a second append on broker {victim}")
            killed_at = time.monotonic()
            c.kill(victim)
        finally:
            for f in followers:
                c.signal(f, signal.SIGCONT)
            for probe in probes:
                probe.join()
        after = c.wait_for(lambda: _new_leader(c, "cf", 0, victim), SESSION_TIMEOUT_MS / 1000 / 2,
                           "a new leader for cf-0 before half the session timeout")
        elected_after = time.monotonic() - killed_at
        assert after["leader"] in before["isr"] and after["leader_epoch"] > before["leader_epoch"], (before, after)
        assert victim not in after["isr"], after
        assert elected_after < SESSION_TIMEOUT_MS / 1000 / 2, (
            f"new leader after {elected_after:.1f} s: the new active controller waited for the lease to expire")
        print(f"\ncontroller {old_active} -> {new_active}; broker {victim} killed, broker {after['leader']} "
              f"leads cf-0 after {elected_after:.3f} s")
        for p in (0, 1):   # writes go on on both partitions (cf-0: through its new leader)
            n_p = len(prod.acked[p])
            c.wait_for(lambda: len(prod.acked[p]) >= n_p + 10, WAIT_S, f"10 more writes to cf-{p} acknowledged")
        prod.stop()
        logs = {p: c.read_all("cf", p) for p in (0, 1)}
        for p in (0, 1):
            assert_acked_exactly_once_in_order(prod.acked[p], logs[p])
        for probe in probes:   # a probe answered 200 is in the log once, at its offset
            status, doc = probe.answer
            if status == 200:
                assert [o for o, v in logs[0] if v == probe.value] == [doc["offsets"][0]["offset"]], (
                    probe.value, doc, logs[0][-5:])
        for p in (0, 1):   # the exactly-once check above spans both faults on each partition
            times = [t for _o, _v, t in prod.acked[p]]
            assert times[0] < controller_killed_at and times[-1] > killed_at, (p, len(times))
    finally:
        try:
            if prod is not None:
                prod.stop()
        finally:
            c.close()
