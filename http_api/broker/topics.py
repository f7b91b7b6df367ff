"""Metadata and topic administration routes: `GET /v1/metadata`, `/v1/topics` (list, create,
describe with optional auto-create, delete), `POST /v1/topics/{t}/partitions` and
`/v1/topics/{t}/configs`. Changes go to the controller; the answer waits until this broker's
metadata shows them.

Creating a topic (issue 25) answers 201 once the topic is ready on its brokers: this
broker's published metadata has it (whole: every partition with a leader) and every
broker hosting a replica has published the metadata offset that created it (its `/healthz`
`published_metadata_offset`, so its logs exist and its leaders serve). When that takes
longer than `metadata_wait_ms`, the answer is 202 with the topic as the controller created
it plus `"creating": true`, `"brokers_pending"` and a `Location` to poll: the topic exists
and is still being created; `GET /v1/topics/{t}` answers 404 on a broker until that broker
shows it whole, then 200.
"""
from __future__ import annotations

import asyncio
import json

import aiohttp
from aiohttp import web

from http_api.broker.context import Routes, json_response, validate_topic_name
from http_api.wire.codecs import JSON
from partitions import internal_topics
from partitions.errors import ErrorCode, KraftlogError
from partitions.log.config import validate_topic_configs


def _topic_ready(img, name: str) -> bool:
    """The image has topic `name` with a leader for every partition."""
    t = img.topics.get(name)
    return t is not None and bool(t.partitions) and all(p.leader >= 0 for p in t.partitions.values())


# partitions of the `GET /v1/metadata` body encoded per turn of the event loop
METADATA_BODY_SLICE_PARTITIONS = 2000


async def metadata_body_in_slices(img, slice_partitions: int = METADATA_BODY_SLICE_PARTITIONS) -> bytes:
    """The `GET /v1/metadata` body of `img` (the same bytes as `json_response(img.to_metadata_json())`),
    built a topic at a time with a turn of the event loop after every `slice_partitions`
    partitions: at 100,000 partitions the body is 14 MB and took 1.05 s of CPU in one turn."""
    def enc(doc) -> str:
        return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)
    head = enc({"cluster_id": img.cluster_id, "controller_id": img.controller_id,
                "brokers": [img.brokers[b].to_json() for b in sorted(img.brokers)]})
    parts = []
    since_yield = 0
    for name in sorted(img.topics):
        t = img.topics[name]
        parts.append(enc(t.to_json()))
        since_yield += len(t.partitions)
        if since_yield >= slice_partitions:
            since_yield = 0
            await asyncio.sleep(0)
    return (head[:-1] + ',"topics":[' + ",".join(parts) + "]}").encode("utf-8")


class TopicRoutes(Routes):
    """Metadata and topic admin handlers."""

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._metadata_body: tuple | None = None   # (image, its GET /v1/metadata body)

    async def get_metadata(self, request: web.Request) -> web.Response:
        img = self.image
        cached = self._metadata_body
        if cached is None or cached[0] is not img:   # a published image never changes: one body per image
            cached = self._metadata_body = (img, await metadata_body_in_slices(img))
        return web.Response(body=cached[1], content_type=JSON)

    async def list_topics(self, request: web.Request) -> web.Response:
        return json_response({"topics": sorted(self.image.topics)})

    async def create_topic(self, request: web.Request) -> web.Response:
        doc = await self.ctx.read_document(request)
        if not isinstance(doc, dict):
            raise KraftlogError(ErrorCode.INVALID_REQUEST,
                                'body must be an object {"name", "partitions", "replication_factor", "configs"}')
        unknown = set(doc) - {"name", "partitions", "replication_factor", "configs"}
        if unknown:
            raise KraftlogError(ErrorCode.INVALID_REQUEST, f"unknown field(s) {sorted(map(str, unknown))}; "
                                "allowed: name, partitions, replication_factor, configs")
        name = validate_topic_name(doc.get("name"))
        internal_topics.check_client_write(name, "creation")
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
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.metadata_wait_ms / 1000
        created = await self.deps.controller.create_topic(name, partitions, rf, configs)
        created_offset = created.get("metadata_offset") if isinstance(created, dict) else None
        ready = await self.deps.metadata.wait_until(lambda img: _topic_ready(img, name),
                                                    max(0.0, deadline - loop.time()))
        pending = await self._brokers_pending(name, created_offset, deadline) if ready else None
        if ready and not pending:
            return json_response(self.image.topic_json(name, include_configs=True), status=201)
        return self._still_creating(name, created, pending)

    async def _brokers_pending(self, name: str, created_offset, deadline: float) -> list:
        """Brokers hosting a replica of `name` whose published metadata does not reach
        `created_offset` by `deadline` (asked through their /healthz, every 50-200 ms)."""
        topic = self.image.topics.get(name)
        if topic is None or created_offset is None or self.deps.http_session is None:
            return []
        loop = asyncio.get_running_loop()
        ids = sorted({b for reg in topic.partitions.values() for b in reg.replicas} - {self.config.broker_id})
        pending = list(ids)
        backoff = 0.05
        while pending:
            left = []
            for b in pending:
                if not await self._broker_reached(b, created_offset, deadline - loop.time()):
                    left.append(b)
            pending = left
            if not pending or loop.time() + backoff >= deadline:
                break
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 0.2)
        return pending

    async def _broker_reached(self, broker_id: int, offset: int, timeout_s: float) -> bool:
        broker = self.image.brokers.get(broker_id)
        if broker is None or not broker.url or timeout_s <= 0:
            return False
        try:
            async with self.deps.http_session.get(
                    f"{broker.url.rstrip('/')}/healthz",
                    timeout=aiohttp.ClientTimeout(total=max(0.05, min(timeout_s, 2.0)))) as resp:
                body = await resp.json(content_type=None)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError):
            return False
        published = body.get("published_metadata_offset") if isinstance(body, dict) else None
        return isinstance(published, int) and published >= offset

    def _still_creating(self, name: str, created: dict, pending) -> web.Response:
        """202: the topic exists (as the controller created it) and is still being created
        on its brokers; poll `Location` until it answers 200 (never a bare timeout)."""
        doc = {k: v for k, v in (created or {}).items() if k != "metadata_offset"}
        doc.setdefault("name", name)
        doc["creating"] = True
        if pending is None:   # this broker has not published it yet
            doc["brokers_pending"] = [self.config.broker_id]
        else:
            doc["brokers_pending"] = pending
        doc["message"] = (f"topic {name!r} was created and is still being set up on brokers "
                          f"{doc['brokers_pending']} after {self.config.metadata_wait_ms} ms; poll GET "
                          f"/v1/topics/{name} on the broker you use until it answers 200")
        resp = json_response(doc, status=202)
        resp.headers["Location"] = f"/v1/topics/{name}"
        resp.headers["Retry-After"] = "1"
        return resp

    @staticmethod
    def _check_configs(configs: dict) -> dict:
        out = {}
        for k, v in configs.items():
            if not isinstance(k, str) or isinstance(v, (dict, list)) or v is None:
                raise KraftlogError(ErrorCode.INVALID_CONFIG,
                                    f"configs.{k}: values must be strings or numbers, got {type(v).__name__}")
            out[k] = str(v).lower() if isinstance(v, bool) else str(v)
        try:
            validate_topic_configs(out)
        except (ValueError, KeyError) as e:
            raise KraftlogError(ErrorCode.INVALID_CONFIG, f"configs: {e}") from None
        return out

    async def describe_topic(self, request: web.Request) -> web.Response:
        """A topic's description. With `?allow_auto_create=true` (Kafka's Metadata
        allow_auto_topic_creation, what producers send) a missing topic is created when the
        broker's auto.create.topics.enable is on."""
        name = request.match_info["topic"]
        if (request.query.get("allow_auto_create", "").lower() == "true"
                and not internal_topics.is_internal_topic(name)):   # its coordinator creates it
            await self.ctx.ensure_topic(name)
        topic = self.image.topic_json(name, include_configs=True)
        if topic is None:
            raise KraftlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                f"topic {name!r} does not exist; list topics with GET /v1/topics")
        return json_response(topic)

    async def delete_topic(self, request: web.Request) -> web.Response:
        name = request.match_info["topic"]
        if name not in self.image.topics:
            raise KraftlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                f"topic {name!r} does not exist; list topics with GET /v1/topics")
        internal_topics.check_deletion(name)
        await self.deps.controller.delete_topic(name)
        self.deps.groups.delete_topic(name)
        await self.deps.metadata.wait_until(lambda img: name not in img.topics,
                                            self.config.metadata_wait_ms / 1000)
        return web.Response(status=204)

    async def create_partitions(self, request: web.Request) -> web.Response:
        name = request.match_info["topic"]
        internal_topics.check_partition_change(name)
        doc = await self.ctx.read_document(request)
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
        return json_response(self.image.topic_json(name, include_configs=True))

    async def alter_configs(self, request: web.Request) -> web.Response:
        name = request.match_info["topic"]
        doc = await self.ctx.read_document(request)
        if not isinstance(doc, dict) or not isinstance(doc.get("configs"), dict):
            raise KraftlogError(ErrorCode.INVALID_CONFIG,
                                'body must be {"configs": {"key": "value" or null to reset}}')
        internal_topics.check_config_change(name, doc["configs"])
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
        return json_response(self.image.topic_json(name, include_configs=True))
