"""The controller quorum through any broker (`kraftlog quorum ...`, API.md section Scale-out):
each route is forwarded to the active controller (metadata_quorum/quorum_routes.py).

    GET    /v1/admin/quorum              -> {"leader_id", "voters": [{"id", "address", "lag", "url", "state"}],
                                             "pending_change", "removed"}
    POST   /v1/admin/quorum/voters       {id, raft_address, url, incarnation} -> 200 once added
    DELETE /v1/admin/quorum/voters/{id}  -> 200 once removed

Under /v1/admin/, so reads need DESCRIBE and changes ALTER on the cluster
(http_api/broker/authorization.py).
"""
from __future__ import annotations

from aiohttp import web

from http_api.broker.context import Routes, json_response
from metadata_quorum.quorum_membership import registration_from_body
from partitions.errors import ErrorCode, KraftlogError

PREFIX = "/controller/v1/quorum"
# adding waits for the new controller to catch up (up to 30 s on the controller)
QUORUM_CHANGE_TIMEOUT_MS = 60_000


class QuorumAdminRoutes(Routes):
    """Forwards the quorum routes to the active controller."""

    def install(self, router: web.UrlDispatcher) -> None:
        router.add_get("/v1/admin/quorum", self.describe)
        router.add_post("/v1/admin/quorum/voters", self.add_voter)
        router.add_delete("/v1/admin/quorum/voters/{id}", self.remove_voter)

    async def describe(self, request: web.Request) -> web.Response:
        doc = await self.deps.controller.request("GET", PREFIX, params={"require_active": "true"})
        return json_response(doc)

    async def add_voter(self, request: web.Request) -> web.Response:
        doc = await self.ctx.read_document(request)
        if not isinstance(doc, dict):
            raise KraftlogError(ErrorCode.INVALID_REQUEST, "body must be an object {id, raft_address, url, incarnation}")
        registration_from_body(doc)   # fail fast; the active controller decides for good
        answer = await self.deps.controller.request("POST", PREFIX + "/voters", json=doc,
                                                    timeout_ms=QUORUM_CHANGE_TIMEOUT_MS,
                                                    try_timeout_ms=QUORUM_CHANGE_TIMEOUT_MS)
        return json_response(answer)

    async def remove_voter(self, request: web.Request) -> web.Response:
        raw = request.match_info["id"]
        if not raw.isdigit():
            raise KraftlogError(ErrorCode.INVALID_REQUEST, f"controller id must be an integer, got {raw!r}")
        answer = await self.deps.controller.request("DELETE", f"{PREFIX}/voters/{int(raw)}",
                                                    timeout_ms=QUORUM_CHANGE_TIMEOUT_MS)
        return json_response(answer)
