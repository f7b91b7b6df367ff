"""Operations routes: `GET /healthz` (503 until ready, or while metadata lags), `GET /metrics`
(Prometheus), `GET /openapi.json`.

Metadata lag (issue 25): `/healthz` shows `metadata_lag_records` (records the active
controller has applied that this broker's published metadata does not show yet) and
`metadata_lag_ms` (for how long it has been behind without catching up), and answers 503
with `"status": "metadata_lagging"` once `metadata_lag_ms` exceeds `metadata_lag_max_ms`
(default 30 s; 0: never). `/metrics` has the same two figures as
`kraftlog_metadata_lag_records` and `kraftlog_metadata_lag_ms`.
"""
from __future__ import annotations

from aiohttp import web
import prometheus_client as prom

from http_api.broker.context import BrokerContext, Routes, json_response
from http_api.broker.openapi import openapi_document


class OpsRoutes(Routes):
    """Health, metrics and the API description."""

    def __init__(self, ctx: BrokerContext) -> None:
        super().__init__(ctx)
        g = prom.Gauge("kraftlog_metadata_lag_records", "Metadata records the active controller has applied that "
                       "this broker's published metadata does not show yet", registry=self.deps.registry)
        g.set_function(lambda: self._lag()[0])
        g = prom.Gauge("kraftlog_metadata_lag_ms", "How long this broker's metadata has been behind the "
                       "controller's without catching up (ms; 0: caught up)", registry=self.deps.registry)
        g.set_function(lambda: self._lag()[1])

    def _lag(self) -> tuple[int, int]:
        lag = getattr(self.deps.metadata, "lag", None)   # test doubles of the view may have none
        return lag() if lag is not None else (0, 0)

    async def healthz(self, request: web.Request) -> web.Response:
        if self.deps.health is not None:
            ready, info = self.deps.health()
        else:
            ready, info = self.deps.metadata.image is not None, {"broker_id": self.config.broker_id}
        ready = ready and self.deps.metadata.image is not None
        lag_records, lag_ms = self._lag()
        limit = self.config.metadata_lag_max_ms
        lagging = limit > 0 and lag_ms > limit
        info = dict(info, metadata_lag_records=lag_records, metadata_lag_ms=lag_ms, metadata_lag_max_ms=limit)
        if self.deps.metadata.image is not None:
            info["published_metadata_offset"] = self.deps.metadata.image.offset
        status = "metadata_lagging" if ready and lagging else "ok" if ready else "starting"
        return json_response(dict(info, status=status), 200 if status == "ok" else 503)

    async def metrics_handler(self, request: web.Request) -> web.Response:
        return web.Response(body=prom.generate_latest(self.deps.registry),
                            headers={"Content-Type": prom.CONTENT_TYPE_LATEST})

    async def openapi(self, request: web.Request) -> web.Response:
        return json_response(openapi_document(self.config.url))
