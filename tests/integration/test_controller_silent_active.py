"""A silent active controller costs the brokers about one heartbeat interval (issue 24).

3 controllers + 2 brokers (RF=2), default heartbeat interval (2 s) and broker session
timeout (9 s). The active controller is SIGSTOPped: the kernel still accepts TCP connects
into its backlog and kept-alive connections stay open, but it never answers, exactly like
a host whose network went silent. The two others elect a new active controller; every
broker must heartbeat it within WITHIN_S of the election (its try on the silent one times
out after at most one heartbeat interval, then it asks the others at once and follows their
hint), and its metadata feed must follow it as fast. No healthy broker may be fenced: the
new controller's lease (9 s from its election) must never expire for them, and no
FenceBroker record may name them. With the old 5 s tries on a kept-alive connection and
a 7 s long poll, the brokers reach the new controller 4-7 s after the election."""
import datetime
import json
import os
import signal
import time

import pytest

from tests.rigs.cluster import ReplicatedCluster, http

pytestmark = pytest.mark.integration

WITHIN_S = 3.0        # election -> every broker heartbeats the new active controller
OBSERVE_S = 12.0      # > broker_session_timeout_ms (9 s): a broker left behind would be fenced
LINE = "heartbeat answered by the active controller "


def _heartbeat_switch_time(c: ReplicatedCluster, broker_id: int, url: str, after: float):
    """Wall time of the broker's log line saying a heartbeat was answered by `url`, or None."""
    with open(c.log_path(broker_id), encoding="utf-8", errors="replace") as f:
        for line in f:
            if LINE + url in line:
                stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
                if stamp >= after:
                    return stamp
    return None


def _records_after(url: str, offset: int) -> list:
    status, body = http("GET", f"{url}/controller/v1/metadata/records?after={offset}&max_wait_ms=0", timeout=5)
    assert status == 200 and body.get("snapshot") is None, (status, body)
    return [item["record"] for item in body["records"]]


def test_brokers_follow_the_new_active_controller_within_a_heartbeat_and_are_never_fenced(tmp_path):
    c = ReplicatedCluster(str(tmp_path), brokers=2, controllers=3)
    stopped = None
    try:
        c.start()
        c.create_topic("silent", partitions=2, replication_factor=2)
        old = c.controllers.wait_active(20)
        before = c.controller_metadata()["metadata_offset"]

        stopped = c.controllers.procs[old]
        t_stop = time.time()
        stopped.send_signal(signal.SIGSTOP)
        new = c.controllers.wait_active(20, exclude=(old,))
        t_elected = time.time()
        new_url = c.controllers.voters[new].url
        print(f"controller {old} silenced; {new} active after {t_elected - t_stop:.2f} s")

        fenced_seen: dict = {}
        switched: dict = {}
        fed: dict = {}     # broker -> s after the election when its metadata names the new controller
        deadline = time.monotonic() + OBSERVE_S
        while time.monotonic() < deadline:
            _, doc = http("GET", new_url + "/controller/v1/metadata", timeout=5)
            for b in (doc or {}).get("brokers", []):
                if b["fenced"]:
                    fenced_seen.setdefault(b["id"], round(time.time() - t_elected, 2))
            for b in (1, 2):
                if b not in fed:
                    _, meta = http("GET", c.url(b) + "/v1/metadata", timeout=5)
                    if (meta or {}).get("controller_id") == new:
                        fed[b] = round(time.time() - t_elected, 2)
                if b not in switched:
                    t = _heartbeat_switch_time(c, b, new_url, t_stop)
                    if t is not None:
                        switched[b] = round(t - t_elected, 2)
            time.sleep(0.1)
        print(f"brokers heartbeat the new active controller at {switched} s after its election")

        assert set(switched) == {1, 2}, f"brokers that never heartbeat {new_url}: {sorted({1, 2} - set(switched))}"
        late = {b: s for b, s in switched.items() if s > WITHIN_S}
        assert not late, f"brokers heartbeat the new active controller late (s after its election): {late}"
        assert not fenced_seen, f"healthy brokers fenced (s after the election): {fenced_seen}"
        fences = [r for r in _records_after(new_url, before)
                  if r["type"] == "FenceBroker" or (r["type"] == "BrokerRegistrationChange" and r.get("fenced"))]
        assert not fences, f"fencing records for healthy brokers: {json.dumps(fences)}"
        # the metadata feed follows too: each broker's metadata names the new controller
        print(f"brokers' metadata names the new active controller at {fed} s after its election")
        assert set(fed) == {1, 2} and max(fed.values()) <= WITHIN_S, \
            f"brokers' metadata feeds follow the new active controller late or never: {fed}"
        for p in c.partition_list("silent"):
            assert len(p["isr"]) == 2, f"an ISR shrank while every broker was healthy: {p}"
    finally:
        if stopped is not None and stopped.poll() is None:
            stopped.send_signal(signal.SIGCONT)
        c.close()
        for b in (1, 2):
            path = c.log_path(b)
            if os.path.exists(path):
                lines = [ln.rstrip() for ln in open(path, encoding="utf-8", errors="replace")
                         if "controller" in ln]
                print(f"--- broker {b} controller lines:\n" + "\n".join(lines[-15:]))
