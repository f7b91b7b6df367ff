"""Partition reassignment (KIP-455) and broker decommission routes of every broker.

    POST   /v1/reassignments    Kafka's reassignment JSON {"version": 1, "partitions": [{topic,
                                partition, replicas}], "throttle"?: bytes/s} -> 202 {reassignments}
    GET    /v1/reassignments    -> {"reassignments": [{topic, partition, replicas, adding_replicas,
                                removing_replicas, bytes_remaining, bytes_moved}]}
    DELETE /v1/reassignments    cancels every move -> 200 {cancelled, reassignments}
    GET    /v1/brokers          -> {"brokers": [{id, url, rack, fenced, state}]}
    POST   /v1/brokers/{broker_id}/decommission | /recommission -> 200 {id, ..., state, replicas}
    GET    /internal/v1/reassignment-progress -> bytes_remaining, bytes_moved of the moving partitions led here

Changes go to the active controller (metadata_quorum/reassignment.py decides) and the answer
waits until this broker's metadata shows them. Progress comes from each partition's leader:
`bytes_remaining` = the bytes of its log from each adding replica's fetch offset (its log end)
to the log end, summed over the adding replicas outside the ISR; `bytes_moved` = the bytes of
its log below those fetch offsets (each adding replica copies from the log start), summed over
every adding replica. Both are exact byte counts of the leader's segments (the batch holding
the fetch offset found through the offset index); `null` when the leader does not answer.
"""
from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from http_api.broker.context import Routes, json_response
from http_api.broker.internal_auth import INTERNAL_TOKEN_HEADER
from partitions.errors import ErrorCode, KraftlogError

CONTROLLER_PREFIX = "/controller/v1"
PROGRESS_PATH = "/internal/v1/reassignment-progress"
PROGRESS_TIMEOUT_S = 5.0


def log_bytes_from(lg, offset: int) -> int:
    """Bytes of `lg`'s segments from the batch holding `offset` (a replica's log end, so a
    batch boundary) to the log end: what a replica fetching from `offset` still has to copy.
    Everything below the log start is still to copy; 0 at or past the log end."""
    with lg.lock:
        segments = lg.segments
        if offset >= lg.log_end_offset:
            return 0
        if offset <= lg.log_start_offset:
            return sum(s.size for s in segments)
        i = max(k for k, s in enumerate(segments) if s.base_offset <= offset)
        found = segments[i].translate_offset(offset)
        rest = sum(s.size for s in segments[i + 1:])
        return rest + (segments[i].size - found[0] if found is not None else 0)


class ReassignmentRoutes(Routes):
    """See the module docstring."""

    def install(self, router: web.UrlDispatcher) -> None:
        router.add_post("/v1/reassignments", self.reassign)
        router.add_get("/v1/reassignments", self.list_reassignments)
        router.add_delete("/v1/reassignments", self.cancel)
        router.add_get("/v1/brokers", self.list_brokers)
        router.add_post("/v1/brokers/{broker_id}/decommission", self.decommission)
        router.add_post("/v1/brokers/{broker_id}/recommission", self.recommission)
        router.add_get(PROGRESS_PATH, self.progress)

    # ------------------------------------------------------------------ helpers
    async def _controller(self, method: str, path: str, json=None) -> dict:
        request = getattr(self.deps.controller, "request", None)
        if request is None:
            raise KraftlogError(ErrorCode.BROKER_NOT_AVAILABLE, "this broker has no controller client; retry")
        return await request(method, CONTROLLER_PREFIX + path, json=json)

    async def _visible(self, answer: dict) -> None:
        offset = answer.get("metadata_offset", 0)
        seen = await self.deps.metadata.wait_until(lambda img: img.offset >= offset,
                                                   self.config.metadata_wait_ms / 1000)
        if not seen:
            raise KraftlogError(ErrorCode.REQUEST_TIMED_OUT,
                                f"the change was made but this broker has not seen it within "
                                f"{self.config.metadata_wait_ms} ms; check with GET /v1/reassignments in a moment")

    def _local_progress(self) -> dict:
        """(topic, partition) -> (bytes_remaining, bytes_moved) of its adding replicas (module
        docstring), for the moving partitions this broker leads."""
        out = {}
        for name, reg in self.image.reassignments():
            key = (name, reg.partition)
            part = self.rm.partitions.get(key)
            lg = self.rm.logs.get(key)
            if part is None or lg is None or not part.is_leader:
                continue
            size = lg.size_bytes
            remaining = moved = 0
            for r in reg.adding_replicas:
                state = part.remote_replicas.get(r)
                fetched = state.log_end_offset if state is not None and state.log_end_offset >= 0 else 0
                left = log_bytes_from(lg, fetched)
                moved += max(0, size - left)
                if r not in reg.isr:
                    remaining += left
            out[key] = (remaining, moved)
        return out

    async def _remote_progress(self, url: str) -> dict:
        session = self.deps.http_session
        if session is None:
            return {}
        token = self.ctx.internal_token
        headers = {INTERNAL_TOKEN_HEADER: token} if token else {}
        try:
            async with session.get(url.rstrip("/") + PROGRESS_PATH, headers=headers,
                                   timeout=aiohttp.ClientTimeout(total=PROGRESS_TIMEOUT_S)) as resp:
                if resp.status != 200:
                    return {}
                doc = await resp.json()
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError):
            return {}
        return {(e["topic"], e["partition"]): (e["bytes_remaining"], e.get("bytes_moved"))
                for e in doc.get("partitions", [])
                if isinstance(e, dict) and {"topic", "partition", "bytes_remaining"} <= set(e)}

    def _listing(self, progress: dict) -> list:
        out = []
        for name, p in self.image.reassignments():
            remaining, moved = progress.get((name, p.partition), (None, None))
            out.append({"topic": name, "partition": p.partition, "replicas": list(p.replicas),
                        "adding_replicas": list(p.adding_replicas), "removing_replicas": list(p.removing_replicas),
                        "bytes_remaining": remaining, "bytes_moved": moved})
        return out

    async def _progress_everywhere(self) -> dict:
        img = self.image
        progress = self._local_progress()
        leaders = sorted({p.leader for _, p in img.reassignments()
                          if p.leader >= 0 and p.leader != self.config.broker_id and p.leader in img.brokers})
        answers = await asyncio.gather(*(self._remote_progress(img.brokers[b].url) for b in leaders))
        for a in answers:
            progress.update(a)
        return progress

    # ------------------------------------------------------------------ routes
    async def reassign(self, request: web.Request) -> web.Response:
        doc = await self.ctx.read_document(request)
        if not isinstance(doc, dict):
            raise KraftlogError(ErrorCode.INVALID_REQUEST,
                                'body must be {"version": 1, "partitions": [{"topic", "partition", "replicas"}]}')
        answer = await self._controller("POST", "/reassignments", doc)
        await self._visible(answer)
        return json_response({"reassignments": self._listing({})}, status=202)

    async def list_reassignments(self, request: web.Request) -> web.Response:
        return json_response({"reassignments": self._listing(await self._progress_everywhere())})

    async def cancel(self, request: web.Request) -> web.Response:
        answer = await self._controller("DELETE", "/reassignments")
        await self._visible(answer)
        return json_response({"cancelled": answer.get("cancelled", []), "reassignments": self._listing({})})

    async def list_brokers(self, request: web.Request) -> web.Response:
        return json_response({"brokers": self.image.brokers_json()})

    def _broker_id(self, request: web.Request) -> int:
        raw = request.match_info["broker_id"]
        try:
            return int(raw)
        except ValueError:
            raise KraftlogError(ErrorCode.INVALID_REQUEST, f"broker id must be an integer, got {raw!r}") from None

    async def decommission(self, request: web.Request) -> web.Response:
        answer = await self._controller("POST", f"/brokers/{self._broker_id(request)}/decommission")
        await self._visible(answer)
        return json_response(answer)

    async def recommission(self, request: web.Request) -> web.Response:
        answer = await self._controller("POST", f"/brokers/{self._broker_id(request)}/recommission")
        await self._visible(answer)
        return json_response(answer)

    async def progress(self, request: web.Request) -> web.Response:
        return json_response({"partitions": [{"topic": t, "partition": p, "bytes_remaining": b, "bytes_moved": m}
                                             for (t, p), (b, m) in sorted(self._local_progress().items())]})


_ERR = {"description": "error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}


def _obj(desc: str) -> dict:
    return {"description": desc, "content": {"application/json": {"schema": {"type": "object"}}}}


_BODY = {"required": True, "content": {"application/json": {"schema": {"type": "object"}}}}
_BROKER = {"name": "broker_id", "in": "path", "required": True, "schema": {"type": "integer"}}
# the OpenAPI paths of these routes (http_api/broker/openapi.py lists them)
OPENAPI_PATHS = {
    "/v1/reassignments": {
        "post": {"summary": "Start (or, with replicas null, cancel) partition moves: Kafka's reassignment JSON "
                            "{version: 1, partitions: [{topic, partition, replicas}], throttle?: bytes/s}",
                 "requestBody": _BODY,
                 "responses": {"202": _obj("{reassignments: [...]}"),
                               "404": dict(_ERR, description="UNKNOWN_TOPIC_OR_PARTITION")}},
        "get": {"summary": "Running moves: {reassignments: [{topic, partition, replicas, adding_replicas, "
                           "removing_replicas, bytes_remaining, bytes_moved}]}",
                "responses": {"200": _obj("{reassignments: [...]}")}},
        "delete": {"summary": "Cancel every running move (the original replicas come back)",
                   "responses": {"200": _obj("{cancelled, reassignments}")}},
    },
    "/v1/brokers": {"get": {"summary": "Brokers with their state: {brokers: [{id, url, rack, fenced, "
                                       "state: active|draining|decommissioned}]}",
                            "responses": {"200": _obj("{brokers: [...]}")}}},
    "/v1/brokers/{broker_id}/decommission": {"parameters": [_BROKER], "post": {
        "summary": "Cordon the broker, move every replica away, then unregister it (refused when a topic's "
                   "replication factor would break)", "responses": {"200": _obj("{id, state, replicas}")}}},
    "/v1/brokers/{broker_id}/recommission": {"parameters": [_BROKER], "post": {
        "summary": "Cancel a decommission", "responses": {"200": _obj("{id, state, replicas}")}}},
    PROGRESS_PATH: {"get": {"summary": "Broker-to-broker: bytes remaining and moved of the moves led here",
                            "responses": {"200": _obj("{partitions: [{topic, partition, bytes_remaining, "
                                                      "bytes_moved}]}")}}},
}
