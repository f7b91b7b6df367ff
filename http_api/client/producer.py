"""`Producer`: accumulates records per partition into record batches (`batch_size_bytes`,
`linger_ms`), sends them as raw batches straight to each partition's leader, up to
`max_in_flight_requests_per_connection` (Kafka's max.in.flight.requests.per.connection,
default 5) requests in flight per partition, retries retriable errors after refreshing metadata
(NOT_LEADER_OR_FOLLOWER, connection errors), optional per-batch compression. Metadata older
than `metadata_max_age_ms` (Kafka's metadata.max.age.ms, 5 min) is refreshed before the next
record is partitioned, so records without a partition spread onto partitions added since.

Idempotent by default with acks=all (`enable_idempotence`): a producer id from
`POST /v1/producer-ids`, a sequence number per partition in every batch, so a retried
batch (timeout, leader change) is never written twice — the leader answers a duplicate
with its original offsets. A batch that fails for good makes the producer take a new
producer id (its outcome is unknown; later batches must not be matched against it).

Ordering with several requests in flight (as Kafka's idempotent producer): sequence
numbers are given when a batch is sent, so batch n+1 carries sequence(n) + count(n). When
batch n must be retried (leader moved, connection lost), batch n+1 may reach the leader
first; the leader refuses it with OUT_OF_ORDER_SEQUENCE_NUMBER, and the producer waits for
batch n to be written, then resends n+1 (a batch already written is answered as a
duplicate with its original offsets: the leader remembers each producer's last 5
batches, hence at most 5 in flight with idempotence). Futures resolve in send order.
The exception is a producer id's first batch to a partition: a leader accepts an unknown
producer's first batch at any sequence (its state may have gone with deleted segments), so
that batch goes alone, and the others follow once it is acknowledged (requests use several
connections; an overtaking batch would otherwise make the first look like an old duplicate).
Without idempotence (acks=0/1), a retried batch can land after a later one, as in Kafka.

High-rate path: `send_batch(topic, values)` queues a whole column of values (optionally
keys) as one record batch with one future for the batch; it is encoded without a Python
call per record (lengths and bytes joined as columns) and keeps its place in the
partition's order relative to `send()`.

Following a moved leader (docs/AVAILABILITY.md part E): an attempt unanswered for
`request_attempt_timeout_ms` makes the producer mark that leader suspect and ask the other
brokers who leads the partition now (newest leader epoch wins), again every
`leader_check_interval_ms` while it stays unanswered. If the leader moved, the
attempt is abandoned and the same bytes (same producer id, epoch and sequence) are sent to
the new leader, which deduplicates them if the first attempt was written after all; a slow
but current leader is waited for, up to `request_timeout_ms` + 5 s as before. A connection
error marks the broker suspect and refreshes at once.

Transactions (KIP-98; API.md "Transactions"): with `transactional_id`, `init_transactions()`
gets the id's producer id and epoch from its coordinator (fencing older producers of the
same id), `begin_transaction()` opens a transaction locally, `send()` buffers its records
(written through `POST /v1/transactions/{id}/records` on `flush()`, when
`batch_size_bytes` fill, or at commit), `send_offsets_to_transaction()` adds group
offsets, and `commit_transaction()` / `abort_transaction()` end it. A fenced producer gets
PRODUCER_FENCED and must be closed. As Kafka's transactional producer is idempotent, the
producer places each record on its partition itself and gives every records request
per-partition base sequences under its (producer id, epoch) (the `"sequences"` field):
a request whose answer was lost (timeout, dropped connection, another broker tried) is
resent as it was and the leaders answer the batches already written with their original
offsets instead of appending them again. Sequences continue across commits and aborts
within an epoch. A records request that still fails leaves its sequences unknown: the
transaction can then only be aborted, and `abort_transaction()` re-initialises the
transactional id (a new epoch, sequences from 0; Kafka's KIP-360 epoch bump).
"""
from __future__ import annotations

import asyncio
import base64
import json
import random
import struct
import time
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import aiohttp
from crc32c import crc32c

from http_api.client.transport import (DEFAULT_CONNECT_TIMEOUT_MS, DEFAULT_METADATA_MAX_AGE_MS,
                                       DEFAULT_REQUEST_ATTEMPT_TIMEOUT_MS, MetadataCache, Transport)
from http_api.wire import codecs
from http_api.wire.partitioner import partition_for_key
from partitions.errors import ErrorCode, KraftlogError
from partitions.log import record_batch as rb

@dataclass(slots=True)
class RecordMetadata:
    topic: str
    partition: int
    offset: int


@dataclass
class _Batch:
    """Records of one partition on their way: keys and values as columns (headers and own
    timestamps, rare, by record index), or a send_batch() column with one future."""
    keys: list = field(default_factory=list)
    values: list = field(default_factory=list)
    extra: dict = field(default_factory=dict)   # record index -> (headers, timestamp)
    keyed: bool = False   # some record has a key
    futures: list = field(default_factory=list)
    size: int = 0
    created: float = field(default_factory=time.monotonic)
    # send_batch(): (values, keys or None, timestamp ms or None); one future
    columns: tuple | None = None

    @property
    def count(self) -> int:
        return len(self.columns[0]) if self.columns is not None else len(self.values)

    def records(self) -> list:
        return [rb.Record(k, v, *self.extra.get(i, ((), None))) for i, (k, v) in enumerate(zip(self.keys, self.values))]


# the fixed batch header (partitions/log/record_batch.py's layout) and the columnar records
# section's keys flag: `columns_batch` writes the same bytes as rb.build_batch
_HEADER = struct.Struct(">qiibIhiqqqhii")
_U32 = struct.Struct(">I")
_F_KEYS = 0x04


def _lengths(items: Sequence) -> tuple[bytes, bytes]:
    """(little-endian int32 lengths, joined bytes) of a column; None (-1) only costs a
    second pass when present."""
    try:
        return struct.pack(f"<{len(items)}i", *map(len, items)), b"".join(items)
    except TypeError:   # a None (tombstone / no key) among them
        lens = [-1 if v is None else len(v) for v in items]
        return struct.pack(f"<{len(items)}i", *lens), b"".join([v for v in items if v is not None])


def columns_batch(values: Sequence[bytes | None], keys: Sequence[bytes | None] | None = None, *,
                  timestamp_ms: int | None = None, producer_id: int = -1, producer_epoch: int = -1,
                  base_sequence: int = -1, compression=rb.Compression.NONE) -> bytes:
    """One record batch of `values` (and `keys`), all with one timestamp, without headers:
    the bytes `rb.build_batch` writes for the same records, built from the columns (lengths
    array + joined bytes) with no Python call per record. Compressed batches go through
    `rb.build_batch`."""
    n = len(values)
    if n == 0:
        raise ValueError("a batch needs at least one record")
    if keys is not None and len(keys) != n:
        raise ValueError(f"{len(keys)} keys for {n} values: give one key per value (or none)")
    ts = int(time.time() * 1000) if timestamp_ms is None else int(timestamp_ms)
    codec = rb.Compression(compression)
    if codec != rb.Compression.NONE:
        ks = keys if keys is not None else [None] * n
        return rb.build_batch(list(map(rb.Record, ks, values, [()] * n, [ts] * n)), compression=codec,
                              producer_id=producer_id, producer_epoch=producer_epoch, base_sequence=base_sequence)
    flags = 0
    parts = [b""]
    key_data = b""
    if keys is not None and any(k is not None for k in keys):
        flags |= _F_KEYS
        key_lens, key_data = _lengths(keys)
        parts.append(key_lens)
    value_lens, value_data = _lengths(values)
    parts[0] = bytes((flags,))
    parts += (value_lens, key_data, value_data)
    section = b"".join(parts)
    attributes = getattr(rb, "COLUMNAR_MASK", 0)   # the columnar layout's bit, where the format has one
    buf = bytearray(rb.HEADER_SIZE + len(section))
    _HEADER.pack_into(buf, 0, 0, rb.HEADER_SIZE - rb.LOG_OVERHEAD + len(section), -1, rb.MAGIC, 0, attributes,
                      n - 1, ts, ts, producer_id, producer_epoch, base_sequence, n)
    buf[rb.HEADER_SIZE:] = section
    _U32.pack_into(buf, rb.CRC_OFFSET, crc32c(memoryview(buf)[rb.ATTRIBUTES_OFFSET:]))
    return bytes(buf)


async def _done_within(task: asyncio.Future, timeout_s: float) -> bool:
    """Wait until `task` is done or `timeout_s` passed (asyncio.wait without its sets); -> done?"""
    if task.done():
        return True
    loop = asyncio.get_running_loop()
    waiter = loop.create_future()

    def wake(_=None) -> None:
        if not waiter.done():
            waiter.set_result(None)

    timer = loop.call_later(timeout_s, wake)
    task.add_done_callback(wake)
    try:
        await waiter
    finally:
        timer.cancel()
        task.remove_done_callback(wake)
    return task.done()


class Producer:
    """Batching, ordered, retrying producer (see module docstring). `send` returns a
    future resolving to RecordMetadata once the batch is acknowledged."""

    def __init__(self, bootstrap=None, *, acks: str | int = "all", linger_ms: int = 5,
                 batch_size_bytes: int = 256 * 1024, compression: str | None = None, retries: int = 2**31 - 1,
                 retry_backoff_ms: int = 100, retry_backoff_max_ms: int = 1000, delivery_timeout_ms: int = 120_000, request_timeout_ms: int = 30_000, client_id: str | None = None,
                 buffer_memory_bytes: int = 64 * 1024 * 1024, producer_id: int = -1, producer_epoch: int = -1,
                 enable_idempotence: bool = True, session: aiohttp.ClientSession | None = None,
                 request_attempt_timeout_ms: int = DEFAULT_REQUEST_ATTEMPT_TIMEOUT_MS,
                 connect_timeout_ms: int = DEFAULT_CONNECT_TIMEOUT_MS, leader_check_interval_ms: int = 500,
                 user: str | None = None, password: str | None = None, token: str | None = None,
                 ca_file: str | None = None, transactional_id: str | None = None,
                 transaction_timeout_ms: int = 60_000,
                 metadata_max_age_ms: int = DEFAULT_METADATA_MAX_AGE_MS,
                 max_in_flight_requests_per_connection: int = 5) -> None:
        if max_in_flight_requests_per_connection < 1:
            raise ValueError("max_in_flight_requests_per_connection must be >= 1")
        self.transactional_id = transactional_id
        self.transaction_timeout_ms = transaction_timeout_ms
        self._in_transaction = False
        self._txn_buffer: list[tuple[dict, asyncio.Future]] = []
        self._txn_buffer_bytes = 0
        self._txn_sequences: dict[tuple[str, int], int] = {}   # tp -> next sequence in this epoch
        self._txn_sequences_unknown = False   # a records request failed: abort, then a new epoch
        self._txn_records_lock = asyncio.Lock()   # one records request at a time: sequences in order
        self.t = Transport(bootstrap, client_id=client_id, request_timeout_ms=request_timeout_ms, session=session,
                           request_attempt_timeout_ms=request_attempt_timeout_ms,
                           connect_timeout_ms=connect_timeout_ms,
                           user=user, password=password, token=token, ca_file=ca_file)   # credentials: API.md Security
        self.meta = MetadataCache(self.t, metadata_max_age_ms)   # Kafka's metadata.max.age.ms
        self.leader_check_interval_s = max(1, leader_check_interval_ms) / 1000
        self.acks = "all" if str(acks) in ("all", "-1") else str(acks)
        if self.acks not in ("0", "1", "all"):
            raise ValueError(f"acks={acks!r}: use 0, 1 or all")
        self.linger_s = linger_ms / 1000
        self.batch_size_bytes = batch_size_bytes
        self.compression = rb.Compression.from_name(compression)
        self.retries = retries
        self.retry_backoff_s = retry_backoff_ms / 1000
        self.retry_backoff_max_s = retry_backoff_max_ms / 1000
        self.delivery_timeout_s = delivery_timeout_ms / 1000
        self.buffer_memory_bytes = buffer_memory_bytes
        # idempotence needs acks=all (as in Kafka); an explicit producer_id is used as given
        self.enable_idempotence = enable_idempotence and self.acks == "all"
        if self.enable_idempotence and max_in_flight_requests_per_connection > 5:
            raise ValueError("max_in_flight_requests_per_connection must be <= 5 with idempotence (the leader "
                             "recognises a resent batch among a producer's last 5), as in Kafka")
        self.max_in_flight = max_in_flight_requests_per_connection
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self._sequences: dict[tuple[str, int], tuple[int, int]] = {}   # tp -> (producer id, next sequence)
        self._established: dict[tuple[str, int], int] = {}   # tp -> producer id whose sequences its leader has acknowledged
        self._pid_lock = asyncio.Lock()
        self._open: dict[tuple[str, int], _Batch] = {}
        self._queues: dict[tuple[str, int], asyncio.Queue] = {}
        self._senders: dict[tuple[str, int], asyncio.Task] = {}
        self._lingers: dict[tuple[str, int], asyncio.TimerHandle] = {}
        self._sticky: dict[str, int] = {}
        self._buffered = 0
        self._space = asyncio.Event()
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None

    def _cached_partitions(self, topic: str) -> int:
        """The topic's partition count from cached metadata younger than metadata_max_age_ms,
        else 0 (then `meta.partitions` refreshes): no coroutine per record."""
        m = self.meta
        if m.doc is None or (time.monotonic() - m.fetched_at) * 1000 >= m.metadata_max_age_ms:
            return 0
        t = m._topics.get(topic)
        return len(t["partitions"]) if t else 0

    async def _partition_for(self, topic: str, key: bytes | None, partition: int | None) -> int:
        n = self._cached_partitions(topic) or await self.meta.partitions(topic)
        if n == 0:
            await self._auto_create(topic)
            n = await self.meta.partitions(topic)
            if n == 0:
                raise KraftlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                    f"topic {topic!r} does not exist; create it first (kraftlog topic create)")
        if partition is not None:
            if partition >= n:
                raise KraftlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                    f"topic {topic!r} has partitions 0..{n - 1}, not {partition}")
            return partition
        if key is not None:
            return partition_for_key(key, n)
        p = self._sticky.get(topic)
        if p is None or p >= n:
            p = self._sticky[topic] = random.randrange(n)
        return p

    async def _auto_create(self, topic: str) -> None:
        """Like a Kafka producer's metadata request: the broker creates a missing topic with
        its defaults only if its auto.create.topics.enable is on (else UNKNOWN_TOPIC_OR_PARTITION)."""
        await self.t.bootstrap_json("GET", f"/v1/topics/{topic}?allow_auto_create=true")
        await self.meta.refresh()

    async def send(self, topic: str, value: bytes | str | None, key: bytes | str | None = None,
                   headers: dict | Iterable | None = None, partition: int | None = None,
                   timestamp: int | None = None) -> asyncio.Future:
        """Queue one record; await the returned future for its RecordMetadata."""
        if self._closed:
            raise RuntimeError("producer is closed; create a new one")
        if self.transactional_id is not None:
            return await self._send_transactional(topic, value, key, headers, partition, timestamp)
        if isinstance(value, str):
            value = value.encode()
        if isinstance(key, str):
            key = key.encode()
        hdrs: tuple = ()
        if headers:
            items = headers.items() if isinstance(headers, dict) else headers
            hdrs = tuple((k, v.encode() if isinstance(v, str) else v) for k, v in items)
        p = await self._partition_for(topic, key, partition)
        size = 24 + len(key or b"") + len(value or b"")
        if hdrs:
            size += sum(6 + len(k) + len(v or b"") for k, v in hdrs)
        while self._buffered + size > self.buffer_memory_bytes and self._buffered > 0:
            self._space.clear()
            await self._space.wait()
        tp = (topic, p)
        batch = self._open.get(tp)
        loop = self._loop or self._bind_loop()
        if batch is None:
            batch = self._open[tp] = _Batch()
            # linger_ms=0: sealed once this loop iteration's sends are in (call_soon skips the timer heap)
            self._lingers[tp] = (loop.call_later(self.linger_s, self._seal, tp) if self.linger_s > 0
                                 else loop.call_soon(self._seal, tp))
        fut = loop.create_future()
        if hdrs or timestamp is not None:
            batch.extra[len(batch.values)] = (hdrs, timestamp)
        if key is not None:
            batch.keyed = True
        batch.keys.append(key)
        batch.values.append(value)
        batch.futures.append(fut)
        batch.size += size
        self._buffered += size
        if batch.size >= self.batch_size_bytes:
            self._seal(tp)
        return fut

    def _bind_loop(self) -> asyncio.AbstractEventLoop:
        self._loop = asyncio.get_running_loop()
        return self._loop

    async def send_batch(self, topic: str, values: Sequence[bytes | None], keys: Sequence[bytes | None] | None = None,
                         partition: int | None = None, timestamp: int | None = None) -> asyncio.Future:
        """Queue `values` (bytes; None is a tombstone) with optional `keys` as ONE record batch
        to one partition (`partition`, else the topic's sticky partition; with keys, give
        the partition). Await the returned future for the RecordMetadata of the first
        record: the others follow at consecutive offsets. Ordered with `send()` to the same
        partition. The whole column is one request: keep it below the broker's request size
        limit (a few MiB)."""
        if self._closed:
            raise RuntimeError("producer is closed; create a new one")
        if self.transactional_id is not None:
            raise RuntimeError("send_batch() is not transactional: use send() inside a transaction")
        if not isinstance(values, (list, tuple)):
            values = list(values)
        if not values:
            raise ValueError("send_batch needs at least one value")
        if keys is not None:
            if not isinstance(keys, (list, tuple)):
                keys = list(keys)
            if len(keys) != len(values):
                raise ValueError(f"{len(keys)} keys for {len(values)} values: give one key per value (or none)")
            if partition is None:
                raise ValueError("send_batch with keys writes one partition: give partition= (records with "
                                 "different keys belong to different partitions; use send() per record)")
        p = await self._partition_for(topic, None, partition)
        try:
            size = 24 * len(values) + sum(map(len, values)) + (sum(map(len, keys)) if keys is not None else 0)
        except TypeError:   # None among them
            size = 24 * len(values) + sum(len(v) for v in values if v is not None) + sum(
                len(k) for k in (keys or ()) if k is not None)
        while self._buffered + size > self.buffer_memory_bytes and self._buffered > 0:
            self._space.clear()
            await self._space.wait()
        tp = (topic, p)
        if tp in self._open:
            self._seal(tp)   # records sent before this column go first
        fut = asyncio.get_running_loop().create_future()
        self._buffered += size
        self._enqueue(tp, _Batch(futures=[fut], size=size, columns=(values, keys, timestamp)))
        if self._sticky.get(topic) == p and partition is None:
            self._sticky.pop(topic, None)
        return fut

    def _enqueue(self, tp, batch: _Batch) -> None:
        q = self._queues.get(tp)
        if q is None:
            q = self._queues[tp] = asyncio.Queue()
            self._senders[tp] = asyncio.ensure_future(self._sender(tp, q))
        q.put_nowait(batch)

    def _seal(self, tp) -> None:
        batch = self._open.pop(tp, None)
        h = self._lingers.pop(tp, None)
        if h is not None:
            h.cancel()
        if batch is None:
            return
        if self._sticky.get(tp[0]) == tp[1]:
            self._sticky.pop(tp[0], None)  # next keyless batch goes elsewhere
        self._enqueue(tp, batch)

    async def _sender(self, tp, q: asyncio.Queue) -> None:
        """Up to `max_in_flight` requests in flight for this partition, sent in queue order;
        each batch's futures resolve after those of the batches before it."""
        window = asyncio.Semaphore(self.max_in_flight)
        prev: asyncio.Task | None = None
        while True:
            batch: _Batch | None = await q.get()
            if batch is None:
                if prev is not None:
                    await asyncio.gather(prev, return_exceptions=True)
                q.task_done()
                return
            await window.acquire()
            if prev is not None and not prev.done() and self._established.get(tp) != self.producer_id:
                # the partition's leader knows no sequence of this producer id yet, and it accepts
                # an unknown producer's first batch at any sequence (its state may have been
                # deleted): a later batch overtaking the first on another connection would be
                # taken as the start, and the first, arriving next, as an old duplicate - acked,
                # never written. So the first batch of a producer id goes alone.
                await asyncio.gather(prev, return_exceptions=True)
            try:
                pid, seq, payload = await self._prepare(tp, batch)
            except Exception as e:  # noqa: BLE001 - no producer id: delivered to the batch's futures
                if prev is not None:
                    await asyncio.gather(prev, return_exceptions=True)
                self._complete(batch, tp, None, e)
                window.release()
                q.task_done()
                continue
            prev = asyncio.ensure_future(self._deliver(tp, batch, pid, seq, payload, prev, window, q))

    async def _deliver(self, tp, batch: _Batch, pid: int, seq: int, payload: bytes,
                       prev: asyncio.Task | None, window: asyncio.Semaphore, q: asyncio.Queue) -> bool:
        """Send one prepared batch (retrying), then resolve its futures once `prev` (the
        batch sent before it on this partition) has resolved its own. -> written?"""
        base, err = -1, None
        try:
            try:
                base = await self._send_payload(tp, payload, prev)
            except Exception as e:  # noqa: BLE001 - delivered to each record's future
                err = e
                self._failed(tp, batch, pid, seq)
            if err is None and pid >= 0:
                self._established[tp] = pid   # the leader has this producer's sequences now
            if prev is not None and not prev.done():
                await asyncio.wait((prev,))
        finally:
            # slots free in send order: while batch n waits for a resend, at most 4 later
            # batches are written, so n is still among the 5 the leader remembers
            window.release()
        self._complete(batch, tp, base, err)
        q.task_done()
        return err is None

    def _complete(self, batch: _Batch, tp, base: int | None, err: BaseException | None) -> None:
        if err is not None:
            for fut in batch.futures:
                if not fut.done():
                    fut.set_exception(err)
        elif batch.columns is not None:
            fut = batch.futures[0]
            if not fut.done():
                fut.set_result(RecordMetadata(tp[0], tp[1], base))
        else:
            for i, fut in enumerate(batch.futures):
                if not fut.done():
                    fut.set_result(RecordMetadata(tp[0], tp[1], base + i if base >= 0 else -1))
        self._buffered -= batch.size
        self._space.set()

    async def _init_producer_id(self) -> None:
        """A fresh producer id from a broker (sequences restart at 0 for it)."""
        async with self._pid_lock:
            if self.producer_id >= 0:
                return
            _, doc = await self.t.bootstrap_json("POST", "/v1/producer-ids", json_body={})
            self.producer_id, self.producer_epoch = int(doc["producer_id"]), int(doc.get("producer_epoch", 0))

    async def _prepare(self, tp, batch: _Batch) -> tuple[int, int, bytes]:
        """-> (producer id, base sequence, encoded batch). The sequence is taken when the
        batch is sent, so batches in flight carry consecutive sequences."""
        if self.enable_idempotence and self.producer_id < 0:
            await self._init_producer_id()
        pid, seq = self.producer_id, -1
        n = batch.count
        if pid >= 0:
            owner, nxt = self._sequences.get(tp, (pid, 0))
            seq = nxt if owner == pid else 0
            self._sequences[tp] = (pid, seq + n)
        if batch.columns is not None:
            values, keys, ts = batch.columns
            payload = columns_batch(values, keys, timestamp_ms=ts, producer_id=pid,
                                    producer_epoch=self.producer_epoch, base_sequence=seq,
                                    compression=self.compression)
        elif not batch.extra:   # no headers, no own timestamps: encoded as columns
            payload = columns_batch(batch.values, batch.keys if batch.keyed else None, producer_id=pid, producer_epoch=self.producer_epoch,
                                    base_sequence=seq, compression=self.compression)
        else:
            payload = rb.build_batch(batch.records(), compression=self.compression, producer_id=pid,
                                     producer_epoch=self.producer_epoch, base_sequence=seq)
        return pid, seq, payload

    def _failed(self, tp, batch: _Batch, pid: int, seq: int) -> None:
        """A batch failed for good: its outcome is unknown."""
        if pid < 0:
            return
        if self.enable_idempotence:
            if self.producer_id == pid:
                # the next batch must not reuse (or follow) this sequence: a new producer id
                self.producer_id = -1
        elif self._sequences.get(tp) == (pid, seq + batch.count):
            self._sequences[tp] = (pid, seq)   # a given producer id: the next batch takes this sequence

    async def _send_payload(self, tp, payload: bytes, prev: asyncio.Future | None = None) -> int:
        """Send `payload` to the partition's leader until it is acknowledged, retrying
        retriable errors. OUT_OF_ORDER_SEQUENCE_NUMBER while `prev` (the batch sent before
        it) is unresolved means this one overtook a retried one: wait for `prev`, resend."""
        topic, p = tp
        attempt = 0
        refresh = False
        deadline = time.monotonic() + self.delivery_timeout_s
        while True:
            try:
                url = await self.meta.leader_url(topic, p, refresh=refresh)
                status, _, body = await self._attempt(tp, url, payload)
                if status == 202:
                    return -1
                return int(json.loads(body)["offsets"][0]["offset"])
            except KraftlogError as e:
                if (e.code is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER and prev is not None
                        and not prev.done()):
                    written = await asyncio.gather(prev, return_exceptions=True)
                    if written[0] is True and time.monotonic() < deadline:
                        refresh = False
                        continue   # the batch before it is written now: resend in order
                    raise
                attempt += 1
                if not e.code.retriable or attempt > self.retries or time.monotonic() >= deadline:
                    raise
                # the leader may have moved (failover, controlled shutdown): ask again
                refresh = e.code is not ErrorCode.THROTTLING_QUOTA_EXCEEDED
                if e.code is ErrorCode.BROKER_NOT_AVAILABLE:
                    self.t.rotate()
                    if attempt == 1:
                        continue   # the broker is suspect now: ask the others who leads, at once
                await asyncio.sleep(min(self.retry_backoff_s * attempt, self.retry_backoff_max_s,
                                        max(0.0, deadline - time.monotonic())))

    async def _attempt(self, tp, url: str, payload: bytes) -> tuple[int, object, bytes]:
        """One produce request to `url`, the leader as last known. After
        `request_attempt_timeout_ms` without an answer, and then every
        `leader_check_interval_ms`, metadata is asked from the other brokers; if they name
        another leader the request is abandoned (BROKER_NOT_AVAILABLE, retriable: the caller
        resends the same bytes there at once). Otherwise the bound is the transport's
        (`request_timeout_ms` + 5 s)."""
        topic, p = tp
        task = asyncio.ensure_future(self.t.request(
            "POST", f"{url}/v1/topics/{topic}/partitions/{p}/records?acks={self.acks}", data=payload,
            content_type=codecs.RAW_BATCH, hot=True))
        wait_s = self.t.attempt_timeout_s
        try:
            while True:
                if await _done_within(task, wait_s):
                    return task.result()
                wait_s = min(self.t.attempt_timeout_s, self.leader_check_interval_s)
                self.t.mark_suspect(url)
                try:
                    leader = await self.meta.leader_url(topic, p, refresh=True)
                except KraftlogError:
                    continue   # nobody answered or no leader yet: keep waiting, ask again
                if leader != url:
                    raise KraftlogError(ErrorCode.BROKER_NOT_AVAILABLE,
                                        f"{url} did not answer within {self.t.request_attempt_timeout_ms} ms and "
                                        f"{topic}-{p} has a new leader at {leader}; resending there")
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    # ---- transactions ------------------------------------------------------------------

    def _txn_path(self, what: str) -> str:
        if self.transactional_id is None:
            raise RuntimeError("this producer has no transactional_id: Producer(transactional_id=...)")
        return f"/v1/transactions/{self.transactional_id}/{what}"

    def _ids(self) -> dict:
        if self.producer_id < 0:
            raise RuntimeError("call init_transactions() first")
        return {"producer_id": self.producer_id, "producer_epoch": self.producer_epoch}

    async def _txn_call(self, what: str, doc: dict) -> dict:
        """POST to the coordinator (any broker forwards); retries retriable errors
        (CONCURRENT_TRANSACTIONS, NOT_COORDINATOR, a lost answer, ...) with backoff within
        delivery_timeout_ms. A records request is resent exactly as it was: its sequences
        make the leaders answer what the first attempt wrote instead of writing it again."""
        deadline = time.monotonic() + self.delivery_timeout_s
        backoff = self.retry_backoff_s
        while True:
            try:
                _, body = await self.t.bootstrap_json("POST", self._txn_path(what), json_body=doc)
                return body or {}
            except KraftlogError as e:
                if not e.code.retriable or time.monotonic() + backoff > deadline:
                    raise
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.retry_backoff_max_s)

    async def init_transactions(self) -> None:
        """Get this transactional id's producer id and epoch (fences older producers of it);
        sequences start from 0 in the new epoch."""
        doc = await self._txn_call("init", {"transaction_timeout_ms": self.transaction_timeout_ms})
        self.producer_id, self.producer_epoch = int(doc["producer_id"]), int(doc["producer_epoch"])
        self._txn_sequences.clear()
        self._txn_sequences_unknown = False

    def begin_transaction(self) -> None:
        self._ids()
        if self._in_transaction:
            raise RuntimeError("a transaction is already open: commit or abort it first")
        self._in_transaction = True

    async def _send_transactional(self, topic, value, key, headers, partition, timestamp) -> asyncio.Future:
        if not self._in_transaction:
            raise RuntimeError("begin_transaction() first: a transactional producer sends inside transactions")
        rec: dict = {"topic": topic}
        for name, v in (("key", key), ("value", value)):
            if isinstance(v, str):
                rec[name] = v
            elif v is not None or name == "value":
                rec[name + "_b64"] = None if v is None else base64.b64encode(v).decode()
        if headers:
            items = headers.items() if isinstance(headers, dict) else headers
            rec["headers"] = {k: v.decode() if isinstance(v, (bytes, bytearray)) else v for k, v in items}
        # placed here, as Kafka's producer does: sequences are per partition
        rec["partition"] = await self._partition_for(topic, key.encode() if isinstance(key, str) else key, partition)
        if timestamp is not None:
            rec["timestamp"] = timestamp
        fut = asyncio.get_running_loop().create_future()
        self._txn_buffer.append((rec, fut))
        self._txn_buffer_bytes += len(value or b"") + len(key or b"") + 64
        if self._txn_buffer_bytes >= self.batch_size_bytes:
            await self._flush_transactional()
        return fut

    def _check_sequences_known(self) -> None:
        if self._txn_sequences_unknown:
            raise KraftlogError(ErrorCode.INVALID_TXN_STATE,
                                "a records request of this transaction failed, so what it wrote is unknown: "
                                "abort_transaction() (which starts a new producer epoch), then begin again")

    async def _flush_transactional(self) -> None:
        async with self._txn_records_lock:
            buffered, self._txn_buffer, self._txn_buffer_bytes = self._txn_buffer, [], 0
            if not buffered:
                return
            try:
                self._check_sequences_known()
            except KraftlogError as e:
                for _, fut in buffered:
                    if not fut.done():
                        fut.set_exception(e)
                raise
            try:
                counts: dict[tuple[str, int], int] = {}
                for r, _ in buffered:
                    tp = (r["topic"], r["partition"])
                    counts[tp] = counts.get(tp, 0) + 1
                sequences = [{"topic": t, "partition": p, "base_sequence": self._txn_sequences.get((t, p), 0)}
                             for t, p in counts]
                doc = await self._txn_call("records", {**self._ids(), "records": [r for r, _ in buffered],
                                                       "sequences": sequences})
            except BaseException as e:
                self._txn_sequences_unknown = True   # some batches may be written: a new epoch is needed
                for _, fut in buffered:
                    if not fut.done():
                        fut.set_exception(e)
                raise
            for tp, n in counts.items():   # sequences wrap at 2**31 - 1, as the leader's
                self._txn_sequences[tp] = (self._txn_sequences.get(tp, 0) + n) & 0x7FFFFFFF
        for (_, fut), o in zip(buffered, doc["offsets"]):
            if not fut.done():
                fut.set_result(RecordMetadata(o["topic"], o["partition"], o["offset"]))

    async def send_offsets_to_transaction(self, offsets: dict, group_id: str) -> None:
        """Commit `offsets` ({(topic, partition): next offset}) to `group_id` with the transaction."""
        if not self._in_transaction:
            raise RuntimeError("begin_transaction() first")
        await self._txn_call("offsets", {**self._ids(), "group": group_id, "offsets": [
            {"topic": t, "partition": p, "offset": o} for (t, p), o in offsets.items()]})

    async def commit_transaction(self) -> None:
        """Write what is buffered, then commit: every record of the transaction becomes visible
        to read_committed consumers together, with the offsets sent to it."""
        if not self._in_transaction:
            raise RuntimeError("no transaction is open")
        await self._flush_transactional()
        self._check_sequences_known()   # Kafka: no commit after a failed send
        await self._txn_call("commit", self._ids())
        self._in_transaction = False

    async def abort_transaction(self) -> None:
        """Drop what is buffered and abort what was written: read_committed consumers never see it."""
        if not self._in_transaction:
            raise RuntimeError("no transaction is open")
        buffered, self._txn_buffer, self._txn_buffer_bytes = self._txn_buffer, [], 0
        for _, fut in buffered:
            if not fut.done():
                fut.set_exception(KraftlogError(ErrorCode.INVALID_TXN_STATE, "the transaction was aborted"))
                fut.exception()
        await self._txn_call("abort", self._ids())
        self._in_transaction = False
        if self._txn_sequences_unknown:   # what a failed records request wrote is aborted now
            await self.init_transactions()

    async def flush(self) -> None:
        """Send everything buffered and wait for the answers."""
        if self.transactional_id is not None and self._in_transaction:
            await self._flush_transactional()
        for tp in list(self._open):
            self._seal(tp)
        await asyncio.gather(*(q.join() for q in list(self._queues.values())))

    async def close(self) -> None:
        if self._closed:
            return
        await self.flush()
        self._closed = True
        for q in self._queues.values():
            q.put_nowait(None)
        await asyncio.gather(*self._senders.values(), return_exceptions=True)
        await self.t.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()
