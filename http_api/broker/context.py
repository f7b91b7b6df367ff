"""What every route of the broker app shares: the injected dependencies (`BrokerDeps`), the
metrics, and `BrokerContext` (request body limits, the metadata image, topic auto-creation,
measured handlers). Route modules (`topics`, `produce`, `fetch`, `replica`, `ops`, and the
group and log cleaner routes) each hold a `Routes` class over one shared `BrokerContext`;
`app.create_app` wires them into the aiohttp app.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Optional, Protocol

from aiohttp import web
import aiohttp
import prometheus_client as prom

from http_api.broker.config import BrokerConfig
from http_api.broker.group_offsets import GroupOffsetStore
from http_api.broker.internal_auth import internal_token
from http_api.wire import codecs
from http_api.wire.auth import broker_auth_headers
from http_api.wire.codecs import CBOR, JSON
from http_api.wire.errors import ErrorCode, KraftlogError, http_status
from partitions.clock import SYSTEM_CLOCK, Clock

if TYPE_CHECKING:
    from http_api.broker.authorization import BrokerAuthorizer
    from http_api.wire.auth import Authenticator
    from http_api.broker.metadata_view import MetadataView
    from partitions.log.log_scheduler import LogScheduler
    from partitions.replication.replica_manager import ReplicaManager

TOPIC_NAME_MAX_CHARS = 249
_TOPIC_RE = re.compile(r"^[A-Za-z0-9._\-]+$")


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

    # users, tokens, ACLs (http_api/broker/security_admin.py); answers carry "metadata_offset"
    async def create_user(self, name: str, credential: dict) -> dict: ...

    async def alter_user(self, name: str, credential: dict) -> dict: ...

    async def delete_user(self, name: str) -> dict: ...

    async def create_token(self, principal: str, token_id: str, token_hash: str,
                           lifetime_ms: Optional[int] = None) -> dict: ...

    async def delete_token(self, token_id: str) -> dict: ...

    async def create_acls(self, bindings: list) -> dict: ...

    async def delete_acls(self, bindings: list) -> dict: ...


@dataclass
class BrokerDeps:
    """What the app needs from the broker process (or from a test)."""

    replica_manager: ReplicaManager
    metadata: MetadataView           # .image, .security (users, tokens, ACLs), .wait_until(pred, timeout_s)
    controller: ControllerAdmin
    groups: GroupOffsetStore
    registry: prom.CollectorRegistry = field(default_factory=prom.CollectorRegistry)
    http_session: aiohttp.ClientSession | None = None   # for forwarding; created on startup
    # () -> (ready, info dict); default: ready once metadata is loaded
    health: Callable[[], tuple[bool, dict]] | None = None
    # async () -> a fresh producer id (POST /v1/producer-ids)
    producer_ids: Callable[[], Awaitable[int]] | None = None
    log_scheduler: LogScheduler | None = None   # retention + log cleaner; None: one on demand
    clock: Clock = SYSTEM_CLOCK   # the group coordinator's time (sessions, offsets retention)
    # () -> the current SecurityImage (users, tokens, ACLs); None: MetadataView.security
    security_image: Callable[[], Any] | None = None


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
        g.set_function(lambda: rm.replica_fetches_waiting)
        g = prom.Gauge("kraftlog_under_replicated_partitions", "Led partitions whose ISR is smaller than their "
                       "replica set", registry=registry)
        g.set_function(lambda: getattr(rm, "under_replicated_count", lambda: 0)())
        self._ok_produce = self.produce_requests.labels("200")
        self._ok_fetch = self.fetch_requests.labels("200")


# ---- request helpers -------------------------------------------------------------------

def json_response(doc: Any, status: int = 200, media: str = JSON) -> web.Response:
    return web.Response(body=codecs.encode_document(media, doc), status=status, content_type=media)


def int_param(value: str | None, name: str, *, default: int | None = None, minimum: int = 0) -> int:
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


def partition_param(request: web.Request) -> int:
    raw = request.match_info["partition"]
    try:
        p = int(raw)
    except ValueError:
        raise KraftlogError(ErrorCode.INVALID_REQUEST, f"partition: must be an integer, got {raw!r}") from None
    if p < 0:
        raise KraftlogError(ErrorCode.INVALID_REQUEST, f"partition: must be >= 0, got {p}")
    return p


class BrokerContext:
    """What the routes of one broker app share (one instance per app, `app[BROKER_KEY]`)."""

    def __init__(self, config: BrokerConfig, deps: BrokerDeps) -> None:
        self.config = config
        self.deps = deps
        self.rm = deps.replica_manager
        self.internal_token = internal_token(config.cluster_secret)   # /internal/ routes need it when set
        # what this broker sends to other brokers as `User:broker-<id>` (empty: no password set)
        self.internal_headers = broker_auth_headers(config.security, config.broker_id)
        self.authenticator: Authenticator | None = None   # set by create_app
        self.authorizer: BrokerAuthorizer | None = None
        self.metrics = BrokerMetrics(deps.registry, deps)

    async def read_body(self, request: web.Request) -> bytes:
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

    async def read_document(self, request: web.Request) -> Any:
        body = await self.read_body(request)
        mt = codecs.media_type(request.headers.get("Content-Type"))
        if mt not in (JSON, CBOR):
            raise KraftlogError(ErrorCode.UNSUPPORTED_MEDIA_TYPE,
                                f"Content-Type {mt!r} is not supported here; use {JSON} or {CBOR}")
        if not body:
            raise KraftlogError(ErrorCode.INVALID_REQUEST, "request body is empty; send a JSON object")
        return codecs.decode_document(mt, body)

    @property
    def image(self):
        img = self.deps.metadata.image
        if img is None:
            raise KraftlogError(ErrorCode.BROKER_NOT_AVAILABLE,
                                "this broker has not loaded cluster metadata yet; retry in a moment")
        return img

    async def ensure_topic(self, name: str):
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
        await self.await_topic(name)
        return self.image.topics[name]

    async def await_topic(self, name: str) -> dict:
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

    async def measured(self, inner, request: web.Request, requests, latency) -> web.Response:
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


class Routes:
    """Base of the route classes: one concern's handlers over the shared `BrokerContext`."""

    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx
        self.config = ctx.config
        self.deps = ctx.deps
        self.rm = ctx.rm
        self.metrics = ctx.metrics

    @property
    def image(self):
        return self.ctx.image
