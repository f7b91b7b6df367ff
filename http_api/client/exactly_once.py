"""Exactly-once consume-transform-produce without transactions: the position travels with
the output.

kraftlog has no transactions (yet). What it supports is Kafka's older pattern where the
output and the input position are written *together*, in one record append:

1. every output record carries the header `kraftlog.source` = "<topic>:<partition>:<next offset>"
   (the input position right after the record it was made from);
2. input partition p of the group's assignment writes to one fixed output partition
   (`output_partition_for`), so the last record there tells where p's processing stopped;
3. the producer is idempotent (the Python Producer's default with acks=all): a retried
   batch is written once;
4. whenever a consumer gains an input partition (start, restart, rebalance) it seeks to
   `recover_position(...)` read from the output partition's tail, falling back to the group's
   committed offset (`Consumer.committed`) when the output has nothing for it yet.

A crash before the output append reprocesses the input (nothing was written); a crash after
it resumes right after it (the position is in the output). Group commits are then only for
progress display (lag); the output topic is the source of truth.

Limits (say so to users): one writer per input partition at a time. The group guarantees it
for live members (partitions are revoked before they move), but a consumer that was paused
longer than its session timeout may still append before it notices it was fenced; keep
processing time per poll well below `session_timeout_ms`, and check `Consumer.assignment()`
before producing. Several input partitions may share an output partition only if
`recover_position` filters by source (it does) and each input partition's records stay in
order (they do: one producer per consumer, one partition each).
"""
from __future__ import annotations

from typing import Any

SOURCE_HEADER = "kraftlog.source"
RECOVER_SCAN_RECORDS = 1000       # tail window read per step when looking for the last source header
RECOVER_TIMEOUT_S = 30.0


def source_header(topic: str, partition: int, next_offset: int) -> dict[str, str]:
    """The header to put on an output record made from input record (topic, partition, next_offset - 1)."""
    return {SOURCE_HEADER: f"{topic}:{partition}:{next_offset}"}


def parse_source(headers) -> tuple[str, int, int] | None:
    for k, v in headers or ():
        if k == SOURCE_HEADER and v is not None:
            raw = v.decode() if isinstance(v, (bytes, bytearray)) else str(v)
            topic, _, rest = raw.rpartition(":")
            topic, _, part = topic.rpartition(":")
            try:
                return topic, int(part), int(rest)
            except ValueError:
                return None
    return None


def output_partition_for(input_partition: int, output_partitions: int) -> int:
    return input_partition % output_partitions


async def recover_position(reader: Any, output_topic: str, output_partition: int,
                           input_topic: str, input_partition: int) -> int | None:
    """The input position recorded by the last output record made from (input_topic,
    input_partition), read backwards from the output partition's high watermark in windows of
    RECOVER_SCAN_RECORDS; None when there is none. `reader` is a Consumer (not in a group) used
    with assign/seek/poll."""
    import time
    deadline = time.monotonic() + RECOVER_TIMEOUT_S
    tp = (output_topic, output_partition)
    reader.assign([tp])
    offs = await reader._offsets(tp)
    start, end = offs["log_start_offset"], offs["high_watermark"]
    hi = end
    while hi > start:
        lo = max(start, hi - RECOVER_SCAN_RECORDS)
        reader.seek(tp, lo)
        found = None
        pos = lo
        while pos < hi:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {output_topic}-{output_partition} up to {hi} took over "
                                   f"{RECOVER_TIMEOUT_S} s; is its leader available?")
            records = await reader.poll(200)
            for r in records:
                if r.offset >= hi:
                    continue
                src = parse_source(r.headers)
                if src is not None and src[0] == input_topic and src[1] == input_partition:
                    found = src[2]
                pos = max(pos, r.offset + 1)
            if not records:
                pos = max(pos, await reader.position(tp))
        if found is not None:
            return found
        hi = lo
    return None
