"""The `kraftlog` sink: batch and streaming writes of DataFrames to topics.

Input columns as in Spark's Kafka sink: `value` (binary or string, required), optional
`key`, `topic` (else the `topic` option), `partition` (else keyed rows go to
`crc32c(key) % partitions` like the broker's partitioner; keyless rows are dealt out in
blocks by an idempotent task (below), or go to a sticky partition that rotates after each
sent batch with idempotence off), `headers` (array<struct<key, value>>).

Each Spark task (`write`) gets Arrow batches, groups rows by (topic, partition), encodes
record batches straight from the Arrow buffers (pipelines/arrow_codec.py) and POSTs them to
the partition leader as `application/vnd.kraftlog.batch` (CBOR when a broker does not take
raw batches).

Transactional (`kraftlog.transactional.id=PREFIX`, issue 18): each task writes its rows as
one transaction under the transactional id `PREFIX-<Spark partition id>` (deterministic per
query and partition: give each query its own prefix), so a restarted query, or a retried
task, initialising that id fences its predecessor and aborts what it left open. A streaming
task also commits, inside the transaction, the group offset `micro-batch id + 1` of the group
`kraftlog-sink-<transactional id>` (the micro-batch marker); before writing, it reads that
marker and skips a micro-batch its transaction already committed (a replay after a crash
between the tasks' commits and the checkpoint's commit log). With the source's checkpointed
offsets, read_committed consumers of the output see each input record exactly once. The
records go through the coordinator's records route (JSON), not raw batches to the leaders:
slower (bench/spark_bench.py, docs/SPARK.md).

Default: idempotent (`kraftlog.enable.idempotence=true`), so a retried task does not
duplicate records. The driver takes one base producer id per write (batch) or per query
(stream, kept in the checkpoint so a restarted query reuses it); every task derives its own
producer id from it, its Spark partition id and the micro-batch id (`IdempotentIdentity`).
An idempotent task holds all its rows, puts them in a canonical order (rows of one key
keep their input order; keyless rows are sorted by content and dealt out to partitions in
contiguous blocks instead of a sticky partition), then cuts batches deterministically: a retry that
sees the same rows, in any order, re-sends byte-identical record sections under the same
sequences and the broker answers them as duplicates. Each duplicate whose offsets the
broker still knows is read back and compared: a retry whose rows differ fails the task
(`NonDeterministicRetryError`) instead of dropping rows. With idempotence off: at-least-once,
rows sent as they come.
"""
from __future__ import annotations

import dataclasses
import random
from typing import Iterator

import numpy as np

from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from pipelines import options as opt
from pipelines.client import BrokerError, Cluster

request_bytes_max_default = 4 * 1024 * 1024
request_records_max_default = 100_000
batch_overhead_bytes = 256


class NonDeterministicRetryError(RuntimeError):
    """A retried idempotent task re-sent a batch under used sequences with other rows."""


@dataclasses.dataclass
class KraftlogCommitMessage(WriterCommitMessage):
    """What one task appended: per "topic-partition", record count and offset span; how many
    of its batches were duplicates of an earlier attempt, read back and found identical
    (`verified_duplicates`) or too old for the broker to say where they are
    (`unverified_duplicates`)."""

    records: dict
    first_offsets: dict
    last_offsets: dict
    verified_duplicates: int = 0
    unverified_duplicates: int = 0

    @property
    def total(self) -> int:
        return sum(self.records.values())


class ProducerIdentity:
    """Producer id, epoch and per-partition sequence numbers stamped into batches.

    This base identity is "no idempotence": everything is -1 and the broker skips
    duplicate checks (at-least-once)."""

    producer_id = -1
    producer_epoch = -1

    def next_sequence(self, topic: str, partition: int, record_count: int) -> int:
        return -1


# Derived producer ids: DERIVED_FLAG | base << 30 | generation << 18 | spark partition id.
# `base` is an id handed out by POST /v1/producer-ids (the controller allocates them
# sequentially from 0, so ids with bit 62 set are never handed out to anyone else).
DERIVED_FLAG = 1 << 62
spark_partition_bits = 18
generation_bits = 12
base_bits = 62 - spark_partition_bits - generation_bits
epoch_bits = 15  # producer_epoch is an int16


def derived_producer_id(base: int, spark_partition: int, batch_id: int | None) -> tuple[int, int] | None:
    """(producer id, epoch) of one Spark task: batch writes use epoch 0, streaming writes
    epoch = batchId mod 2**15 with the higher bits of batchId in `generation`, so each
    micro-batch starts a new epoch at sequence 0. None when a field does not fit."""
    batch_id = batch_id or 0
    generation, epoch = batch_id >> epoch_bits, batch_id & ((1 << epoch_bits) - 1)
    if not (0 <= base < 1 << base_bits and 0 <= spark_partition < 1 << spark_partition_bits
            and 0 <= generation < 1 << generation_bits):
        return None
    pid = DERIVED_FLAG | base << (spark_partition_bits + generation_bits) \
        | generation << spark_partition_bits | spark_partition
    return pid, epoch


class IdempotentIdentity(ProducerIdentity):
    """One task's idempotent identity: fixed producer id and epoch, one sequence counter per
    (topic, partition) starting at 0 and advanced by each batch's record count. A retried
    task gets the same id and epoch and, with the same rows, the same batches and sequences."""

    def __init__(self, producer_id: int, producer_epoch: int):
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self._sequences: dict = {}

    def next_sequence(self, topic: str, partition: int, record_count: int) -> int:
        seq = self._sequences.get((topic, partition), 0)
        self._sequences[(topic, partition)] = seq + record_count
        return seq


def task_identity(base_producer_id: int, spark_partition: int | None,
                  batch_id: int | None) -> ProducerIdentity:
    """The identity of one task; the non-idempotent one (with a warning) when there is no
    base id, no partition id, or the ids do not fit the derived layout."""
    if base_producer_id is None or base_producer_id < 0 or spark_partition is None:
        return ProducerIdentity()
    derived = derived_producer_id(base_producer_id, spark_partition, batch_id)
    if derived is None:
        import warnings
        warnings.warn(f"kraftlog sink: cannot derive an idempotent producer id (base {base_producer_id}, "
                      f"partition {spark_partition}, batch {batch_id}); this task writes at-least-once")
        return ProducerIdentity()
    return IdempotentIdentity(*derived)


def allocate_base_producer_id(sink: opt.SinkOptions) -> int:
    """One producer id from the cluster (driver side, when a write is planned); -1 (no
    idempotence) with kraftlog.enable.idempotence=false."""
    if not sink.idempotence:
        return -1
    cluster = Cluster(sink.bootstrap_servers, client_id="kraftlog-spark-writer", security=sink.security)
    return int(cluster.init_producer_id()["producer_id"])


checkpoint_file_name = "kraftlog-sink-producer.json"


def _local_dir(location: str | None) -> str | None:
    """A checkpoint location as a local directory, None for remote file systems."""
    if not location:
        return None
    if location.startswith("file://"):
        return location[len("file://"):]
    if location.startswith("file:"):
        return location[len("file:"):]
    return None if "://" in location else location


def stream_base_producer_id(sink: opt.SinkOptions) -> int:
    """The streaming query's base producer id: kept in its checkpoint directory, so a query
    restarted from the checkpoint re-runs a micro-batch under the producer ids and epochs it
    used before and the broker drops what that batch had already written. Without a local
    checkpoint (remote file system): a new id per run, at-least-once across restarts."""
    import json
    import os
    import warnings

    if not sink.idempotence:
        return -1
    directory = _local_dir(sink.checkpoint_location)
    if directory is None:
        if sink.checkpoint_location:
            warnings.warn(f"kraftlog sink: checkpoint {sink.checkpoint_location!r} is not a local path; "
                          "a micro-batch replayed after a driver restart is written again (at-least-once)")
        return allocate_base_producer_id(sink)
    path = os.path.join(directory, checkpoint_file_name)
    try:
        with open(path) as f:
            return int(json.load(f)["base_producer_id"])
    except FileNotFoundError:
        pass
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path} is damaged ({e}); delete it to take a new producer id (replays "
                         "of micro-batches already written are then appended again)") from None
    base = allocate_base_producer_id(sink)
    os.makedirs(directory, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"base_producer_id": base}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return base


txn_retriable_codes = frozenset({"CONCURRENT_TRANSACTIONS", "NOT_COORDINATOR", "COORDINATOR_LOAD_IN_PROGRESS",
                                 "COORDINATOR_NOT_AVAILABLE"})
txn_call_timeout_ms_default = 120_000   # a retriable coordinator answer is retried this long
# records per transactional records request: the coordinator writes one batch per partition
# per request, which must stay under the broker's max.message.bytes (1 MiB by default)
txn_request_bytes_max_default = 512 * 1024


class TransactionalTask:
    """One task's transaction over the HTTP routes (API.md "Transactions"): `init()` fences
    older producers of the id (and aborts or completes what they left), `committed_batch()`
    reads the micro-batch marker, `send()` adds records, `commit(batch_id)` commits them with
    the marker. Invariant: nothing is visible to read_committed readers before `commit`."""

    def __init__(self, cluster: Cluster, transactional_id: str, call_timeout_ms: int = txn_call_timeout_ms_default):
        self.cluster = cluster
        self.transactional_id = transactional_id
        self.group = f"kraftlog-sink-{transactional_id}"
        self.call_timeout_s = call_timeout_ms / 1000
        self.ids: dict = {}
        self.topics: set = set()

    def _call(self, what: str, doc: dict) -> dict:
        import json
        import time
        from urllib.parse import quote

        deadline = time.monotonic() + self.call_timeout_s
        backoff = 0.1
        while True:
            try:
                _, _, data = self.cluster._any_broker(
                    "POST", f"/v1/transactions/{quote(self.transactional_id, safe='')}/{what}",
                    body=json.dumps(doc).encode(), headers={"Content-Type": "application/json",
                                                            "Accept": "application/json"})
                return json.loads(data) if data else {}
            except BrokerError as exc:
                # a records request is retried only on answers that prove nothing was written
                if exc.error_code not in txn_retriable_codes or time.monotonic() + backoff > deadline:
                    raise
            time.sleep(backoff)
            backoff = min(backoff * 2, 1.0)

    def init(self) -> None:
        doc = self._call("init", {})
        self.ids = {"producer_id": int(doc["producer_id"]), "producer_epoch": int(doc["producer_epoch"])}

    def committed_batch(self) -> int:
        """The last micro-batch id this transactional id committed (-1: none)."""
        import json
        from urllib.parse import quote
        _, _, data = self.cluster._any_broker("GET", f"/v1/groups/{quote(self.group, safe='')}/offsets",
                                              headers={"Accept": "application/json"})
        offsets = [int(o["offset"]) for o in (json.loads(data) if data else {}).get("offsets", [])
                   if o.get("offset") is not None]
        return max(offsets, default=0) - 1

    def send(self, topic: str, partition: int, body: bytes,
             request_bytes_max: int = txn_request_bytes_max_default) -> dict:
        """Add the records of the raw batches `body` to the transaction, in requests of at
        most `request_bytes_max` record bytes; the produce answer (an offset per record)."""
        import base64
        from partitions.log import record_batch as rb

        self.topics.add(topic)
        offsets: list = []
        chunk: list = []
        size = 0

        def flush():
            if chunk:
                answer = self._call("records", {**self.ids, "records": chunk})
                offsets.extend({"offset": o["offset"]} for o in answer.get("offsets", []))
        for r in rb.decode_batches(body):
            rec = {"topic": topic, "partition": partition,
                   "value_b64": None if r.value is None else base64.b64encode(r.value).decode()}
            if r.key is not None:
                rec["key_b64"] = base64.b64encode(r.key).decode()
            if r.headers:
                rec["headers"] = {k: v.decode() if isinstance(v, (bytes, bytearray)) else v for k, v in r.headers}
            n = len(r.value or b"") + len(r.key or b"") + sum(len(k) + len(v or b"") for k, v in r.headers) + 32
            if chunk and size + n > request_bytes_max:
                flush()
                chunk, size = [], 0
            chunk.append(rec)
            size += n
        flush()
        return {"offsets": offsets}

    def commit(self, batch_id: int | None) -> None:
        if batch_id is not None and self.topics:
            self._call("offsets", {**self.ids, "group": self.group,
                                   "offsets": [{"topic": min(self.topics), "partition": 0, "offset": batch_id + 1}]})
        self._call("commit", self.ids)


class PartitionedProducer:
    """Buffers Arrow rows per (topic, partition) and sends record batches to leaders (or,
    with `txn`, into that task's transaction)."""

    def __init__(self, sink: opt.SinkOptions, identity: ProducerIdentity | None = None,
                 cluster: Cluster | None = None, seed: int = 0, txn: TransactionalTask | None = None):
        self.sink = sink
        self.txn = txn
        self.identity = identity or ProducerIdentity()
        self._random = random.Random(seed)  # sticky partitions: the same on a retried task
        self._seed = seed
        self.cluster = cluster or Cluster(sink.bootstrap_servers, client_id="kraftlog-spark-writer",
                                          security=sink.security)
        self._pending: dict = {}   # (topic, partition) -> list of (keys, values, headers)
        self._pending_bytes: dict = {}
        self._pending_rows: dict = {}
        self._sticky: dict = {}    # topic -> partition for keyless rows
        self._raw = True
        # idempotent: hold every row, send in canonical order at flush (see module docstring)
        self.canonical = isinstance(self.identity, IdempotentIdentity)
        self._held_bytes = 0
        self._posts = 0
        self.records: dict = {}
        self.first_offsets: dict = {}
        self.last_offsets: dict = {}
        self.verified_duplicates = 0
        self.unverified_duplicates = 0

    # -- routing ---------------------------------------------------------------------------

    def num_partitions(self, topic: str) -> int:
        parts = self.cluster.topic_partitions().get(topic)
        if not parts:
            parts = self.cluster.topic_partitions(refresh=True).get(topic)
        if not parts:
            raise ValueError(f"topic {topic!r} does not exist: create it first "
                             f"(kraftlog topic create {topic} --partitions N --replication-factor R)")
        return len(parts)

    def _sticky_partition(self, topic: str, n: int) -> int:
        part = self._sticky.get(topic)
        if part is None or part >= n:
            part = self._sticky[topic] = self._random.randrange(n)
        return part

    def append_batch(self, batch) -> None:
        """Route one Arrow RecordBatch of input rows."""
        import pyarrow as pa
        import pyarrow.compute as pc

        names = batch.schema.names
        if "value" not in names:
            raise ValueError("the kraftlog sink needs a 'value' column (binary or string)")
        if batch.num_rows == 0:
            return
        if "topic" in names:
            topics = batch.column("topic")
            if self.sink.topic:
                topics = pc.fill_null(topics, self.sink.topic)
            elif topics.null_count:
                raise ValueError("a row has a null 'topic' and no 'topic' option is set")
            uniques = pc.unique(topics).to_pylist()
            if len(uniques) == 1:
                groups = [(uniques[0], batch)]
            else:
                groups = [(t, batch.filter(pc.equal(topics, t))) for t in uniques]
        else:
            if not self.sink.topic:
                raise ValueError("set the 'topic' option or provide a 'topic' column")
            groups = [(self.sink.topic, batch)]
        for topic, rows in groups:
            self._append_topic(topic, rows, pa)

    def _append_topic(self, topic: str, rows, pa) -> None:
        from http_api.wire.partitioner import partition_for_key

        names = rows.schema.names
        n = self.num_partitions(topic)
        keys = rows.column("key") if "key" in names else None
        if keys is not None and keys.null_count == len(keys):
            keys = None
        values = rows.column("value")
        headers = None
        if "headers" in names:
            headers = [[(h["key"], h["value"]) for h in (hs or ())] for hs in rows.column("headers").to_pylist()]
        count = rows.num_rows
        parts = np.full(count, -1, dtype=np.int64)
        if "partition" in names:
            col = rows.column("partition")
            parts = np.asarray(col.fill_null(-1).to_numpy(zero_copy_only=False), dtype=np.int64)
            bad = parts[(parts >= n) | (parts < -1)]
            if len(bad):
                raise ValueError(f"partition {int(bad[0])} does not exist in topic {topic!r} "
                                 f"({n} partitions)")
        unset = parts < 0
        if unset.any() and keys is not None:
            key_list = keys.cast(pa.binary()).to_pylist()
            idx = np.nonzero(unset)[0]
            for i in idx:
                key = key_list[i]
                if key is not None:
                    parts[i] = partition_for_key(key, n)
            unset = parts < 0
        if unset.any() and not self.canonical:  # canonical: held as partition -1, see _route_keyless
            parts[unset] = self._sticky_partition(topic, n)
        uniques = np.unique(parts)
        for p in uniques:
            p = int(p)
            if len(uniques) == 1:
                sel_k, sel_v, sel_h = keys, values, headers
            else:
                idx = np.nonzero(parts == p)[0]
                take = pa.array(idx)
                sel_k = None if keys is None else keys.take(take)
                sel_v = values.take(take)
                sel_h = None if headers is None else [headers[i] for i in idx]
            self._buffer((topic, p), sel_k, sel_v, sel_h)

    def _buffer(self, tp, keys, values, headers) -> None:
        size = values.nbytes + (0 if keys is None else keys.nbytes)
        self._pending.setdefault(tp, []).append((keys, values, headers))
        self._pending_bytes[tp] = self._pending_bytes.get(tp, 0) + size
        self._pending_rows[tp] = self._pending_rows.get(tp, 0) + len(values)
        if self.canonical:
            self._held_bytes += size
            if self._held_bytes > self.sink.idempotence_buffer_max_bytes:
                raise ValueError(
                    f"this task has over {self.sink.idempotence_buffer_max_bytes} bytes to write; an idempotent "
                    "task holds all its rows to send them in a canonical order. Split the input into more "
                    "partitions (df.repartition(N)), raise kraftlog.idempotence.buffer.max.bytes, or set "
                    "kraftlog.enable.idempotence=false (at-least-once)")
            return
        if (self._pending_bytes[tp] >= request_bytes_max_default
                or self._pending_rows[tp] >= self.sink.linger_records):
            self._send(tp)

    # -- sending ---------------------------------------------------------------------------

    def flush(self) -> None:
        if self.canonical:
            self._route_keyless()
        for tp in (sorted(self._pending) if self.canonical else list(self._pending)):
            self._send(tp)

    def _route_keyless(self) -> None:
        """Idempotent tasks: a topic's keyless rows (held as partition -1) in canonical order,
        cut into one contiguous block per partition, starting at a partition seeded by the
        Spark partition id: the same rows land on the same partitions in any input order."""
        import pyarrow as pa

        import crc32c

        for tp in sorted(tp for tp in self._pending if tp[1] < 0):
            chunks = self._pending.pop(tp)
            self._pending_bytes.pop(tp, None)
            self._pending_rows.pop(tp, None)
            values = pa.concat_arrays([_plain(c[1]) for c in chunks])
            headers = None
            if any(c[2] is not None for c in chunks):
                headers = [h for c in chunks for h in (c[2] if c[2] is not None else [[]] * len(c[1]))]
            _, values, headers = _canonical_order(None, values, headers)
            topic, m = tp[0], len(values)
            n = self.num_partitions(topic)
            first = (crc32c.crc32c(topic.encode()) + self._seed) % n  # not input-order dependent
            for i in range(n):
                lo, hi = i * m // n, (i + 1) * m // n
                if hi > lo:
                    self._pending.setdefault((topic, (first + i) % n), []).append(
                        (None, values.slice(lo, hi - lo), None if headers is None else headers[lo:hi]))

    def _send(self, tp) -> None:
        import pyarrow as pa

        chunks = self._pending.pop(tp, [])
        self._pending_bytes.pop(tp, None)
        self._pending_rows.pop(tp, None)
        if not chunks:
            return
        values = pa.concat_arrays([_plain(c[1]) for c in chunks])
        if any(c[0] is not None for c in chunks):
            keys = pa.concat_arrays([_plain(c[0]) if c[0] is not None else pa.nulls(len(c[1]), pa.binary())
                                     for c in chunks])
        else:
            keys = None
        if any(c[2] is not None for c in chunks):
            headers = [h for c in chunks for h in (c[2] if c[2] is not None else [[]] * len(c[1]))]
        else:
            headers = None
        if self.canonical:
            keys, values, headers = _canonical_order(keys, values, headers)
        request, request_rows = [], 0
        for lo, hi in self._cuts(keys, values):
            batch = self._encode(tp, keys, values, headers, lo, hi)
            if request and (sum(map(len, request)) + len(batch) > request_bytes_max_default
                            or request_rows + (hi - lo) > request_records_max_default):
                self._post(tp, request, request_rows)
                request, request_rows = [], 0
            request.append(batch)
            request_rows += hi - lo
        if request:
            self._post(tp, request, request_rows)
        # keyless rows move on to another partition after each send (sticky partitioner)
        if self._sticky.get(tp[0]) == tp[1]:
            self._sticky.pop(tp[0], None)

    def _cuts(self, keys, values) -> list:
        """Row ranges whose encoded batch stays under kraftlog.batch.size bytes."""
        import pyarrow.compute as pc

        def lengths(arr):
            return pc.binary_length(arr).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)

        sizes = lengths(values) + 8
        if keys is not None:
            sizes = sizes + lengths(keys) + 4
        budget = max(1, self.sink.batch_bytes - batch_overhead_bytes)
        cuts, lo, n = [], 0, len(sizes)
        cum = np.cumsum(sizes)
        base = 0
        while lo < n:
            hi = int(np.searchsorted(cum, base + budget, side="right"))
            hi = max(hi, lo + 1)
            cuts.append((lo, hi))
            base = int(cum[hi - 1])
            lo = hi
        return cuts

    def _encode(self, tp, keys, values, headers, lo, hi) -> bytes:
        from pipelines import arrow_codec
        count = hi - lo
        return arrow_codec.encode_batch(
            None if keys is None else keys.slice(lo, count), values.slice(lo, count),
            None if headers is None else headers[lo:hi], compression=self.sink.compression,
            producer_id=self.identity.producer_id, producer_epoch=self.identity.producer_epoch,
            base_sequence=self.identity.next_sequence(tp[0], tp[1], count))

    def _post(self, tp, batches: list, rows: int) -> None:
        topic, partition = tp
        body = b"".join(batches)
        self._failpoint()
        if self.txn is not None:
            answer = self.txn.send(topic, partition, body)
        elif self._raw:
            try:
                answer = self.cluster.produce_raw(topic, partition, body, acks=self.sink.acks)
            except BrokerError as exc:
                if exc.error_code != "UNSUPPORTED_MEDIA_TYPE":
                    raise
                self._raw = False
        if not self._raw:
            from partitions.log import record_batch as rb
            records = [{"key": r.key, "value": r.value, "headers": {k: v for k, v in r.headers}}
                       for r in rb.decode_batches(body)]
            answer = self.cluster.produce_records(topic, partition, records, acks=self.sink.acks)
        if self.canonical and self._raw and self.txn is None:
            self._verify_duplicates(tp, batches, answer)
        name = f"{topic}-{partition}"
        self.records[name] = self.records.get(name, 0) + rows
        first, last = _offset_span(answer, rows)
        if first is not None:
            self.first_offsets.setdefault(name, first)
            self.last_offsets[name] = last

    def _failpoint(self) -> None:
        """Testing only (`kraftlog.failpoint.first.attempt.fail.after.requests`): the first
        attempt of a task dies after that many produce requests, as if its executor was lost
        part-way through a write; the retry (attempt 1) runs normally."""
        limit = self.sink.failpoint_fail_after_requests
        if limit <= 0:
            return
        from pyspark import TaskContext
        ctx = TaskContext.get()
        if ctx is not None and ctx.attemptNumber() == 0 and self._posts >= limit:
            raise RuntimeError(f"failpoint: attempt 0 of task {ctx.partitionId()} dies after {limit} requests")
        self._posts += 1

    def _verify_duplicates(self, tp, batches: list, answer: dict) -> None:
        """Batches answered as duplicates must hold what this attempt sent: read each back
        at its original offset and compare records (key, value, headers)."""
        from partitions.log import record_batch as rb

        entries = answer.get("offsets") if isinstance(answer, dict) else None
        if not entries or len(entries) != len(batches):
            return
        for sent, entry in zip(batches, entries):
            if not entry.get("duplicate"):
                continue
            offset = int(entry.get("offset", -1))
            if offset < 0:  # older than the broker's cached batches: where it is is unknown
                self.unverified_duplicates += 1
                continue
            mine = [(r.key, r.value, tuple(r.headers)) for r in rb.decode_batches(sent)]
            stored = self._stored_batch(tp, offset, len(sent))
            if stored != mine:
                raise NonDeterministicRetryError(
                    f"{tp[0]}-{tp[1]}: this retried task re-sent sequences already written at offset {offset} "
                    f"with other rows ({len(mine)} rows vs {len(stored)} stored): its input is not the same as "
                    "the failed attempt's, so idempotence would drop rows. Make the input deterministic (e.g. no "
                    "random or time-dependent columns before the write) or set kraftlog.enable.idempotence=false")
            self.verified_duplicates += 1

    def _stored_batch(self, tp, offset: int, size_hint: int, timeout_s: float = 30.0) -> list:
        """Records of the stored batch that starts at `offset` (waits for it to be committed)."""
        import time
        from partitions.log import record_batch as rb

        deadline = time.monotonic() + timeout_s
        while True:
            got = self.cluster.fetch(tp[0], tp[1], offset, max(size_hint * 2, 1 << 16), max_wait_ms=500)
            for header, view in rb.iter_batches(got.get("batches") or b""):
                if header.base_offset == offset:
                    return [(r.key, r.value, tuple(r.headers)) for r in rb.decode_records(bytes(view))]
                if header.base_offset > offset:
                    break
            if time.monotonic() > deadline:
                raise NonDeterministicRetryError(
                    f"{tp[0]}-{tp[1]}: the broker answered a batch as a duplicate of offset {offset}, but no batch "
                    "starts there; retry the write, and report this if it persists")

    def commit_message(self) -> KraftlogCommitMessage:
        return KraftlogCommitMessage(dict(self.records), dict(self.first_offsets), dict(self.last_offsets),
                                     self.verified_duplicates, self.unverified_duplicates)


def _canonical_order(keys, values, headers):
    """Rows in an order that depends only on their multiset, keeping Kafka's per-key order:
    keyed rows first, by key, in input order within a key (stable sort); then keyless rows by
    (value, null value, headers)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(values)
    if n <= 1:
        return keys, values, headers
    if headers is None and (keys is None or keys.null_count == n):
        order = pc.sort_indices(values)     # all keyless: by value (null values last, all equal)
        return (None if keys is None else keys.take(order)), values.take(order), None
    if keys.null_count == 0:
        order = pc.sort_indices(keys)       # all keyed: by key, stable (input order within a key)
        return keys.take(order), values.take(order), None if headers is None else [headers[i] for i in order.to_pylist()]
    keyless = pa.array(np.ones(n, dtype=bool)) if keys is None else pc.is_null(keys)
    empty = pa.scalar(b"", pa.binary())
    cols = {"keyless": keyless,
            "key": pa.nulls(n, pa.binary()).fill_null(empty) if keys is None else keys.fill_null(empty),
            "value": pc.if_else(keyless, values.fill_null(empty), empty),
            "value_null": pc.and_(keyless, pc.is_null(values))}
    sort_keys = [("keyless", "ascending"), ("key", "ascending"), ("value", "ascending"),
                 ("value_null", "ascending")]
    if headers is not None:
        cols["headers"] = pc.if_else(keyless, pa.array([repr(h).encode() for h in headers], pa.binary()), empty)
        sort_keys.append(("headers", "ascending"))
    order = pc.sort_indices(pa.table(cols), sort_keys=sort_keys)
    return (None if keys is None else keys.take(order), values.take(order),
            None if headers is None else [headers[i] for i in order.to_pylist()])


def _plain(arr):
    import pyarrow as pa
    if isinstance(arr, pa.ChunkedArray):
        arr = pa.concat_arrays(arr.chunks) if arr.num_chunks else pa.array([], pa.binary())
    if arr.type != pa.binary():
        arr = arr.cast(pa.binary())
    return arr


def _offset_span(answer: dict, rows: int):
    """(first, last) offsets from a produce answer, whatever shape the broker used."""
    if not isinstance(answer, dict):
        return None, None
    offsets = [o for o in answer.get("offsets") or []
               if isinstance(o, dict) and o.get("offset") is not None and int(o["offset"]) >= 0]
    if offsets:
        first = min(int(o["offset"]) for o in offsets)
        if any("last_offset" in o for o in offsets):  # raw batches: one entry per batch
            return first, max(int(o.get("last_offset", o["offset"])) for o in offsets)
        if len(offsets) == 1:
            return first, first + rows - 1
        return first, max(int(o["offset"]) for o in offsets)
    base = answer.get("base_offset")
    if base is not None and int(base) >= 0:
        return int(base), int(base) + rows - 1
    return None, None


def write_partition(sink: opt.SinkOptions, iterator: Iterator, base_producer_id: int | None,
                    spark_partition: int | None, batch_id: int | None = None,
                    cluster: Cluster | None = None) -> KraftlogCommitMessage:
    """What one Spark task does: route, batch and send its rows with its own identity."""
    if sink.transactional_id:
        return write_partition_transactional(sink, iterator, spark_partition, batch_id, cluster)
    identity = task_identity(base_producer_id, spark_partition, batch_id)
    producer = PartitionedProducer(sink, identity, cluster=cluster, seed=spark_partition or 0)
    for batch in iterator:
        producer.append_batch(batch)
    producer.flush()
    return producer.commit_message()


def write_partition_transactional(sink: opt.SinkOptions, iterator: Iterator, spark_partition: int | None,
                                  batch_id: int | None = None, cluster: Cluster | None = None
                                  ) -> KraftlogCommitMessage:
    """One task as one transaction (module docstring): init the task's transactional id
    (fencing its predecessor), skip a micro-batch already committed, write, commit."""
    cluster = cluster or Cluster(sink.bootstrap_servers, client_id="kraftlog-spark-writer", security=sink.security)
    txn = TransactionalTask(cluster, f"{sink.transactional_id}-{spark_partition or 0}")
    producer = PartitionedProducer(sink, ProducerIdentity(), cluster=cluster, seed=spark_partition or 0, txn=txn)
    txn.init()   # before the first send: fences older producers of the id, aborts what they left open
    if batch_id is not None and txn.committed_batch() >= batch_id:
        for _ in iterator:   # this micro-batch's transaction committed before a restart: write nothing
            pass
        return producer.commit_message()
    for batch in iterator:
        producer.append_batch(batch)
    producer.flush()
    txn.commit(batch_id)
    return producer.commit_message()


def _task() -> tuple[int | None, int | None]:
    """(Spark partition id, streaming batchId) of the running task; (None, None) outside Spark."""
    from pyspark import TaskContext
    ctx = TaskContext.get()
    if ctx is None:
        return None, None
    batch_id = ctx.getLocalProperty("streaming.sql.batchId")
    return ctx.partitionId(), None if batch_id is None else int(batch_id)


class KraftlogWriter(DataSourceArrowWriter):
    """Batch write; each task returns a KraftlogCommitMessage (appends are not transactional,
    but idempotent: `base_producer_id` is taken on the driver, see IdempotentIdentity)."""

    def __init__(self, sink: opt.SinkOptions, schema: StructType, base_producer_id: int | None = None):
        self.sink = sink
        _check_schema(schema, sink)
        self.base_producer_id = (allocate_base_producer_id(sink) if base_producer_id is None
                                 else base_producer_id)

    def write(self, iterator) -> KraftlogCommitMessage:
        spark_partition, _ = _task()
        return write_partition(self.sink, iterator, self.base_producer_id, spark_partition)

    def commit(self, messages) -> None:
        pass

    def abort(self, messages) -> None:
        pass  # appended records stay (no transactions); re-running the job as a new one appends again


class KraftlogStreamWriter(DataSourceStreamArrowWriter):
    """Streaming write, one call of `write` per task per micro-batch. The base producer id is
    kept in the query's checkpoint (`stream_base_producer_id`); each micro-batch is a new
    producer epoch (batchId), so a retried task, and a micro-batch replayed after a driver
    restart, is deduplicated."""

    def __init__(self, sink: opt.SinkOptions, schema: StructType, base_producer_id: int | None = None):
        self.sink = sink
        _check_schema(schema, sink)
        self.base_producer_id = (stream_base_producer_id(sink) if base_producer_id is None
                                 else base_producer_id)

    def write(self, iterator) -> KraftlogCommitMessage:
        spark_partition, batch_id = _task()
        if batch_id is None:  # not in a micro-batch: no epoch to tell batches apart
            return write_partition(self.sink, iterator, None, None)
        return write_partition(self.sink, iterator, self.base_producer_id, spark_partition, batch_id)

    def commit(self, messages, batchId: int) -> None:
        pass

    def abort(self, messages, batchId: int) -> None:
        pass


def _check_schema(schema: StructType, sink: opt.SinkOptions) -> None:
    from pyspark.sql.types import BinaryType, IntegerType, LongType, ShortType, StringType
    fields = {f.name: f.dataType for f in schema.fields}
    if "value" not in fields:
        raise ValueError("the kraftlog sink needs a 'value' column (binary or string); "
                         f"got columns {list(fields)}")
    for name in ("key", "value"):
        if name in fields and not isinstance(fields[name], (BinaryType, StringType)):
            raise ValueError(f"column {name!r} must be binary or string, not {fields[name].simpleString()}; "
                             f"cast it first, e.g. to_json(...) or col.cast('string')")
    if "topic" in fields and not isinstance(fields["topic"], StringType):
        raise ValueError("column 'topic' must be a string")
    if "topic" not in fields and not sink.topic:
        raise ValueError("set the 'topic' option or provide a 'topic' column")
    if "partition" in fields and not isinstance(fields["partition"], (IntegerType, LongType, ShortType)):
        raise ValueError("column 'partition' must be an integer")
