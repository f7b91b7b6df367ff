"""Idempotent producer dedup across a leader failover, real processes (1 controller + 3
brokers, RF=3): batches written with a producer id, epoch and sequence and acknowledged with
acks=all; the leader is killed with kill -9; the same batches resent to the new leader are
answered as duplicates with their original offsets (the followers rebuilt the producer state
from the replicated batches), the next sequence is appended after them, a sequence gap is
refused, and every record is in the log once."""
import time

import pytest

from http_api.wire import codecs
from http_api.wire.errors import ErrorCode, http_status
from partitions.log import record_batch as rb
from tests.rigs.cluster import ReplicatedCluster, http

pytestmark = pytest.mark.integration

RAW = codecs.RAW_BATCH


def _post_raw(url: str, batch: bytes, deadline_s: float = 30.0) -> tuple[int, dict]:
    """POST a raw batch (acks=all); retried while the partition has no usable leader yet."""
    deadline = time.monotonic() + deadline_s
    while True:
        status, doc = http("POST", url + "?acks=all", raw=batch, content_type=RAW, timeout=30)
        retriable = status in (0, 421, 503) and not (isinstance(doc, dict) and doc.get("error_code") in (
            "NOT_ENOUGH_REPLICAS_AFTER_APPEND", "REQUEST_TIMED_OUT"))   # those may have appended
        if not retriable or time.monotonic() >= deadline:
            return status, doc
        time.sleep(0.1)


def test_a_batch_resent_to_the_new_leader_after_kill_9_is_a_duplicate_with_its_original_offsets(tmp_path):
    c = ReplicatedCluster(str(tmp_path), brokers=3, broker_config={"min_insync_replicas": 2})
    try:
        c.start()
        c.create_topic("idem", partitions=1, replication_factor=3)
        status, doc = http("POST", c.urls[0] + "/v1/producer-ids", {})
        assert status == 200, doc
        pid, epoch = doc["producer_id"], doc["producer_epoch"]

        def batch(seq: int, *values: bytes) -> bytes:
            return rb.build_batch([rb.Record(None, v) for v in values], producer_id=pid, producer_epoch=epoch,
                                  base_sequence=seq)

        first, second = batch(0, b"a", b"b"), batch(2, b"c")
        victim = c.partition("idem")["leader"]
        route = "/v1/topics/idem/partitions/0/records"
        answers = []
        for b in (first, second):
            status, doc = http("POST", c.url(victim) + route + "?acks=all", raw=b, content_type=RAW)
            assert status == 200, (status, doc)
            answers.append(doc["offsets"])
        assert answers == [[{"partition": 0, "offset": 0, "last_offset": 1}],
                           [{"partition": 0, "offset": 2, "last_offset": 2}]]

        before = c.partition("idem")["leader_epoch"]
        c.kill(victim)
        new = c.wait_for(lambda: (lambda p: p if p["leader"] not in (victim, -1) else None)(c.partition("idem")),
                         20, "a new leader for idem-0")
        assert new["leader_epoch"] > before
        new_url = c.url(new["leader"]) + route

        # the acknowledgement was "lost": the producer resends the same id, epoch and sequence
        for b, answer in ((second, answers[1]), (first, answers[0])):
            status, doc = _post_raw(new_url, b)
            assert status == 200, (status, doc)
            assert doc["offsets"] == [dict(e, duplicate=True) for e in answer], doc

        # the new leader continues the producer's sequence and refuses a gap in it
        status, doc = _post_raw(new_url, batch(3, b"d"))
        assert (status, doc["offsets"]) == (200, [{"partition": 0, "offset": 3, "last_offset": 3}]), doc
        status, doc = _post_raw(new_url, batch(9, b"gap"))
        assert status == http_status(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER), (status, doc)
        assert doc["error_code"] == "OUT_OF_ORDER_SEQUENCE_NUMBER", doc

        assert c.read_all("idem") == [(0, "a"), (1, "b"), (2, "c"), (3, "d")]
    finally:
        c.close()
