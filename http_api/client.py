"""Python client for kraftlog brokers: Producer, Consumer, AdminClient (asyncio) and
synchronous wrappers (SyncProducer, SyncConsumer, SyncAdminClient).

- `Producer` accumulates records per partition into record batches (`batch_size_bytes`,
  `linger_ms`), sends them as raw batches straight to each partition's leader, one request
  in flight per partition (ordering), retries retriable errors after refreshing metadata
  (NOT_LEADER_OR_FOLLOWER, connection errors), optional per-batch compression.
  Idempotent by default with acks=all (`enable_idempotence`): a producer id from
  `POST /v1/producer-ids`, a sequence number per partition in every batch, so a retried
  batch (timeout, leader change) is never written twice — the leader answers a duplicate
  with its original offsets. A batch that fails for good makes the producer take a new
  producer id (its outcome is unknown; later batches must not be matched against it).
- `Consumer` reads partitions it was assigned (or every partition of subscribed topics)
  with long polls, keeping one fetch in flight per partition; positions, seek, and commits
  to a consumer group.
- `AdminClient`: create / list / describe / delete topics, metadata.
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

import aiohttp

from http_api import codecs
from http_api.errors import ErrorCode, KraftlogError
from http_api.partitioner import partition_for_key
from partitions.log import record_batch as rb

DEFAULT_URL = "http://127.0.0.1:8082"


def default_bootstrap() -> str:
    return os.environ.get("KRAFTLOG_URL") or DEFAULT_URL


def _urls(bootstrap: str | Iterable[str] | None) -> list[str]:
    if bootstrap is None:
        bootstrap = default_bootstrap()
    if isinstance(bootstrap, str):
        bootstrap = bootstrap.split(",")
    out = [u.strip().rstrip("/") for u in bootstrap if u.strip()]
    if not out:
        raise ValueError("give at least one broker URL (e.g. http://127.0.0.1:8082)")
    return out


def _error_from(status: int, body: bytes) -> KraftlogError:
    try:
        doc = json.loads(body) if body else {}
    except ValueError:
        doc = {}
    err = KraftlogError.from_body(doc)
    if err is not None:
        return err
    return KraftlogError(ErrorCode.UNKNOWN_SERVER_ERROR, f"broker answered HTTP {status}: {body[:200]!r}")


class _Transport:
    """HTTP to brokers: bootstrap rotation, JSON helpers, typed errors."""

    def __init__(self, bootstrap, *, client_id: str | None, request_timeout_ms: int,
                 session: aiohttp.ClientSession | None = None) -> None:
        self.urls = _urls(bootstrap)
        self.client_id = client_id or f"kraftlog-py-{os.getpid()}"
        self.request_timeout_ms = request_timeout_ms
        self._session = session
        self._own = session is None
        self._next = random.randrange(len(self.urls))

    async def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=256, keepalive_timeout=60),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=5))
            self._own = True
        return self._session

    def bootstrap_url(self) -> str:
        url = self.urls[self._next % len(self.urls)]
        return url

    def rotate(self) -> None:
        self._next += 1

    async def request(self, method: str, url: str, *, json_body: Any = None, data: bytes | None = None,
                      content_type: str | None = None, accept: str = codecs.JSON, params: dict | None = None,
                      timeout_s: float | None = None) -> tuple[int, Any, bytes]:
        """-> (status, headers, body); raises KraftlogError for 4xx/5xx, and
        BROKER_NOT_AVAILABLE for connection failures."""
        s = await self.session()
        headers = {"Accept": accept, "X-Client-Id": self.client_id}
        if json_body is not None:
            data = json.dumps(json_body).encode()
            content_type = codecs.JSON
        if content_type:
            headers["Content-Type"] = content_type
        to = aiohttp.ClientTimeout(total=timeout_s if timeout_s is not None else self.request_timeout_ms / 1000 + 5)
        try:
            async with s.request(method, url, data=data, headers=headers, params=params, timeout=to) as resp:
                body = await resp.read()
                if resp.status >= 400:
                    raise _error_from(resp.status, body)
                return resp.status, resp.headers, body
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            raise KraftlogError(ErrorCode.BROKER_NOT_AVAILABLE,
                                f"cannot reach broker at {url}: {e or type(e).__name__}; check that the broker "
                                "is running and --bootstrap / KRAFTLOG_URL points at it") from None

    async def bootstrap_json(self, method: str, path: str, **kw) -> tuple[int, Any]:
        """Call `path` on a bootstrap broker, trying the next one on connection failure."""
        last: Exception | None = None
        for _ in range(len(self.urls)):
            url = self.bootstrap_url() + path
            try:
                status, _, body = await self.request(method, url, **kw)
                return status, (json.loads(body) if body else None)
            except KraftlogError as e:
                if e.code is not ErrorCode.BROKER_NOT_AVAILABLE:
                    raise
                last = e
                self.rotate()
        raise last  # type: ignore[misc]

    async def close(self) -> None:
        if self._own and self._session is not None:
            await self._session.close()
            self._session = None


class _Metadata:
    """Cached cluster metadata: partition counts and leader URLs."""

    def __init__(self, transport: _Transport) -> None:
        self.t = transport
        self.doc: dict | None = None
        self._topics: dict[str, dict] = {}
        self.fetched_at = 0.0
        self._refreshing: asyncio.Task | None = None

    async def refresh(self) -> dict:
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.ensure_future(self.t.bootstrap_json("GET", "/v1/metadata"))
        _, doc = await asyncio.shield(self._refreshing)
        self.doc = doc
        self._topics = {t["name"]: t for t in doc["topics"]}
        self.fetched_at = time.monotonic()
        return doc

    def _topic(self, topic: str) -> dict | None:
        if self.doc is None:
            return None
        return self._topics.get(topic)

    async def partitions(self, topic: str) -> int:
        t = self._topic(topic)
        if t is None:
            await self.refresh()
            t = self._topic(topic)
        return len(t["partitions"]) if t else 0

    async def leader_url(self, topic: str, partition: int, refresh: bool = False) -> str:
        if refresh or self.doc is None:
            await self.refresh()
        t = self._topic(topic)
        if t is None:
            await self.refresh()
            t = self._topic(topic)
        if t is None:
            raise KraftlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {topic!r} does not exist; create it first")
        p = next((p for p in t["partitions"] if p["partition"] == partition), None)
        if p is None:
            raise KraftlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                f"topic {topic!r} has no partition {partition}")
        brokers = {b["id"]: b["url"] for b in self.doc["brokers"]}
        url = brokers.get(p["leader"])
        if url is None:
            raise KraftlogError(ErrorCode.LEADER_NOT_AVAILABLE, f"{topic}-{partition} has no leader right now; retry")
        return url.rstrip("/")


# ---- admin ---------------------------------------------------------------------------

class AdminClient:
    """Topic administration against any broker (which forwards to the controller)."""

    def __init__(self, bootstrap=None, *, client_id: str | None = None, request_timeout_ms: int = 30_000,
                 session: aiohttp.ClientSession | None = None) -> None:
        self.t = _Transport(bootstrap, client_id=client_id, request_timeout_ms=request_timeout_ms, session=session)

    async def create_topic(self, name: str, partitions: int = 1, replication_factor: int = 1,
                           configs: dict | None = None) -> dict:
        _, doc = await self.t.bootstrap_json("POST", "/v1/topics", json_body={
            "name": name, "partitions": partitions, "replication_factor": replication_factor,
            "configs": configs or {}})
        return doc

    async def list_topics(self) -> list[str]:
        _, doc = await self.t.bootstrap_json("GET", "/v1/topics")
        return doc["topics"]

    async def describe_topic(self, name: str) -> dict:
        _, doc = await self.t.bootstrap_json("GET", f"/v1/topics/{name}")
        return doc

    async def delete_topic(self, name: str) -> None:
        await self.t.bootstrap_json("DELETE", f"/v1/topics/{name}")

    async def metadata(self) -> dict:
        _, doc = await self.t.bootstrap_json("GET", "/v1/metadata")
        return doc

    # consumer groups (http_api/group_routes.py)
    async def list_groups(self) -> list[dict]:
        _, doc = await self.t.bootstrap_json("GET", "/v1/groups")
        return doc["groups"]

    async def describe_group(self, group: str) -> dict:
        _, doc = await self.t.bootstrap_json("GET", f"/v1/groups/{group}")
        return doc

    async def delete_group(self, group: str) -> None:
        await self.t.bootstrap_json("DELETE", f"/v1/groups/{group}")

    async def close(self) -> None:
        await self.t.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()


# ---- producer ------------------------------------------------------------------------

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
                 enable_idempotence: bool = True, session: aiohttp.ClientSession | None = None) -> None:
        self.t = _Transport(bootstrap, client_id=client_id, request_timeout_ms=request_timeout_ms, session=session)
        self.meta = _Metadata(self.t)
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
                status, _, body = await self.t.request(
                    "POST", f"{url}/v1/topics/{topic}/partitions/{p}/records", data=payload,
                    content_type=codecs.RAW_BATCH, params={"acks": self.acks})
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
                await asyncio.sleep(min(self.retry_backoff_s * attempt, self.retry_backoff_max_s,
                                        max(0.0, deadline - time.monotonic())))

    async def flush(self) -> None:
        """Send everything buffered and wait for the answers."""
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


# ---- consumer ------------------------------------------------------------------------

@dataclass
class ConsumerRecord:
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple = ()


class Consumer:
    """Long-polling consumer of assigned partitions (see module docstring).

    auto_offset_reset: where to start without a committed offset, or after an
    OFFSET_OUT_OF_RANGE: "earliest" (log start) or "latest" (high watermark).

    With a group_id, `subscribe()` joins the consumer group (http_api/group_client.py): the
    coordinator assigns partitions, a background task heartbeats, each poll reconciles
    (revoked partitions are committed, then released). At-least-once by default: with
    enable_auto_commit the positions of records returned by earlier polls are committed every
    auto_commit_interval_ms, on revocation and on close; commit() commits explicitly."""

    def __init__(self, bootstrap=None, *, group_id: str | None = None, auto_offset_reset: str = "latest",
                 max_wait_ms: int = 500, max_bytes: int = 1024 * 1024, request_timeout_ms: int = 30_000,
                 client_id: str | None = None, session: aiohttp.ClientSession | None = None,
                 enable_auto_commit: bool = True, auto_commit_interval_ms: int = 5_000,
                 session_timeout_ms: int | None = None, assignor: str | None = None) -> None:
        if auto_offset_reset not in ("earliest", "latest"):
            raise ValueError("auto_offset_reset must be 'earliest' or 'latest'")
        self.t = _Transport(bootstrap, client_id=client_id, request_timeout_ms=request_timeout_ms, session=session)
        self.meta = _Metadata(self.t)
        self.group_id = group_id
        self.auto_offset_reset = auto_offset_reset
        self.max_wait_ms = max_wait_ms
        self.max_bytes = max_bytes
        self._assigned: list[tuple[str, int]] = []
        self._positions: dict[tuple[str, int], int] = {}
        self._inflight: dict[tuple[str, int], tuple[int, asyncio.Task]] = {}
        self._subscribed: list[str] = []
        # consumer group membership (subscribe() with a group_id)
        self.enable_auto_commit = enable_auto_commit
        self.auto_commit_interval_ms = auto_commit_interval_ms
        self.session_timeout_ms = session_timeout_ms
        self.assignor = assignor
        self.membership = None
        self._last_auto_commit = time.monotonic()
        self._committed_cache: dict | None = None

    # assignment
    def assign(self, partitions: Iterable[tuple[str, int]]) -> None:
        self._assigned = list(partitions)

    async def subscribe(self, topics: Iterable[str]) -> None:
        """With a group_id: join the group, which assigns partitions of `topics` among its
        members. Without: assign every partition of `topics`."""
        self._subscribed = list(topics)
        if self.group_id:
            from http_api.group_client import GroupMembership
            self.membership = GroupMembership(self.t, self.group_id, self._subscribed,
                                              session_timeout_ms=self.session_timeout_ms, assignor=self.assignor,
                                              client_id=self.t.client_id)
            await self.membership.start()
            self._assigned = []
            await self._reconcile()
            return
        await self.meta.refresh()
        assigned = []
        for t in self._subscribed:
            n = await self.meta.partitions(t)
            if n == 0:
                raise KraftlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                    f"topic {t!r} does not exist; create it or check the name")
            assigned.extend((t, p) for p in range(n))
        self._assigned = assigned

    def assignment(self) -> list[tuple[str, int]]:
        return list(self._assigned)

    async def _offsets(self, tp) -> dict:
        url = await self.meta.leader_url(*tp)
        _, _, body = await self.t.request("GET", f"{url}/v1/topics/{tp[0]}/partitions/{tp[1]}/offsets")
        return json.loads(body)

    async def _reset(self, tp) -> int:
        offs = await self._offsets(tp)
        pos = offs["log_start_offset"] if self.auto_offset_reset == "earliest" else offs["high_watermark"]
        self._positions[tp] = pos
        return pos

    async def _reconcile(self) -> None:
        """Apply the group's latest assignment: commit and release revoked partitions (drop
        lost ones without committing), start owning added ones at their committed offsets."""
        m = self.membership
        if m is None or not m.changed.is_set():
            return
        revoked, added, lost = m.pending_changes()
        if revoked:
            if not lost and self.enable_auto_commit:
                offs = {tp: self._positions[tp] for tp in revoked if tp in self._positions}
                try:
                    await self.commit(offs)
                except KraftlogError:
                    pass  # the next owner re-reads from the last commit (at-least-once)
            for tp in revoked:
                self._drop_inflight(tp)
                self._positions.pop(tp, None)
        self._committed_cache = None
        owned = (frozenset(self._assigned) - revoked) | added if not lost else added
        self._assigned = sorted(owned)
        for tp in added:
            self._positions.pop(tp, None)
        m.ack(owned)

    async def _maybe_auto_commit(self) -> None:
        if self.membership is None or not self.enable_auto_commit:
            return
        if time.monotonic() - self._last_auto_commit < self.auto_commit_interval_ms / 1000:
            return
        self._last_auto_commit = time.monotonic()
        offs = {tp: o for tp, o in self._positions.items() if tp in self._assigned}
        if offs:
            try:
                await self.commit(offs)
            except KraftlogError:
                pass  # retried at the next interval; at-least-once either way

    async def position(self, tp) -> int:
        if tp not in self._positions:
            if self.membership is not None:  # one offsets fetch per rebalance, not one per partition
                if self._committed_cache is None:
                    _, doc = await self.t.bootstrap_json("GET", f"/v1/groups/{self.group_id}/offsets")
                    self._committed_cache = {(e["topic"], e["partition"]): e["offset"] for e in doc["offsets"]}
                committed = self._committed_cache.get(tuple(tp))
            else:
                committed = await self.committed(tp) if self.group_id else None
            if committed is not None:
                self._positions[tp] = committed
            else:
                await self._reset(tp)
        return self._positions[tp]

    def seek(self, tp, offset: int) -> None:
        self._positions[tp] = offset
        self._drop_inflight(tp)

    async def seek_to_beginning(self, tp) -> None:
        self.seek(tp, (await self._offsets(tp))["log_start_offset"])

    async def seek_to_end(self, tp) -> None:
        self.seek(tp, (await self._offsets(tp))["high_watermark"])

    def _drop_inflight(self, tp) -> None:
        entry = self._inflight.pop(tp, None)
        if entry is not None:
            entry[1].cancel()

    async def _fetch(self, tp, offset: int, max_wait_ms: int) -> tuple[bytes, Any]:
        url = await self.meta.leader_url(*tp)
        _, headers, body = await self.t.request(
            "GET", f"{url}/v1/topics/{tp[0]}/partitions/{tp[1]}/records", accept=codecs.RAW_BATCH,
            params={"offset": str(offset), "max_bytes": str(self.max_bytes), "max_wait_ms": str(max_wait_ms)},
            timeout_s=max_wait_ms / 1000 + self.t.request_timeout_ms / 1000)
        return body, headers

    async def poll(self, timeout_ms: int | None = None) -> list[ConsumerRecord]:
        """Records from any assigned partition; waits up to timeout_ms (long poll)."""
        wait_ms = self.max_wait_ms if timeout_ms is None else timeout_ms
        if self.membership is not None:
            await self._maybe_auto_commit()
            await self._reconcile()
            if not self._assigned:  # nothing assigned (yet): wait for the group to give us some
                try:
                    await asyncio.wait_for(self.membership.changed.wait(), wait_ms / 1000)
                except asyncio.TimeoutError:
                    pass
                await self._reconcile()
                if not self._assigned:
                    return []
        if not self._assigned:
            raise RuntimeError("assign() or subscribe() first")
        for tp in self._assigned:
            pos = await self.position(tp)
            entry = self._inflight.get(tp)
            if entry is None or entry[0] != pos:
                self._drop_inflight(tp)
                self._inflight[tp] = (pos, asyncio.ensure_future(self._fetch(tp, pos, wait_ms)))
        tasks = [t for _, t in self._inflight.values()]
        if self.membership is not None:  # a rebalance interrupts the long poll
            tasks.append(asyncio.ensure_future(self.membership.changed.wait()))
        await asyncio.wait(tasks, timeout=wait_ms / 1000 + 1, return_when=asyncio.FIRST_COMPLETED)
        if self.membership is not None:
            tasks[-1].cancel()
        out: list[ConsumerRecord] = []
        for tp, (pos, task) in list(self._inflight.items()):
            if not task.done():
                continue
            del self._inflight[tp]
            try:
                body, _ = task.result()
            except asyncio.CancelledError:
                continue
            except KraftlogError as e:
                if e.code is ErrorCode.OFFSET_OUT_OF_RANGE:
                    await self._reset(tp)
                    continue
                if e.code.retriable:
                    await self.meta.refresh()
                    continue
                raise
            if self._positions.get(tp) != pos:
                continue  # seeked meanwhile
            nxt = pos
            for header, batch in rb.iter_batches(body, validate=False):
                nxt = max(nxt, header.next_offset)
                if header.is_control:
                    continue
                for r in rb.decode_records(batch, validate=False):
                    if r.offset >= pos:
                        out.append(ConsumerRecord(tp[0], tp[1], r.offset, r.timestamp, r.key, r.value, r.headers))
            self._positions[tp] = nxt
        return out

    async def commit(self, offsets: dict | None = None) -> None:
        """Commit positions (or `offsets` {(topic, p): next offset}) to the group."""
        if not self.group_id:
            raise ValueError("commit needs a group_id")
        offs = offsets if offsets is not None else dict(self._positions)
        body: dict = {"offsets": [{"topic": t, "partition": p, "offset": o} for (t, p), o in offs.items()]}
        if self.membership is not None:
            if offsets is None:
                body["offsets"] = [e for e in body["offsets"] if (e["topic"], e["partition"]) in self._assigned]
            body.update(self.membership.commit_fields())
        if not body["offsets"]:
            return
        # retriable errors (coordinator moving / loading, broker down) are retried until
        # request_timeout_ms; fencing errors (ILLEGAL_GENERATION, ...) are raised at once
        deadline = time.monotonic() + self.t.request_timeout_ms / 1000
        while True:
            try:
                if self.membership is not None:   # straight to the coordinator
                    await self.membership.request("POST", f"/v1/groups/{self.group_id}/offsets", body)
                else:
                    await self.t.bootstrap_json("POST", f"/v1/groups/{self.group_id}/offsets", json_body=body)
                return
            except KraftlogError as e:
                if not e.code.retriable or time.monotonic() > deadline:
                    raise
                self.t.rotate()
                await asyncio.sleep(0.1)

    async def committed(self, tp) -> int | None:
        if not self.group_id:
            return None
        _, doc = await self.t.bootstrap_json("GET", f"/v1/groups/{self.group_id}/offsets")
        for e in doc["offsets"]:
            if (e["topic"], e["partition"]) == tuple(tp):
                return e["offset"]
        return None

    async def close(self) -> None:
        for tp in list(self._inflight):
            self._drop_inflight(tp)
        if self.membership is not None:
            if self.enable_auto_commit:
                try:
                    await self.commit()
                except KraftlogError:
                    pass
            await self.membership.close()
        await self.t.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()


# ---- synchronous wrappers ------------------------------------------------------------

class _LoopThread:
    """An event loop in a daemon thread, for the sync wrappers."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="kraftlog-client")
        self.thread.start()

    def run(self, coro, timeout: float | None = None):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


class _SyncWrapper:
    _factory: Any = None

    def __init__(self, *args, **kwargs) -> None:
        self._lt = _LoopThread()

        async def make():
            return self._factory(*args, **kwargs)
        self._inner = self._lt.run(make())

    def close(self) -> None:
        try:
            self._lt.run(self._inner.close())
        finally:
            self._lt.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class SyncProducer(_SyncWrapper):
    """Blocking Producer: `send(...)` returns a concurrent future; `flush()` waits for all."""

    _factory = Producer

    def send(self, topic, value, key=None, headers=None, partition=None, timestamp=None):
        async def go():
            fut = await self._inner.send(topic, value, key, headers, partition, timestamp)
            return asyncio.ensure_future(_await(fut))
        task = self._lt.run(go())
        return asyncio.run_coroutine_threadsafe(_await(task), self._lt.loop)

    def flush(self) -> None:
        self._lt.run(self._inner.flush())


async def _await(fut):
    return await fut


class SyncConsumer(_SyncWrapper):
    """Blocking Consumer."""

    _factory = Consumer

    def assign(self, partitions) -> None:
        self._inner.assign(partitions)

    def subscribe(self, topics) -> None:
        self._lt.run(self._inner.subscribe(topics))

    def poll(self, timeout_ms: int | None = None) -> list[ConsumerRecord]:
        return self._lt.run(self._inner.poll(timeout_ms))

    def position(self, tp) -> int:
        return self._lt.run(self._inner.position(tp))

    def seek(self, tp, offset: int) -> None:
        self._lt.loop.call_soon_threadsafe(self._inner.seek, tp, offset)

    def commit(self, offsets=None) -> None:
        self._lt.run(self._inner.commit(offsets))


class SyncAdminClient(_SyncWrapper):
    """Blocking AdminClient."""

    _factory = AdminClient

    def create_topic(self, name, partitions=1, replication_factor=1, configs=None) -> dict:
        return self._lt.run(self._inner.create_topic(name, partitions, replication_factor, configs))

    def list_topics(self) -> list[str]:
        return self._lt.run(self._inner.list_topics())

    def describe_topic(self, name) -> dict:
        return self._lt.run(self._inner.describe_topic(name))

    def delete_topic(self, name) -> None:
        self._lt.run(self._inner.delete_topic(name))

    def metadata(self) -> dict:
        return self._lt.run(self._inner.metadata())
