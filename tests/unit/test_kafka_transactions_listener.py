"""The Kafka listener's transaction pieces (http_api/kafka/): transaction markers in Kafka's
control record format (read by kafka-python's reader, an independent implementation),
transactional batches stored and fetched byte for byte, the checks on a client's batches,
the read_committed cut at the last stable offset, and the transaction APIs advertised and
dispatched only over a coordinator."""
from __future__ import annotations

import asyncio
import io
import struct
from types import SimpleNamespace

import pytest
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from http_api.broker.config import BrokerConfig
from http_api.kafka import protocol
from http_api.kafka.apis import KafkaApis, TXN_API_KEYS
from http_api.kafka.protocol import FrameError, build
from http_api.kafka.records import (InvalidRecord, batches_below, check_client_batch, kafka_to_stored,
                                    stored_batch_to_kafka, stored_to_kafka)
from partitions.errors import ErrorCode, KraftlogError
from partitions.log import record_batch as rb
from partitions.log import transactions as ptxn


def _kafka_txn_batch(pid: int = 11, epoch: int = 2, seq: int = 0, n: int = 3) -> bytes:
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=True, producer_id=pid,
                                  producer_epoch=epoch, base_sequence=seq, batch_size=1 << 20)
    for i in range(n):
        b.append(i, timestamp=1_700_000_000_000 + i, key=f"k{i}".encode(), value=f"v{i}".encode(), headers=[])
    return bytes(b.build())


@pytest.mark.parametrize("commit", [True, False])
def test_markers_reach_kafka_clients_as_control_records(commit):
    marker = ptxn.build_marker_batch(42, 3, commit, coordinator_epoch=5)
    kafka = DefaultRecordBatch(stored_batch_to_kafka(marker))
    assert kafka.validate_crc()
    assert kafka.is_control_batch and kafka.is_transactional
    assert (kafka.producer_id, kafka.producer_epoch) == (42, 3)
    (record,) = list(kafka)
    # Kafka's control record: key int16 version 0 + int16 type (0 ABORT, 1 COMMIT),
    # value int16 version 0 + int32 coordinator epoch
    assert record.key == struct.pack(">hh", 0, 1 if commit else 0)
    assert record.value == struct.pack(">hi", 0, 5)


def test_a_transactional_kafka_batch_is_stored_transactional_and_fetched_byte_for_byte():
    kafka = _kafka_txn_batch()
    stored, h = kafka_to_stored(kafka)
    header = rb.BatchHeader.parse(stored)
    assert header.is_transactional and not header.is_control
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (11, 2, 0)
    assert stored_batch_to_kafka(stored) == kafka
    check_client_batch(h, transactional=True)


def test_client_batches_that_kafka_refuses_are_refused():
    _s, txn_h = kafka_to_stored(_kafka_txn_batch())
    with pytest.raises(InvalidRecord, match="transactional id"):
        check_client_batch(txn_h, transactional=False)      # transactional batch, no transactional id
    plain = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                      producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    plain.append(0, timestamp=1, key=None, value=b"v", headers=[])
    _s, plain_h = kafka_to_stored(bytes(plain.build()))
    check_client_batch(plain_h, transactional=False)
    with pytest.raises(InvalidRecord, match="transactional"):
        check_client_batch(plain_h, transactional=True)     # a transactional request with a plain batch
    _s, marker_h = kafka_to_stored(stored_batch_to_kafka(ptxn.build_marker_batch(1, 0, True)))
    with pytest.raises(InvalidRecord, match="control"):
        check_client_batch(marker_h, transactional=True)    # a client forging a marker


def test_read_committed_answers_whole_batches_below_the_last_stable_offset():
    batches = [rb.build_batch([rb.Record(None, f"v{i}".encode()) for i in range(n)], base_offset=base)
               for base, n in ((0, 2), (2, 3), (5, 1))]
    buf = b"".join(batches)
    assert batches_below(buf, 0) == (b"", -1)
    assert batches_below(buf, 2) == (batches[0], 2)
    assert batches_below(buf, 4) == (batches[0] + batches[1], 5)    # a batch starting below the LSO is whole
    assert batches_below(buf, 6) == (buf, 6)
    assert batches_below(buf + batches[2][:20], 100) == (buf, 6)    # a partial batch at the end is left out
    assert stored_to_kafka(batches_below(buf, 2)[0]) == stored_batch_to_kafka(batches[0])


class _FakeCoordinator:
    """Stands for http_api.broker.transactions.TransactionCoordinator: every transactional
    id is coordinated elsewhere."""

    async def run_local(self, txid, fn):
        raise KraftlogError(ErrorCode.NOT_COORDINATOR, f"not the coordinator of {txid!r}")

    async def coordinator_of(self, txid):
        raise KraftlogError(ErrorCode.COORDINATOR_NOT_AVAILABLE, "no coordinator yet")


def _apis(transactions) -> KafkaApis:
    ctx = SimpleNamespace(config=BrokerConfig(), rm=None)
    return KafkaApis(ctx, None, broker_id=1, kafka_address=lambda: "127.0.0.1:1", transactions=transactions)


def _request(api_key: int, version: int, body: dict) -> bytes:
    cls = protocol.request_type(api_key, version)
    header = struct.pack(">hhih", api_key, version, 7, 1) + b"t" + (b"\x00" if cls.__flexible__ else b"")
    buf = io.BytesIO()
    protocol._writer(cls)(buf, build(cls, body))
    return header + buf.getvalue()


def _decode_answer(api_key: int, version: int, frame: bytes):
    cls = protocol.response_type(api_key, version)
    body = memoryview(frame)[8 + (1 if cls.__flexible__ and api_key != 18 else 0):]
    return protocol._reader(cls)(body, 0)[0]


def test_transaction_apis_are_advertised_and_served_only_over_a_coordinator():
    async def go():
        with_txn, without = _apis(_FakeCoordinator()), _apis(None)
        req = _request(18, 3, {"client_software_name": "t", "client_software_version": "1"})
        keys = {k.api_key: (k.min_version, k.max_version) for k in _decode_answer(18, 3, await with_txn.handle(req)).api_keys}
        assert {k: keys[k] for k in TXN_API_KEYS} == {24: (0, 3), 25: (0, 3), 26: (0, 3), 28: (0, 3)}
        assert keys[22] == (0, 4)
        keys = {k.api_key for k in _decode_answer(18, 3, await without.handle(req)).api_keys}
        assert not keys & TXN_API_KEYS
        end = _request(26, 3, {"transactional_id": "tx", "producer_id": 5, "producer_epoch": 0, "committed": True})
        with pytest.raises(FrameError):
            await without.handle(end)
        answer = _decode_answer(26, 3, await with_txn.handle(end))
        assert answer.error_code.name == "not_coordinator"    # the client finds the coordinator again
        find = _request(10, 3, {"key": "tx", "key_type": 1})
        answer = _decode_answer(10, 3, await with_txn.handle(find))
        assert answer.error_code.name == "coordinator_not_available" and answer.node_id == -1
    asyncio.run(go())


def test_producer_fenced_is_invalid_producer_epoch_for_versions_before_kip_588():
    apis = _apis(_FakeCoordinator())
    fenced = KraftlogError(ErrorCode.PRODUCER_FENCED, "fenced")
    for api_key, first in ((22, 4), (24, 2), (25, 2), (26, 2), (28, 3)):
        assert apis._txn_error(fenced, SimpleNamespace(api_key=api_key, api_version=first)).name == "producer_fenced"
        assert apis._txn_error(fenced, SimpleNamespace(api_key=api_key, api_version=first - 1)).name == \
            "invalid_producer_epoch"
