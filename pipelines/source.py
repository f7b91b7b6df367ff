"""The `kraftlog` PySpark data source: batch and streaming reads of topic partitions.

Planning (driver) resolves offsets through the broker API and cuts work into
`OffsetRange`s: one Spark partition per topic partition, split when a range holds more
than `maxRecordsPerPartition` records (or to reach `minPartitions`). Executors fetch the
range with raw record batches and hand Spark one Arrow RecordBatch per fetch response,
built without per-record Python objects (pipelines/arrow_codec.py).

Invariants:
- a range is [start, end) with end <= the high watermark seen at planning time, so only
  committed records are read and re-running a range returns the same records;
- streaming offsets are `{"topic": {"partition": next_offset}}` (sorted, string keys),
  checkpointed by Spark; the end of one micro-batch is the start of the next;
- a start offset below the log start offset (deleted by retention or delete-records) is
  data loss: an error with failOnDataLoss=true (the default), else the read skips ahead.
"""
from __future__ import annotations

import time
from typing import Iterator

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from pipelines import options as opt
from pipelines.client import BrokerError, Cluster

BASE_SCHEMA = ("key binary, value binary, topic string, partition int, offset long, "
               "timestamp timestamp, timestampType int")
HEADERS_COLUMN = "headers array<struct<key: string, value: binary>>"
fetch_max_wait_ms_default = 500


class DataLossError(RuntimeError):
    """Requested offsets no longer exist (retention / delete-records / topic recreated)."""


def schema_for(include_headers: bool) -> str:
    return BASE_SCHEMA + (", " + HEADERS_COLUMN if include_headers else "")


class OffsetRange(InputPartition):
    """Records [start, end) of one topic partition: the unit of work of one Spark task.

    `skip_data_loss` marks ranges that may begin below the log start without it being a
    loss (a partition that appeared after the query started is read from its earliest).
    """

    def __init__(self, topic: str, partition: int, start: int, end: int, bootstrap: tuple,
                 fail_on_data_loss: bool, include_headers: bool, fetch_max_bytes: int,
                 fetch_timeout_ms: int, skip_data_loss: bool = False, security=None):
        super().__init__((topic, partition, start, end))
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end
        self.bootstrap = bootstrap
        self.fail_on_data_loss = fail_on_data_loss and not skip_data_loss
        self.include_headers = include_headers
        self.fetch_max_bytes = fetch_max_bytes
        self.fetch_timeout_ms = fetch_timeout_ms
        self.security = security   # options.ClientSecurity (credentials, CA file)

    def __repr__(self) -> str:
        return f"OffsetRange({self.topic}-{self.partition} [{self.start}, {self.end}))"


def _data_loss_message(topic, partition, wanted, log_start) -> str:
    return (f"records {topic}-{partition} offsets [{wanted}, {log_start}) were deleted before they "
            f"were read (retention or delete-records). Set failOnDataLoss=false to skip to the "
            f"log start offset {log_start} instead of failing.")


def read_range(rng: OffsetRange, schema) -> Iterator:
    """Executor side: yield Arrow RecordBatches of the records in `rng`."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    from pipelines import arrow_codec

    arrow_schema = to_arrow_schema(schema, timezone="UTC") if not isinstance(schema, pa.Schema) else schema
    cluster = Cluster(rng.bootstrap, client_id="kraftlog-spark-reader", security=rng.security)
    pos, end = rng.start, rng.end
    deadline = time.monotonic() + rng.fetch_timeout_ms / 1000
    raw = True
    while pos < end:
        try:
            resp = cluster.fetch(rng.topic, rng.partition, pos, rng.fetch_max_bytes,
                                 max_wait_ms=0, raw=raw)
        except BrokerError as exc:
            if exc.error_code == "OFFSET_OUT_OF_RANGE":
                log_start, hw = cluster.offsets(rng.topic, rng.partition)
                if pos < log_start:
                    if rng.fail_on_data_loss:
                        raise DataLossError(_data_loss_message(rng.topic, rng.partition, pos, log_start)) from None
                    pos = log_start
                    continue
                # pos above the high watermark: a new leader still catching up; wait
                if time.monotonic() > deadline:
                    raise DataLossError(
                        f"{rng.topic}-{rng.partition}: offset {pos} is above the high watermark {hw} "
                        f"for {rng.fetch_timeout_ms} ms; records planned for this batch are gone "
                        f"(unclean leader change or topic recreated)") from None
                time.sleep(0.1)
                continue
            if exc.error_code == "UNSUPPORTED_MEDIA_TYPE" and raw:
                raw = False
                continue
            raise
        if "batches" in resp:
            cols, next_offset = arrow_codec.decode_fetch(resp["batches"], pos, end, rng.include_headers)
        else:
            cols = arrow_codec.columns_from_tuples(
                [r for r in resp["records"] if pos <= r[0] < end])
            next_offset = min(end, max(pos, resp["next_offset"]))
            if cols is not None:
                next_offset = max(next_offset, int(cols.offsets[-1]) + 1)
        if cols is not None and len(cols):
            if rng.fail_on_data_loss and int(cols.offsets[0]) > pos and resp.get("log_start_offset", -1) > pos:
                raise DataLossError(_data_loss_message(rng.topic, rng.partition, pos, int(cols.offsets[0])))
            yield arrow_codec.to_record_batch(cols, rng.topic, rng.partition, arrow_schema)
        if next_offset > pos:
            pos = next_offset
            deadline = time.monotonic() + rng.fetch_timeout_ms / 1000
            continue
        if time.monotonic() > deadline:
            raise TimeoutError(f"{rng.topic}-{rng.partition}: no records at offset {pos} (planned up to "
                               f"{end}) within kraftlog.fetch.timeout.ms={rng.fetch_timeout_ms}")
        time.sleep(0.05)


class _Planner:
    """Driver-side offset resolution shared by the batch and the stream reader."""

    def __init__(self, source_options: opt.SourceOptions):
        self.opts = source_options
        self._cluster: Cluster | None = None

    @property
    def cluster(self) -> Cluster:
        if self._cluster is None:
            self._cluster = Cluster(self.opts.bootstrap_servers, client_id="kraftlog-spark-driver",
                                    security=self.opts.security)
        return self._cluster

    def __getstate__(self):
        return {"opts": self.opts, "_cluster": None}

    def topic_partitions(self) -> list:
        """Subscribed (topic, partition) pairs that exist now, sorted."""
        existing = self.cluster.topic_partitions(refresh=True)
        if self.opts.assign:
            missing = [tp for tp in self.opts.assign if tp[1] not in existing.get(tp[0], [])]
            if missing:
                raise ValueError(f"assigned partitions do not exist: {missing}; create the topic or fix 'assign'")
            return list(self.opts.assign)
        return opt.sorted_partitions((t, p) for t, parts in existing.items() for p in parts
                                     if self.opts.wants(t, p))

    def bounds(self, tps) -> dict:
        """{tp: (log_start_offset, high_watermark)}"""
        return {tp: self.cluster.offsets(*tp) for tp in tps}

    def resolve(self, spec: opt.OffsetSpec, tps, bounds: dict, default_latest: bool) -> dict:
        """Concrete offsets for every tp according to `spec`."""
        explicit = spec.offset_map()
        if spec.kind == "offsets":
            unknown = sorted(set(explicit) - set(tps))
            if unknown:
                raise ValueError(f"offsets given for partitions that are not subscribed or do not exist: "
                                 f"{unknown}")
        stamps = spec.timestamp_map()
        out = {}
        for tp in tps:
            log_start, hw = bounds[tp]
            if spec.kind == "earliest":
                out[tp] = log_start
            elif spec.kind == "latest":
                out[tp] = hw
            elif spec.kind == "timestamp":
                ms = stamps.get(tp, spec.timestamp_ms)
                if ms is None:
                    out[tp] = hw if default_latest else log_start
                else:
                    found = self.cluster.offset_for_timestamp(tp[0], tp[1], ms)
                    out[tp] = hw if found is None else found
            else:
                value = explicit.get(tp, opt.LATEST if default_latest else opt.EARLIEST)
                out[tp] = log_start if value == opt.EARLIEST else hw if value == opt.LATEST else value
        return out

    def ranges(self, start: dict, end: dict, new_partitions=frozenset()) -> list:
        """OffsetRanges covering start..end, split by maxRecordsPerPartition / minPartitions."""
        o = self.opts
        sizes = {tp: end[tp] - start.get(tp, 0) for tp in end}
        for tp, size in sizes.items():
            if size < 0:
                msg = (f"{tp[0]}-{tp[1]}: offset went backwards from {start.get(tp)} to {end[tp]} "
                       f"(topic deleted and recreated, or an unclean leader change)")
                if o.fail_on_data_loss:
                    raise DataLossError(msg + "; set failOnDataLoss=false to continue from the new offsets")
        total = sum(s for s in sizes.values() if s > 0)
        out = []
        for tp in opt.sorted_partitions(end):
            size = sizes[tp]
            if size <= 0:
                continue
            pieces = 1
            if o.min_partitions and total:
                pieces = max(1, -(-o.min_partitions * size // total))
            for lo, hi in opt.split_range(start.get(tp, 0), end[tp], o.max_records_per_partition, pieces):
                out.append(OffsetRange(tp[0], tp[1], lo, hi, o.bootstrap_servers, o.fail_on_data_loss,
                                       o.include_headers, o.fetch_max_bytes, o.fetch_timeout_ms,
                                       skip_data_loss=tp in new_partitions, security=o.security))
        return out


class KraftlogBatchReader(DataSourceReader):
    """Batch read: startingOffsets..endingOffsets, resolved once at planning time."""

    def __init__(self, source_options: opt.SourceOptions, schema: StructType):
        self.opts = source_options
        self.schema = schema

    def partitions(self):
        planner = _Planner(self.opts)
        tps = planner.topic_partitions()
        bounds = planner.bounds(tps)
        start = planner.resolve(self.opts.starting, tps, bounds, default_latest=False)
        end = planner.resolve(self.opts.ending, tps, bounds, default_latest=True)
        end = {tp: min(end[tp], bounds[tp][1]) for tp in tps}  # never beyond the high watermark
        start = {tp: min(start[tp], end[tp]) for tp in tps}
        if self.opts.fail_on_data_loss:
            for tp in tps:
                if start[tp] < bounds[tp][0] and end[tp] > start[tp]:
                    raise DataLossError(_data_loss_message(tp[0], tp[1], start[tp], bounds[tp][0]))
        return planner.ranges(start, end)

    def read(self, partition: OffsetRange):
        return read_range(partition, self.schema)


class KraftlogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch read with admission control (maxOffsetsPerTrigger) and AvailableNow."""

    def __init__(self, source_options: opt.SourceOptions, schema: StructType):
        self.opts = source_options
        self.schema = schema
        self._planner = _Planner(source_options)
        self._target: dict | None = None     # AvailableNow: offsets not to go beyond
        self._latest: dict | None = None     # last high watermarks seen, for reportLatestOffset

    def initialOffset(self) -> dict:
        tps = self._planner.topic_partitions()
        bounds = self._planner.bounds(tps)
        return opt.to_offset_json(self._planner.resolve(self.opts.starting, tps, bounds, default_latest=True))

    def _high_watermarks(self) -> dict:
        tps = self._planner.topic_partitions()
        return {tp: hw for tp, (_, hw) in self._planner.bounds(tps).items()}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_offsets_per_trigger:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._high_watermarks()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        start_map = opt.from_offset_json(start)
        latest = self._high_watermarks()
        self._latest = dict(latest)
        if self._target is not None:
            latest = {tp: min(hw, self._target[tp]) for tp, hw in latest.items() if tp in self._target}
        for tp, off in start_map.items():   # partitions that vanished keep their offset
            latest.setdefault(tp, off)
        start_full = {tp: start_map.get(tp, 0) for tp in latest}
        # a latest below the start (offsets went backwards) is left for partitions() to report
        if isinstance(limit, ReadMaxRows):
            forward = {tp: max(latest[tp], start_full[tp]) for tp in latest}
            end = opt.rate_limit(start_full, forward, limit.max_rows)
            end = {tp: (latest[tp] if latest[tp] < start_full[tp] else end[tp]) for tp in end}
        else:
            end = latest
        return opt.to_offset_json(end)

    def reportLatestOffset(self):
        return None if self._latest is None else opt.to_offset_json(self._latest)

    def partitions(self, start: dict, end: dict):
        start_map = opt.from_offset_json(start)
        end_map = opt.from_offset_json(end)
        new = frozenset(tp for tp in end_map if tp not in start_map)
        if not self.opts.fail_on_data_loss:
            # offsets that went backwards: continue from the new end (nothing to read now)
            start_map = {tp: (end_map[tp] if tp in end_map and end_map[tp] < off else off)
                         for tp, off in start_map.items()}
        return self._planner.ranges(start_map, end_map, new_partitions=new)

    def read(self, partition: OffsetRange):
        return read_range(partition, self.schema)

    def commit(self, end: dict) -> None:
        pass

    def stop(self) -> None:
        pass


class KraftlogDataSource(DataSource):
    """`spark.read.format("kraftlog")` / `readStream` / `write` / `writeStream`."""

    @classmethod
    def name(cls) -> str:
        return "kraftlog"

    def schema(self) -> str:
        include = str(_get(self.options, "includeHeaders", "false")).strip().lower() == "true"
        return schema_for(include)

    def reader(self, schema: StructType) -> DataSourceReader:
        return KraftlogBatchReader(opt.parse_source_options(self.options, streaming=False), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KraftlogStreamReader(opt.parse_source_options(self.options, streaming=True), schema)

    def writer(self, schema: StructType, overwrite: bool):
        from pipelines.sink import KraftlogWriter
        return KraftlogWriter(opt.parse_sink_options(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool):
        from pipelines.sink import KraftlogStreamWriter
        return KraftlogStreamWriter(opt.parse_sink_options(self.options), schema)


def _get(options, name: str, default=None):
    for k, v in dict(options).items():
        if str(k).lower() == name.lower():
            return v
    return default
