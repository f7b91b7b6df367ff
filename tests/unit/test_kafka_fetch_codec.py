"""The hand-tuned Fetch response encoder (http_api/kafka/fetch_codec.py) writes, for every
served Fetch version, the same bytes as kio's generated codec for the same answer."""
from __future__ import annotations

import random

import pytest
from kio.schema.errors import ErrorCode as K

from http_api.kafka import protocol
from http_api.kafka.fetch_codec import encode_fetch_response

FETCH = 1


def _kio_frame(version: int, correlation_id: int, doc: dict) -> bytes:
    return protocol.encode_response(FETCH, version, correlation_id,
                                    protocol.build(protocol.response_type(FETCH, version), doc))


def _answer(rnd: random.Random) -> dict:
    """An answer as KafkaApis.fetch builds it: topics of partitions with errors or records,
    aborted transactions absent (read_uncommitted), empty or listed (read_committed)."""
    topics = []
    for t in range(rnd.choice([0, 1, 1, 2, 3])):
        parts = []
        for p in range(rnd.choice([1, 1, 2, 5])):
            records = rnd.choice([b"", bytes(rnd.randrange(256) for _ in range(rnd.choice([1, 70, 300])))])
            aborted = rnd.choice([None, [], [{"producer_id": rnd.randrange(1 << 40), "first_offset": rnd.randrange(
                1 << 33)} for _ in range(rnd.randint(1, 3))]])
            parts.append({"partition_index": p * 3 + t, "error_code": rnd.choice([K.none, K.offset_out_of_range,
                                                                                 K.topic_authorization_failed]),
                          "high_watermark": rnd.choice([-1, 0, rnd.randrange(1 << 50)]),
                          "last_stable_offset": rnd.choice([-1, rnd.randrange(1 << 40)]),
                          "log_start_offset": rnd.choice([-1, 0, 12345]), "aborted_transactions": aborted,
                          "preferred_read_replica": -1, "records": records})
        topics.append({"topic": rnd.choice(["t", "orders-ü", "x" * 130]) + str(t), "partitions": parts})
    return {"throttle_time": rnd.choice([0, 7]), "error_code": K.none, "session_id": 0, "responses": topics}


@pytest.mark.parametrize("version", range(protocol.API_VERSIONS[FETCH][1], protocol.API_VERSIONS[FETCH][2] + 1))
def test_fetch_frames_equal_kios_byte_for_byte(version):
    rnd = random.Random(version)
    for i in range(60):
        doc = _answer(rnd)
        cid = rnd.randrange(-(1 << 31), 1 << 31)
        parts = encode_fetch_response(version, cid, doc)
        assert parts is not None
        assert b"".join(parts) == _kio_frame(version, cid, doc), (version, i)


def test_records_are_passed_on_uncopied_and_tagged_answers_left_to_kio():
    records = b"r" * 1000
    doc = {"throttle_time": 0, "error_code": K.none, "session_id": 0, "responses": [
        {"topic": "t", "partitions": [{"partition_index": 0, "error_code": K.none, "high_watermark": 5,
                                       "last_stable_offset": 5, "log_start_offset": 0, "aborted_transactions": None,
                                       "preferred_read_replica": -1, "records": records}]}]}
    assert any(p is records for p in encode_fetch_response(12, 1, doc))
    doc["responses"][0]["partitions"][0]["current_leader"] = {"leader_id": 2, "leader_epoch": 3}
    assert encode_fetch_response(12, 1, doc) is None
    assert encode_fetch_response(13, 1, {"responses": []}) is None
