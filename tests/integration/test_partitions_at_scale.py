"""Partitions at scale (issue 25), end to end on a real 3-broker cluster: while a topic of
5,100 partitions is created (more records than one page of the controller's metadata
feed, 5,000), clients polling `GET /v1/topics/{t}` and `GET /v1/metadata` on every broker
see the topic with 0 or all of its partitions, never a part of it; the create call answers
201 (or 202 "creating"), never a timeout; the metadata lag is in /healthz and /metrics."""
from __future__ import annotations

import threading
import time
import urllib.request

import pytest

from tests.rigs.cluster import ReplicatedCluster, http

# minutes at load 30+ on 2 shared cores (a healthy run takes about one)
pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

PARTITIONS = 5100          # > feed_records_per_response_max (5000): the topic spans two feed pages
# brokers read the feed in runs, up to feed_run_records_per_response_max records an answer
# (50,000): lowered here so the topic spans three of their pages too
RUN_PAGE_RECORDS = 2000
DEADLINE_S = 480.0         # generous: 2 shared cores (180 s ran out at load 30)
POLL_PAUSE_S = 0.05        # between one poller's reads: six back-to-back pollers of 5,100-partition
                           # answers competed for the 2 cores with the controller and brokers creating it


def _count_topic(url: str, topic: str) -> int | None:
    status, body = http("GET", f"{url}/v1/topics/{topic}", timeout=30)
    if status == 404:
        return 0
    if status == 200:
        return len(body["partitions"])
    return None   # unreachable / busy: no observation


def _count_in_metadata(url: str, topic: str) -> int | None:
    status, body = http("GET", f"{url}/v1/metadata", timeout=30)
    if status != 200:
        return None
    for t in body["topics"]:
        if t["name"] == topic:
            return len(t["partitions"])
    return 0


def test_no_client_observes_a_partial_topic_while_a_large_topic_is_created(tmp_path):
    with ReplicatedCluster(str(tmp_path), brokers=3,
                           controller_args=["--feed-run-records-per-response-max", str(RUN_PAGE_RECORDS)]) as c:
        seen: dict = {}            # (broker, route) -> observed partition counts
        stop = threading.Event()
        errors: list = []

        def poll(broker_id: int, route: str, fn) -> None:
            counts = seen.setdefault((broker_id, route), [])
            try:
                while not stop.is_set():
                    n = fn(c.url(broker_id), "big")
                    if n is not None:
                        counts.append(n)
                    stop.wait(POLL_PAUSE_S)
            except Exception as e:  # noqa: BLE001 - reported by the test
                errors.append(e)

        pollers = [threading.Thread(target=poll, args=(b, "topic", _count_topic), daemon=True) for b in c.ports]
        pollers += [threading.Thread(target=poll, args=(b, "metadata", _count_in_metadata), daemon=True)
                    for b in c.ports]
        for t in pollers:
            t.start()
        try:
            started = time.monotonic()
            status, body = http("POST", c.url(1) + "/v1/topics",
                                {"name": "big", "partitions": PARTITIONS, "replication_factor": 1}, timeout=120)
            assert status in (201, 202), (status, body)
            if status == 202:
                assert body["creating"] is True and body["brokers_pending"], body
            # every broker shows the whole topic (poll, generous deadline)
            for b in c.ports:
                while _count_topic(c.url(b), "big") != PARTITIONS:
                    assert time.monotonic() - started < DEADLINE_S, f"broker {b} never showed the whole topic"
                    time.sleep(0.1)
            # keep polling a moment after the topic is whole everywhere
            settle = time.monotonic() + 1.0
            while time.monotonic() < settle:
                time.sleep(0.1)
        finally:
            stop.set()
            for t in pollers:
                t.join(60)
        assert not errors, errors
        for (b, route), counts in seen.items():
            assert counts, f"no observation of broker {b} {route}"
            partial = sorted({n for n in counts if n not in (0, PARTITIONS)})
            assert not partial, f"broker {b} {route} showed {partial} of {PARTITIONS} partitions"
            assert counts[-1] == PARTITIONS, (b, route, counts[-5:])
        # every broker's metadata lag is visible and back to 0 once caught up
        for b in c.ports:
            status, health = http("GET", c.url(b) + "/healthz")
            assert status == 200 and health["metadata_lag_ms"] == 0 and health["metadata_lag_records"] == 0, health
            assert health["published_metadata_offset"] >= PARTITIONS + 1, health
            with urllib.request.urlopen(c.url(b) + "/metrics", timeout=30) as r:
                metrics = r.read().decode()
            assert "kraftlog_metadata_lag_records 0.0" in metrics and "kraftlog_metadata_lag_ms 0.0" in metrics
        # a broker's feed answer (runs=1) held a page of the topic, not the whole of it
        status, page = http("GET", c.controllers.urls[0] + "/controller/v1/metadata/records?after=0&runs=1",
                            timeout=30)
        assert status == 200, page
        held = sum(len(i["run"]["partition"]) if "run" in i else 1 for i in page["records"])
        assert held <= RUN_PAGE_RECORDS < PARTITIONS, held
        # a produce to the last partition works on its leader
        status, body = http("POST", c.url(1) + "/v1/topics/big/records",
                            {"records": [{"value": "v", "partition": PARTITIONS - 1}]}, timeout=60)
        assert status == 200, body
