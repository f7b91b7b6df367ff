"""Metadata and topic administration routes: `GET /v1/metadata`, `/v1/topics` (list, create,
describe with optional auto-create, delete), `POST /v1/topics/{t}/partitions` and
`/v1/topics/{t}/configs`. Changes go to the controller; the answer waits until this broker's
metadata shows them.
"""
from __future__ import annotations

from aiohttp import web

from http_api.broker.context import Routes, json_response, validate_topic_name
from partitions import internal_topics
from partitions.errors import ErrorCode, KraftlogError
from partitions.log.config import validate_topic_configs


class TopicRoutes(Routes):
    """Metadata and topic admin handlers."""

    async def get_metadata(self, request: web.Request) -> web.Response:
        return json_response(self.image.to_metadata_json())

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
        await self.deps.controller.create_topic(name, partitions, rf, configs)
        topic = await self.ctx.await_topic(name)
        return json_response(topic, status=201)

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
