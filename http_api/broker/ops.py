"""Operations routes: `GET /healthz` (503 until ready), `GET /metrics` (Prometheus),
`GET /openapi.json`."""
from __future__ import annotations

from aiohttp import web
import prometheus_client as prom

from http_api.broker.context import Routes, json_response
from http_api.broker.openapi import openapi_document


class OpsRoutes(Routes):
    """Health, metrics and the API description."""

    async def healthz(self, request: web.Request) -> web.Response:
        if self.deps.health is not None:
            ready, info = self.deps.health()
        else:
            ready, info = self.deps.metadata.image is not None, {"broker_id": self.config.broker_id}
        ready = ready and self.deps.metadata.image is not None
        return json_response(dict(info, status="ok" if ready else "starting"), 200 if ready else 503)

    async def metrics_handler(self, request: web.Request) -> web.Response:
        return web.Response(body=prom.generate_latest(self.deps.registry),
                            headers={"Content-Type": prom.CONTENT_TYPE_LATEST})

    async def openapi(self, request: web.Request) -> web.Response:
        return json_response(openapi_document(self.config.url))
