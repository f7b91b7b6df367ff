"""Fencing from fetch silence, confirmed by the controller (issue 24, docs/AVAILABILITY.md
part B): the pure rule of `QuorumController.silent_brokers` / `fence_silent`, on the
metadata harness (no raft, no sockets; the probe is the shell's and is not run here).

A broker is fenced for silence only when another live broker reported it silent within
`broker_silence_report_max_age_ms` AND this controller has had no heartbeat from it for
`broker_silence_fence_ms` (or none since it became active); the shell's probe must then fail
to connect too. A broker that heartbeats (busy under load, or a one-way broker-to-broker link
loss) is never fenced this way."""
from __future__ import annotations

import pytest

from partitions.errors import ErrorCode, KraftlogError
from metadata_quorum.controller import ControllerSettings
from metadata_quorum.records import FenceBrokerRecord
from metadata_harness import Harness

FENCE_MS = 1500
MAX_AGE_MS = 3000


def harness() -> Harness:
    h = Harness(broker_silence_fence_ms=FENCE_MS, broker_silence_report_max_age_ms=MAX_AGE_MS)
    h.create("t", 3, 3)
    return h


def epoch(h: Harness, b: int) -> int:
    return h.image.brokers[b].epoch


def test_a_reported_broker_without_heartbeats_is_fenced_with_its_leaderships_moved():
    h = harness()
    h.now = 1000
    for b in (1, 3):
        h.heartbeat(b)           # broker 2's last heartbeat was at 0
    assert h.controller.report_silent(h.image, 1, epoch(h, 1), 2, h.now)
    assert h.controller.silent_brokers(h.image, h.now) == []         # heard from it 1000 ms ago
    h.now = FENCE_MS
    assert h.controller.silent_brokers(h.image, h.now) == [2]
    records = h.controller.fence_silent(h.image, 2, epoch(h, 2), h.now)
    assert isinstance(records[0], FenceBrokerRecord) and records[0].broker_id == 2
    h.run(records)
    assert h.image.brokers[2].fenced
    parts = h.image.topic("t").partitions.values()
    assert all(p.leader != 2 and 2 not in p.isr and p.leader >= 0 for p in parts)
    assert h.controller.silent_brokers(h.image, h.now) == []          # fenced: nothing left to do
    assert h.controller.fence_silent(h.image, 2, epoch(h, 2), h.now) == []


def test_no_report_no_fencing_however_long_the_heartbeat_silence_below_the_session():
    h = harness()
    h.now = 8000    # 8 s without heartbeats (session timeout 9 s), but nobody reported it
    assert h.controller.silent_brokers(h.image, h.now) == []
    assert h.controller.fence_silent(h.image, 2, epoch(h, 2), h.now) == []


def test_a_heartbeating_broker_is_never_fenced_for_silence():
    """Busy under load or a one-way broker-to-broker link loss: reported, but it heartbeats."""
    h = harness()
    for t in range(0, 10_000, 1000):
        h.now = t
        h.heartbeat(2)
        h.controller.report_silent(h.image, 1, epoch(h, 1), 2, h.now)
        h.controller.report_silent(h.image, 3, epoch(h, 3), 2, h.now)
        assert h.controller.silent_brokers(h.image, h.now) == []
        assert h.controller.fence_silent(h.image, 2, epoch(h, 2), h.now) == []
    h.now += FENCE_MS - 1
    assert h.controller.silent_brokers(h.image, h.now) == []


def test_a_heartbeat_during_the_probe_cancels_the_fencing():
    h = harness()
    h.now = 2000
    h.controller.report_silent(h.image, 1, epoch(h, 1), 2, h.now)
    assert h.controller.silent_brokers(h.image, h.now) == [2]   # the shell starts its probe
    h.heartbeat(2)                                              # it answers meanwhile
    assert h.controller.fence_silent(h.image, 2, epoch(h, 2), h.now + 400) == []


def test_reports_expire_and_a_new_incarnation_is_left_alone():
    h = harness()
    h.now = 2000
    h.controller.report_silent(h.image, 1, epoch(h, 1), 2, h.now)
    assert h.controller.silent_brokers(h.image, h.now + MAX_AGE_MS) == [2]
    assert h.controller.silent_brokers(h.image, h.now + MAX_AGE_MS + 1) == []   # stale report
    h.controller.report_silent(h.image, 1, epoch(h, 1), 2, h.now)
    assert h.controller.fence_silent(h.image, 2, epoch(h, 2) - 1, h.now) == []   # another incarnation


def test_only_live_registered_reporters_count():
    h = harness()
    h.now = 2000
    with pytest.raises(KraftlogError) as e:
        h.controller.report_silent(h.image, 1, epoch(h, 1) + 1, 2, h.now)   # stale reporter epoch
    assert e.value.code is ErrorCode.STALE_BROKER_EPOCH
    assert not h.controller.report_silent(h.image, 1, epoch(h, 1), 1, h.now)  # itself
    assert not h.controller.report_silent(h.image, 1, epoch(h, 1), 9, h.now)  # unknown target
    h.controller.report_silent(h.image, 3, epoch(h, 3), 2, h.now)
    h.run(h.controller.fence_broker(h.image, 3))          # the reporter itself got fenced
    assert h.controller.silent_brokers(h.image, h.now) == []


def test_a_new_active_controller_counts_brokers_it_never_heard_from_as_silent_once_reported():
    """After a failover the brokers were heartbeating the old controller: the new one has
    heard from nobody, so a report plus a failed probe suffice (its lease grant is no heartbeat)."""
    h = harness()
    h.now = 50_000
    h.controller.reset_sessions(h.image, h.now)
    assert h.controller.silent_brokers(h.image, h.now) == []
    h.controller.report_silent(h.image, 1, epoch(h, 1), 2, h.now)
    assert h.controller.silent_brokers(h.image, h.now) == [2]
    h.heartbeat(2)
    assert h.controller.silent_brokers(h.image, h.now) == []
    # and it forgets what its predecessor's instance was told
    h.controller.report_silent(h.image, 1, epoch(h, 1), 3, h.now)
    h.controller.reset_sessions(h.image, h.now)
    assert h.controller.silence_reports == {}


def test_the_rule_is_off_at_zero_and_settings_are_checked():
    h = Harness(broker_silence_fence_ms=0)
    h.create("t", 1, 3)
    h.now = 5000
    h.controller.report_silent(h.image, 1, epoch(h, 1), 2, h.now)
    assert h.controller.silent_brokers(h.image, h.now) == []
    with pytest.raises(ValueError, match="broker_silence_fence_ms"):
        ControllerSettings(broker_silence_fence_ms=-1)
    with pytest.raises(ValueError, match="broker_silence_report_max_age_ms"):
        ControllerSettings(broker_silence_report_max_age_ms=0)


def test_the_probe_tells_a_serving_broker_from_a_stopped_or_missing_one():
    """The shell's probe (`_probe_broker`, a blocking connect + GET /healthz in a thread):
    only an HTTP answer counts as alive; an accepted connection alone does not (a stopped
    process, or a proxy accepting for a dead one)."""
    import socket
    import threading

    from metadata_quorum.controller_server import _probe_broker

    def server(answer: bytes):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen(4)

        def serve():
            conn, _ = s.accept()
            conn.recv(1024)
            if answer:
                conn.sendall(answer)
            conn.close()
        threading.Thread(target=serve, daemon=True).start()
        return s, f"http://127.0.0.1:{s.getsockname()[1]}"

    s, url = server(b"HTTP/1.1 503 Service Unavailable\r\n\r\n")
    assert _probe_broker(url, 0.5, 1.0) == "connected"        # any answer: alive (503 while starting)
    s.close()
    s, url = server(b"")
    assert _probe_broker(url, 0.5, 1.0) == "closed"            # accepted, then closed unanswered
    s.close()
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)                                            # the kernel accepts; nobody answers
    assert _probe_broker(f"http://127.0.0.1:{silent.getsockname()[1]}", 0.5, 0.3) == "no-answer"
    port = silent.getsockname()[1]
    silent.close()
    assert _probe_broker(f"http://127.0.0.1:{port}", 0.5, 0.3) == "refused"


def test_a_busy_broker_answers_the_second_probe_a_stopped_one_none():
    """A connected probe left unanswered is tried again before it counts
    (`broker_silence_probe_answer_attempts`, 2): a broker whose event loop is busy for a
    little more than the answer timeout (applying a large metadata change) answers the second
    probe and is not fenced; a listener that never answers (a stopped process) is "no-answer"
    after every attempt. With a single attempt the busy broker would count as stopped."""
    import socket
    import threading

    import dataclasses

    from metadata_quorum.controller_server import ControllerConfig, _probe_broker_attempts

    defaults = {f.name: f.default for f in dataclasses.fields(ControllerConfig)}
    assert defaults["broker_silence_probe_answer_attempts"] == 2

    def busy_listener(busy_s: float):
        """Accepts (the kernel does), but serves nobody for `busy_s`, then answers every
        connection still open."""
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        stop = threading.Event()

        def serve():
            if stop.wait(busy_s):
                return
            s.settimeout(0.2)
            while not stop.is_set():
                try:
                    conn, _ = s.accept()
                except OSError:
                    continue
                with conn:
                    try:
                        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                    except OSError:
                        pass   # the first probe gave up on this connection already
        threading.Thread(target=serve, daemon=True).start()
        return s, stop, f"http://127.0.0.1:{s.getsockname()[1]}"

    s, stop, url = busy_listener(1.3)
    try:
        assert _probe_broker_attempts(url, 0.5, 1.0, 1) == "no-answer"   # the old rule: fenced
    finally:
        stop.set()
        s.close()
    s, stop, url = busy_listener(1.3)
    try:
        assert _probe_broker_attempts(url, 0.5, 1.0, 2) == "connected"   # busy 1.3 s: the second probe is answered
    finally:
        stop.set()
        s.close()
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)                                                    # stopped: never answers
    try:
        assert _probe_broker_attempts(f"http://127.0.0.1:{silent.getsockname()[1]}", 0.5, 0.3, 2) == "no-answer"
    finally:
        silent.close()


def test_a_broker_noted_alive_by_its_watchdog_is_not_silent_but_keeps_its_lease_as_it_was():
    """`note_alive` (a broker's stall watchdog, issue 25): a reported broker whose event loop is
    busy but whose process says it is alive counts as heard for the silence rule; it renews no
    lease, and a stale epoch or a fenced broker does not count."""
    h = harness()
    h.now = 20_000
    h.controller.report_silent(h.image, 1, epoch(h, 1), 2, h.now)
    assert h.controller.silent_brokers(h.image, h.now) == [2]
    lease = h.controller.sessions.get(2)
    assert not h.controller.note_alive(h.image, 2, epoch(h, 2) + 1, h.now)   # another incarnation's epoch
    assert h.controller.silent_brokers(h.image, h.now) == [2]
    assert h.controller.note_alive(h.image, 2, epoch(h, 2), h.now)
    assert h.controller.silent_brokers(h.image, h.now) == []
    assert h.controller.sessions.get(2) == lease                              # no lease renewal
    h.now += FENCE_MS + 1                                                     # the notes stopped
    h.controller.report_silent(h.image, 1, epoch(h, 1), 2, h.now)
    assert h.controller.silent_brokers(h.image, h.now) == [2]
