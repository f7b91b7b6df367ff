"""The Python `Producer` follows a moved leader instead of waiting out `request_timeout_ms`
(docs/AVAILABILITY.md part E), real processes (1 controller + 3 brokers, RF=3,
min.insync.replicas=2): an idempotent producer writes acks=all continuously; the leader of
its partition is SIGSTOPped (a silent leader: connects still succeed through the kernel
backlog, nothing answers); the controller fences it after the broker session timeout and
moves leadership. The producer must resume within the session timeout + 2 s (the old client
waited request_timeout_ms + 5 s = 35 s), and after SIGCONT every acknowledged record is in
the log exactly once and no record twice."""
import asyncio
import signal
import threading
import time

import pytest

from http_api.client import Producer
from tests.rigs.cluster import ReplicatedCluster

pytestmark = pytest.mark.integration

SESSION_MS = 3_000
RESUME_BOUND_S = SESSION_MS / 1000 + 2.0
ROUND = 5              # records in flight together per round


class _Writer(threading.Thread):
    """An idempotent acks=all Producer on its own event loop, in rounds of ROUND records;
    records (send time, ack time, value, offset) of every acknowledged record."""

    def __init__(self, urls: list[str], topic: str) -> None:
        super().__init__(daemon=True)
        self.urls, self.topic = urls, topic
        self.acked: list[tuple[float, float, str, int]] = []
        self.error: BaseException | None = None
        self.stop = threading.Event()
        self.lock = threading.Lock()

    def run(self) -> None:
        try:
            asyncio.run(self._write())
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e

    async def _write(self) -> None:
        async with Producer(self.urls, acks="all", enable_idempotence=True, linger_ms=1) as p:
            i = 0
            while not self.stop.is_set():
                sent = time.monotonic()
                values = [f"v{i + k}" for k in range(ROUND)]
                futs = [await p.send(self.topic, v, partition=0) for v in values]
                metas = await asyncio.gather(*futs)
                now = time.monotonic()
                with self.lock:
                    self.acked.extend((sent, now, v, m.offset) for v, m in zip(values, metas))
                i += ROUND

    def snapshot(self) -> list[tuple[float, float, str, int]]:
        with self.lock:
            return list(self.acked)


def test_idempotent_producer_follows_a_silent_leader_within_the_session_timeout(tmp_path):
    c = ReplicatedCluster(str(tmp_path), brokers=3, broker_config={"min_insync_replicas": 2},
                          controller_args=["--broker-session-timeout-ms", str(SESSION_MS),
                                           "--broker-heartbeat-interval-ms", "500"])
    w = None
    victim = None
    try:
        c.start()
        c.create_topic("follow", partitions=1, replication_factor=3)
        w = _Writer(c.urls, "follow")
        w.start()
        c.wait_for(lambda: len(w.snapshot()) >= 100 or w.error, 60, "the writer acknowledging records")
        assert w.error is None, w.error

        before = c.partition("follow")
        victim = before["leader"]
        stopped_at = time.monotonic()
        c.signal(victim, signal.SIGSTOP)

        # resumed = a record sent after the SIGSTOP was acknowledged (by the new leader)
        def resumed():
            return next((ack for sent, ack, _, _ in w.snapshot() if sent > stopped_at), None) or w.error
        c.wait_for(resumed, RESUME_BOUND_S + 40, "the producer to resume after the leader was SIGSTOPped")
        assert w.error is None, w.error
        resume_s = resumed() - stopped_at
        after = c.partition("follow")
        assert after["leader"] != victim and after["leader_epoch"] > before["leader_epoch"], after
        assert resume_s <= RESUME_BOUND_S, (
            f"producer resumed {resume_s:.2f} s after the leader went silent; bound {RESUME_BOUND_S} s "
            f"(broker session timeout {SESSION_MS} ms + 2 s)")

        # keep writing on the new leader a little, then let the old one come back and rejoin
        n = len(w.snapshot())
        c.wait_for(lambda: len(w.snapshot()) >= n + 50 or w.error, 60, "more records on the new leader")
        c.signal(victim, signal.SIGCONT)
        victim = None
        c.wait_for(lambda: len(c.partition("follow")["isr"]) == 3, 60, "the old leader back in the ISR")
        w.stop.set()
        w.join(60)
        assert not w.is_alive(), "the writer did not stop"
        assert w.error is None, w.error

        log = c.read_all("follow")
        values = [v for _, v in log]
        assert len(values) == len(set(values)), "a record is in the log twice"
        by_value = dict((v, off) for off, v in log)
        acked = w.snapshot()
        missing = [v for _, _, v, _ in acked if v not in by_value]
        assert not missing, f"{len(missing)} acknowledged records lost, e.g. {missing[:5]}"
        moved = [(v, off, by_value[v]) for _, _, v, off in acked if by_value[v] != off]
        assert not moved, f"acknowledged offsets differ from the log: {moved[:5]}"
        print(f"resumed {resume_s:.2f} s after SIGSTOP; {len(acked)} acknowledged, {len(values)} in the log")
    finally:
        if w is not None:
            w.stop.set()
        if victim is not None:
            c.signal(victim, signal.SIGCONT)
        c.close()
        if w is not None:
            w.join(30)
