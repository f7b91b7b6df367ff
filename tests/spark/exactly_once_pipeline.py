"""The processing process of tests/spark/test_spark_exactly_once_cluster.py: a Structured
Streaming copy-and-transform job from one topic to another with the kraftlog source and
sink (idempotent by default), run in its own process so the test can kill -9 it.

    python tests/spark/exactly_once_pipeline.py --bootstrap URL,URL --input in --output out \
        --checkpoint DIR [--max-offsets-per-trigger 300] [--hold-dir DIR --hold-partition 2]

The query reads `input` from earliest with `trigger(availableNow=True)` (bounded micro-batches
of `--max-offsets-per-trigger` records), maps each record (key kept, value -> "out:" + value)
and writes it to `output`, checkpointing in `--checkpoint`; started again on the same
checkpoint it resumes there.

Testing knob: with `--hold-dir D --hold-partition P`, the task with Spark partition id P of
micro-batch B, after its last input row and before its sink sends the rows it holds, creates
the file `D/held-B` and waits until the file `D/release-B` exists. The other tasks of the micro-batch write their output
meanwhile, so the test decides when a micro-batch is half written and what happens then
(kill a leader the held rows are routed to, kill this process).

The transformation is deterministic, as the sink's exactly-once promise requires. On success it prints one line `PROGRESS <json>` with the
batch ids and input row counts of the micro-batches it ran, and exits 0.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

hold_max_s = 600.0   # a held task goes on by itself after this long (the test normally decides)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap", required=True, help="comma-separated broker URLs")
    ap.add_argument("--input", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--max-offsets-per-trigger", type=int, default=300)
    ap.add_argument("--hold-partition", type=int, default=-1)
    ap.add_argument("--hold-dir", default="")
    ap.add_argument("--master", default="local[2,4]")
    ap.add_argument("--timeout-s", type=float, default=300.0)
    ap.add_argument("--sink-option", action="append", default=[], metavar="KEY=VALUE",
                    help="an extra sink option, e.g. kraftlog.transactional.id=q1 (repeatable)")
    args = ap.parse_args(argv)

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import pipelines

    spark = (SparkSession.builder.master(args.master).appName("kraftlog-exactly-once-cluster")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.memory", "512m")
             # a short-lived JVM on 2 busy cores: C1 only and one GC thread start up faster
             .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
             .config("spark.sql.session.timeZone", "UTC")
             .getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    pipelines.register(spark)

    hold_partition, hold_dir, max_s = args.hold_partition, args.hold_dir, hold_max_s

    def hold(batches):
        import os
        import time

        from pyspark import TaskContext
        yield from batches
        # after its last row: the sink task already holds the rows and the leaders it looked
        # up, and sends them when this input ends
        ctx = TaskContext.get()
        if hold_dir and ctx.partitionId() == hold_partition:
            batch_id = ctx.getLocalProperty("streaming.sql.batchId")
            open(os.path.join(hold_dir, f"held-{batch_id}"), "w").close()
            release = os.path.join(hold_dir, f"release-{batch_id}")
            deadline = time.monotonic() + max_s
            while not os.path.exists(release) and time.monotonic() < deadline:
                time.sleep(0.05)

    writer = (spark.readStream.format("kraftlog")
             .option("kraftlog.bootstrap.servers", args.bootstrap)
             .option("subscribe", args.input)
             .option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", str(args.max_offsets_per_trigger))
             .load()
             .selectExpr("key", "value")
             .mapInArrow(hold, "key binary, value binary")
             .selectExpr("key", "concat(CAST('out:' AS BINARY), value) AS value")
             .writeStream.format("kraftlog")
             .option("kraftlog.bootstrap.servers", args.bootstrap))
    for kv in args.sink_option:
        key, _, value = kv.partition("=")
        writer = writer.option(key, value)
    query = (writer
             .option("topic", args.output)
             .option("checkpointLocation", args.checkpoint)
             .trigger(availableNow=True)
             .start())
    try:
        finished = query.awaitTermination(args.timeout_s)
        if not finished:
            print(f"query still running after {args.timeout_s} s", flush=True)
            return 2
        if query.exception() is not None:
            print(f"query failed: {query.exception()}", flush=True)
            return 1
        progress = [{"batchId": p["batchId"], "numInputRows": p["numInputRows"]} for p in query.recentProgress]
        print("PROGRESS " + json.dumps(progress), flush=True)
        return 0
    finally:
        query.stop()
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
