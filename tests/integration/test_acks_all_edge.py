"""acks=all at the HTTP edge, RF=3, real processes (1 controller + 3 brokers): the default
acks (no query parameter) on the leader's partition route, and the topic-level route the
README tour uses sent to a broker that is not the leader (it forwards to the leader), answer
only once every ISR member has the record; below min.insync.replicas the forwarding route
refuses with NOT_ENOUGH_REPLICAS and appends nothing.

The witness is a follower stopped with SIGSTOP before the write: its log end cannot pass the
record, so an answer may only come once it has left the ISR (after replica.lag.time.max.ms).
An acks=all that answered after the leader's own write would answer while it is still in."""
import signal
import time

import pytest

from tests.rigs.cluster import ReplicatedCluster, http

pytestmark = pytest.mark.integration

LAG_MS = 2000   # replica.lag.time.max.ms: how long an answer must wait for the stopped follower


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # long broker sessions: the stopped follower leaves the ISR by lag, never by fencing
    c = ReplicatedCluster(str(tmp_path_factory.mktemp("acks-edge")), brokers=3,
                          broker_config={"replica_lag_time_max_ms": LAG_MS, "min_insync_replicas": 2},
                          controller_args=["--broker-session-timeout-ms", "60000"])
    try:
        c.start()
        yield c
    finally:
        c.close()


def _roles(c: ReplicatedCluster, topic: str) -> tuple[int, int, int]:
    """(leader, the follower to stop, the live follower that forwards)."""
    p = c.partition(topic)
    assert len(p["isr"]) == 3, p
    leader = p["leader"]
    stopped, forwarder = [r for r in p["replicas"] if r != leader]
    return leader, stopped, forwarder


def _produce_with_a_follower_stopped(c: ReplicatedCluster, topic: str, stopped: int, url: str, value: str) -> int:
    """SIGSTOP `stopped`, POST one record to `url` with no acks parameter, and check the
    answer came once every ISR member (as the controller commits it) was past the record:
    the stopped follower cannot be, so it must be out of the ISR by then. Returns the offset."""
    c.signal(stopped, signal.SIGSTOP)
    try:
        stopped_at = time.monotonic()
        status, doc = http("POST", url, {"records": [{"value": value}]}, timeout=30)
        acked_after = time.monotonic() - stopped_at
        isr_at_ack = c.partition(topic)["isr"]      # read right after the answer
        assert status == 200, (status, doc)
        offset = doc["offsets"][0]["offset"]
        assert stopped not in isr_at_ack, (
            f"acks=all answered {acked_after:.3f} s after broker {stopped} was stopped, while it was still "
            f"in the ISR {isr_at_ack} with its log end behind offset {offset}")
        leader = c.partition(topic)["leader"]
        status, off = http("GET", f"{c.url(leader)}/v1/topics/{topic}/partitions/0/offsets")
        assert status == 200 and off["high_watermark"] > offset, off
    finally:
        c.signal(stopped, signal.SIGCONT)
    c.wait_for(lambda: stopped in c.partition(topic)["isr"], 30, f"broker {stopped} back in the ISR")
    return offset



def test_default_acks_on_the_partition_route_waits_for_every_isr_member(cluster):
    c = cluster
    c.create_topic("edge-default", partitions=1, replication_factor=3)
    leader, stopped, _ = _roles(c, "edge-default")
    url = f"{c.url(leader)}/v1/topics/edge-default/partitions/0/records"   # no ?acks=: the default
    offset = _produce_with_a_follower_stopped(c, "edge-default", stopped, url, "default-acks")
    assert c.read_all("edge-default") == [(offset, "default-acks")]


def test_topic_route_forwarded_by_a_non_leader_waits_for_every_isr_member(cluster):
    c = cluster
    c.create_topic("edge-forward", partitions=1, replication_factor=3)
    leader, stopped, forwarder = _roles(c, "edge-forward")
    assert forwarder != leader
    url = f"{c.url(forwarder)}/v1/topics/edge-forward/records"   # the README tour's route, default acks
    offset = _produce_with_a_follower_stopped(c, "edge-forward", stopped, url, "forwarded")
    assert c.read_all("edge-forward") == [(offset, "forwarded")]


def test_forwarding_route_refuses_with_not_enough_replicas_below_min_insync(cluster):
    c = cluster
    c.create_topic("edge-strict", partitions=1, replication_factor=3, configs={"min.insync.replicas": "3"})
    leader, stopped, forwarder = _roles(c, "edge-strict")
    url = f"{c.url(forwarder)}/v1/topics/edge-strict/records"
    c.signal(stopped, signal.SIGSTOP)
    try:
        c.wait_for(lambda: stopped not in c.partition("edge-strict")["isr"], 20,
                   f"broker {stopped} out of the ISR")
        assert c.partition("edge-strict")["leader"] == leader
        status, doc = http("POST", url, {"records": [{"value": "refused-1"}, {"value": "refused-2"}]}, timeout=30)
        assert status == 503 and doc["error_code"] == "NOT_ENOUGH_REPLICAS", (status, doc)
        assert [e.get("error_code") for e in doc["offsets"]] == ["NOT_ENOUGH_REPLICAS"] * 2, doc
        assert not any("offset" in e for e in doc["offsets"]), doc
    finally:
        c.signal(stopped, signal.SIGCONT)
    c.wait_for(lambda: len(c.partition("edge-strict")["isr"]) == 3, 30, "full ISR again")
    # ISR back at min.insync.replicas: the same route accepts, and the refused records never were written
    status, doc = http("POST", url, {"records": [{"value": "accepted"}]}, timeout=30)
    assert status == 200, (status, doc)
    assert c.read_all("edge-strict") == [(doc["offsets"][0]["offset"], "accepted")]
