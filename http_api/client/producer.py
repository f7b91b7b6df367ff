"""`Producer`: accumulates records per partition into record batches (`batch_size_bytes`,
`linger_ms`), sends them as raw batches straight to each partition's leader, one request
in flight per partition (ordering), retries retriable errors after refreshing metadata
(NOT_LEADER_OR_FOLLOWER, connection errors), optional per-batch compression. Metadata older
than `metadata_max_age_ms` (Kafka's metadata.max.age.ms, 5 min) is refreshed before the next
record is partitioned, so records without a partition spread onto partitions added since.

Idempotent by default with acks=all (`enable_idempotence`): a producer id from
`POST /v1/producer-ids`, a sequence number per partition in every batch, so a retried
batch (timeout, leader change) is never written twice — the leader answers a duplicate
with its original offsets. A batch that fails for good makes the producer take a new
producer id (its outcome is unknown; later batches must not be matched against it).

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
PRODUCER_FENCED and must be closed.
"""
from __future__ import annotations

import asyncio
import base64
import json
import random
import time
from dataclasses import dataclass, field
from typing import Iterable

import aiohttp

from http_api.client.transport import (DEFAULT_CONNECT_TIMEOUT_MS, DEFAULT_METADATA_MAX_AGE_MS,
                                       DEFAULT_REQUEST_ATTEMPT_TIMEOUT_MS, MetadataCache, Transport)
from http_api.wire import codecs
from http_api.wire.partitioner import partition_for_key
from partitions.errors import ErrorCode, KraftlogError
from partitions.log import record_batch as rb

@dataclass
class RecordMetadata:
    topic: str
    partition: int
    offset: int


@dataclass
class _Batch:
    records: list = field(default_factory=list)
    futures: list = field(default_factory=list)
    size: int = 0
    created: float = field(default_factory=time.monotonic)


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
                 metadata_max_age_ms: int = DEFAULT_METADATA_MAX_AGE_MS) -> None:
        self.transactional_id = transactional_id
        self.transaction_timeout_ms = transaction_timeout_ms
        self._in_transaction = False
        self._txn_buffer: list[tuple[dict, asyncio.Future]] = []
        self._txn_buffer_bytes = 0
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
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self._sequences: dict[tuple[str, int], tuple[int, int]] = {}   # tp -> (producer id, next sequence)
        self._pid_lock = asyncio.Lock()
        self._open: dict[tuple[str, int], _Batch] = {}
        self._queues: dict[tuple[str, int], asyncio.Queue] = {}
        self._senders: dict[tuple[str, int], asyncio.Task] = {}
        self._lingers: dict[tuple[str, int], asyncio.TimerHandle] = {}
        self._sticky: dict[str, int] = {}
        self._buffered = 0
        self._space = asyncio.Event()
        self._closed = False

    async def _partition_for(self, topic: str, key: bytes | None, partition: int | None) -> int:
        n = await self.meta.partitions(topic)
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
        size = 24 + len(key or b"") + len(value or b"") + sum(6 + len(k) + len(v or b"") for k, v in hdrs)
        while self._buffered + size > self.buffer_memory_bytes and self._buffered > 0:
            self._space.clear()
            await self._space.wait()
        tp = (topic, p)
        batch = self._open.get(tp)
        if batch is None:
            batch = self._open[tp] = _Batch()
            self._lingers[tp] = asyncio.get_running_loop().call_later(self.linger_s, self._seal, tp)
        fut = asyncio.get_running_loop().create_future()
        batch.records.append(rb.Record(key, value, hdrs, timestamp))
        batch.futures.append(fut)
        batch.size += size
        self._buffered += size
        if batch.size >= self.batch_size_bytes:
            self._seal(tp)
        return fut

    def _seal(self, tp) -> None:
        batch = self._open.pop(tp, None)
        h = self._lingers.pop(tp, None)
        if h is not None:
            h.cancel()
        if batch is None:
            return
        if self._sticky.get(tp[0]) == tp[1]:
            self._sticky.pop(tp[0], None)  # next keyless batch goes elsewhere
        q = self._queues.get(tp)
        if q is None:
            q = self._queues[tp] = asyncio.Queue()
            self._senders[tp] = asyncio.ensure_future(self._sender(tp, q))
        q.put_nowait(batch)

    async def _sender(self, tp, q: asyncio.Queue) -> None:
        """One request in flight per partition, in order."""
        while True:
            batch: _Batch = await q.get()
            try:
                if batch is None:
                    return
                try:
                    base = await self._send_batch(tp, batch)
                    for i, fut in enumerate(batch.futures):
                        if not fut.done():
                            fut.set_result(RecordMetadata(tp[0], tp[1], base + i if base >= 0 else -1))
                except Exception as e:  # noqa: BLE001 - delivered to each record's future
                    for fut in batch.futures:
                        if not fut.done():
                            fut.set_exception(e)
            finally:
                if batch is not None:
                    self._buffered -= batch.size
                    self._space.set()
                q.task_done()

    async def _init_producer_id(self) -> None:
        """A fresh producer id from a broker (sequences restart at 0 for it)."""
        async with self._pid_lock:
            if self.producer_id >= 0:
                return
            _, doc = await self.t.bootstrap_json("POST", "/v1/producer-ids", json_body={})
            self.producer_id, self.producer_epoch = int(doc["producer_id"]), int(doc.get("producer_epoch", 0))

    async def _send_batch(self, tp, batch: _Batch) -> int:
        topic, p = tp
        if self.enable_idempotence and self.producer_id < 0:
            await self._init_producer_id()
        pid, seq = self.producer_id, -1
        if pid >= 0:
            owner, nxt = self._sequences.get(tp, (pid, 0))
            seq = nxt if owner == pid else 0
        payload = rb.build_batch(batch.records, compression=self.compression, producer_id=pid,
                                 producer_epoch=self.producer_epoch, base_sequence=seq)
        try:
            base = await self._send_payload(tp, payload)
        except Exception:
            if pid >= 0 and self.enable_idempotence and self.producer_id == pid:
                # unknown outcome: the next batch must not reuse (or follow) this sequence
                self.producer_id = -1
            raise
        if pid >= 0:  # (a producer id replaced meanwhile makes the next batch start at 0 anyway)
            self._sequences[tp] = (pid, seq + len(batch.records))
        return base

    async def _send_payload(self, tp, payload: bytes) -> int:
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
            "POST", f"{url}/v1/topics/{topic}/partitions/{p}/records", data=payload,
            content_type=codecs.RAW_BATCH, params={"acks": self.acks}))
        wait_s = self.t.attempt_timeout_s
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=wait_s)
                wait_s = min(self.t.attempt_timeout_s, self.leader_check_interval_s)
                if done:
                    return task.result()
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

    # retriable errors a records request gets before anything was written (others, such as a
    # lost connection or a timeout, leave it unknown whether the records were written: a resend
    # could write them twice, so they are raised and the application aborts the transaction)
    _RECORDS_RETRIABLE = frozenset({ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                                    ErrorCode.CONCURRENT_TRANSACTIONS})

    async def _txn_call(self, what: str, doc: dict) -> dict:
        """POST to the coordinator (any broker forwards); retries retriable errors
        (CONCURRENT_TRANSACTIONS, NOT_COORDINATOR, ...) with backoff within delivery_timeout_ms;
        records requests only those that prove nothing was written."""
        deadline = time.monotonic() + self.delivery_timeout_s
        backoff = self.retry_backoff_s
        while True:
            try:
                _, body = await self.t.bootstrap_json("POST", self._txn_path(what), json_body=doc)
                return body or {}
            except KraftlogError as e:
                retry = e.code in self._RECORDS_RETRIABLE if what == "records" else e.code.retriable
                if not retry or time.monotonic() + backoff > deadline:
                    raise
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.retry_backoff_max_s)

    async def init_transactions(self) -> None:
        """Get this transactional id's producer id and epoch (fences older producers of it)."""
        doc = await self._txn_call("init", {"transaction_timeout_ms": self.transaction_timeout_ms})
        self.producer_id, self.producer_epoch = int(doc["producer_id"]), int(doc["producer_epoch"])

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
        if partition is not None:
            rec["partition"] = partition
        if timestamp is not None:
            rec["timestamp"] = timestamp
        fut = asyncio.get_running_loop().create_future()
        self._txn_buffer.append((rec, fut))
        self._txn_buffer_bytes += len(value or b"") + len(key or b"") + 64
        if self._txn_buffer_bytes >= self.batch_size_bytes:
            await self._flush_transactional()
        return fut

    async def _flush_transactional(self) -> None:
        buffered, self._txn_buffer, self._txn_buffer_bytes = self._txn_buffer, [], 0
        if not buffered:
            return
        try:
            doc = await self._txn_call("records", {**self._ids(), "records": [r for r, _ in buffered]})
        except BaseException as e:
            for _, fut in buffered:
                if not fut.done():
                    fut.set_exception(e)
            raise
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
