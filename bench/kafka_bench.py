"""Kafka listener benchmark: confluent-kafka (librdkafka) against the Kafka listener vs the
project's Python HTTP client against the HTTP API, same node, same run, 100-byte records.

Figures (printed, not asserted):
- produce records/s, acks=1 and acks=all: confluent-kafka Producer (linger 5 ms) vs
  http_api.client.Producer (send() per record, linger 5 ms, 256 KiB batches);
- consumer catch-up records/s from offset 0: confluent-kafka Consumer vs http_api.client.Consumer;
- the ratios Kafka / HTTP;
- record format costs, in process (docs/RECORD_FORMAT.md): per record, encoding and decoding
  kraftlog's columnar records section vs Kafka's varint records (both are stored, chosen per
  batch: what the Python client, the broker's JSON routes and Spark pay on each), the
  listener's produce check (Kafka batches stored as sent) and its fetch (Kafka batches passed
  through, columnar ones converted).

Both sides run against one `kraftlog serve` node (a broker process + a controller process)
on this 2-core machine; the client runs in this process (librdkafka's threads are native).

    python -m bench.kafka_bench [--records N]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from deploy.local_node import LocalNode  # noqa: E402

RECORD_BYTES = 100


def _create_topic(base: str, name: str) -> None:
    req = urllib.request.Request(f"{base}/v1/topics", method="POST", headers={"Content-Type": "application/json"},
                                 data=json.dumps({"name": name, "partitions": 1, "replication_factor": 1}).encode())
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 201


def kafka_produce(bootstrap: str, topic: str, n: int, acks: str) -> float:
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": bootstrap, "acks": acks, "linger.ms": 5, "batch.size": 1 << 20,
                  "enable.idempotence": acks == "all", "queue.buffering.max.messages": 1_000_000})
    value = b"x" * RECORD_BYTES
    errors = []

    def report(err, _msg):
        if err is not None:
            errors.append(err)
    t0 = time.perf_counter()
    for i in range(n):
        while True:
            try:
                p.produce(topic, value=value, partition=0, on_delivery=report if i % 1000 == 0 else None)
                break
            except BufferError:
                p.poll(0.01)
        if i % 10_000 == 0:
            p.poll(0)
    left = p.flush(120)
    dt = time.perf_counter() - t0
    if left or errors:
        raise RuntimeError(f"confluent-kafka producer: {left} undelivered, errors {errors[:3]}")
    return n / dt


def kafka_consume(bootstrap: str, topic: str, n: int) -> float:
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "kafka-bench", "enable.auto.commit": False,
                  "fetch.max.bytes": 8 << 20, "max.partition.fetch.bytes": 8 << 20})
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        got = 0
        t0 = time.perf_counter()
        deadline = t0 + 300
        while got < n and time.perf_counter() < deadline:
            for m in c.consume(num_messages=10_000, timeout=1.0):
                if m.error() is None:
                    got += 1
        dt = time.perf_counter() - t0
    finally:
        c.close()
    if got < n:
        raise RuntimeError(f"confluent-kafka consumer read {got} of {n}")
    return n / dt


async def http_produce(base: str, topic: str, n: int, acks: str) -> float:
    from http_api.client import Producer
    value = b"x" * RECORD_BYTES
    async with Producer(base, acks=acks, linger_ms=5, batch_size_bytes=256 * 1024) as producer:
        t0 = time.perf_counter()
        futs = [await producer.send(topic, value, partition=0) for _ in range(n)]
        await producer.flush()
        dt = time.perf_counter() - t0
    for f in futs[::1000]:
        f.result()   # raises if the batch failed; offset -1: a retried batch answered as a duplicate
    return n / dt


async def http_consume(base: str, topic: str, n: int) -> float:
    from http_api.client import Consumer
    async with Consumer(base, auto_offset_reset="earliest", max_bytes=8 << 20, enable_auto_commit=False) as c:
        c.assign([(topic, 0)])
        c.seek((topic, 0), 0)
        got = 0
        t0 = time.perf_counter()
        deadline = t0 + 300
        while got < n and time.perf_counter() < deadline:
            got += len(await c.poll(timeout_ms=1000))
        dt = time.perf_counter() - t0
    if got < n:
        raise RuntimeError(f"HTTP consumer read {got} of {n}")
    return n / dt


def _per_record_us(fn, records: int, min_seconds: float = 0.3) -> float:
    """Best of 5 timings of `fn()` (each repeated for at least `min_seconds` / 5), per record: the
    minimum is the least disturbed by other work on a shared machine."""
    times = []
    for _ in range(5):
        reps, t0 = 0, time.perf_counter()
        while True:
            fn()
            reps += 1
            dt = time.perf_counter() - t0
            if dt >= min_seconds / 5:
                break
        times.append(dt / reps / records * 1e6)
    return min(times)


def format_costs(records_per_batch: int = 1000, keyed: bool = True) -> list[tuple[str, str]]:
    """Per-record costs of the two records-section formats (columnar vs Kafka's), in process:
    what each reader pays per batch format now that both are stored (docs/RECORD_FORMAT.md)."""
    from http_api.kafka.records import _kafka_records_section, kafka_to_stored, stored_batch_to_kafka
    from partitions.log import record_batch as rb
    value = b"x" * RECORD_BYTES
    recs = [rb.Record(f"key-{i}".encode() if keyed else None, value, (), 1_700_000_000_000 + i)
            for i in range(records_per_batch)]
    columnar = rb.build_batch(recs)
    kafka = stored_batch_to_kafka(columnar)   # the batch a Kafka client sends for the same records
    n = records_per_batch
    rows = []
    enc_c = _per_record_us(lambda: rb.build_batch(recs), n)
    decoded = rb.decode_records(columnar)
    enc_k = _per_record_us(lambda: _kafka_records_section(decoded, 0, decoded[0].timestamp), n)
    dec_c = _per_record_us(lambda: rb.decode_records(columnar), n)
    dec_k = _per_record_us(lambda: rb.decode_records(kafka), n)
    rows.append((f"format: encode {n} records ({'keyed' if keyed else 'no keys'}), columnar us/record",
                 f"{enc_c:.2f}"))
    rows.append(("format: encode, Kafka varint records us/record", f"{enc_k:.2f}  ({enc_k / enc_c:.1f}x)"))
    rows.append(("format: decode to Records, columnar us/record", f"{dec_c:.2f}"))
    rows.append(("format: decode to Records, Kafka varint records us/record", f"{dec_k:.2f}  ({dec_k / dec_c:.1f}x)"))
    try:
        from pipelines import arrow_codec
        ch, kh = rb.BatchHeader.parse(columnar), rb.BatchHeader.parse(kafka)
        cm, km = memoryview(columnar), memoryview(kafka)
        dec_a = _per_record_us(lambda: arrow_codec.decode_batch_columns(ch, cm, False), n)
        dec_ak = _per_record_us(lambda: arrow_codec.decode_batch_columns(kh, km, False), n)
        rows.append(("format: Spark's Arrow columns from columnar us/record", f"{dec_a:.3f}"))
        rows.append(("format: Spark's Arrow columns from Kafka records us/record",
                     f"{dec_ak:.3f}  ({dec_ak / dec_a:.0f}x)"))
    except ImportError:   # the spark extra is not installed
        pass
    rows.append(("listener produce: Kafka batch checked and stored as sent us/record",
                 f"{_per_record_us(lambda: kafka_to_stored(kafka), n):.2f}"))
    rows.append(("listener fetch: Kafka-format batch passed through us/record",
                 f"{_per_record_us(lambda: stored_batch_to_kafka(kafka), n):.3f}"))
    rows.append(("listener fetch: columnar batch converted us/record",
                 f"{_per_record_us(lambda: stored_batch_to_kafka(columnar), n):.2f}"))
    return rows


def run(n: int) -> list[tuple[str, str]]:
    tmp = tempfile.mkdtemp(prefix="kafka-bench-")
    node = LocalNode(os.path.join(tmp, "data")).start()
    rows: list[tuple[str, str]] = []
    try:
        base, bootstrap = node.url, f"127.0.0.1:{node.kafka_port}"
        for acks in ("1", "all"):
            kt, ht = f"kafka-acks-{acks}", f"http-acks-{acks}"
            _create_topic(base, kt)
            _create_topic(base, ht)
            k = kafka_produce(bootstrap, kt, n, acks)
            h = asyncio.run(http_produce(base, ht, n, acks))
            rows.append((f"produce acks={acks}: confluent-kafka -> Kafka listener records/s", f"{k:,.0f}"))
            rows.append((f"produce acks={acks}: Python HTTP client -> HTTP API records/s", f"{h:,.0f}"))
            rows.append(("  Kafka / HTTP", f"{k / h:.2f}x"))
        k = kafka_consume(bootstrap, "kafka-acks-1", n)
        h = asyncio.run(http_consume(base, "http-acks-1", n))
        rows.append(("consumer catch-up: confluent-kafka <- Kafka listener records/s", f"{k:,.0f}"))
        rows.append(("consumer catch-up: Python HTTP client <- HTTP API records/s", f"{h:,.0f}"))
        rows.append(("  Kafka / HTTP", f"{k / h:.2f}x"))
    finally:
        node.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.kafka_bench")
    ap.add_argument("--records", type=int, default=200_000, help="records per measurement (100 B each)")
    ap.add_argument("--formats-only", action="store_true", help="only the in-process record format costs")
    args = ap.parse_args(argv)
    rows = format_costs(keyed=True) + format_costs(keyed=False)
    if not args.formats_only:
        rows += run(args.records)
    width = max(len(r[0]) for r in rows)
    print("record format costs, in process, 1000 records of 100 B per batch" if args.formats_only else
          f"Kafka listener vs HTTP, one `kraftlog serve` node, {args.records:,} records of {RECORD_BYTES} B each")
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")


if __name__ == "__main__":
    main()
