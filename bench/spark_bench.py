"""Spark connector benchmark: `python -m bench.spark_bench [--rows 1000000] [--bootstrap URL]`.

Measures rows/s of the kraftlog data source with 100-byte values, batch write and batch
read through Spark (local[2]) (writes: idempotent, at-least-once, transactional), next to baselines measured in the same run against the
same broker without Spark:

- write baseline: one Python process encodes batches from Arrow columns and POSTs them
  as raw batches to the partition leaders (what each Spark write task does);
- read baselines: raw fetch only (bytes over HTTP), raw fetch + Arrow decode (what each
  Spark read task does), raw fetch + the reference per-record decoder (`decode_batches`).

Then the example pipeline (`pipelines/clickstream.py`: clicks -> per-page per-minute
counts with a watermark -> `page-stats`) runs as a streaming job (1 s trigger) while a
generator sends a round of clicks every second; printed: micro-batch duration p50/p99 of
the batches that had input, and the ingest latency of each round (sent -> the micro-batch
that read it committed its output), p50/p99.

Spark reads are forced through every column with the `noop` sink. Starts a local node
(`kraftlog serve`) in a temp dir unless --bootstrap is given. Figures are printed, not
asserted; the machine has 2 cores shared by the broker, Spark's JVM and its Python workers.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid

value_bytes_default = 100


def _fmt(n: float) -> str:
    return f"{n:,.0f}"


def produce_baseline(cluster, topic: str, partitions: int, rows: int, value_bytes: int) -> float:
    """Encode + POST raw batches from one process; returns seconds."""
    import pyarrow as pa

    from pipelines import arrow_codec

    per_batch = max(1, (900 * 1024) // (value_bytes + 8))
    chunk = pa.array([(b"%010d" % i) + b"x" * (value_bytes - 10) for i in range(per_batch)], pa.binary())
    t0 = time.perf_counter()
    sent, p = 0, 0
    while sent < rows:
        n = min(per_batch, rows - sent)
        batches = [arrow_codec.encode_batch(None, chunk.slice(0, n))]
        cluster.produce_raw(topic, p % partitions, b"".join(batches))
        sent += n
        p += 1
    return time.perf_counter() - t0


def fetch_baseline(cluster, topic: str, partitions: int, decode: str) -> tuple:
    """Fetch every partition from 0 to its high watermark; returns (rows, bytes, seconds)."""
    from partitions.log import record_batch as rb
    from pipelines import arrow_codec

    rows = size = 0
    t0 = time.perf_counter()
    for p in range(partitions):
        _, hw = cluster.offsets(topic, p)
        pos = 0
        while pos < hw:
            resp = cluster.fetch(topic, p, pos, 8 * 1024 * 1024)
            buf = resp["batches"]
            size += len(buf)
            if decode == "arrow":
                cols, nxt = arrow_codec.decode_fetch(buf, pos, hw)
                rows += len(cols) if cols is not None else 0
            elif decode == "records":
                recs = [r for r in rb.decode_batches(buf) if r.offset >= pos]
                rows += len(recs)
                nxt = recs[-1].offset + 1 if recs else resp["next_offset"]
            else:
                nxt = resp["next_offset"]
                rows += nxt - pos
            pos = max(nxt, resp["next_offset"]) if decode != "records" else nxt
    return rows, size, time.perf_counter() - t0


def spark_write(spark, url: str, topic: str, rows: int, value_bytes: int, idempotence: bool = True,
                transactional_id: str | None = None) -> float:
    from pyspark.sql import functions as F

    df = spark.range(rows, numPartitions=2).select(
        F.concat(F.lpad(F.col("id").cast("string"), 10, "0"),
                 F.repeat(F.lit("x"), value_bytes - 10)).cast("binary").alias("value"))
    t0 = time.perf_counter()
    df.write.format("kraftlog").option("kraftlog.bootstrap.servers", url).option("topic", topic) \
        .option("kraftlog.enable.idempotence", str(idempotence).lower()) \
        .options(**({"kraftlog.transactional.id": transactional_id} if transactional_id else {})) \
        .mode("append").save()
    return time.perf_counter() - t0


def spark_read(spark, url: str, topic: str) -> float:
    t0 = time.perf_counter()
    (spark.read.format("kraftlog").option("kraftlog.bootstrap.servers", url).option("subscribe", topic)
     .load().write.format("noop").mode("overwrite").save())
    return time.perf_counter() - t0


def _pct(xs: list, q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def pipeline_latency(spark, url: str, cluster, rounds: int, clicks_per_round: int) -> dict:
    """Run the clickstream job; a round of clicks each second. -> latency figures (ms)."""
    import datetime
    import json
    import shutil

    from pipelines import clickstream

    clicks, stats = "clicks-" + uuid.uuid4().hex[:8], "stats-" + uuid.uuid4().hex[:8]
    starting = clickstream.ensure_topic(cluster, clicks, partitions=2)
    clickstream.ensure_topic(cluster, stats, partitions=1)
    checkpoint = tempfile.mkdtemp(prefix="spark-bench-chk-")
    query = clickstream.start_job(spark, url, clicks, stats, starting, checkpoint)
    events = clickstream.make_events(rounds * clicks_per_round, 5, 50, 7)
    sent = []   # (wall time sent, {partition: last offset})
    try:
        for r in range(rounds):
            chunk = events[r * clicks_per_round:(r + 1) * clicks_per_round]
            t = time.time()
            resp = _produce_round(url, clicks, chunk)
            last = {}
            for o in resp["offsets"]:
                last[o["partition"]] = max(last.get(o["partition"], -1), o["offset"])
            sent.append((t, last))
            print(f"  pipeline: round {r + 1}/{rounds} sent ({clicks_per_round} clicks)", flush=True)
            time.sleep(max(0.0, t + 1.0 - time.time()))
        want = {p: o for _, last in sent for p, o in last.items()}
        deadline = time.time() + 60
        while time.time() < deadline:
            prog = query.lastProgress or {}
            ends = (prog.get("sources") or [{}])[0].get("endOffset")
            ends = json.loads(ends) if isinstance(ends, str) else ends
            if ends and all(int(ends.get(clicks, {}).get(str(p), -1)) > o for p, o in want.items()):
                break
            time.sleep(0.5)
        progress = [p for p in query.recentProgress if p.get("numInputRows", 0) > 0]
    finally:
        query.stop()
        shutil.rmtree(checkpoint, ignore_errors=True)

    def done_at(p) -> float:
        start = datetime.datetime.strptime(p["timestamp"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(
            tzinfo=datetime.timezone.utc).timestamp()
        return start + p["durationMs"]["triggerExecution"] / 1000

    batches = []
    for p in progress:
        ends = p["sources"][0]["endOffset"]
        ends = json.loads(ends) if isinstance(ends, str) else ends
        batches.append((done_at(p), {int(k): int(v) for k, v in ends[clicks].items()}))
    ingest = []
    for t, last in sent:
        first = next((done for done, ends in batches if all(ends.get(p, -1) > o for p, o in last.items())), None)
        if first is not None:
            ingest.append((first - t) * 1000)
    durations = [p["durationMs"]["triggerExecution"] for p in progress]
    return {"batches": len(durations), "batch_p50": _pct(durations, 0.5), "batch_p99": _pct(durations, 0.99),
            "rounds": len(sent), "rounds_seen": len(ingest), "ingest_p50": _pct(ingest, 0.5),
            "ingest_p99": _pct(ingest, 0.99)}


def _produce_round(url: str, topic: str, chunk: list) -> dict:
    import json
    import urllib.request

    body = json.dumps({"records": [{"key": e["user"], "value": json.dumps(e)} for e in chunk]}).encode()
    req = urllib.request.Request(f"{url}/v1/topics/{topic}/records", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="kraftlog Spark connector benchmark")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--value-bytes", type=int, default=value_bytes_default)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=2, help="best of N for each measurement")
    parser.add_argument("--bootstrap", help="broker URL (default: start a local node)")
    parser.add_argument("--pipeline-rounds", type=int, default=30, help="clickstream rounds, one a second")
    parser.add_argument("--pipeline-clicks", type=int, default=500, help="clicks per round")
    args = parser.parse_args(argv)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import pipelines
    from pipelines.client import Cluster
    from deploy.local_node import LocalNode

    node = tmp = None
    url = args.bootstrap
    if not url:
        tmp = tempfile.TemporaryDirectory(prefix="spark-bench-")
        node = LocalNode(tmp.name).start()
        url = node.url
    spark = (SparkSession.builder.master("local[2]").appName("kraftlog-spark-bench")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").config("spark.driver.memory", "1g")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    pipelines.register(spark)
    cluster = Cluster([url], client_id="spark-bench")
    n, vb, parts = args.rows, args.value_bytes, args.partitions
    results = []
    try:
        def topic() -> str:
            name = "bench-" + uuid.uuid4().hex[:8]
            cluster.create_topic(name, partitions=parts)
            cluster.wait_for_topic(name, parts)
            return name

        # writes (a fresh topic each time, so every run appends the same amount)
        best = min(produce_baseline(cluster, topic(), parts, n, vb) for _ in range(args.repeat))
        results.append(("write: raw batches, 1 process, no Spark (baseline)", n, n * vb, best))
        spark_write(spark, url, topic(), min(n, 10_000), vb)  # warm up the Python workers
        best = min(spark_write(spark, url, topic(), n, vb) for _ in range(args.repeat))
        results.append(("write: Spark df.write, idempotent (default)", n, n * vb, best))
        best = min(spark_write(spark, url, topic(), n, vb, idempotence=False) for _ in range(args.repeat))
        results.append(("write: Spark df.write, idempotence=false", n, n * vb, best))
        best = min(spark_write(spark, url, topic(), n, vb, transactional_id="bench-" + uuid.uuid4().hex[:8])
                   for _ in range(args.repeat))
        results.append(("write: Spark df.write, kraftlog.transactional.id", n, n * vb, best))

        # reads of one topic holding n rows
        data = topic()
        produce_baseline(cluster, data, parts, n, vb)
        for label, mode in (("read: raw fetch only, no decode (baseline)", "none"),
                            ("read: raw fetch + Arrow decode, no Spark (baseline)", "arrow"),
                            ("read: raw fetch + per-record decode_batches (baseline)", "records")):
            runs = [fetch_baseline(cluster, data, parts, mode) for _ in range(args.repeat)]
            rows, size, secs = min(runs, key=lambda r: r[2])
            results.append((label, rows, size, secs))
        spark_read(spark, url, data)  # warm up
        best = min(spark_read(spark, url, data) for _ in range(args.repeat))
        results.append(("read: Spark spark.read.format('kraftlog') -> noop", n, n * vb, best))
        latency = pipeline_latency(spark, url, cluster, args.pipeline_rounds, args.pipeline_clicks) \
            if args.pipeline_rounds > 0 else None
    finally:
        spark.stop()
        if node is not None:
            node.stop()
        if tmp is not None:
            tmp.cleanup()

    print(f"\nkraftlog Spark connector: {n:,} rows x {vb} B values, {parts} partitions, local[2], "
          f"best of {args.repeat}\n")
    print(f"| {'path':<56} | {'rows':>10} | {'seconds':>8} | {'rows/s':>12} | {'MB/s':>8} |")
    print(f"|{'-' * 58}|{'-' * 12}|{'-' * 10}|{'-' * 14}|{'-' * 10}|")
    for label, rows, size, secs in results:
        print(f"| {label:<56} | {_fmt(rows):>10} | {secs:8.2f} | {_fmt(rows / secs):>12} | "
              f"{size / secs / 1e6:8.1f} |")
    spark_read_rps = results[-1][1] / results[-1][3]
    arrow_rps = results[-3][1] / results[-3][3]
    spark_write_rps = results[1][1] / results[1][3]
    base_write_rps = results[0][1] / results[0][3]
    plain_write_rps = results[2][1] / results[2][3]
    txn_write_rps = results[3][1] / results[3][3]
    print(f"\nSpark read / Arrow-decode baseline: {spark_read_rps / arrow_rps:.2f}; "
          f"Spark write / raw-produce baseline: {spark_write_rps / base_write_rps:.2f}; "
          f"idempotent write / at-least-once write: {spark_write_rps / plain_write_rps:.2f}; "
          f"transactional write / idempotent write: {txn_write_rps / spark_write_rps:.2f}")
    if latency:
        print(f"\nexample pipeline (clickstream, 1 s trigger, {args.pipeline_clicks} clicks a second): "
              f"{latency['batches']} micro-batches with input, duration p50 {latency['batch_p50']:.0f} ms "
              f"p99 {latency['batch_p99']:.0f} ms; round sent -> output committed p50 {latency['ingest_p50']:.0f} ms "
              f"p99 {latency['ingest_p99']:.0f} ms ({latency['rounds_seen']}/{latency['rounds']} rounds)")


if __name__ == "__main__":
    main()
