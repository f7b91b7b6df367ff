"""The Kafka listener with real, unmodified Kafka clients (kafka-python, confluent-kafka /
librdkafka, aiokafka, kcat) against a real 3-broker cluster (tests/rigs/cluster.py: free
HTTP and Kafka ports, never 9092): metadata, produce + consume with each client, records
equal across HTTP and Kafka both ways, a consumer group resuming at its committed offsets,
and bad requests that get Kafka's errors or a closed connection without hurting the broker.
"""
from __future__ import annotations

import asyncio
import base64
import io
import socket
import struct
import subprocess
import time
import uuid

import pytest

from tests.rigs.cluster import ReplicatedCluster, http

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with ReplicatedCluster(str(tmp_path_factory.mktemp("kafka")), brokers=3) as c:
        yield c


def _topic(cluster: ReplicatedCluster, partitions: int = 1, rf: int = 3) -> str:
    name = f"k-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(name, partitions=partitions, replication_factor=rf)
    # each leader has applied the topic (create_topic waits for the ISR, which at rf=1 the
    # controller reports before the leader broker has the metadata)
    for p in cluster.partition_list(name):
        url = cluster.url(p["leader"])
        cluster.wait_for(lambda: http("GET", f"{url}/v1/topics/{name}/partitions/{p['partition']}/offsets")[0] == 200,
                         30, f"{name}-{p['partition']} served by its leader", interval=0.05)
    return name


def _wait(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")


def _http_records(cluster: ReplicatedCluster, topic: str, partition: int = 0) -> list[dict]:
    leader = cluster.partition(topic, partition)["leader"]
    status, doc = http("GET", f"{cluster.url(leader)}/v1/topics/{topic}/partitions/{partition}/records"
                              "?offset=0&max_bytes=1048576")
    assert status == 200, doc
    return doc["records"]


def _confluent_consume(cluster, topic: str, n: int, partitions: int = 1, timeout: float = 30.0, **conf) -> list:
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": cluster.kafka_bootstrap, "group.id": f"g-{uuid.uuid4().hex[:6]}",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest", **conf})
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        out = []
        deadline = time.monotonic() + timeout
        while len(out) < n and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            assert m.error() is None, m.error()
            out.append(m)
        return out
    finally:
        c.close()


# ---- metadata ------------------------------------------------------------------------------

def test_kafka_metadata_lists_three_brokers_with_their_kafka_addresses(cluster):
    from confluent_kafka.admin import AdminClient
    topic = _topic(cluster, partitions=3)
    admin = AdminClient({"bootstrap.servers": cluster.kafka_address(2)})
    want = {i: cluster.kafka_address(i) for i in (1, 2, 3)}
    # every broker's metadata follows the controller asynchronously: poll until broker 2 lists all
    md = _wait(lambda: (m := admin.list_topics(timeout=20)) and
               {b.id: f"{b.host}:{b.port}" for b in m.brokers.values()} == want and topic in m.topics and m, 30,
               "broker 2's metadata listing the 3 brokers and the topic")
    assert md.controller_id in (1, 2, 3)          # a live broker, never -1
    ours = md.topics[topic]
    http_parts = {p["partition"]: p for p in cluster.partition_list(topic)}
    assert sorted(ours.partitions) == [0, 1, 2]
    for p, pm in ours.partitions.items():
        assert pm.leader == http_parts[p]["leader"]
        assert sorted(pm.replicas) == sorted(http_parts[p]["replicas"])


def test_kcat_lists_metadata(cluster):
    topic = _topic(cluster, partitions=2)
    out = subprocess.run(["kcat", "-b", cluster.kafka_address(1), "-L", "-J"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    import json
    doc = json.loads(out.stdout)
    assert sorted(b["id"] for b in doc["brokers"]) == [1, 2, 3]
    assert {b["name"] for b in doc["brokers"]} == {cluster.kafka_address(i) for i in (1, 2, 3)}
    t = next(t for t in doc["topics"] if t["topic"] == topic)
    assert len(t["partitions"]) == 2


# ---- produce + consume with each client -------------------------------------------------------

def test_kafka_python_idempotent_produce_and_consume(cluster):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    topic = _topic(cluster)
    p = KafkaProducer(bootstrap_servers=cluster.kafka_bootstrap, acks="all", enable_idempotence=True)
    try:
        sent = [(f"k{i}".encode() if i % 3 != 1 else None, f"v{i}".encode() if (i % 5 or i % 3 == 1) else None,
                 [("h", f"{i}".encode())] if i % 2 else []) for i in range(50)]
        futs = [p.send(topic, key=k, value=v, headers=h, timestamp_ms=1_700_000_000_000 + i)
                for i, (k, v, h) in enumerate(sent)]
        p.flush(30)
        assert [f.get(10).offset for f in futs] == list(range(50))
    finally:
        p.close(10)
    c = KafkaConsumer(bootstrap_servers=cluster.kafka_bootstrap, enable_auto_commit=False,
                      consumer_timeout_ms=3000, auto_offset_reset="earliest")
    try:
        c.assign([TopicPartition(topic, 0)])
        got = []
        deadline = time.monotonic() + 30
        while len(got) < 50 and time.monotonic() < deadline:
            for m in c:
                got.append(m)
    finally:
        c.close()
    assert [(m.key, m.value, [tuple(h) for h in m.headers], m.timestamp) for m in got] == \
        [(k, v, h, 1_700_000_000_000 + i) for i, (k, v, h) in enumerate(sent)]
    assert [m.offset for m in got] == list(range(50))


@pytest.mark.parametrize("acks", ["all", "1", "0"])
def test_confluent_produce_and_consume(cluster, acks):
    from confluent_kafka import Producer
    topic = _topic(cluster, partitions=2)
    conf = {"bootstrap.servers": cluster.kafka_bootstrap, "acks": acks, "linger.ms": 5}
    if acks == "all":
        conf["enable.idempotence"] = True
    pr = Producer(conf)
    errors = []
    n = 500
    for i in range(n):
        pr.produce(topic, key=f"key-{i % 17}".encode(), value=f"value-{i}".encode(),
                   headers=[("n", str(i).encode())], partition=i % 2,
                   on_delivery=lambda err, msg: err and errors.append(err))
    assert pr.flush(30) == 0
    assert errors == []
    msgs = _confluent_consume(cluster, topic, n, partitions=2)
    assert sorted(m.value() for m in msgs) == sorted(f"value-{i}".encode() for i in range(n))
    for m in msgs:
        i = int(m.headers()[0][1])
        assert m.key() == f"key-{i % 17}".encode() and m.partition() == i % 2
    # offsets per partition are dense from 0
    for p in (0, 1):
        assert sorted(m.offset() for m in msgs if m.partition() == p) == list(range(n // 2))


def test_aiokafka_produce_and_consume(cluster):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    topic = _topic(cluster)

    async def run():
        p = AIOKafkaProducer(bootstrap_servers=cluster.kafka_bootstrap, acks="all", enable_idempotence=True)
        await p.start()
        try:
            for i in range(20):
                await p.send_and_wait(topic, value=f"a{i}".encode(), key=b"k", headers=[("x", b"y")])
        finally:
            await p.stop()
        c = AIOKafkaConsumer(bootstrap_servers=cluster.kafka_bootstrap, enable_auto_commit=False,
                             auto_offset_reset="earliest")
        await c.start()
        try:
            c.assign([TopicPartition(topic, 0)])
            await c.seek_to_beginning(TopicPartition(topic, 0))
            got = []
            deadline = time.monotonic() + 30
            while len(got) < 20 and time.monotonic() < deadline:
                batch = await c.getmany(timeout_ms=500)
                for msgs in batch.values():
                    got.extend(msgs)
            return got
        finally:
            await c.stop()

    got = asyncio.run(run())
    assert [(m.offset, m.key, m.value, list(m.headers)) for m in got] == \
        [(i, b"k", f"a{i}".encode(), [("x", b"y")]) for i in range(20)]


# ---- the same records both ways -------------------------------------------------------------

def test_records_written_over_http_read_by_kafka_and_back_are_equal(cluster):
    topic = _topic(cluster)
    leader = cluster.partition(topic)["leader"]
    binary = bytes(range(256))
    body = {"records": [
        {"key": "k1", "value": "v1", "headers": {"a": "1", "b": "2"}},
        {"key": None, "value": None},
        {"key_b64": base64.b64encode(binary).decode(), "value_b64": base64.b64encode(binary[::-1]).decode()},
        {"key": "", "value": ""},
    ]}
    status, doc = http("POST", f"{cluster.url(leader)}/v1/topics/{topic}/partitions/0/records?acks=all", body)
    assert status == 200, doc
    via_http = _http_records(cluster, topic)
    msgs = _confluent_consume(cluster, topic, 4)
    assert [(m.offset(), m.key(), m.value(), m.timestamp()[1], dict((k, v.decode()) for k, v in (m.headers() or [])))
            for m in msgs] == [
        (0, b"k1", b"v1", via_http[0]["timestamp"], {"a": "1", "b": "2"}),
        (1, None, None, via_http[1]["timestamp"], {}),
        (2, binary, binary[::-1], via_http[2]["timestamp"], {}),
        (3, b"", b"", via_http[3]["timestamp"], {}),
    ]
    # and back: Kafka writes, HTTP reads
    from confluent_kafka import Producer
    pr = Producer({"bootstrap.servers": cluster.kafka_bootstrap, "enable.idempotence": True})
    pr.produce(topic, key=b"kk", value=b"vv", headers=[("h1", b"x")], timestamp=1_600_000_000_123, partition=0)
    pr.produce(topic, key=None, value=None, timestamp=1_600_000_000_124, partition=0)
    pr.produce(topic, key=binary, value=binary, timestamp=1_600_000_000_125, partition=0)
    assert pr.flush(30) == 0
    recs = _wait(lambda: (r := _http_records(cluster, topic)) and len(r) == 7 and r, 30, "7 records over HTTP")
    assert [(r["offset"], r.get("key"), r.get("value"), r["timestamp"], r["headers"]) for r in recs[4:6]] == [
        (4, "kk", "vv", 1_600_000_000_123, {"h1": "x"}),
        (5, None, None, 1_600_000_000_124, {}),
    ]
    assert base64.b64decode(recs[6]["key_b64"]) == binary and base64.b64decode(recs[6]["value_b64"]) == binary


# ---- Kafka clients' batches are stored as sent --------------------------------------------------

def _stored_batches(cluster, topic: str, partition: int = 0) -> list[bytes]:
    """The partition's stored batches as the leader's raw-batch fetch answers them."""
    import urllib.request
    from partitions.log import record_batch as rb
    leader = cluster.partition(topic, partition)["leader"]
    req = urllib.request.Request(f"{cluster.url(leader)}/v1/topics/{topic}/partitions/{partition}/records"
                                 "?offset=0&max_bytes=4194304", headers={"Accept": "application/vnd.kraftlog.batch"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return [bytes(b) for _h, b in rb.iter_batches(r.read())]


def test_kafka_batches_are_stored_byte_for_byte_and_snappy_is_accepted(cluster):
    """Batches kafka-python's builder made (none, gzip, lz4, zstd) are stored exactly as sent
    (after the leader's base offset and leader epoch, which precede the CRC), and fetched by
    a Kafka client untouched; confluent-kafka's snappy batches are stored with the client's
    codec and read back over Kafka and HTTP."""
    import datetime
    from confluent_kafka import Producer
    from kafka.record.default_records import DefaultRecordBatchBuilder
    from kio.schema.produce.v11.request import PartitionProduceData, ProduceRequest, TopicProduceData
    from kio.schema.produce.v11.response import ProduceResponse
    from kio.serial import entity_reader
    from partitions.log import record_batch as rb
    topic = _topic(cluster)
    host, port = cluster.kafka_address(cluster.partition(topic)["leader"]).rsplit(":", 1)
    sent = []
    for n, codec in enumerate((0, 1, 3, 4)):
        b = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=False, producer_id=-1,
                                      producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
        for i in range(50):
            b.append(i, timestamp=1_700_000_000_000 + i, key=b"k%d" % (i % 7) if i % 5 else None,
                     value=b"v%d-" % i * 20, headers=[("c", b"%d" % codec)] if i % 2 else [])
        sent.append(bytes(b.build()))
        req = ProduceRequest(transactional_id=None, acks=-1, timeout=datetime.timedelta(seconds=30), topic_data=(
            TopicProduceData(name=topic, partition_data=(PartitionProduceData(index=0, records=sent[-1]),)),))
        with socket.create_connection((host, int(port)), timeout=30) as s:
            s.sendall(_kafka_request(0, 11, n, req))
            answer = _read_answer(s)
        part = entity_reader(ProduceResponse)(answer[5:], 0)[0].responses[0].partition_responses[0]
        assert part.error_code.name == "none" and part.base_offset == 50 * n
    stored = _stored_batches(cluster, topic)
    assert len(stored) == 4
    for n, (got, want) in enumerate(zip(stored, sent)):
        assert len(got) == len(want) and got[16:] == want[16:]   # magic, CRC, attributes ... records: as sent
        assert rb.batch_base_offset(got) == 50 * n
    # a Kafka fetch answers the same bytes
    fetched = _raw_fetch(f"{host}:{port}", topic, -1)
    assert bytes(fetched.records) == b"".join(stored)
    # confluent-kafka (librdkafka) with snappy: stored with the client's codec, not converted
    topic2 = _topic(cluster)
    pr = Producer({"bootstrap.servers": cluster.kafka_bootstrap, "compression.type": "snappy", "linger.ms": 20,
                   "enable.idempotence": True})
    for i in range(300):
        pr.produce(topic2, key=b"s%d" % i, value=b"snappy-%d " % i * 10, partition=0)
    assert pr.flush(30) == 0
    batches = _wait(lambda: (b := _stored_batches(cluster, topic2)) and
                    sum(rb.BatchHeader.parse(x).record_count for x in b) == 300 and b, 30, "300 stored records")
    for x in batches:
        h = rb.validate_batch(x)
        assert h.compression == rb.Compression.SNAPPY and not h.is_columnar and h.producer_id >= 0
    msgs = _confluent_consume(cluster, topic2, 300)
    assert [(m.key(), m.value()) for m in msgs] == [(b"s%d" % i, b"snappy-%d " % i * 10) for i in range(300)]
    over_http = _wait(lambda: (r := _http_records(cluster, topic2)) and len(r) >= 100 and r, 30, "records over HTTP")
    assert [(r["key"], r["value"]) for r in over_http[:100]] == [("s%d" % i, "snappy-%d " % i * 10)
                                                                  for i in range(100)]


# ---- consumer groups -------------------------------------------------------------------------

def test_consumer_group_subscribe_commit_and_resume(cluster):
    from confluent_kafka import Consumer, Producer
    topic = _topic(cluster, partitions=2)
    pr = Producer({"bootstrap.servers": cluster.kafka_bootstrap, "enable.idempotence": True})
    for i in range(40):
        pr.produce(topic, value=f"m{i}".encode(), partition=i % 2)
    assert pr.flush(30) == 0
    group = f"grp-{uuid.uuid4().hex[:6]}"
    conf = {"bootstrap.servers": cluster.kafka_bootstrap, "group.id": group, "enable.auto.commit": False,
            "auto.offset.reset": "earliest", "session.timeout.ms": 6000}
    c = Consumer(conf)
    first = []
    try:
        c.subscribe([topic])
        deadline = time.monotonic() + 60
        while len(first) < 40 and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                first.append(m)
        assert len(first) == 40
        assert {tp.partition for tp in c.assignment()} == {0, 1}
        # commit only the first 5 records of each partition: the group resumes after them
        from confluent_kafka import TopicPartition
        c.commit(offsets=[TopicPartition(topic, 0, 5), TopicPartition(topic, 1, 5)], asynchronous=False)
        committed = c.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=10)
        assert [tp.offset for tp in committed] == [5, 5]
    finally:
        c.close()   # LeaveGroup
    # the committed offsets are the group's: visible over HTTP too
    status, doc = http("GET", f"{cluster.urls[0]}/v1/groups/{group}/offsets")
    assert status == 200, doc
    assert sorted((o["partition"], o["offset"]) for o in doc["offsets"] if o["topic"] == topic) == [(0, 5), (1, 5)]
    c2 = Consumer(conf)
    again = []
    try:
        c2.subscribe([topic])
        deadline = time.monotonic() + 60
        while len(again) < 30 and time.monotonic() < deadline:
            m = c2.poll(0.5)
            if m is not None and m.error() is None:
                again.append(m)
    finally:
        c2.close()
    assert sorted((m.partition(), m.offset()) for m in again) == [(p, o) for p in (0, 1) for o in range(5, 20)]


def test_kafka_python_group_two_members_share_partitions(cluster):
    """Two members, each polling in its own thread as applications do, split the partitions."""
    import threading
    from kafka import KafkaConsumer, KafkaProducer
    topic = _topic(cluster, partitions=4)
    p = KafkaProducer(bootstrap_servers=cluster.kafka_bootstrap, acks="all")
    try:
        for i in range(40):
            p.send(topic, value=f"x{i}".encode(), partition=i % 4)
        p.flush(30)
    finally:
        p.close(10)
    group = f"kp-{uuid.uuid4().hex[:6]}"
    stop = threading.Event()
    seen: list[set] = [set(), set()]
    assigned: list[set] = [set(), set()]
    failures: list[BaseException] = []

    def member(i: int) -> None:
        c = KafkaConsumer(topic, bootstrap_servers=cluster.kafka_bootstrap, group_id=group,
                          auto_offset_reset="earliest", enable_auto_commit=False,
                          session_timeout_ms=6000, heartbeat_interval_ms=500)
        try:
            while not stop.is_set():
                for tp, msgs in c.poll(timeout_ms=200).items():
                    seen[i].update((tp.partition, x.offset) for x in msgs)
                assigned[i] = {tp.partition for tp in c.assignment()}
        except BaseException as e:  # noqa: BLE001 - reported by the test
            failures.append(e)
        finally:
            c.close()

    threads = [threading.Thread(target=member, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    try:
        _wait(lambda: all(assigned) and not (assigned[0] & assigned[1])
              and assigned[0] | assigned[1] == {0, 1, 2, 3} and len(seen[0] | seen[1]) == 40, 60,
              "two members sharing the 4 partitions and every record read")
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert failures == []
    assert len(assigned[0]) == len(assigned[1]) == 2    # range assignor: 2 partitions each


# ---- bad requests never hurt the broker -------------------------------------------------------

def _kafka_request(api_key: int, version: int, correlation_id: int, body_entity) -> bytes:
    from kio.serial import entity_writer
    buf = io.BytesIO()
    flexible = type(body_entity).__flexible__
    buf.write(struct.pack(">hhih", api_key, version, correlation_id, 4) + b"test")
    if flexible:
        buf.write(b"\x00")
    entity_writer(type(body_entity))(buf, body_entity)
    data = buf.getvalue()
    return struct.pack(">i", len(data)) + data


def _read_answer(sock: socket.socket) -> bytes | None:
    head = b""
    while len(head) < 4:
        chunk = sock.recv(4 - len(head))
        if not chunk:
            return None
        head += chunk
    (size,) = struct.unpack(">i", head)
    body = b""
    while len(body) < size:
        chunk = sock.recv(size - len(body))
        if not chunk:
            return None
        body += chunk
    return body


def _closed(sock: socket.socket) -> bool:
    sock.settimeout(10)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def _api_versions_ok(address: str) -> bool:
    from kio.schema.api_versions.v3.request import ApiVersionsRequest
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(_kafka_request(18, 3, 42, ApiVersionsRequest(client_software_name="t",
                                                               client_software_version="1")))
        answer = _read_answer(s)
    return answer is not None and struct.unpack(">ih", answer[:6]) == (42, 0)


def test_bad_requests_get_kafka_errors_or_a_closed_connection(cluster):
    from kio.schema.produce.v11.request import PartitionProduceData, ProduceRequest, TopicProduceData
    from kio.serial import entity_reader
    from kio.schema.produce.v11.response import ProduceResponse
    import datetime
    from kafka.record.default_records import DefaultRecordBatchBuilder
    topic = _topic(cluster)
    leader = cluster.partition(topic)["leader"]
    follower = next(b for b in (1, 2, 3) if b != leader)
    host, port = cluster.kafka_address(follower).rsplit(":", 1)
    # unknown API key: the connection is closed
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(struct.pack(">ihhih", 10, 999, 0, 1, -1))
        assert _closed(s)
    # truncated frame: the size promises more than arrives, then the client goes away
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(struct.pack(">i", 1000) + b"\x00\x12\x00\x03")
    # oversized frame: closed without reading it
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(struct.pack(">i", 1 << 30) + b"\x00" * 64)
        assert _closed(s)
    # garbage body of a known API: closed
    with socket.create_connection((host, int(port)), timeout=10) as s:
        frame = struct.pack(">hhi", 12, 0, 9) + b"\xff\xff" + b"\x00\x01"   # Heartbeat v0, body cut short
        s.sendall(struct.pack(">i", len(frame)) + frame)
        assert _closed(s)
    # produce to a follower: NOT_LEADER_OR_FOLLOWER, the batch stored nowhere
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                  producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    b.append(0, timestamp=1, key=b"k", value=b"must not be stored", headers=[])
    req = ProduceRequest(transactional_id=None, acks=-1, timeout=datetime.timedelta(seconds=5), topic_data=(
        TopicProduceData(name=topic, partition_data=(PartitionProduceData(index=0, records=bytes(b.build())),)),))
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(_kafka_request(0, 11, 7, req))
        answer = _read_answer(s)
    assert answer is not None and struct.unpack(">i", answer[:4]) == (7,)
    resp, _ = entity_reader(ProduceResponse)(answer[5:], 0)   # header v1: correlation id + tagged fields
    part = resp.responses[0].partition_responses[0]
    assert part.error_code.name == "not_leader_or_follower"
    assert part.current_leader.leader_id == leader
    # every broker still answers, and nothing was stored
    for i in (1, 2, 3):
        assert _api_versions_ok(cluster.kafka_address(i))
        assert http("GET", cluster.url(i) + "/healthz")[0] == 200
    assert _http_records(cluster, topic) == []


# ---- admin -----------------------------------------------------------------------------------

def _kcat_topics(cluster) -> dict:
    import json
    out = subprocess.run(["kcat", "-b", cluster.kafka_address(3), "-L", "-J"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return {t["topic"]: len(t["partitions"]) for t in json.loads(out.stdout)["topics"]}


def test_admin_create_alter_describe_delete_reflected_in_kcat(cluster):
    from confluent_kafka import Producer, TopicPartition
    from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewPartitions,
                                       NewTopic)
    admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    name = f"adm-{uuid.uuid4().hex[:6]}"
    admin.create_topics([NewTopic(name, num_partitions=2, replication_factor=2,
                                  config={"retention.ms": "3600000"})])[name].result(30)
    assert _wait(lambda: _kcat_topics(cluster).get(name) == 2, 30, "the new topic in kcat -L")
    assert {p["partition"]: len(p["replicas"]) for p in cluster.partition_list(name)} == {0: 2, 1: 2}
    with pytest.raises(Exception, match="TOPIC_ALREADY_EXISTS"):
        admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1)])[name].result(30)

    admin.create_partitions([NewPartitions(name, 3)])[name].result(30)
    assert _wait(lambda: _kcat_topics(cluster).get(name) == 3, 30, "3 partitions in kcat -L")

    res = ConfigResource(ConfigResource.Type.TOPIC, name, incremental_configs=[
        ConfigEntry("retention.ms", "7200000", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res])[res].result(30)
    described = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, name)])
    configs = list(described.values())[0].result(30)
    assert configs["retention.ms"].value == "7200000"

    pr = Producer({"bootstrap.servers": cluster.kafka_bootstrap})
    for i in range(10):
        pr.produce(name, value=b"r%d" % i, partition=0)
    assert pr.flush(30) == 0
    done = admin.delete_records([TopicPartition(name, 0, 4)])
    assert list(done.values())[0].result(30).low_watermark == 4
    leader = cluster.partition(name, 0)["leader"]
    assert http("GET", f"{cluster.url(leader)}/v1/topics/{name}/partitions/0/offsets")[1]["log_start_offset"] == 4

    admin.delete_topics([name])[name].result(30)
    assert _wait(lambda: name not in _kcat_topics(cluster), 30, "the topic gone from kcat -L")
    assert http("GET", f"{cluster.urls[0]}/v1/topics/{name}")[0] == 404


# ---- failover ------------------------------------------------------------------------------

def test_idempotent_acks_all_producer_survives_a_killed_leader(tmp_path):
    """kill -9 of the partition leader while confluent-kafka produces (idempotent, acks=all):
    every record is delivered once, in order, read back from the new leader."""
    from confluent_kafka import Producer
    with ReplicatedCluster(str(tmp_path), brokers=3) as c:
        topic = "failover"
        c.create_topic(topic, partitions=1, replication_factor=3, configs={"min.insync.replicas": "2"})
        old_leader, old_epoch = c.partition(topic)["leader"], c.partition(topic)["leader_epoch"]
        survivor = next(b for b in (1, 2, 3) if b != old_leader)
        delivered, errors = [], []

        def report(err, msg):
            (errors if err is not None else delivered).append(err if err is not None else msg.value())
        p = Producer({"bootstrap.servers": ",".join(c.kafka_address(b) for b in (1, 2, 3)), "acks": "all",
                      "enable.idempotence": True, "linger.ms": 2, "message.timeout.ms": 120_000})
        n = 3000
        for i in range(n):
            p.produce(topic, value=f"v{i}".encode(), partition=0, on_delivery=report)
            p.poll(0)
            if i == 1000:
                _wait(lambda: p.poll(0.1) >= 0 and len(delivered) >= 500, 60, "500 acknowledged records before the kill")
                c.kill(old_leader)
            if i % 50 == 0:
                time.sleep(0.002)
        assert p.flush(120) == 0
        assert errors == []
        assert len(delivered) == n
        new_leader = c.wait_for(lambda: (lead := c.partition(topic)["leader"]) not in (-1, old_leader) and lead,
                                30, "a new leader")
        assert new_leader in c.procs
        # a client still on the old leader epoch is told its epoch is fenced
        assert c.partition(topic)["leader_epoch"] > old_epoch
        assert _raw_fetch(c.kafka_address(new_leader), topic, old_epoch).error_code.name == "fenced_leader_epoch"
        msgs = []
        from confluent_kafka import Consumer, TopicPartition
        cons = Consumer({"bootstrap.servers": c.kafka_address(survivor), "group.id": "check",
                         "enable.auto.commit": False})
        try:
            cons.assign([TopicPartition(topic, 0, 0)])
            deadline = time.monotonic() + 60
            while len(msgs) < n and time.monotonic() < deadline:
                for m in cons.consume(num_messages=1000, timeout=0.5):
                    assert m.error() is None, m.error()
                    msgs.append(m.value())
        finally:
            cons.close()
        assert msgs == [f"v{i}".encode() for i in range(n)]   # 0 lost, 0 duplicated, in order


def _raw_fetch(address: str, topic: str, current_epoch: int, *, offset: int = 0, max_wait_ms: int = 0,
               min_bytes: int = 1):
    """One Fetch v12 of partition 0 with `current_leader_epoch`: its partition answer."""
    import datetime
    from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
    from kio.schema.fetch.v12.response import FetchResponse
    from kio.serial import entity_reader
    host, port = address.rsplit(":", 1)
    req = FetchRequest(max_wait=datetime.timedelta(milliseconds=max_wait_ms), min_bytes=min_bytes,
                       topics=(FetchTopic(topic=topic, partitions=(
        FetchPartition(partition=0, current_leader_epoch=current_epoch, fetch_offset=offset,
                       partition_max_bytes=1 << 20),)),), forgotten_topics_data=())
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(_kafka_request(1, 12, 3, req))
        answer = _read_answer(s)
    return entity_reader(FetchResponse)(answer[5:], 0)[0].responses[0].partitions[0]


def test_fetch_and_list_offsets_check_the_current_leader_epoch(cluster):
    from kio.schema.list_offsets.v7.request import ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic
    from kio.schema.list_offsets.v7.response import ListOffsetsResponse
    from kio.serial import entity_reader
    topic = _topic(cluster)
    part = cluster.partition(topic)
    leader, epoch = part["leader"], part["leader_epoch"]
    host, port = cluster.kafka_address(leader).rsplit(":", 1)

    def list_offsets(current_epoch: int):
        req = ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=(ListOffsetsTopic(name=topic, partitions=(
            ListOffsetsPartition(partition_index=0, current_leader_epoch=current_epoch, timestamp=-1),)),))
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(_kafka_request(2, 7, 4, req))
            answer = _read_answer(s)
        return entity_reader(ListOffsetsResponse)(answer[5:], 0)[0].topics[0].partitions[0]

    assert _raw_fetch(cluster.kafka_address(leader), topic, epoch).error_code.name == "none"
    assert _raw_fetch(cluster.kafka_address(leader), topic, epoch + 5).error_code.name == "unknown_leader_epoch"
    assert list_offsets(epoch).error_code.name == "none"
    assert list_offsets(epoch + 5).error_code.name == "unknown_leader_epoch"


def test_admin_describes_the_cluster_and_the_groups(cluster):
    """DescribeCluster, ListGroups, DescribeGroups, OffsetFetch and DeleteGroups through
    confluent-kafka's AdminClient, with a live group member and after it left."""
    from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient
    admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    desc = admin.describe_cluster(request_timeout=30).result(30)
    assert sorted((n.id, f"{n.host}:{n.port}") for n in desc.nodes) == [(i, cluster.kafka_address(i)) for i in (1, 2, 3)]
    assert desc.controller.id in (1, 2, 3)

    topic = _topic(cluster)
    pr = Producer({"bootstrap.servers": cluster.kafka_bootstrap})
    for i in range(5):
        pr.produce(topic, value=b"d%d" % i, partition=0)
    assert pr.flush(30) == 0
    group = f"desc-{uuid.uuid4().hex[:6]}"
    c = Consumer({"bootstrap.servers": cluster.kafka_bootstrap, "group.id": group, "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", "client.id": "describer"})
    try:
        c.subscribe([topic])
        _wait(lambda: (c.poll(0.2), bool(c.assignment()))[1], 60, "an assignment")
        c.commit(offsets=[TopicPartition(topic, 0, 3)], asynchronous=False)
        listed = admin.list_consumer_groups(request_timeout=30).result(30)
        assert group in {g.group_id for g in listed.valid}
        described = admin.describe_consumer_groups([group], request_timeout=30)[group].result(30)
        assert str(described.state).endswith("STABLE")
        assert [m.client_id for m in described.members] == ["describer"]
        assert [(tp.topic, tp.partition) for tp in described.members[0].assignment.topic_partitions] == [(topic, 0)]
    finally:
        c.close()
    offsets = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(30)
    assert [(tp.topic, tp.partition, tp.offset) for tp in offsets.topic_partitions] == [(topic, 0, 3)]
    admin.delete_consumer_groups([group], request_timeout=30)[group].result(30)
    assert http("GET", f"{cluster.urls[0]}/v1/groups/{group}/offsets")[1].get("offsets", []) == []


def test_group_rebalances_when_a_member_joins_and_one_leaves_then_resumes_from_commits(cluster):
    """Two confluent-kafka members share 4 partitions; a third joins (3 members), one leaves
    (2 again); every member commits what it read; a restarted group resumes at the commits."""
    import threading
    from confluent_kafka import Consumer, Producer
    topic = _topic(cluster, partitions=4)
    pr = Producer({"bootstrap.servers": cluster.kafka_bootstrap, "enable.idempotence": True})
    for i in range(80):
        pr.produce(topic, value=f"r{i}".encode(), partition=i % 4)
    assert pr.flush(30) == 0
    group = f"reb-{uuid.uuid4().hex[:6]}"
    conf = {"bootstrap.servers": cluster.kafka_bootstrap, "group.id": group, "enable.auto.commit": False,
            "auto.offset.reset": "earliest", "session.timeout.ms": 6000, "heartbeat.interval.ms": 500}

    class Member(threading.Thread):
        def __init__(self) -> None:
            super().__init__()
            self.stop = threading.Event()
            self.assigned: set = set()
            self.read: set = set()
            self.failure: BaseException | None = None

        def run(self) -> None:
            c = Consumer(conf)
            try:
                c.subscribe([topic])
                while not self.stop.is_set():
                    m = c.poll(0.2)
                    if m is not None and m.error() is None:
                        self.read.add((m.partition(), m.offset()))
                        c.commit(message=m, asynchronous=False)
                    self.assigned = {tp.partition for tp in c.assignment()}
            except BaseException as e:  # noqa: BLE001 - reported by the test
                self.failure = e
            finally:
                c.close()

    def split(members) -> bool:
        sets = [m.assigned for m in members]
        return all(sets) and set().union(*sets) == {0, 1, 2, 3} and sum(map(len, sets)) == 4

    members = [Member(), Member()]
    try:
        for m in members:
            m.start()
        _wait(lambda: split(members), 60, "2 members sharing 4 partitions")
        third = Member()
        members.append(third)
        third.start()
        _wait(lambda: split(members), 60, "3 members sharing 4 partitions")
        leaving = members.pop(0)
        leaving.stop.set()
        leaving.join(30)
        assert leaving.failure is None
        _wait(lambda: split(members), 60, "2 members sharing 4 partitions after one left")
        _wait(lambda: len(set().union(leaving.read, *(m.read for m in members))) == 80, 60, "all 80 records read")
    finally:
        for m in members:
            m.stop.set()
        for m in members:
            m.join(30)
    assert all(m.failure is None for m in members)
    # every partition's commit is its end: a restarted member of the group reads nothing old
    status, doc = http("GET", f"{cluster.urls[0]}/v1/groups/{group}/offsets")
    assert status == 200, doc
    assert sorted((o["partition"], o["offset"]) for o in doc["offsets"]) == [(p, 20) for p in range(4)]
    pr.produce(topic, value=b"after", partition=2)
    assert pr.flush(30) == 0
    c = Consumer(conf)
    try:
        c.subscribe([topic])
        got = []
        deadline = time.monotonic() + 60
        while not got and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                got.append((m.partition(), m.offset(), m.value()))
    finally:
        c.close()
    assert got == [(2, 20, b"after")]


def test_idle_and_surplus_kafka_connections_are_closed(tmp_path):
    with ReplicatedCluster(str(tmp_path), brokers=1, broker_config={
            "kafka_connections_max_idle_ms": 500, "connections_max_per_ip": 3}) as c:
        host, port = c.kafka_address(1).rsplit(":", 1)
        idle = socket.create_connection((host, int(port)), timeout=10)
        try:
            assert _api_versions_ok(c.kafka_address(1))
            started = time.monotonic()
            assert _closed(idle)                        # nothing sent for 500 ms: closed
            assert time.monotonic() - started < 5
        finally:
            idle.close()
        held = [socket.create_connection((host, int(port)), timeout=10) for _ in range(3)]
        try:
            with socket.create_connection((host, int(port)), timeout=10) as fourth:
                assert _closed(fourth)                  # a 4th connection from this address: closed at once
        finally:
            for s in held:
                s.close()
        assert _wait(lambda: _api_versions_ok(c.kafka_address(1)), 10, "the listener serving again")


def test_kcat_produces_and_consumes_and_aiokafka_joins_a_group(cluster):
    topic = _topic(cluster)
    b = cluster.kafka_bootstrap
    r = subprocess.run(["kcat", "-b", b, "-P", "-t", topic, "-p", "0", "-K:"], input="k1:v1\nk2:v2\n",
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(["kcat", "-b", b, "-C", "-t", topic, "-o", "beginning", "-e", "-f", "%k=%s@%o\\n"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "k1=v1@0\nk2=v2@1\n"
    from aiokafka import AIOKafkaConsumer, TopicPartition

    async def group_read():
        c = AIOKafkaConsumer(topic, bootstrap_servers=b, group_id=f"aio-{uuid.uuid4().hex[:6]}",
                             auto_offset_reset="earliest", enable_auto_commit=False)
        await c.start()
        try:
            got = []
            deadline = time.monotonic() + 60
            while len(got) < 2 and time.monotonic() < deadline:
                for msgs in (await c.getmany(timeout_ms=500)).values():
                    got += [(m.key, m.value) for m in msgs]
            await c.commit()
            return got, await c.committed(TopicPartition(topic, 0))
        finally:
            await c.stop()

    assert asyncio.run(group_read()) == ([(b"k1", b"v1"), (b"k2", b"v2")], 2)


def test_fetch_long_polls_until_data_or_max_wait(cluster):
    import threading
    topic = _topic(cluster, rf=1)
    leader = cluster.partition(topic)["leader"]
    address = cluster.kafka_address(leader)
    # the leader serves the new partition once its metadata arrived (before: UNKNOWN_TOPIC_OR_PARTITION)
    cluster.wait_for(lambda: _raw_fetch(address, topic, -1).error_code.name == "none", 30,
                     "the leader serves the new partition over Kafka", interval=0.1)
    started = time.monotonic()
    empty = _raw_fetch(address, topic, -1, max_wait_ms=1500)
    waited = time.monotonic() - started
    assert empty.error_code.name == "none" and not empty.records and 1.3 <= waited < 10
    # a record produced while the fetch waits ends the wait early
    def produce_later():
        time.sleep(0.5)
        http("POST", f"{cluster.url(leader)}/v1/topics/{topic}/partitions/0/records?acks=1",
             {"records": [{"value": "wake"}]})
    t = threading.Thread(target=produce_later)
    t.start()
    try:
        started = time.monotonic()
        got = _raw_fetch(address, topic, -1, max_wait_ms=20_000)
        waited = time.monotonic() - started
    finally:
        t.join(30)
    assert got.records and got.high_watermark == 1 and waited < 10
    from kafka.record.memory_records import MemoryRecords
    assert [r.value for r in MemoryRecords(bytes(got.records)).next_batch()] == [b"wake"]
