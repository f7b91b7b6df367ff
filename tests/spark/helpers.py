"""Helpers shared by the Spark tests: produce with the reference codec, stream to memory."""
from __future__ import annotations

import time

from partitions.log import record_batch as rb


def produce(cluster, topic: str, partition: int, values, keys=None, headers=None,
            timestamp_ms: int | None = None) -> int:
    """Append records with the shared codec (not the connector's encoder); returns base offset."""
    values = list(values)
    keys = list(keys) if keys is not None else [None] * len(values)
    headers = list(headers) if headers is not None else [()] * len(values)
    records = [rb.Record(key=k, value=v, headers=tuple(h), timestamp=timestamp_ms)
               for k, v, h in zip(keys, values, headers)]
    answer = cluster.produce_raw(topic, partition, rb.build_batch(records))
    return int(answer["offsets"][0]["offset"]) if "offsets" in answer else int(answer.get("base_offset", -1))


def wait_high_watermark(cluster, topic: str, partition: int, at_least: int, timeout_s: float = 20.0) -> int:
    deadline = time.monotonic() + timeout_s
    while True:
        _, hw = cluster.offsets(topic, partition)
        if hw >= at_least or time.monotonic() > deadline:
            return hw
        time.sleep(0.05)


def reader(spark, url: str, **options):
    r = spark.readStream.format("kraftlog").option("kraftlog.bootstrap.servers", url)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def batch_reader(spark, url: str, **options):
    r = spark.read.format("kraftlog").option("kraftlog.bootstrap.servers", url)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def stored_records(cluster, topic: str, partitions: int) -> list:
    """Every committed record of `topic` as (partition, offset, key, value, batch header),
    fetched as raw batches from each partition's leader up to its high watermark."""
    out = []
    for p in range(partitions):
        offset = 0
        _, hw = cluster.offsets(topic, p)
        while offset < hw:
            got = cluster.fetch(topic, p, offset, 1 << 20)
            for header, view in rb.iter_batches(got["batches"]):
                for r in rb.decode_records(bytes(view)):
                    if r.offset >= offset:
                        out.append((p, r.offset, r.key, r.value, header))
            offset = max(offset, got["next_offset"])
    return out


def checkpoint_batch_ids(checkpoint_dir: str, log: str) -> list:
    """Batch ids Spark has written to `<checkpoint>/<log>` ("offsets": planned, "commits": done);
    each file appears by an atomic rename, so a listed id is complete."""
    import os
    path = os.path.join(checkpoint_dir, log)
    if not os.path.isdir(path):
        return []
    return sorted(int(n) for n in os.listdir(path) if n.isdigit())


def checkpoint_end_offsets(checkpoint_dir: str, batch_id: int) -> dict:
    """The source end offsets `{"topic": {"partition": next_offset}}` of micro-batch `batch_id`."""
    import json
    import os
    with open(os.path.join(checkpoint_dir, "offsets", str(batch_id))) as f:
        return json.loads(f.read().splitlines()[-1])
