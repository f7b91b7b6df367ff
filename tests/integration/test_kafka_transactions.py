"""Kafka transactions (KIP-98) on the Kafka listener with real, unmodified clients against a
real 3-broker cluster (tests/rigs/cluster.py): confluent-kafka's and kafka-python's
transactional producers over the transaction coordinator of http_api/broker/transactions.py,
read_committed consumers of both clients, fencing by a second producer of the same
transactional.id, exactly-once consume-transform-produce with a worker that dies mid
transaction, and HTTP's read_committed fetch seeing the same records.
"""
from __future__ import annotations

import time
import uuid

import pytest

from tests.rigs.cluster import ReplicatedCluster, http

pytestmark = [pytest.mark.integration, pytest.mark.slow]

POLL_S = 60.0   # generous: the machine is shared


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with ReplicatedCluster(str(tmp_path_factory.mktemp("kafka-txn")), brokers=3,
                           broker_config={"transaction_state_num_partitions": 3}) as c:
        yield c


def _topic(cluster: ReplicatedCluster, partitions: int = 1) -> str:
    name = f"t-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(name, partitions=partitions, replication_factor=3)
    for p in cluster.partition_list(name):
        url = cluster.url(p["leader"])
        cluster.wait_for(lambda: http("GET", f"{url}/v1/topics/{name}/partitions/{p['partition']}/offsets")[0] == 200,
                         30, f"{name}-{p['partition']} served by its leader", interval=0.05)
    return name


def _txid() -> str:
    return f"tx-{uuid.uuid4().hex[:8]}"


def _confluent_producer(cluster, txid: str):
    from confluent_kafka import Producer
    return Producer({"bootstrap.servers": cluster.kafka_bootstrap, "transactional.id": txid,
                     "transaction.timeout.ms": 60_000, "linger.ms": 5})


def _confluent_read(cluster, tps: list[tuple[str, int]], isolation: str, until, timeout: float = POLL_S) -> list:
    """(topic, partition, key, value) of every record a fresh consumer reads from offset 0,
    polled until `until(records)` holds, then 1 s more (nothing else may arrive)."""
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": cluster.kafka_bootstrap, "group.id": f"r-{uuid.uuid4().hex[:6]}",
                  "enable.auto.commit": False, "isolation.level": isolation})
    try:
        c.assign([TopicPartition(t, p, 0) for t, p in tps])
        out: list = []
        deadline = time.monotonic() + timeout
        settle = None
        while time.monotonic() < (settle or deadline):
            m = c.poll(0.2)
            if m is not None:
                assert m.error() is None, m.error()
                out.append((m.topic(), m.partition(), m.key(), m.value()))
            if settle is None and until(out):
                settle = time.monotonic() + 1.0
        return sorted(out, key=lambda r: (r[0], r[1], r[3] or b""))
    finally:
        c.close()


def _http_committed_values(cluster, topic: str, partition: int) -> list[str]:
    leader = cluster.partition(topic, partition)["leader"]
    status, doc = http("GET", f"{cluster.url(leader)}/v1/topics/{topic}/partitions/{partition}/records"
                              "?offset=0&isolation_level=read_committed&max_bytes=1048576")
    assert status == 200, doc
    return [r["value"] for r in doc["records"]]


def _latest(cluster, topic: str, isolation: str) -> int:
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": cluster.kafka_bootstrap, "group.id": f"w-{uuid.uuid4().hex[:6]}",
                  "isolation.level": isolation})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)[1]
    finally:
        c.close()


def _committed_offset(cluster, group: str, topic: str, partition: int) -> int:
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": cluster.kafka_bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        return c.committed([TopicPartition(topic, partition)], timeout=30)[0].offset
    finally:
        c.close()


def test_confluent_commit_and_abort_across_two_topics_read_committed_both_ways(cluster):
    """A committed transaction over 3 partitions of 2 topics with group offsets, then an
    aborted one: read_committed (Kafka and HTTP) sees the committed records only, no markers;
    read_uncommitted sees both; the group's offsets appear with the commit only."""
    from confluent_kafka import TopicPartition
    a, b, src = _topic(cluster, partitions=2), _topic(cluster), _topic(cluster)
    group = f"g-{uuid.uuid4().hex[:6]}"
    p = _confluent_producer(cluster, _txid())
    p.init_transactions(POLL_S)
    p.begin_transaction()
    for i in range(6):
        p.produce(a, key=f"k{i}".encode(), value=f"c{i}".encode(), partition=i % 2,
                  headers=[("h", f"{i}".encode())])
    p.produce(b, key=None, value=b"c-b")
    from confluent_kafka import Consumer
    meta_consumer = Consumer({"bootstrap.servers": cluster.kafka_bootstrap, "group.id": group})
    try:
        p.send_offsets_to_transaction([TopicPartition(src, 0, 7)], meta_consumer.consumer_group_metadata(), POLL_S)
    finally:
        meta_consumer.close()
    p.commit_transaction(POLL_S)
    assert _committed_offset(cluster, group, src, 0) == 7

    p.begin_transaction()
    for i in range(4):
        p.produce(a, value=f"x{i}".encode(), partition=i % 2)
    p.produce(b, value=b"x-b")
    meta_consumer = Consumer({"bootstrap.servers": cluster.kafka_bootstrap, "group.id": group})
    try:
        p.send_offsets_to_transaction([TopicPartition(src, 0, 99)], meta_consumer.consumer_group_metadata(), POLL_S)
    finally:
        meta_consumer.close()
    p.flush(POLL_S)
    p.abort_transaction(POLL_S)
    p.begin_transaction()
    p.produce(a, value=b"c-last", partition=0)
    p.commit_transaction(POLL_S)
    p.flush(POLL_S)

    tps = [(a, 0), (a, 1), (b, 0)]
    committed = _confluent_read(cluster, tps, "read_committed", lambda rs: len(rs) >= 8)
    assert sorted(r[3] for r in committed) == sorted([f"c{i}".encode() for i in range(6)] + [b"c-b", b"c-last"])
    assert {(r[0], r[1], r[2], r[3]) for r in committed if r[3].startswith(b"c") and r[0] == a and r[3] != b"c-last"} \
        == {(a, i % 2, f"k{i}".encode(), f"c{i}".encode()) for i in range(6)}
    everything = _confluent_read(cluster, tps, "read_uncommitted", lambda rs: len(rs) >= 13)
    assert sorted(r[3] for r in everything) == sorted(
        [f"c{i}".encode() for i in range(6)] + [b"c-b", b"c-last"] + [f"x{i}".encode() for i in range(4)] + [b"x-b"])
    # the same records over HTTP (the Kafka client wrote them; HTTP's read_committed filters them)
    assert _http_committed_values(cluster, a, 0) == ["c0", "c2", "c4", "c-last"]
    assert _http_committed_values(cluster, a, 1) == ["c1", "c3", "c5"]
    assert _http_committed_values(cluster, b, 0) == ["c-b"]
    assert _committed_offset(cluster, group, src, 0) == 7   # the aborted transaction's offsets were dropped


def test_second_producer_with_the_same_transactional_id_fences_the_first(cluster):
    from confluent_kafka import KafkaError, KafkaException
    t = _topic(cluster)
    txid = _txid()
    p1 = _confluent_producer(cluster, txid)
    p1.init_transactions(POLL_S)
    p1.begin_transaction()
    p1.produce(t, value=b"zombie-1")
    p1.flush(POLL_S)
    # ListOffsets latest under read_committed is the LSO: the open transaction's first offset
    assert _latest(cluster, t, "read_committed") == 0
    assert _latest(cluster, t, "read_uncommitted") == 1
    p2 = _confluent_producer(cluster, txid)
    p2.init_transactions(POLL_S)      # bumps the epoch; aborts p1's open transaction
    p2.begin_transaction()
    p2.produce(t, value=b"p2")
    p2.commit_transaction(POLL_S)
    p1.produce(t, value=b"zombie-2")
    with pytest.raises(KafkaException) as e:
        p1.commit_transaction(POLL_S)
    err = e.value.args[0]
    assert err.fatal(), err
    assert err.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH), err
    got = _confluent_read(cluster, [(t, 0)], "read_committed", lambda rs: len(rs) >= 1)
    assert [r[3] for r in got] == [b"p2"]
    assert _http_committed_values(cluster, t, 0) == ["p2"]
    p2.flush(POLL_S)


def test_kafka_python_transactional_producer_and_read_committed_consumer(cluster):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    t = _topic(cluster, partitions=2)
    p = KafkaProducer(bootstrap_servers=cluster.kafka_bootstrap, transactional_id=_txid())
    try:
        p.init_transactions()
        p.begin_transaction()
        for i in range(5):
            p.send(t, value=f"c{i}".encode(), partition=i % 2)
        p.commit_transaction()
        p.begin_transaction()
        for i in range(3):
            p.send(t, value=f"x{i}".encode(), partition=i % 2)
        p.flush(POLL_S)
        p.abort_transaction()
        p.begin_transaction()
        p.send(t, value=b"c-last", partition=1)
        p.commit_transaction()
    finally:
        p.close(10)

    def read(isolation: str, n: int) -> list[bytes]:
        c = KafkaConsumer(bootstrap_servers=cluster.kafka_bootstrap, enable_auto_commit=False,
                          isolation_level=isolation, auto_offset_reset="earliest", consumer_timeout_ms=1000)
        try:
            c.assign([TopicPartition(t, 0), TopicPartition(t, 1)])
            got: list[bytes] = []
            deadline = time.monotonic() + POLL_S
            while len(got) < n and time.monotonic() < deadline:
                got.extend(m.value for m in c)
            got.extend(m.value for m in c)   # one more idle second: nothing else may arrive
            return sorted(got)
        finally:
            c.close()
    assert read("read_committed", 6) == sorted([f"c{i}".encode() for i in range(5)] + [b"c-last"])
    assert read("read_uncommitted", 9) == sorted(
        [f"c{i}".encode() for i in range(5)] + [b"c-last"] + [f"x{i}".encode() for i in range(3)])
    # confluent's read_committed consumer agrees on records kafka-python wrote
    got = _confluent_read(cluster, [(t, 0), (t, 1)], "read_committed", lambda rs: len(rs) >= 6)
    assert sorted(r[3] for r in got) == sorted([f"c{i}".encode() for i in range(5)] + [b"c-last"])


def test_exactly_once_consume_transform_produce_with_a_worker_dying_mid_transaction(cluster):
    """Input records are upper-cased into an output topic, each batch in one transaction with
    its input offsets. The first worker dies after producing a batch but before committing;
    the next worker (same transactional.id) fences it, its transaction is aborted, and it
    resumes at the group's committed offsets: the output holds every input exactly once."""
    from confluent_kafka import Consumer, Producer, TopicPartition
    src, dst = _topic(cluster, partitions=2), _topic(cluster, partitions=2)
    n = 60
    plain = Producer({"bootstrap.servers": cluster.kafka_bootstrap, "acks": "all"})
    for i in range(n):
        plain.produce(src, value=f"r{i}".encode(), partition=i % 2)
    assert plain.flush(POLL_S) == 0
    group, txid = f"eos-{uuid.uuid4().hex[:6]}", _txid()

    def worker(stop_after_batches: int | None) -> int:
        """Runs until the input is drained (or dies mid transaction); returns inputs committed."""
        consumer = Consumer({"bootstrap.servers": cluster.kafka_bootstrap, "group.id": group,
                             "enable.auto.commit": False, "auto.offset.reset": "earliest",
                             "isolation.level": "read_committed"})
        producer = _confluent_producer(cluster, txid)
        producer.init_transactions(POLL_S)
        consumer.subscribe([src])
        done = batches = 0
        idle_deadline = time.monotonic() + POLL_S
        try:
            while time.monotonic() < idle_deadline:
                msgs = consumer.consume(10, 0.5)
                msgs = [m for m in msgs if m.error() is None]
                if not msgs:
                    if done and all(consumer.position([TopicPartition(src, p)])[0].offset >= n // 2
                                    for p in (0, 1)):
                        break
                    continue
                producer.begin_transaction()
                for m in msgs:
                    producer.produce(dst, value=m.value().upper(), partition=m.partition())
                if stop_after_batches is not None and batches == stop_after_batches:
                    producer.flush(POLL_S)   # the outputs are written, the commit never comes
                    return done
                positions = [tp for tp in consumer.position(consumer.assignment()) if tp.offset >= 0]
                producer.send_offsets_to_transaction(positions,
                                                     consumer.consumer_group_metadata(), POLL_S)
                producer.commit_transaction(POLL_S)
                done += len(msgs)
                batches += 1
                idle_deadline = time.monotonic() + POLL_S
            return done
        finally:
            consumer.close()

    first = worker(stop_after_batches=2)
    assert 0 < first < n
    worker(stop_after_batches=None)
    out = _confluent_read(cluster, [(dst, 0), (dst, 1)], "read_committed", lambda rs: len(rs) >= n)
    assert sorted(r[3] for r in out) == sorted(f"R{i}".encode() for i in range(n))   # each exactly once
    assert sorted(_http_committed_values(cluster, dst, 0) + _http_committed_values(cluster, dst, 1)) == \
        sorted(f"R{i}" for i in range(n))
    # the aborted outputs of the dead worker are in the log, invisible to read_committed only
    raw = _confluent_read(cluster, [(dst, 0), (dst, 1)], "read_uncommitted", lambda rs: len(rs) > n)
    assert len(raw) > n


# ---- KIP-890 part 1: a transactional write only into the producer's ongoing transaction ------

def _kafka_txn_produce(cluster, broker: int, txid: str, topic: str, pid: int, epoch: int, value: bytes) -> str:
    """One Produce v11 with `txid` and a transactional batch, sent to `broker` over a raw
    socket (no AddPartitionsToTxn first, unlike a real client); the partition's error name."""
    import datetime
    import socket

    from kafka.record.default_records import DefaultRecordBatchBuilder
    from kio.schema.produce.v11.request import PartitionProduceData, ProduceRequest, TopicProduceData
    from kio.schema.produce.v11.response import ProduceResponse
    from kio.serial import entity_reader

    from tests.integration.test_kafka_clients import _kafka_request, _read_answer
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=True, producer_id=pid,
                                  producer_epoch=epoch, base_sequence=0, batch_size=1 << 20)
    b.append(0, timestamp=int(time.time() * 1000), key=None, value=value, headers=[])
    req = ProduceRequest(transactional_id=txid, acks=-1, timeout=datetime.timedelta(seconds=30), topic_data=(
        TopicProduceData(name=topic, partition_data=(PartitionProduceData(index=0, records=bytes(b.build())),)),))
    host, port = cluster.kafka_address(broker).rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=POLL_S) as s:
        s.sendall(_kafka_request(0, 11, 9, req))
        answer = _read_answer(s)
    assert answer is not None
    resp, _ = entity_reader(ProduceResponse)(answer[5:], 0)
    return resp.responses[0].partition_responses[0].error_code.name


def _http_txn_produce(cluster, broker: int, txid: str | None, topic: str, pid: int, epoch: int,
                      value: bytes) -> tuple[int, dict]:
    """A raw transactional batch to the partition route of `broker` (what the coordinator
    forwards to leaders), with `txid` in X-Kraftlog-Transactional-Id."""
    import urllib.request
    import json as _json

    from partitions.log.record_batch import Record
    from partitions.log.transactions import build_transactional_batch
    headers = {"Content-Type": "application/vnd.kraftlog.batch", "Accept": "application/json"}
    if txid is not None:
        headers["X-Kraftlog-Transactional-Id"] = txid
    req = urllib.request.Request(f"{cluster.url(broker)}/v1/topics/{topic}/partitions/0/records?acks=all",
                                 method="POST", data=build_transactional_batch([Record(None, value)], pid, epoch),
                                 headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=POLL_S) as r:
            return r.status, _json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, _json.loads(e.read())


def _offsets(cluster, topic: str) -> tuple[int, int]:
    """(high watermark, last stable offset) of partition 0 on its leader (acks=all writes:
    the high watermark is the log end)."""
    leader = cluster.partition(topic)["leader"]
    status, doc = http("GET", f"{cluster.url(leader)}/v1/topics/{topic}/partitions/0/offsets")
    assert status == 200, doc
    return doc["high_watermark"], doc.get("last_stable_offset", doc["high_watermark"])


def test_transactional_write_to_a_partition_not_in_the_transaction_is_refused(cluster):
    """KIP-890 part 1: the leader verifies with the transaction coordinator before the first
    transactional batch of a producer's transaction; a partition never added to it is
    refused (INVALID_TXN_STATE over the Kafka listener and HTTP) and nothing is appended, so
    no transaction hangs. A partition in the transaction takes the same raw write; once the
    transaction commits, the next unadded write is refused again."""
    from partitions.transactions.coordinator import partition_for
    topic, other = _topic(cluster), _topic(cluster)
    leader = cluster.partition(topic)["leader"]
    assert http("POST", f"{cluster.url(1)}/v1/transactions/{_txid()}/init", {})[0] == 200   # the state topic
    n_state = len(cluster.partition_list("__transaction_state"))
    # a transactional id coordinated by another broker: the leader verifies over the network
    # and caches the answer (the records route's forwarded batch is the first one there)
    txid = next(t for t in (_txid() for _ in range(1000))
                if cluster.partition("__transaction_state", partition_for(t, n_state))["leader"] != leader)
    status, ids = http("POST", f"{cluster.url(1)}/v1/transactions/{txid}/init", {})
    assert status == 200, ids
    pid, epoch = ids["producer_id"], ids["producer_epoch"]
    assert _kafka_txn_produce(cluster, leader, txid, topic, pid, epoch, b"hanging-k") == "invalid_txn_state"
    status, doc = _http_txn_produce(cluster, leader, txid, topic, pid, epoch, b"hanging-h")
    assert (status, doc["error_code"]) == (409, "INVALID_TXN_STATE"), doc
    status, doc = _http_txn_produce(cluster, leader, None, topic, pid, epoch, b"no-id")
    assert (status, doc["error_code"]) == (400, "INVALID_RECORD"), doc
    assert _offsets(cluster, topic) == (0, 0)                 # nothing appended, nothing open

    # an ongoing transaction on another partition does not let the producer write here either
    status, doc = http("POST", f"{cluster.url(2)}/v1/transactions/{txid}/records",
                       {"producer_id": pid, "producer_epoch": epoch, "records": [{"topic": other, "value": "o"}]})
    assert status == 200, doc
    assert _kafka_txn_produce(cluster, leader, txid, topic, pid, epoch, b"hanging-k2") == "invalid_txn_state"
    assert _offsets(cluster, topic) == (0, 0)
    # added to the transaction (the records route): the same raw writes are accepted
    status, doc = http("POST", f"{cluster.url(3)}/v1/transactions/{txid}/records",
                       {"producer_id": pid, "producer_epoch": epoch, "records": [{"topic": topic, "value": "r"}]})
    assert status == 200, doc
    status, doc = _http_txn_produce(cluster, leader, txid, topic, pid, epoch, b"raw-in-txn")
    assert status == 200, doc
    assert _kafka_txn_produce(cluster, leader, txid, topic, pid, epoch, b"kafka-in-txn") == "none"
    status, doc = http("POST", f"{cluster.url(1)}/v1/transactions/{txid}/commit",
                       {"producer_id": pid, "producer_epoch": epoch})
    assert status == 200 and doc["state"] == "CompleteCommit", doc
    cluster.wait_for(lambda: _http_committed_values(cluster, topic, 0) == ["r", "raw-in-txn", "kafka-in-txn"],
                     POLL_S, "the committed records")
    # the transaction ended with its marker: a new write there must be verified again
    end = _offsets(cluster, topic)
    assert end[0] == end[1] == 4
    status, doc = _http_txn_produce(cluster, leader, txid, topic, pid, epoch, b"after-commit")
    assert (status, doc["error_code"]) == (409, "INVALID_TXN_STATE"), doc
    assert _kafka_txn_produce(cluster, leader, txid, topic, pid, epoch, b"after-commit") == "invalid_txn_state"
    assert _offsets(cluster, topic) == end
