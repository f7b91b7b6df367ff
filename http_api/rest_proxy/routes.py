"""The Confluent REST Proxy v2 routes of a broker (see http_api/rest_proxy/__init__.py)."""
from __future__ import annotations

import base64
import binascii
import functools
import json
from typing import Any

import aiohttp
from aiohttp import web

from http_api.broker.context import BrokerContext
from http_api.broker.streaming import internal_session, loopback_consumer
from http_api.rest_proxy import errors as rpe
from http_api.rest_proxy.consumers import (AUTO_COMMIT_INTERVAL_MS, CONSUMER_REQUEST_MAX_BYTES, FORMATS, RESETS,
                                           ConsumerInstance, ConsumerInstances)
from http_api.wire.auth import principal_of
from partitions.errors import KraftlogError

V2 = "application/vnd.kafka.v2+json"
V2_JSON = "application/vnd.kafka.json.v2+json"
V2_BINARY = "application/vnd.kafka.binary.v2+json"
_EMBEDDED = {V2_JSON: "json", V2_BINARY: "binary"}
_OTHER_EMBEDDED = ("application/vnd.kafka.avro.v2+json", "application/vnd.kafka.protobuf.v2+json",
                   "application/vnd.kafka.jsonschema.v2+json")
# request bodies of the non-produce routes, and answers Confluent's proxy serves as v2 JSON
_GENERIC = {V2, "application/vnd.kafka+json", "application/json", "*/*", "application/*", V2_JSON, V2_BINARY,
            *_OTHER_EMBEDDED}
PRODUCE_TIMEOUT_S = 60


def _types(header: str | None) -> list[str]:
    return [t.split(";")[0].strip().lower() for t in (header or "").split(",") if t.strip()]


def _check_accept(request: web.Request) -> None:
    accept = _types(request.headers.get("Accept"))
    if accept and not any(t in _GENERIC for t in accept):
        raise rpe.RestProxyError(406, f"HTTP 406 Not Acceptable (Accept {request.headers.get('Accept')!r}; this "
                                 f"route answers {V2})")


def _check_content_type(request: web.Request) -> None:
    ct = _types(request.headers.get("Content-Type"))
    if request.can_read_body and ct and ct[0] not in _GENERIC - {"*/*", "application/*"}:
        raise rpe.RestProxyError(415, f"HTTP 415 Unsupported Media Type (Content-Type {ct[0]!r}; send {V2})")


def _answer(doc: Any, status: int = 200, content_type: str = V2) -> web.Response:
    return web.Response(body=json.dumps(doc).encode(), status=status, content_type=content_type)


def confluent(handler):
    """Answer what a handler raises in Confluent's error shape; check the media types."""
    @functools.wraps(handler)
    async def wrapped(self, request: web.Request) -> web.StreamResponse:
        try:
            return await handler(self, request)
        except rpe.RestProxyError as e:
            return e.response()
        except KraftlogError as e:
            return rpe.from_kraftlog(e).response()
    return wrapped


async def _body(request: web.Request, required: bool = True) -> Any:
    raw = await request.read()
    if not raw.strip():
        if required:
            raise rpe.invalid("Request body is empty. Data is required.")
        return None
    try:
        return json.loads(raw)
    except ValueError as e:
        raise rpe.RestProxyError(400, f"Unexpected character in the JSON request body: {e}", 400) from None


def _tps(doc: Any, field: str = "partitions") -> list[tuple[str, int]]:
    items = doc.get(field) if isinstance(doc, dict) else None
    if not isinstance(items, list):
        raise rpe.invalid(f'{field}: give {{"{field}": [{{"topic": "t", "partition": 0}}, ...]}}')
    out = []
    for i, e in enumerate(items):
        if not (isinstance(e, dict) and isinstance(e.get("topic"), str) and isinstance(e.get("partition"), int)
                and not isinstance(e.get("partition"), bool)):
            raise rpe.invalid(f"{field}[{i}]: must be {{\"topic\": string, \"partition\": integer}}")
        out.append((e["topic"], e["partition"]))
    return out


def _offsets(doc: Any) -> list[tuple[str, int, int]]:
    items = doc.get("offsets") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        raise rpe.invalid('offsets: give {"offsets": [{"topic": "t", "partition": 0, "offset": 0}, ...]}')
    out = []
    for i, e in enumerate(items):
        ok = isinstance(e, dict) and isinstance(e.get("topic"), str)
        for f in ("partition", "offset"):
            ok = ok and isinstance(e.get(f), int) and not isinstance(e.get(f), bool) and e[f] >= 0
        if not ok:
            raise rpe.invalid(f"offsets[{i}]: must be {{\"topic\": string, \"partition\": int >= 0, "
                              "\"offset\": int >= 0}}")
        out.append((e["topic"], e["partition"], e["offset"]))
    return out


def _bytes_of(fmt: str, v: Any, what: str) -> str | None:
    """A record key/value of the embedded format as base64 of its bytes (None stays None)."""
    if v is None:
        return None
    if fmt == "json":
        return base64.b64encode(json.dumps(v, separators=(",", ":")).encode()).decode()
    if not isinstance(v, str):
        raise rpe.RestProxyError(rpe.JSON_CONVERSION, f"Conversion of JSON to Object failed: {what} must be a "
                                 "base64 string in the binary embedded format")
    try:
        base64.b64decode(v, validate=True)
    except (binascii.Error, ValueError):
        raise rpe.RestProxyError(rpe.JSON_CONVERSION, f"Conversion of JSON to Object failed: {what} is not valid "
                                 "base64") from None
    return v


def _render(fmt: str, data: bytes | None) -> Any:
    if data is None:
        return None
    if fmt == "binary":
        return base64.b64encode(data).decode()
    try:
        return json.loads(data)
    except ValueError:
        raise rpe.RestProxyError(rpe.KAFKA_ERROR, "Kafka error: a record is not JSON and cannot be returned in "
                                 "the json embedded format; consume it with a binary consumer instance") from None


class RestProxyRoutes:
    """Handlers of the v2 API over one broker's `BrokerContext`."""

    def __init__(self, ctx: BrokerContext, instances: ConsumerInstances) -> None:
        self.ctx = ctx
        self.instances = instances

    # ---- topics ----------------------------------------------------------------------

    def _visible(self, request: web.Request, names) -> list[str]:
        az = self.ctx.authorizer
        names = sorted(n for n in names if not n.startswith("__"))
        principal = principal_of(request)
        if az is None or not az.security.secured:
            return names
        from metadata_quorum.security.acl import ResourceType
        return az.describable(principal, ResourceType.TOPIC, names)

    def _topic(self, name: str):
        t = self.ctx.image.topics.get(name)
        if t is None:
            raise rpe.topic_not_found(name)
        return t

    @staticmethod
    def _partition_doc(reg) -> dict:
        return {"partition": reg.partition, "leader": reg.leader,
                "replicas": [{"broker": b, "leader": b == reg.leader, "in_sync": b in reg.isr} for b in reg.replicas]}

    @confluent
    async def list_topics(self, request: web.Request) -> web.Response:
        _check_accept(request)
        return _answer(self._visible(request, self.ctx.image.topics))

    @confluent
    async def describe_topic(self, request: web.Request) -> web.Response:
        _check_accept(request)
        t = self._topic(request.match_info["topic"])
        return _answer({"name": t.name, "configs": dict(t.configs),
                        "partitions": [self._partition_doc(t.partitions[p]) for p in sorted(t.partitions)]})

    @confluent
    async def list_partitions(self, request: web.Request) -> web.Response:
        _check_accept(request)
        t = self._topic(request.match_info["topic"])
        return _answer([self._partition_doc(t.partitions[p]) for p in sorted(t.partitions)])

    def _partition(self, request: web.Request):
        t = self._topic(request.match_info["topic"])
        raw = request.match_info["partition"]
        try:
            p = int(raw)
        except ValueError:
            raise rpe.partition_not_found(t.name, raw) from None
        if p not in t.partitions:
            raise rpe.partition_not_found(t.name, p)
        return t, p

    @confluent
    async def describe_partition(self, request: web.Request) -> web.Response:
        _check_accept(request)
        t, p = self._partition(request)
        return _answer(self._partition_doc(t.partitions[p]))

    # ---- produce ---------------------------------------------------------------------

    @confluent
    async def produce_topic(self, request: web.Request) -> web.Response:
        return await self._produce(request, request.match_info["topic"], None)

    @confluent
    async def produce_partition(self, request: web.Request) -> web.Response:
        t, p = self._partition(request)
        return await self._produce(request, t.name, p)

    async def _produce(self, request: web.Request, topic: str, partition: int | None) -> web.Response:
        _check_accept(request)
        ct = _types(request.headers.get("Content-Type"))
        fmt = _EMBEDDED.get(ct[0]) if ct else None
        if fmt is None:
            if ct and ct[0] in _OTHER_EMBEDDED:
                raise rpe.RestProxyError(415, f"HTTP 415 Unsupported Media Type: the embedded format of {ct[0]} "
                                         "needs a schema registry; send json or binary records "
                                         f"({V2_JSON} or {V2_BINARY})")
            raise rpe.RestProxyError(415, f"HTTP 415 Unsupported Media Type: produce with Content-Type {V2_JSON} "
                                     f"or {V2_BINARY}")
        doc = await _body(request)
        records = doc.get("records") if isinstance(doc, dict) else None
        if not isinstance(records, list) or not records:
            raise rpe.invalid('records: give {"records": [{"key"?, "value", "partition"?}, ...]}')
        out = []
        for i, r in enumerate(records):
            if not isinstance(r, dict):
                raise rpe.invalid(f"records[{i}]: must be an object")
            rec: dict = {"value_b64": _bytes_of(fmt, r.get("value"), f"records[{i}].value")}
            key = _bytes_of(fmt, r.get("key"), f"records[{i}].key")
            if key is not None:
                rec["key_b64"] = key
            p = r.get("partition") if partition is None else partition
            if p is not None:
                if isinstance(p, bool) or not isinstance(p, int) or p < 0:
                    raise rpe.invalid(f"records[{i}].partition: must be an integer >= 0")
                t = self.ctx.image.topics.get(topic)
                if t is not None and p not in t.partitions:
                    raise rpe.partition_not_found(topic, p)
                rec["partition"] = p
            out.append(rec)
        if topic not in self.ctx.image.topics and not self.ctx.config.auto_create_topics_enable:
            raise rpe.topic_not_found(topic)
        # the broker's own produce route (partitioning by key, forwarding to leaders, auto-creation)
        async with internal_session(self.ctx, request) as session:
            try:
                async with session.post(f"{self.ctx.config.url.rstrip('/')}/v1/topics/{topic}/records",
                                        json={"records": out}, headers={"Accept": "application/json"},
                                        timeout=aiohttp.ClientTimeout(total=PRODUCE_TIMEOUT_S)) as resp:
                    answer = await resp.json(content_type=None)
            except (aiohttp.ClientError, TimeoutError, ValueError) as e:
                raise rpe.RestProxyError(rpe.KAFKA_RETRIABLE_ERROR, f"Kafka retriable error: produce failed: {e}")
        entries = answer.get("offsets") if isinstance(answer, dict) else None
        if not isinstance(entries, list):
            err = KraftlogError.from_body(answer)
            if err is not None:
                raise err
            raise rpe.RestProxyError(rpe.KAFKA_ERROR, f"Kafka error: unexpected produce answer {answer!r}")
        offsets = []
        for e in entries:
            e = e or {}
            if "offset" in e:
                offsets.append({"partition": e.get("partition"), "offset": e["offset"], "error_code": None,
                                "error": None})
            else:
                err = KraftlogError.from_body({"error_code": e.get("error_code"), "message": e.get("message", "")})
                offsets.append({"partition": e.get("partition"), "offset": None,
                                "error_code": 2 if err is not None and err.code.retriable else 1,
                                "error": f"{e.get('error_code')}: {e.get('message')}"})
        return _answer({"offsets": offsets, "key_schema_id": None, "value_schema_id": None})

    # ---- consumer instances ----------------------------------------------------------

    def _instance(self, request: web.Request) -> ConsumerInstance:
        return self.instances.get(request.match_info["group"], request.match_info["instance"], principal_of(request))

    @confluent
    async def create_instance(self, request: web.Request) -> web.Response:
        _check_accept(request)
        _check_content_type(request)
        group = request.match_info["group"]
        from http_api.broker.group_offsets import validate_group_id
        validate_group_id(group)
        doc = await _body(request, required=False) or {}
        if not isinstance(doc, dict):
            raise rpe.invalid("body must be an object {\"name\"?, \"format\"?, \"auto.offset.reset\"?, ...}")
        import uuid
        name = doc.get("id") or doc.get("name") or f"rest-consumer-{uuid.uuid4()}"
        fmt = str(doc.get("format") or "binary").lower()
        if not isinstance(name, str) or not name or "/" in name:
            raise rpe.invalid("name: must be a non-empty string without '/'")
        if fmt not in FORMATS:
            raise rpe.RestProxyError(rpe.INVALID_CONSUMER_CONFIG, f"Invalid consumer configuration: format {fmt!r} "
                                     f"is not supported here; use one of {list(FORMATS)}")
        reset = RESETS.get(str(doc.get("auto.offset.reset") or "latest").lower())
        if reset is None:
            raise rpe.RestProxyError(rpe.INVALID_CONSUMER_CONFIG, "Invalid consumer configuration: auto.offset.reset "
                                     "must be earliest or latest")
        auto_commit = str(doc.get("auto.commit.enable", "true")).lower()
        if auto_commit not in ("true", "false"):
            raise rpe.RestProxyError(rpe.INVALID_CONSUMER_CONFIG, "Invalid consumer configuration: "
                                     "auto.commit.enable must be true or false")
        options: dict = {"auto_offset_reset": reset, "enable_auto_commit": auto_commit == "true"}
        wait = doc.get("consumer.request.timeout.ms")
        if wait is not None:
            try:
                options["request_timeout_ms"] = max(0, int(wait))
            except (TypeError, ValueError):
                raise rpe.RestProxyError(rpe.INVALID_CONSUMER_CONFIG, "Invalid consumer configuration: "
                                         "consumer.request.timeout.ms must be an integer") from None
        self.instances.reserve(group, name)

        def make(**opts):
            return loopback_consumer(self.ctx, request, group_id=group, auto_commit_interval_ms=AUTO_COMMIT_INTERVAL_MS,
                                     **opts)
        inst = ConsumerInstance(group, name, fmt, principal_of(request), options, make)
        self.instances.add(inst)
        base = f"{self.ctx.config.url.rstrip('/')}/consumers/{group}/instances/{name}"
        return _answer({"instance_id": name, "base_uri": base})

    @confluent
    async def delete_instance(self, request: web.Request) -> web.Response:
        _check_accept(request)
        await self.instances.delete(request.match_info["group"], request.match_info["instance"], principal_of(request))
        return web.Response(status=204)

    @confluent
    async def subscribe(self, request: web.Request) -> web.Response:
        _check_accept(request)
        _check_content_type(request)
        inst = self._instance(request)
        doc = await _body(request)
        topics = doc.get("topics") if isinstance(doc, dict) else None
        pattern = doc.get("topic_pattern") if isinstance(doc, dict) else None
        if topics is not None and pattern is not None:
            raise rpe.RestProxyError(rpe.ILLEGAL_STATE, "Illegal state: give topics or topic_pattern, not both")
        if pattern is not None:
            import re
            try:
                rx = re.compile(pattern)
            except (re.error, TypeError):
                raise rpe.invalid(f"topic_pattern: {pattern!r} is not a regular expression") from None
            topics = [t for t in sorted(self.ctx.image.topics) if rx.fullmatch(t) and not t.startswith("__")]
        if not isinstance(topics, list) or not topics or not all(isinstance(t, str) for t in topics):
            raise rpe.invalid('A list (of Topics type) or a topic_pattern must be specified: '
                              '{"topics": ["t1", ...]}')
        async with inst.lock:
            await inst.subscribe(topics)
            inst.touch()
        return web.Response(status=204)

    @confluent
    async def subscription(self, request: web.Request) -> web.Response:
        _check_accept(request)
        inst = self._instance(request)
        return _answer({"topics": list(inst.topics)})

    @confluent
    async def unsubscribe(self, request: web.Request) -> web.Response:
        _check_accept(request)
        inst = self._instance(request)
        async with inst.lock:
            if inst.mode == "subscribe":
                await inst.reset()
            inst.touch()
        return web.Response(status=204)

    @confluent
    async def assign(self, request: web.Request) -> web.Response:
        _check_accept(request)
        _check_content_type(request)
        inst = self._instance(request)
        tps = _tps(await _body(request))
        for t, p in tps:
            topic = self.ctx.image.topics.get(t)
            if topic is None:
                raise rpe.topic_not_found(t)
            if p not in topic.partitions:
                raise rpe.partition_not_found(t, p)
        async with inst.lock:
            await inst.assign(tps)
            inst.touch()
        return web.Response(status=204)

    @confluent
    async def assignments(self, request: web.Request) -> web.Response:
        _check_accept(request)
        inst = self._instance(request)
        return _answer({"partitions": [{"topic": t, "partition": p} for t, p in inst.assignment()]})

    @confluent
    async def seek(self, request: web.Request) -> web.Response:
        _check_accept(request)
        _check_content_type(request)
        inst = self._instance(request)
        offsets = _offsets(await _body(request))
        async with inst.lock:
            await inst.seek(offsets)
            inst.touch()
        return web.Response(status=204)

    async def _seek_to(self, request: web.Request, where: str) -> web.Response:
        _check_accept(request)
        _check_content_type(request)
        inst = self._instance(request)
        tps = _tps(await _body(request))
        async with inst.lock:
            await inst.seek_to(tps, where)
            inst.touch()
        return web.Response(status=204)

    @confluent
    async def seek_beginning(self, request: web.Request) -> web.Response:
        return await self._seek_to(request, "beginning")

    @confluent
    async def seek_end(self, request: web.Request) -> web.Response:
        return await self._seek_to(request, "end")

    @confluent
    async def records(self, request: web.Request) -> web.Response:
        inst = self._instance(request)
        accept = _types(request.headers.get("Accept"))
        wanted = None
        for t in accept or ["*/*"]:
            if t in _EMBEDDED:
                wanted = _EMBEDDED[t]
            elif t in _OTHER_EMBEDDED:
                wanted = t.split(".")[2]
            elif t in _GENERIC:
                wanted = "binary"           # Confluent: a generic v2 Accept reads as binary
            else:
                continue
            break
        if wanted is None:
            raise rpe.RestProxyError(406, f"HTTP 406 Not Acceptable (Accept {request.headers.get('Accept')!r}; "
                                     f"read records with Accept: application/vnd.kafka.{inst.format}.v2+json)")
        if wanted != inst.format:
            raise rpe.RestProxyError(rpe.CONSUMER_FORMAT_MISMATCH, "The requested embedded data format does not "
                                     f"match the deserializer for this consumer instance (it reads {inst.format}: "
                                     f"Accept: application/vnd.kafka.{inst.format}.v2+json)")
        q = request.query
        try:
            timeout_ms = int(q.get("timeout", inst.request_timeout_ms))
            max_bytes = int(q.get("max_bytes", CONSUMER_REQUEST_MAX_BYTES))
        except ValueError:
            raise rpe.invalid("timeout and max_bytes: must be integers") from None
        timeout_ms = max(0, min(timeout_ms, inst.request_timeout_ms))
        async with inst.lock:
            recs = await inst.poll(timeout_ms, min(max(1, max_bytes), CONSUMER_REQUEST_MAX_BYTES))
            inst.touch()
            try:
                out = [{"topic": r.topic, "key": _render(inst.format, r.key), "value": _render(inst.format, r.value),
                        "partition": r.partition, "offset": r.offset} for r in recs]
            except rpe.RestProxyError:
                # nothing was returned: the position goes back to the first polled record of
                # each partition, so no record is skipped (every poll answers the error until
                # the client seeks past it or reads with a binary instance)
                first: dict[tuple[str, int], int] = {}
                for r in recs:
                    first[(r.topic, r.partition)] = min(r.offset, first.get((r.topic, r.partition), r.offset))
                await inst.seek([(t, p, off) for (t, p), off in first.items()])
                raise
        return _answer(out, 200, f"application/vnd.kafka.{inst.format}.v2+json")

    @confluent
    async def commit(self, request: web.Request) -> web.Response:
        _check_accept(request)
        _check_content_type(request)
        inst = self._instance(request)
        doc = await _body(request, required=False)
        offsets = None if doc is None or doc == {} else _offsets(doc)
        async with inst.lock:
            await inst.commit(offsets)
            inst.touch()
        return _answer({"offsets": []})

    @confluent
    async def committed(self, request: web.Request) -> web.Response:
        _check_accept(request)
        inst = self._instance(request)
        doc = await _body(request, required=False)
        if doc is None:
            raise rpe.partition_not_found("", "(none given: send a body {\"partitions\": [...]})")
        tps = _tps(doc)
        async with inst.lock:
            offsets = await inst.committed(tps)
            inst.touch()
        return _answer({"offsets": offsets})
