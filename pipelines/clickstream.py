"""End-to-end example: click events -> Structured Streaming aggregation -> topic -> consumer.

    python -m pipelines.clickstream                 # starts a local node in a temp dir
    python -m pipelines.clickstream --bootstrap http://127.0.0.1:8082 --events 5000

1. a generator produces click events (JSON values `{"page", "user", "ts"}`, keyed by user)
   to `clicks`, in rounds, while the job runs;
2. a Structured Streaming job reads `clicks` with the kraftlog source, counts clicks per
   page per event-time minute (1-minute tumbling windows, 1-minute watermark, append
   mode) and writes each closed window as JSON to `page-stats` with the kraftlog sink;
3. a consumer reads `page-stats` and prints every result as it arrives;
4. the results are checked against the same aggregation done in plain Python; the exit
   status is 0 only when they match.

A last event far ahead in event time (page `__flush__`) moves the watermark past every
real window so append mode emits them all; its own window never closes, so it is never
emitted. Topics that
already exist are read from their current end, so reruns against one cluster still check.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import random
import sys
import tempfile
import threading
import time

from pipelines.client import BrokerError, Cluster

FLUSH_PAGE = "__flush__"
PAGES = ["/", "/pricing", "/docs", "/blog", "/signup", "/login", "/about"]
base_time_ms_default = 1_767_225_600_000  # 2026-01-01T00:00:00Z: event time is synthetic
jitter_ms_max = 20_000                     # out-of-order events, well inside the watermark


def log(msg: str) -> None:
    print(f"[clickstream {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def make_events(count: int, minutes: int, users: int, seed: int) -> list:
    """Click events with event times spread over `minutes`, slightly out of order."""
    rnd = random.Random(seed)
    span = minutes * 60_000
    events = []
    for i in range(count):
        ts = base_time_ms_default + (i * span) // max(1, count) + rnd.randint(0, jitter_ms_max)
        ts = min(ts, base_time_ms_default + span - 1)
        events.append({"page": rnd.choice(PAGES), "user": f"u{rnd.randrange(users)}", "ts": ts})
    return events


def expected_counts(events: list) -> dict:
    """The same aggregation in plain Python: {(page, window_start_ms): clicks}."""
    counts = collections.Counter()
    for e in events:
        if e["page"] != FLUSH_PAGE:
            counts[(e["page"], e["ts"] - e["ts"] % 60_000)] += 1
    return dict(counts)


def ensure_topic(cluster: Cluster, name: str, partitions: int) -> dict:
    """Create `name` if needed; returns {partition: high watermark} to start reading from."""
    try:
        cluster.create_topic(name, partitions=partitions, replication_factor=1)
    except BrokerError as exc:
        if exc.error_code != "TOPIC_ALREADY_EXISTS":
            raise
    parts = None
    deadline = time.monotonic() + 30
    while not parts:
        parts = cluster.topic_partitions(refresh=True).get(name)
        if not parts:
            if time.monotonic() > deadline:
                raise TimeoutError(f"topic {name} did not appear in metadata")
            time.sleep(0.1)
    cluster.wait_for_topic(name, len(parts))
    return {p: cluster.offsets(name, p)[1] for p in parts}


def produce_events(cluster: Cluster, topic: str, events: list, rounds: int, pause_s: float,
                   stop: threading.Event) -> None:
    """Send events in `rounds` (keyed by user) through the topic route, like a web app would."""
    import urllib.parse
    import urllib.request

    size = -(-len(events) // rounds)
    for r in range(rounds):
        chunk = events[r * size:(r + 1) * size]
        if not chunk or stop.is_set():
            break
        body = json.dumps({"records": [{"key": e["user"], "value": json.dumps(e)} for e in chunk]}).encode()
        url = f"{cluster.bootstrap[0]}/v1/topics/{urllib.parse.quote(topic)}/records"
        req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            resp.read()
        log(f"generator: round {r + 1}/{rounds} sent {len(chunk)} clicks")
        stop.wait(pause_s)


def start_job(spark, bootstrap: str, clicks: str, stats: str, starting: dict, checkpoint: str):
    from pyspark.sql import functions as F

    starting_json = json.dumps({clicks: {str(p): o for p, o in sorted(starting.items())}})
    clicks_df = (spark.readStream.format("kraftlog")
                 .option("kraftlog.bootstrap.servers", bootstrap)
                 .option("subscribe", clicks)
                 .option("startingOffsets", starting_json)
                 .load())
    events = (clicks_df
              .select(F.from_json(F.col("value").cast("string"),
                                  "page string, user string, ts long").alias("e"))
              .select("e.page", "e.user", F.timestamp_millis("e.ts").alias("event_time"))
              .withWatermark("event_time", "1 minute"))
    # no filter on FLUSH_PAGE here: Spark would push it below the watermark, and the flush
    # event must move the watermark; its own window never closes, so it is never emitted
    stats_df = (events.groupBy(F.window("event_time", "1 minute"), "page").count()
                .select(F.col("page").alias("key"),
                        F.to_json(F.struct(
                            "page",
                            F.unix_millis(F.col("window.start")).alias("window_start_ms"),
                            F.date_format("window.start", "yyyy-MM-dd HH:mm").alias("minute"),
                            F.col("count").alias("clicks"))).alias("value")))
    return (stats_df.writeStream.format("kraftlog")
            .option("kraftlog.bootstrap.servers", bootstrap)
            .option("topic", stats)
            .option("checkpointLocation", checkpoint)
            .outputMode("append")
            .trigger(processingTime="1 second")
            .queryName("clickstream-page-stats")
            .start())


class StatsConsumer:
    """Reads page-stats from given offsets; keeps the last result per (page, window)."""

    def __init__(self, cluster: Cluster, topic: str, starting: dict):
        self.cluster, self.topic = cluster, topic
        self.positions = dict(starting)
        self.results: dict = {}

    def poll(self) -> int:
        new = 0
        for p, pos in self.positions.items():
            resp = self.cluster.fetch(self.topic, p, pos, 1 << 20, max_wait_ms=0, raw=False)
            for offset, _ts, _key, value, _headers in resp["records"]:
                row = json.loads(value)
                self.results[(row["page"], row["window_start_ms"])] = row["clicks"]
                print(f"  page-stats  {row['minute']}  {row['page']:<10} {row['clicks']:>6} clicks", flush=True)
                new += 1
                pos = offset + 1
            self.positions[p] = max(pos, resp["next_offset"])
        return new


def run(spark, bootstrap: str, events_count: int = 2000, minutes: int = 5, users: int = 50,
        rounds: int = 4, pause_s: float = 1.0, timeout_s: float = 180.0, seed: int = 1,
        clicks_topic: str = "clicks", stats_topic: str = "page-stats", checkpoint: str | None = None) -> int:
    """Run the pipeline against `bootstrap`; returns 0 when the output checks out."""
    import pipelines

    pipelines.register(spark)
    cluster = Cluster([bootstrap], client_id="clickstream")
    clicks_start = ensure_topic(cluster, clicks_topic, partitions=2)
    stats_start = ensure_topic(cluster, stats_topic, partitions=1)
    events = make_events(events_count, minutes, users, seed)
    flush = {"page": FLUSH_PAGE, "user": "flush", "ts": base_time_ms_default + (minutes + 10) * 60_000}
    expected = expected_counts(events)
    log(f"{len(events)} clicks over {minutes} event-time minutes -> {len(expected)} (page, minute) windows")

    tmp = None
    if checkpoint is None:
        tmp = tempfile.TemporaryDirectory(prefix="clickstream-chk-")
        checkpoint = tmp.name
    query = start_job(spark, bootstrap, clicks_topic, stats_topic, clicks_start, checkpoint)
    log(f"streaming job started: {clicks_topic} -> per-page per-minute counts -> {stats_topic}")
    stop = threading.Event()
    generator = threading.Thread(target=produce_events, name="generator", daemon=True,
                                 args=(cluster, clicks_topic, events + [flush], rounds, pause_s, stop))
    consumer = StatsConsumer(Cluster([bootstrap], client_id="clickstream-consumer"), stats_topic, stats_start)
    generator.start()
    deadline = time.monotonic() + timeout_s
    last_report = 0.0
    try:
        while time.monotonic() < deadline:
            if query.exception() is not None:
                log(f"streaming job failed: {query.exception()}")
                return 2
            consumer.poll()
            if not generator.is_alive() and len(consumer.results) >= len(expected):
                break
            if time.monotonic() - last_report > 5:
                progress = query.lastProgress or {}
                log(f"job: batch {progress.get('batchId', '-')}, {progress.get('numInputRows', 0)} rows in "
                    f"last batch; consumer has {len(consumer.results)}/{len(expected)} windows")
                last_report = time.monotonic()
            time.sleep(0.3)
        time.sleep(1.5)  # a straggling duplicate would show up here
        consumer.poll()
    finally:
        stop.set()
        query.stop()
        generator.join(10)
        if tmp is not None:
            tmp.cleanup()
    if consumer.results == expected:
        log(f"OK: {len(expected)} windows, {sum(expected.values())} clicks match the plain-Python aggregation")
        return 0
    missing = {k: v for k, v in expected.items() if consumer.results.get(k) != v}
    extra = {k: v for k, v in consumer.results.items() if k not in expected}
    log(f"MISMATCH: {len(missing)} windows differ or are missing, {len(extra)} unexpected; "
        f"e.g. missing {list(missing.items())[:3]} extra {list(extra.items())[:3]}")
    return 1


def build_spark():
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master(os.environ.get("SPARK_MASTER", "local[2]"))
             .appName("kraftlog-clickstream")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.memory", "768m")
             .config("spark.sql.session.timeZone", "UTC")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", help="broker URL of a running cluster (default: start a local node)")
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--minutes", type=int, default=5, help="event-time span of the clicks")
    parser.add_argument("--users", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=4, help="generator rounds, one per pause")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for all results")
    args = parser.parse_args(argv)

    node = None
    tmp = None
    bootstrap = args.bootstrap
    try:
        if not bootstrap:
            from deploy.local_node import LocalNode
            tmp = tempfile.TemporaryDirectory(prefix="clickstream-node-")
            log("starting a local single-node cluster (kraftlog serve)")
            node = LocalNode(tmp.name).start()
            bootstrap = node.url
            log(f"cluster ready at {bootstrap}")
        spark = build_spark()
        try:
            return run(spark, bootstrap, args.events, args.minutes, args.users, args.rounds,
                       timeout_s=args.timeout)
        finally:
            spark.stop()
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    finally:
        if node is not None:
            node.stop()
            log("local cluster stopped")
        if tmp is not None:
            tmp.cleanup()


if __name__ == "__main__":
    sys.exit(main())
