"""The broker's public HTTP API (API.md "Broker HTTP API v1") as an aiohttp app.

`create_app(config, deps)` builds the app from a `BrokerConfig` and injected dependencies
(`BrokerDeps`: replica manager, metadata view, controller client, group offset store), so
functional tests run it in-process with a fake controller and the broker process
(`server.py`) wires the real ones.

Routing rules: partition-level produce/fetch/offsets answer only on the partition leader
(else 421 NOT_LEADER_OR_FOLLOWER with leader_id/leader_url); topic-level produce works on
any broker and forwards each partition's batch to its leader as a raw batch; admin routes
go to the controller. Bad input is rejected with a 4xx before anything is stored.
"""
from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Optional, Protocol

from aiohttp import web
import aiohttp
import prometheus_client as prom

from http_api.broker import replica_client
from http_api.broker.config import BrokerConfig
from http_api.broker.group_offsets import GroupOffsetStore
from http_api.broker.internal_auth import INTERNAL_PATH_PREFIX, INTERNAL_TOKEN_HEADER, internal_token, token_ok
from http_api.wire import codecs
from http_api.wire.codecs import CBOR, JSON, RAW_BATCH
from http_api.wire.errors import ErrorCode, KraftlogError, http_status
from http_api.wire.partitioner import RoundRobin, partition_for_key
from partitions.groups import records as grec
from partitions.replication.replica_manager import ACKS_ALL, ACKS_NONE, parse_acks
from partitions.replication.replica_state import ReplicaFetchRequest

if TYPE_CHECKING:
    from http_api.broker.metadata_view import MetadataView
    from partitions.log.log_scheduler import LogScheduler
    from partitions.replication.replica_manager import ReplicaManager

log = logging.getLogger("kraftlog.broker")

TOPIC_NAME_MAX_CHARS = 249
_TOPIC_RE = re.compile(r"^[A-Za-z0-9._\-]+$")
CORRELATION_HEADER = "X-Correlation-Id"
CLIENT_ID_HEADER = "X-Client-Id"
BROKER_KEY: web.AppKey = web.AppKey("broker", object)


def validate_topic_name(name: Any) -> str:
    """Kafka's rule: 1-249 chars of [A-Za-z0-9._-], not '.' or '..'."""
    if not isinstance(name, str) or not name:
        raise KraftlogError(ErrorCode.INVALID_TOPIC_EXCEPTION, "name: a topic name must be a non-empty string")
    if len(name) > TOPIC_NAME_MAX_CHARS or name in (".", "..") or not _TOPIC_RE.match(name):
        raise KraftlogError(ErrorCode.INVALID_TOPIC_EXCEPTION,
                            f"topic name {name!r} is invalid: use 1-{TOPIC_NAME_MAX_CHARS} characters from "
                            "[A-Za-z0-9._-] (not '.' or '..')")
    return name


class ControllerAdmin(Protocol):
    """The controller calls the broker app makes (metadata_quorum.client.ControllerClient)."""

    async def create_topic(self, name: str, partitions: int, replication_factor: int,
                           configs: Optional[dict] = None) -> dict: ...

    async def delete_topic(self, name: str) -> dict: ...

    async def create_partitions(self, name: str, count: int) -> dict: ...

    async def alter_configs(self, name: str, configs: dict) -> dict: ...

    async def allocate_producer_ids(self, broker_id: int, broker_epoch: int) -> tuple[int, int]: ...


@dataclass
class BrokerDeps:
    """What the app needs from the broker process (or from a test)."""

    replica_manager: ReplicaManager
    metadata: MetadataView           # .image, .wait_until(pred, timeout_s)
    controller: ControllerAdmin
    groups: GroupOffsetStore
    registry: prom.CollectorRegistry = field(default_factory=prom.CollectorRegistry)
    http_session: aiohttp.ClientSession | None = None   # for forwarding; created on startup
    # () -> (ready, info dict); default: ready once metadata is loaded
    health: Callable[[], tuple[bool, dict]] | None = None
    # async () -> a fresh producer id (POST /v1/producer-ids)
    producer_ids: Callable[[], Awaitable[int]] | None = None
    log_scheduler: LogScheduler | None = None   # retention + log cleaner; None: one on demand


class BrokerMetrics:
    """Prometheus metrics of one broker app (own registry, so tests can run several)."""

    def __init__(self, registry: prom.CollectorRegistry, deps: BrokerDeps) -> None:
        buckets = (.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30)
        self.produce_requests = prom.Counter("kraftlog_produce_requests", "Produce requests", ["status"],
                                             registry=registry)
        self.produce_records = prom.Counter("kraftlog_produce_records", "Records produced", registry=registry)
        self.produce_bytes = prom.Counter("kraftlog_produce_bytes", "Produce request body bytes",
                                          registry=registry)
        self.produce_latency = prom.Histogram("kraftlog_produce_latency_seconds", "Produce request latency",
                                              buckets=buckets, registry=registry)
        self.fetch_requests = prom.Counter("kraftlog_fetch_requests", "Fetch requests", ["status"],
                                           registry=registry)
        self.fetch_bytes = prom.Counter("kraftlog_fetch_bytes", "Record batch bytes returned by fetches",
                                        registry=registry)
        self.fetch_latency = prom.Histogram("kraftlog_fetch_latency_seconds",
                                            "Fetch request latency (long polls included)",
                                            buckets=buckets, registry=registry)
        self.replica_fetch_requests = prom.Counter("kraftlog_replica_fetch_requests",
                                                   "Follower fetch requests served (as a leader)", registry=registry)
        self.replica_fetch_bytes = prom.Counter("kraftlog_replica_fetch_bytes",
                                                "Record batch bytes sent to followers", registry=registry)
        rm = deps.replica_manager
        g = prom.Gauge("kraftlog_partitions", "Partition replicas hosted by this broker", registry=registry)
        g.set_function(lambda: rm.local_partition_counts()[0])
        g = prom.Gauge("kraftlog_leader_partitions", "Partitions led by this broker", registry=registry)
        g.set_function(lambda: rm.local_partition_counts()[1])
        g = prom.Gauge("kraftlog_long_polls_waiting", "Fetches waiting for data", registry=registry)
        g.set_function(lambda: rm.long_polls_waiting)
        g = prom.Gauge("kraftlog_replica_fetches_waiting", "Follower fetches parked on this leader", registry=registry)
        g.set_function(lambda: getattr(rm, "replica_fetches_waiting", 0))
        g = prom.Gauge("kraftlog_under_replicated_partitions", "Led partitions whose ISR is smaller than their "
                       "replica set", registry=registry)
        g.set_function(lambda: getattr(rm, "under_replicated_count", lambda: 0)())
        self._ok_produce = self.produce_requests.labels("200")
        self._ok_fetch = self.fetch_requests.labels("200")


# ---- helpers ---------------------------------------------------------------------------

METADATA_REFRESH_WAIT_S = 1.0   # topic-level produce: wait this long for newer metadata before retrying


def _nothing_appended(e: KraftlogError) -> bool:
    """Errors raised before any leader appended the batch, so a retry cannot duplicate it:
    no leader, "not the leader" answered up front (it names the leader), refused connection."""
    if e.code is ErrorCode.LEADER_NOT_AVAILABLE:
        return True
    if e.code is ErrorCode.NOT_LEADER_OR_FOLLOWER:
        return "leader_id" in e.extra or "becoming leader" in e.message
    return e.code is ErrorCode.BROKER_NOT_AVAILABLE and bool(e.extra.get("refused"))


def _json_response(doc: Any, status: int = 200, media: str = JSON) -> web.Response:
    return web.Response(body=codecs.encode_document(media, doc), status=status, content_type=media)


def _error_response(err: KraftlogError) -> web.Response:
    return web.Response(body=codecs.error_body(err), status=http_status(err), content_type=JSON)


def _int_param(value: str | None, name: str, *, default: int | None = None, minimum: int = 0) -> int:
    if value is None or value == "":
        if default is None:
            raise KraftlogError(ErrorCode.INVALID_REQUEST, f"{name}: query parameter is required")
        return default
    try:
        v = int(value)
    except ValueError:
        raise KraftlogError(ErrorCode.INVALID_REQUEST, f"{name}: must be an integer, got {value!r}") from None
    if v < minimum:
        raise KraftlogError(ErrorCode.INVALID_REQUEST, f"{name}: must be >= {minimum}, got {v}")
    return v


def _partition_param(request: web.Request) -> int:
    raw = request.match_info["partition"]
    try:
        p = int(raw)
    except ValueError:
        raise KraftlogError(ErrorCode.INVALID_REQUEST, f"partition: must be an integer, got {raw!r}") from None
    if p < 0:
        raise KraftlogError(ErrorCode.INVALID_REQUEST, f"partition: must be >= 0, got {p}")
    return p


class BrokerApp:
    """Request handlers; one instance per app."""

    def __init__(self, config: BrokerConfig, deps: BrokerDeps) -> None:
        self.config = config
        self.deps = deps
        self.rm = deps.replica_manager
        self.internal_token = internal_token(config.cluster_secret)   # /internal/ routes need it when set
        self.metrics = BrokerMetrics(deps.registry, deps)
        self.round_robin = RoundRobin()

    # ---- body ---------------------------------------------------------------------------

    async def _read_body(self, request: web.Request) -> bytes:
        limit = self.config.socket_request_max_bytes
        if request.content_length is not None and request.content_length > limit:
            raise KraftlogError(ErrorCode.RECORD_LIST_TOO_LARGE,
                                f"request body of {request.content_length} bytes exceeds socket_request_max_bytes="
                                f"{limit}; split it into smaller requests")
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise KraftlogError(ErrorCode.RECORD_LIST_TOO_LARGE,
                                f"request body exceeds socket_request_max_bytes={limit}; split it into smaller "
                                "requests") from None

    async def _read_document(self, request: web.Request) -> Any:
        body = await self._read_body(request)
        mt = codecs.media_type(request.headers.get("Content-Type"))
        if mt not in (JSON, CBOR):
            raise KraftlogError(ErrorCode.UNSUPPORTED_MEDIA_TYPE,
                                f"Content-Type {mt!r} is not supported here; use {JSON} or {CBOR}")
        if not body:
            raise KraftlogError(ErrorCode.INVALID_REQUEST, "request body is empty; send a JSON object")
        return codecs.decode_document(mt, body)

    # ---- metadata & topics -------------------------------------------------------------

    @property
    def image(self):
        img = self.deps.metadata.image
        if img is None:
            raise KraftlogError(ErrorCode.BROKER_NOT_AVAILABLE,
                                "this broker has not loaded cluster metadata yet; retry in a moment")
        return img

    async def get_metadata(self, request: web.Request) -> web.Response:
        return _json_response(self.image.to_metadata_json())

    async def list_topics(self, request: web.Request) -> web.Response:
        return _json_response({"topics": sorted(self.image.topics)})

    async def create_topic(self, request: web.Request) -> web.Response:
        doc = await self._read_document(request)
        if not isinstance(doc, dict):
            raise KraftlogError(ErrorCode.INVALID_REQUEST,
                                'body must be an object {"name", "partitions", "replication_factor", "configs"}')
        unknown = set(doc) - {"name", "partitions", "replication_factor", "configs"}
        if unknown:
            raise KraftlogError(ErrorCode.INVALID_REQUEST, f"unknown field(s) {sorted(map(str, unknown))}; "
                                "allowed: name, partitions, replication_factor, configs")
        name = validate_topic_name(doc.get("name"))
        partitions = doc.get("partitions", self.config.num_partitions)
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
            raise KraftlogError(ErrorCode.INVALID_PARTITIONS,
                                f"partitions: must be an integer >= 1, got {partitions!r}")
        rf = doc.get("replication_factor", self.config.default_replication_factor)
        if isinstance(rf, bool) or not isinstance(rf, int) or rf < 1:
            raise KraftlogError(ErrorCode.INVALID_REPLICATION_FACTOR,
                                f"replication_factor: must be an integer >= 1, got {rf!r}")
        configs = doc.get("configs") or {}
        if not isinstance(configs, dict):
            raise KraftlogError(ErrorCode.INVALID_CONFIG, "configs: must be an object of string to string")
        configs = self._check_configs(configs)
        await self.deps.controller.create_topic(name, partitions, rf, configs)
        topic = await self._await_topic(name)
        return _json_response(topic, status=201)

    @staticmethod
    def _check_configs(configs: dict) -> dict:
        out = {}
        for k, v in configs.items():
            if not isinstance(k, str) or isinstance(v, (dict, list)) or v is None:
                raise KraftlogError(ErrorCode.INVALID_CONFIG,
                                    f"configs.{k}: values must be strings or numbers, got {type(v).__name__}")
            out[k] = str(v).lower() if isinstance(v, bool) else str(v)
        try:
            from partitions.log.config import validate_topic_configs
        except ImportError:  # storage not there yet: the controller validates
            return out
        try:
            validate_topic_configs(out)
        except (ValueError, KeyError) as e:
            raise KraftlogError(ErrorCode.INVALID_CONFIG, f"configs: {e}") from None
        return out

    async def _await_topic(self, name: str) -> dict:
        """Wait until this broker's metadata has the topic with leaders, then describe it."""
        def ready(img) -> bool:
            t = img.topics.get(name)
            return t is not None and bool(t.partitions) and all(
                p.leader >= 0 for p in t.partitions.values())
        await self.deps.metadata.wait_until(ready, self.config.metadata_wait_ms / 1000)
        topic = self.image.topic_json(name, include_configs=True)
        if topic is None:
            raise KraftlogError(ErrorCode.REQUEST_TIMED_OUT,
                                f"topic {name!r} was created but this broker has not seen it within "
                                f"{self.config.metadata_wait_ms} ms; retry GET /v1/topics/{name}")
        return topic

    async def describe_topic(self, request: web.Request) -> web.Response:
        """A topic's description. With `?allow_auto_create=true` (Kafka's Metadata
        allow_auto_topic_creation, what producers send) a missing topic is created when the
        broker's auto.create.topics.enable is on."""
        name = request.match_info["topic"]
        if request.query.get("allow_auto_create", "").lower() == "true":
            await self._ensure_topic(name)
        topic = self.image.topic_json(name, include_configs=True)
        if topic is None:
            raise KraftlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                f"topic {name!r} does not exist; list topics with GET /v1/topics")
        return _json_response(topic)

    async def delete_topic(self, request: web.Request) -> web.Response:
        name = request.match_info["topic"]
        if name not in self.image.topics:
            raise KraftlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                f"topic {name!r} does not exist; list topics with GET /v1/topics")
        if name == grec.OFFSETS_TOPIC:
            raise KraftlogError(ErrorCode.INVALID_TOPIC_EXCEPTION,
                                f"{name} is an internal topic (every group's committed offsets) and cannot be "
                                "deleted; delete groups with DELETE /v1/groups/{group} instead")
        await self.deps.controller.delete_topic(name)
        self.deps.groups.delete_topic(name)
        await self.deps.metadata.wait_until(lambda img: name not in img.topics,
                                            self.config.metadata_wait_ms / 1000)
        return web.Response(status=204)

    async def create_partitions(self, request: web.Request) -> web.Response:
        name = request.match_info["topic"]
        doc = await self._read_document(request)
        count = doc.get("partitions") if isinstance(doc, dict) else None
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise KraftlogError(ErrorCode.INVALID_PARTITIONS,
                                'body must be {"partitions": N} with N the new total partition count')
        if name not in self.image.topics:
            raise KraftlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist")
        await self.deps.controller.create_partitions(name, count)
        await self.deps.metadata.wait_until(
            lambda img: name in img.topics and len(img.topics[name].partitions) >= count,
            self.config.metadata_wait_ms / 1000)
        return _json_response(self.image.topic_json(name, include_configs=True))

    async def alter_configs(self, request: web.Request) -> web.Response:
        name = request.match_info["topic"]
        doc = await self._read_document(request)
        if not isinstance(doc, dict) or not isinstance(doc.get("configs"), dict):
            raise KraftlogError(ErrorCode.INVALID_CONFIG,
                                'body must be {"configs": {"key": "value" or null to reset}}')
        if name not in self.image.topics:
            raise KraftlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist")
        sets = {k: v for k, v in doc["configs"].items() if v is not None}
        configs = self._check_configs(sets)
        configs.update({k: None for k, v in doc["configs"].items() if v is None})
        await self.deps.controller.alter_configs(name, configs)
        await self.deps.metadata.wait_until(
            lambda img: name in img.topics and all(img.topics[name].configs.get(k) == v
                                                   for k, v in configs.items()),
            self.config.metadata_wait_ms / 1000)
        return _json_response(self.image.topic_json(name, include_configs=True))

    async def _ensure_topic(self, name: str):
        """The topic's image; auto-creates it when auto.create.topics.enable."""
        img = self.image
        topic = img.topics.get(name)
        if topic is not None:
            return topic
        validate_topic_name(name)
        if not self.config.auto_create_topics_enable:
            raise KraftlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                f"topic {name!r} does not exist and auto.create.topics.enable is off; "
                                "create it first (POST /v1/topics)")
        try:
            await self.deps.controller.create_topic(name, self.config.num_partitions,
                                                    self.config.default_replication_factor, {})
        except KraftlogError as e:
            if e.code is not ErrorCode.TOPIC_ALREADY_EXISTS:
                raise
        await self._await_topic(name)
        return self.image.topics[name]

    # ---- produce -----------------------------------------------------------------------

    async def _measured(self, inner, request: web.Request, requests, latency) -> web.Response:
        """Run a handler, counting it by answer status and timing it."""
        started = time.perf_counter()
        status = "500"
        try:
            resp = await inner(request)
            status = str(resp.status)
            return resp
        except KraftlogError as e:
            status = str(http_status(e))
            raise
        finally:
            requests.labels(status).inc()
            latency.observe(time.perf_counter() - started)

    async def produce_topic(self, request: web.Request) -> web.Response:
        return await self._measured(self._produce_topic, request, self.metrics.produce_requests, self.metrics.produce_latency)

    async def _produce_topic(self, request: web.Request) -> web.Response:
        name = request.match_info["topic"]
        acks = parse_acks(request.query.get("acks"))
        ct = request.headers.get("Content-Type")
        mt = codecs.media_type(ct)
        if mt == RAW_BATCH:
            raise KraftlogError(ErrorCode.UNSUPPORTED_MEDIA_TYPE,
                                "raw batches carry no partition: send them to "
                                f"/v1/topics/{name}/partitions/{{p}}/records, or send JSON/CBOR records here")
        body = await self._read_body(request)
        records = codecs.parse_produce_body(ct, body, max_records=self.config.request_max_records)
        topic = await self._ensure_topic(name)
        n_parts = len(topic.partitions)
        # assign partitions (validate all before storing anything)
        by_partition: dict[int, list[int]] = {}
        for i, r in enumerate(records):
            p = r.partition
            if p is None:
                p = (partition_for_key(r.key, n_parts) if r.key is not None
                     else self.round_robin.next(name, n_parts))
            elif p >= n_parts:
                raise KraftlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                    f"records[{i}].partition: topic {name!r} has partitions 0..{n_parts - 1}, "
                                    f"not {p}")
            by_partition.setdefault(p, []).append(i)
        max_msg = self._max_message_bytes(name)
        built = {p: codecs.build_batches([records[i] for i in idx], max_message_bytes=max_msg)
                 for p, idx in by_partition.items()}
        self.metrics.produce_bytes.inc(len(body))
        self.metrics.produce_records.inc(len(records))
        results = await asyncio.gather(*(self._append_anywhere(name, p, built[p], acks) for p in built))
        entries: list[dict | None] = [None] * len(records)
        first_error: KraftlogError | None = None
        for (p, idx), res in zip(by_partition.items(), results):
            if isinstance(res, KraftlogError):
                first_error = first_error or res
                for i in idx:
                    entries[i] = {"partition": p, "error_code": res.code.name, "message": res.message}
            else:
                for j, i in enumerate(idx):
                    entries[i] = {"partition": p, "offset": res + j}
        if acks == ACKS_NONE and first_error is None:
            return web.Response(status=202)
        media = codecs.negotiate_response_type(request.headers.get("Accept"), mt)
        if media == RAW_BATCH:
            media = JSON
        if first_error is not None:
            doc = {"error_code": first_error.code.name, "message": first_error.message, "offsets": entries}
            return _json_response(doc, http_status(first_error), media)
        return _json_response({"offsets": entries}, 200, media)

    def _max_message_bytes(self, topic: str) -> int:
        raw = self.rm.topic_config(topic).get("max.message.bytes")
        try:
            return int(raw) if raw is not None else self.config.message_max_bytes
        except ValueError:
            return self.config.message_max_bytes

    async def _append_anywhere(self, topic: str, partition: int, batches: list[bytes], acks: int):
        """Append on the local leader or forward to the remote leader. Returns the first
        offset or the KraftlogError (never raises, so one partition's failure is reported
        per record)."""
        payload = batches[0] if len(batches) == 1 else b"".join(batches)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.request_timeout_ms / 1000
        while True:
            res = await self._append_once(topic, partition, payload, acks)
            if not (isinstance(res, KraftlogError) and _nothing_appended(res)) or loop.time() >= deadline:
                return res
            # the leader moved (failover, controlled shutdown): wait for newer metadata, retry
            view = self.deps.metadata
            version = getattr(view, "version", None)
            if version is None:
                return res
            await view.wait_until(lambda _img: view.version != version,
                                  min(METADATA_REFRESH_WAIT_S, max(0.0, deadline - loop.time())))

    async def _append_once(self, topic: str, partition: int, payload: bytes, acks: int):
        try:
            part = self.rm.partitions.get((topic, partition))
            if part is not None and part.is_leader:
                res = await self.rm.append(topic, partition, payload, acks=acks,
                                           timeout_ms=self.config.request_timeout_ms)
                return res.first_offset
            leader_id, leader_url = self.rm.leader_info(topic, partition)
            if leader_id < 0 or not leader_url:
                raise KraftlogError(ErrorCode.LEADER_NOT_AVAILABLE, self.rm.no_leader_message(topic, partition))
            if leader_id == self.config.broker_id:
                # metadata says we lead but the replica manager has not caught up yet
                raise KraftlogError(ErrorCode.NOT_LEADER_OR_FOLLOWER,
                                    f"{topic}-{partition}: this broker is becoming leader; retry")
            return await self._forward(leader_url, topic, partition, payload, acks)
        except KraftlogError as e:
            return e
        except Exception as e:  # noqa: BLE001 - reported per record, logged
            log.exception("append to %s-%s failed", topic, partition)
            return KraftlogError(ErrorCode.UNKNOWN_SERVER_ERROR, f"append failed: {e}")

    async def _forward(self, leader_url: str, topic: str, partition: int, payload: bytes, acks: int) -> int:
        session = self.deps.http_session
        if session is None:
            raise KraftlogError(ErrorCode.BROKER_NOT_AVAILABLE, "forwarding is not configured on this broker")
        acks_s = "all" if acks == ACKS_ALL else str(acks)
        url = f"{leader_url.rstrip('/')}/v1/topics/{topic}/partitions/{partition}/records?acks={acks_s}"
        try:
            async with session.post(url, data=payload, headers={"Content-Type": RAW_BATCH, "Accept": JSON},
                                    timeout=aiohttp.ClientTimeout(
                                        total=self.config.request_timeout_ms / 1000 + 5)) as resp:
                body = await resp.read()
                if resp.status == 202:
                    return -1
                doc = codecs.decode_document(JSON, body) if body else {}
                if resp.status != 200:
                    err = KraftlogError.from_body(doc, fallback=f"leader answered HTTP {resp.status}")
                    if err is None:
                        raise KraftlogError(ErrorCode.UNKNOWN_SERVER_ERROR, f"leader answered HTTP {resp.status}")
                    extra = {k: v for k, v in err.extra.items() if k in ("leader_id", "leader_url")}
                    raise KraftlogError(err.code, err.message, **extra)
                return int(doc["offsets"][0]["offset"])
        except aiohttp.ClientConnectorError as e:  # refused: the request was never sent
            raise KraftlogError(ErrorCode.BROKER_NOT_AVAILABLE,
                                f"cannot reach the leader of {topic}-{partition} at {leader_url}: {e}; "
                                "retry after a metadata refresh", refused=True) from None
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            raise KraftlogError(ErrorCode.BROKER_NOT_AVAILABLE,
                                f"cannot reach the leader of {topic}-{partition} at {leader_url}: {e}; "
                                "retry after a metadata refresh") from None

    async def produce_partition(self, request: web.Request) -> web.Response:
        return await self._measured(self._produce_partition, request, self.metrics.produce_requests, self.metrics.produce_latency)

    async def _produce_partition(self, request: web.Request) -> web.Response:
        name = request.match_info["topic"]
        partition = _partition_param(request)
        acks = parse_acks(request.query.get("acks"))
        ct = request.headers.get("Content-Type")
        mt = codecs.media_type(ct)
        if mt not in (JSON, CBOR, RAW_BATCH):
            raise KraftlogError(ErrorCode.UNSUPPORTED_MEDIA_TYPE,
                                f"Content-Type {mt!r} is not supported; use {JSON}, {CBOR} or {RAW_BATCH}")
        body = await self._read_body(request)
        max_msg = self._max_message_bytes(name)
        if mt == RAW_BATCH:
            # framing, sizes and counts here; the log checks every CRC before writing anything
            headers = codecs.validate_raw_batches(body, max_message_bytes=max_msg,
                                                  max_records=self.config.request_max_records,
                                                  check_crc=False)
            n_records = sum(h.record_count for h in headers)
            payload = body
        else:
            records = codecs.parse_produce_body(ct, body, max_records=self.config.request_max_records)
            for i, r in enumerate(records):
                if r.partition is not None and r.partition != partition:
                    raise KraftlogError(ErrorCode.INVALID_RECORD,
                                        f"records[{i}].partition is {r.partition} but the URL names partition "
                                        f"{partition}; drop the field or use the topic-level route")
            headers = None
            n_records = len(records)
            if name not in self.image.topics:
                await self._ensure_topic(name)
            self.rm.leader_partition(name, partition)  # 404/421 before encoding
            payload = b"".join(codecs.build_batches(records, max_message_bytes=max_msg))
        if name not in self.image.topics:
            await self._ensure_topic(name)
        res = await self.rm.append(name, partition, payload, acks=acks, timeout_ms=self.config.request_timeout_ms)
        self.metrics.produce_bytes.inc(len(body))
        self.metrics.produce_records.inc(n_records)
        if acks == ACKS_NONE:
            return web.Response(status=202)
        media = codecs.negotiate_response_type(request.headers.get("Accept"), mt)
        if media == RAW_BATCH:
            media = JSON
        duplicate = bool(getattr(res, "duplicate", False))
        unknown = duplicate and res.first_offset < 0  # appended before the cached 5 batches
        if headers is not None:
            entries = []
            off = res.first_offset
            for h in headers:
                last = off + h.last_offset_delta
                entries.append({"partition": partition, "offset": -1 if unknown else off,
                                "last_offset": -1 if unknown else last})
                off = last + 1
        else:
            entries = [{"partition": partition, "offset": -1 if unknown else res.first_offset + j}
                       for j in range(n_records)]
        if duplicate:  # an idempotent resend: nothing appended; offsets are the original ones (or -1)
            for e in entries:
                e["duplicate"] = True
        return _json_response({"offsets": entries}, 200, media)

    # ---- fetch -------------------------------------------------------------------------

    async def fetch(self, request: web.Request) -> web.Response:
        return await self._measured(self._fetch, request, self.metrics.fetch_requests, self.metrics.fetch_latency)

    async def _fetch(self, request: web.Request) -> web.Response:
        name = request.match_info["topic"]
        partition = _partition_param(request)
        q = request.query
        offset = _int_param(q.get("offset"), "offset")
        max_bytes = min(_int_param(q.get("max_bytes"), "max_bytes", default=self.config.fetch_default_max_bytes,
                                   minimum=1), self.config.fetch_max_bytes)
        min_bytes = _int_param(q.get("min_bytes"), "min_bytes", default=1)
        max_wait_ms = min(_int_param(q.get("max_wait_ms"), "max_wait_ms", default=0),
                          self.config.fetch_max_wait_ms)
        media = codecs.negotiate_response_type(request.headers.get("Accept"), JSON)
        res = await self.rm.fetch(name, partition, offset, max_bytes=max_bytes, min_bytes=min_bytes,
                                  max_wait_ms=max_wait_ms)
        self.metrics.fetch_bytes.inc(len(res.records))
        if media == RAW_BATCH:
            return web.Response(body=res.records, content_type=RAW_BATCH, headers={
                codecs.HEADER_HIGH_WATERMARK: str(res.high_watermark),
                codecs.HEADER_NEXT_OFFSET: str(res.next_offset),
                codecs.HEADER_LOG_START_OFFSET: str(res.log_start_offset),
            })
        records, next_offset = codecs.decode_fetched(res.records, offset, binary=(media == CBOR))
        return _json_response({"records": records, "next_offset": next_offset,
                               "high_watermark": res.high_watermark,
                               "log_start_offset": res.log_start_offset}, 200, media)

    async def offsets(self, request: web.Request) -> web.Response:
        name = request.match_info["topic"]
        partition = _partition_param(request)
        ts = request.query.get("timestamp")
        if ts is not None:
            t = _int_param(ts, "timestamp")
            return _json_response({"offset": self.rm.offset_for_timestamp(name, partition, t)})
        return _json_response(self.rm.offsets(name, partition))

    async def delete_records(self, request: web.Request) -> web.Response:
        name = request.match_info["topic"]
        partition = _partition_param(request)
        doc = await self._read_document(request)
        before = doc.get("before_offset") if isinstance(doc, dict) else None
        if isinstance(before, bool) or not isinstance(before, int) or before < -1:
            raise KraftlogError(ErrorCode.INVALID_REQUEST,
                                'before_offset: body must be {"before_offset": N} with N >= 0 '
                                "(or -1 for the high watermark)")
        lso = await self.rm.delete_records(name, partition, before)
        return _json_response({"log_start_offset": lso})

    # ---- internal: replication (broker to broker; wire format in http_api/broker/replica_client.py) ----

    async def replica_fetch(self, request: web.Request) -> web.Response:
        """A follower's batched long poll for every partition it follows from this leader."""
        doc = await self._read_document(request)
        try:
            replica_id = int(doc["replica_id"])
            broker_epoch = int(doc.get("broker_epoch", -1))
            parts = [ReplicaFetchRequest(str(e["topic"]), int(e["partition"]), int(e["offset"]),
                                         int(e["leader_epoch"]), int(e.get("high_watermark", -1)))
                     for e in doc["partitions"]]
            max_wait_ms = min(max(0, int(doc.get("max_wait_ms", 0))), self.config.fetch_max_wait_ms)
            max_bytes = min(max(1, int(doc.get("max_bytes", self.config.fetch_max_bytes))),
                            self.config.fetch_max_bytes)
            part_max = min(max(1, int(doc.get("partition_max_bytes", self.config.fetch_default_max_bytes))),
                           max_bytes)
        except (KeyError, TypeError, ValueError, AttributeError):
            raise KraftlogError(ErrorCode.INVALID_REQUEST,
                                "replica-fetch body needs replica_id and partitions: [{topic, partition, offset, "
                                "leader_epoch}]") from None
        results = await self.rm.replica_fetch(replica_id, parts, max_bytes=max_bytes, partition_max_bytes=part_max,
                                              max_wait_ms=max_wait_ms, broker_epoch=broker_epoch)
        entries, chunks = [], []
        for req, res in zip(parts, results):
            if isinstance(res, KraftlogError):
                entries.append(replica_client.error_entry(req.topic, req.partition, res))
            else:
                entries.append({"topic": req.topic, "partition": req.partition, "size": len(res.records),
                                "high_watermark": res.high_watermark, "log_start_offset": res.log_start_offset,
                                "log_end_offset": res.log_end_offset})
                chunks.append(res.records)
        head = replica_client.encode_fetch_header(entries)
        resp = web.StreamResponse(headers={"Content-Type": replica_client.REPLICA_FETCH_MEDIA})
        body_bytes = sum(len(c) for c in chunks)
        self.metrics.replica_fetch_requests.inc()
        self.metrics.replica_fetch_bytes.inc(body_bytes)
        resp.content_length = len(head) + body_bytes
        if self.rm.closing:
            resp.force_close()   # stopping: the follower must not re-fetch on this connection
        await resp.prepare(request)
        await resp.write(head)
        for c in chunks:
            if len(c):
                await resp.write(c)
        await resp.write_eof()
        return resp

    async def epoch_end_offsets(self, request: web.Request) -> web.Response:
        """OffsetsForLeaderEpoch, batched: where each requested epoch ends in the leader's log."""
        doc = await self._read_document(request)
        try:
            asks = [(str(e["topic"]), int(e["partition"]), int(e["epoch"]),
                     int(e["leader_epoch"]) if e.get("leader_epoch") is not None else None)
                    for e in doc["partitions"]]
        except (KeyError, TypeError, ValueError, AttributeError):
            raise KraftlogError(ErrorCode.INVALID_REQUEST,
                                "epoch-end-offsets body needs partitions: [{topic, partition, epoch, "
                                "leader_epoch}]") from None
        out = []
        for topic, p, epoch, leader_epoch in asks:
            try:
                e, end = self.rm.epoch_end_offset(topic, p, epoch, leader_epoch)
                out.append({"topic": topic, "partition": p, "epoch": e, "end_offset": end})
            except KraftlogError as err:
                out.append(replica_client.error_entry(topic, p, err))
        return _json_response({"partitions": out})

    async def init_producer_id(self, request: web.Request) -> web.Response:
        """A producer id for an idempotent producer (blocks come from the controller)."""
        if self.deps.producer_ids is None:
            from http_api.broker.producer_ids import ProducerIdAllocator
            self.deps.producer_ids = ProducerIdAllocator(self.deps.controller, self.config.broker_id, lambda: -1).next
        pid = await self.deps.producer_ids()
        return _json_response({"producer_id": pid, "producer_epoch": 0})

    # ---- groups: http_api/broker/groups.py (coordinator on the __consumer_offsets leaders) --

    # ---- ops ---------------------------------------------------------------------------

    async def healthz(self, request: web.Request) -> web.Response:
        if self.deps.health is not None:
            ready, info = self.deps.health()
        else:
            ready, info = self.deps.metadata.image is not None, {"broker_id": self.config.broker_id}
        ready = ready and self.deps.metadata.image is not None
        return _json_response(dict(info, status="ok" if ready else "starting"), 200 if ready else 503)

    async def metrics_handler(self, request: web.Request) -> web.Response:
        return web.Response(body=prom.generate_latest(self.deps.registry),
                            headers={"Content-Type": prom.CONTENT_TYPE_LATEST})

    async def openapi(self, request: web.Request) -> web.Response:
        from http_api.broker.openapi import openapi_document
        return _json_response(openapi_document(self.config.url))


@web.middleware
async def _error_middleware(request: web.Request, handler):
    cid = request.headers.get(CORRELATION_HEADER)
    client_id = request.headers.get(CLIENT_ID_HEADER)
    if client_id and log.isEnabledFor(logging.DEBUG):
        log.debug("%s %s client_id=%s correlation_id=%s", request.method, request.path, client_id, cid)
    try:
        if request.path.startswith(INTERNAL_PATH_PREFIX) and not token_ok(
                request.app[BROKER_KEY].internal_token, request.headers.get(INTERNAL_TOKEN_HEADER)):
            raise KraftlogError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                                f"{request.path} is for the brokers of this cluster: the request lacks the token "
                                "of the cluster secret (set the same `password` on every node)")
        resp = await handler(request)
    except KraftlogError as e:
        resp = _error_response(e)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        code = ErrorCode.RECORD_LIST_TOO_LARGE if e.status == 413 else ErrorCode.INVALID_REQUEST
        msg = (f"no route {request.method} {request.path}; see GET /openapi.json" if e.status in (404, 405)
               else e.reason)
        resp = web.Response(body=codecs.error_body(KraftlogError(code, msg)), status=e.status,
                            content_type=JSON)
    except asyncio.CancelledError:
        raise
    except Exception as e:  # noqa: BLE001 - a bug must not kill the broker
        log.exception("unhandled error in %s %s (client_id=%s)", request.method, request.path, client_id)
        resp = _error_response(KraftlogError(ErrorCode.UNKNOWN_SERVER_ERROR,
                                             f"internal error: {type(e).__name__}: {e}; see the broker log"))
    if cid is not None:
        resp.headers[CORRELATION_HEADER] = cid
    return resp


def create_app(config: BrokerConfig, deps: BrokerDeps) -> web.Application:
    """The broker aiohttp app; `deps` are injected (real in server.py, fakes in tests)."""
    app = web.Application(middlewares=[_error_middleware], client_max_size=config.socket_request_max_bytes)
    h = BrokerApp(config, deps)
    app[BROKER_KEY] = h
    r = app.router
    r.add_get("/v1/metadata", h.get_metadata)
    r.add_get("/v1/topics", h.list_topics)
    r.add_post("/v1/topics", h.create_topic)
    r.add_get("/v1/topics/{topic}", h.describe_topic)
    r.add_delete("/v1/topics/{topic}", h.delete_topic)
    r.add_post("/v1/topics/{topic}/partitions", h.create_partitions)
    r.add_post("/v1/topics/{topic}/configs", h.alter_configs)
    r.add_post("/v1/topics/{topic}/records", h.produce_topic)
    r.add_post("/v1/topics/{topic}/partitions/{partition}/records", h.produce_partition)
    r.add_get("/v1/topics/{topic}/partitions/{partition}/records", h.fetch)
    r.add_get("/v1/topics/{topic}/partitions/{partition}/offsets", h.offsets)
    r.add_post("/v1/topics/{topic}/partitions/{partition}/delete-records", h.delete_records)
    from http_api.broker.groups import install_group_routes  # consumer groups: /v1/groups...
    install_group_routes(app, h)
    r.add_post("/v1/producer-ids", h.init_producer_id)
    from http_api.broker.log_cleaner import install_log_cleaner_routes  # /admin/v1/log-cleaner...
    install_log_cleaner_routes(app, h)
    r.add_post("/internal/v1/replica-fetch", h.replica_fetch)
    r.add_post("/internal/v1/epoch-end-offsets", h.epoch_end_offsets)
    r.add_get("/healthz", h.healthz)
    r.add_get("/metrics", h.metrics_handler)
    r.add_get("/openapi.json", h.openapi)

    async def _session(app: web.Application):
        own = deps.http_session is None
        if own:
            deps.http_session = aiohttp.ClientSession()
        yield
        if own and deps.http_session is not None:
            await deps.http_session.close()
            deps.http_session = None

    app.cleanup_ctx.append(_session)
    return app
