"""Kafka listener benchmark: confluent-kafka (librdkafka) against the Kafka listener vs the
project's Python HTTP client against the HTTP API, same node, same run, 100-byte records.

Figures (printed, not asserted):
- produce records/s, acks=1 and acks=all: confluent-kafka Producer (linger 5 ms, 1 MB
  batches, compression none; acks=1 also lz4) vs http_api.client.Producer (send() per record,
  linger 5 ms, 256 KiB batches);
- consumer catch-up records/s from offset 0: confluent-kafka Consumer (8 MB fetches, a
  prefetch queue that never pauses fetching) vs http_api.client.Consumer;
- the ratios Kafka / HTTP;
- CPU-seconds per million records of the broker process (net of its idle background work)
  and of this client process (librdkafka's threads included), for every confluent-kafka run: on 2 shared cores the client
  and the broker compete, and a wall-clock rate under load says little; broker CPU-s per M
  records says whether the broker could do 1M records/s with a core of its own (< 1.0);
- with `--before TREE` (a `git worktree` of an older commit): the confluent-kafka runs
  against that tree's broker and this one's, alternating rounds on fresh nodes, and the
  ratios after / before of each figure;
- record format costs, in process (docs/RECORD_FORMAT.md): per record, encoding and decoding
  kraftlog's columnar records section vs Kafka's varint records (both are stored, chosen per
  batch: what the Python client, the broker's JSON routes and Spark pay on each), the
  listener's produce check (Kafka batches stored as sent) and its fetch (Kafka batches passed
  through, columnar ones converted).

Both sides run against one `kraftlog serve` node (a broker process + a controller process)
on this 2-core machine; the client runs in this process (librdkafka's threads are native).

    python -m bench.kafka_bench [--records N] [--before TREE --rounds R]
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import resource
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


class CpuMeter:
    """CPU-seconds (user + system) used by the broker process and by this process (the
    client: librdkafka's native threads count here) between `start()` and `stop()`.

    The broker's own background work (heartbeats, metadata, timers) is subtracted: `start()`
    first measures the idle broker for `idle_s` and `broker_s` is net of that rate over the
    run (on a loaded machine a run lasts long and the background work would otherwise
    inflate the per-record figure)."""

    def __init__(self, broker_pid: int | None, idle_s: float = 2.0) -> None:
        self.broker_pid = broker_pid
        self.idle_s = idle_s
        self.broker_s = self.client_s = self.broker_idle_rate = 0.0

    def _broker(self) -> float:
        if self.broker_pid is None:
            return 0.0
        with open(f"/proc/{self.broker_pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")   # utime + stime

    @staticmethod
    def _client() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    def measure_idle(self) -> None:
        """The idle broker's CPU rate, over `idle_s` (call it while no client is working)."""
        b, t = self._broker(), time.perf_counter()
        time.sleep(self.idle_s)   # a measuring window, not synchronisation
        self.broker_idle_rate = (self._broker() - b) / (time.perf_counter() - t)
        self._idle_measured = True

    def start(self) -> "CpuMeter":
        if self.idle_s > 0 and not getattr(self, "_idle_measured", False):
            self.measure_idle()
        self._b0, self._c0, self._t0 = self._broker(), self._client(), time.perf_counter()
        return self

    def stop(self) -> "CpuMeter":
        wall = time.perf_counter() - self._t0
        self.broker_s = max(0.0, self._broker() - self._b0 - self.broker_idle_rate * wall)
        self.client_s = self._client() - self._c0
        return self


def broker_pid(node) -> int | None:
    """The broker child of a `kraftlog serve` node (its supervisor also runs a controller)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if ppid == node.proc.pid and b"http_api.broker.server" in cmd:
            return int(entry)
    return None


def kafka_produce(bootstrap: str, topic: str, n: int, acks: str, compression: str = "none",
                  meter: CpuMeter | None = None) -> float:
    """confluent-kafka tuned for throughput as a Kafka user would: 5 ms linger, 1 MB batches
    (librdkafka's request cap, message.max.bytes, is 1 MB too), up to 100,000 records a batch
    and a queue large enough never to block the producing loop."""
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": bootstrap, "acks": acks, "linger.ms": 5, "batch.size": 1 << 20,
                  "batch.num.messages": 100_000, "compression.type": compression,
                  "enable.idempotence": acks == "all", "queue.buffering.max.messages": 1_000_000,
                  "queue.buffering.max.kbytes": 1 << 20})
    value = b"x" * RECORD_BYTES
    errors = []

    def report(err, _msg):
        if err is not None:
            errors.append(err)
    p.produce(topic, value=value, partition=0)   # connection and metadata before the clock starts
    if p.flush(60):
        raise RuntimeError("confluent-kafka producer: the first record was not delivered in 60 s")
    if meter:
        meter.start()
    t0 = time.perf_counter()
    for i in range(n - 1):
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
    if meter:
        meter.stop()
    if left or errors:
        raise RuntimeError(f"confluent-kafka producer: {left} undelivered, errors {errors[:3]}")
    return (n - 1) / dt


def kafka_consume(bootstrap: str, topic: str, n: int, meter: CpuMeter | None = None) -> float:
    """Catch-up from offset 0 with 8 MB fetches; queued.min.messages is raised so librdkafka
    keeps fetching while the application drains its queue (by default it pauses fetching
    for fetch.queue.backoff.ms = 1 s once 100,000 records wait)."""
    from confluent_kafka import Consumer, TopicPartition
    if meter:
        meter.measure_idle()   # before the consumer exists: it starts fetching once assigned
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "kafka-bench", "enable.auto.commit": False,
                  "fetch.max.bytes": 8 << 20, "max.partition.fetch.bytes": 8 << 20, "fetch.wait.max.ms": 100,
                  "queued.min.messages": 10_000_000, "queued.max.messages.kbytes": 1 << 20,
                  "fetch.queue.backoff.ms": 1})
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        got = 0
        if meter:
            meter.start()
        t0 = time.perf_counter()
        deadline = t0 + 300
        while got < n and time.perf_counter() < deadline:
            for m in c.consume(num_messages=100_000, timeout=1.0):
                if m.error() is None:
                    got += 1
        dt = time.perf_counter() - t0
        if meter:
            meter.stop()
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


def _per_m(seconds: float, n: int) -> str:
    return f"{seconds / n * 1e6:.2f}"


def run(n: int) -> list[tuple[str, str]]:
    tmp = tempfile.mkdtemp(prefix="kafka-bench-")
    node = LocalNode(os.path.join(tmp, "data")).start()
    rows: list[tuple[str, str]] = []
    try:
        base, bootstrap = node.url, f"127.0.0.1:{node.kafka_port}"
        bpid = broker_pid(node)
        for acks in ("1", "all"):
            kt, ht = f"kafka-acks-{acks}", f"http-acks-{acks}"
            _create_topic(base, kt)
            _create_topic(base, ht)
            meter = CpuMeter(bpid)
            k = kafka_produce(bootstrap, kt, n, acks, meter=meter)
            h = asyncio.run(http_produce(base, ht, n, acks))
            rows.append((f"produce acks={acks}: confluent-kafka -> Kafka listener records/s", f"{k:,.0f}"))
            rows.append(("  broker / client CPU-s per M records", f"{_per_m(meter.broker_s, n)} / "
                                                                   f"{_per_m(meter.client_s, n)}"))
            rows.append((f"produce acks={acks}: Python HTTP client -> HTTP API records/s", f"{h:,.0f}"))
            rows.append(("  Kafka / HTTP", f"{k / h:.2f}x"))
        _create_topic(base, "kafka-lz4")
        meter = CpuMeter(bpid)
        k = kafka_produce(bootstrap, "kafka-lz4", n, "1", "lz4", meter=meter)
        rows.append(("produce acks=1 lz4: confluent-kafka -> Kafka listener records/s", f"{k:,.0f}"))
        rows.append(("  broker / client CPU-s per M records", f"{_per_m(meter.broker_s, n)} / "
                                                               f"{_per_m(meter.client_s, n)}"))
        meter = CpuMeter(bpid)
        k = kafka_consume(bootstrap, "kafka-acks-1", n, meter=meter)
        h = asyncio.run(http_consume(base, "http-acks-1", n))
        rows.append(("consumer catch-up: confluent-kafka <- Kafka listener records/s", f"{k:,.0f}"))
        rows.append(("  broker / client CPU-s per M records", f"{_per_m(meter.broker_s, n)} / "
                                                               f"{_per_m(meter.client_s, n)}"))
        rows.append(("consumer catch-up: Python HTTP client <- HTTP API records/s", f"{h:,.0f}"))
        rows.append(("  Kafka / HTTP", f"{k / h:.2f}x"))
    finally:
        node.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


def _node_class(tree: str):
    """`LocalNode` of another source tree (its broker runs that tree's code)."""
    spec = importlib.util.spec_from_file_location(f"_local_node_{abs(hash(tree))}",
                                                  os.path.join(tree, "deploy", "local_node.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.LocalNode


def _kafka_round(node_cls, n: int) -> dict[str, float]:
    """One fresh node: confluent-kafka produce (acks=1, none and lz4) and catch-up; records/s
    and broker / client CPU-s per M records of each."""
    tmp = tempfile.mkdtemp(prefix="kafka-bench-")
    node = node_cls(os.path.join(tmp, "data")).start()
    out: dict[str, float] = {}
    try:
        bootstrap, bpid = f"127.0.0.1:{node.kafka_port}", broker_pid(node)
        for name, comp in (("produce", "none"), ("produce lz4", "lz4")):
            _create_topic(node.url, name.replace(" ", "-"))
            meter = CpuMeter(bpid)
            out[f"{name} records/s"] = kafka_produce(bootstrap, name.replace(" ", "-"), n, "1", comp, meter=meter)
            out[f"{name} broker CPU-s/M"] = meter.broker_s / n * 1e6
            out[f"{name} client CPU-s/M"] = meter.client_s / n * 1e6
        meter = CpuMeter(bpid)
        out["catch-up records/s"] = kafka_consume(bootstrap, "produce", n, meter=meter)
        out["catch-up broker CPU-s/M"] = meter.broker_s / n * 1e6
        out["catch-up client CPU-s/M"] = meter.client_s / n * 1e6
    finally:
        node.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def compare(before_tree: str, n: int, rounds: int) -> list[tuple[str, str]]:
    """The confluent-kafka figures against `before_tree`'s broker and this tree's,
    alternating rounds (before, after, after, before, ...), each on a fresh node; medians and
    the ratio after / before of each round's pair (load drifts less within a pair)."""
    import statistics
    kinds = {"before": _node_class(before_tree), "after": LocalNode}
    seen: dict[str, list[dict]] = {"before": [], "after": []}
    for r in range(rounds):
        for kind in (("before", "after") if r % 2 == 0 else ("after", "before")):
            seen[kind].append(_kafka_round(kinds[kind], n))
    rows = []
    for key in seen["after"][0]:
        b = statistics.median(x[key] for x in seen["before"])
        a = statistics.median(x[key] for x in seen["after"])
        pairs = [x[key] / y[key] for x, y in zip(seen["after"], seen["before"]) if y[key]]
        fmt = "{:,.0f}" if key.endswith("records/s") else "{:.2f}"
        rows.append((f"acks=1 {key}: before / after (median of {rounds})",
                     f"{fmt.format(b)} / {fmt.format(a)}; after/before per round pair "
                     + ", ".join(f"{r:.2f}" for r in pairs)))
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.kafka_bench")
    ap.add_argument("--records", type=int, default=200_000, help="records per measurement (100 B each)")
    ap.add_argument("--formats-only", action="store_true", help="only the in-process record format costs")
    ap.add_argument("--before", metavar="TREE", help="also measure this source tree's broker (a git worktree of an "
                    "older commit), alternating rounds with this tree's")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of each tree with --before")
    args = ap.parse_args(argv)
    rows = format_costs(keyed=True) + format_costs(keyed=False)
    if args.before:
        rows = compare(args.before, args.records, args.rounds)
    elif not args.formats_only:
        rows += run(args.records)
    width = max(len(r[0]) for r in rows)
    print(f"confluent-kafka against {args.before} (before) and this tree (after), {args.records:,} records of "
          f"{RECORD_BYTES} B, fresh node per round" if args.before else
          "record format costs, in process, 1000 records of 100 B per batch" if args.formats_only else
          f"Kafka listener vs HTTP, one `kraftlog serve` node, {args.records:,} records of {RECORD_BYTES} B each")
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")


if __name__ == "__main__":
    main()
