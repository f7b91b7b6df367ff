"""Console routes: page shells, the two static assets and the log-dirs read.

A page is a fixed HTML shell naming what it shows (`data-page`, `data-topic`, `data-group`,
this broker's id); `static/console.js` fills it from the JSON routes and keeps it live.
`GET /ui/api/log-dirs` is the one read the JSON API lacks: this broker's log directories
(disk total/used/free) and the size, log start, high watermark and log end of every local
replica (Kafka's DescribeLogDirs; DESCRIBE on the cluster).
"""
from __future__ import annotations

import asyncio
import html
import shutil
from pathlib import Path
from typing import Any

from aiohttp import web

__all__ = ["LOG_DIRS_PATH", "OPENAPI_PATHS", "PAGE_ROUTES", "STATIC_PATHS", "install_console"]

STATIC_DIR = Path(__file__).with_name("static")
_ASSETS = {"console.js": "application/javascript", "console.css": "text/css"}
STATIC_PATHS = frozenset(f"/ui/static/{name}" for name in _ASSETS)
LOG_DIRS_PATH = "/ui/api/log-dirs"
PAGE_ROUTES = ("/ui", "/ui/", "/ui/topics/{topic}", "/ui/groups", "/ui/groups/{group}", "/ui/metrics")

_NAV = (("/ui/", "Overview"), ("/ui/groups", "Consumer groups"), ("/ui/metrics", "Metrics"))


def _shell(title: str, page: str, broker_id: int, body: str, **data: str) -> web.Response:
    attrs = "".join(f' data-{k}="{html.escape(v)}"' for k, v in data.items())
    nav = "".join(f'<a href="{href}">{label}</a>' for href, label in _NAV)
    doc = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)} - kraftlog</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="/ui/static/console.css">
</head>
<body data-page="{page}" data-broker-id="{broker_id}"{attrs}>
<header><span class="brand">kraftlog</span><nav>{nav}</nav><span class="who">broker {broker_id}</span></header>
<main>
<h1>{html.escape(title)}</h1>
<div id="error" class="error" hidden></div>
{body}
</main>
<script src="/ui/static/console.js"></script>
</body></html>
"""
    return web.Response(text=doc, content_type="text/html", headers={"Cache-Control": "no-store"})


_OVERVIEW = """
<section><h2>Brokers</h2><table id="brokers"></table></section>
<section><h2>Controller quorum</h2><table id="quorum"></table></section>
<section><h2>Topics</h2><table id="topics"></table></section>
<section><h2>Disk use (this broker)</h2><table id="disk"></table></section>
"""

_TOPIC = """
<section><h2>Partitions</h2><table id="partitions"></table></section>
<section><h2>Configs</h2><table id="configs"></table></section>
<section class="cols">
<div><h2>Live tail</h2>
<label>Partition <select id="tail-partition"></select></label>
<span id="tail-status" class="muted">not connected</span>
<table id="tail"><thead><tr><th>offset</th><th>time</th><th>key</th><th>value</th><th>headers</th></tr></thead>
<tbody></tbody></table></div>
<div><h2>Produce a record</h2>
<form id="produce">
<label>Partition <select name="partition"><option value="">by key / round robin</option></select></label>
<label>Key <input name="key" autocomplete="off"></label>
<label>Value <textarea name="value" rows="4"></textarea></label>
<label>Headers (one name=value a line) <textarea name="headers" rows="2"></textarea></label>
<button type="submit">Produce</button> <span id="produce-result" class="muted"></span>
</form></div>
</section>
"""

_GROUPS = """<section><table id="groups"></table></section>"""

_GROUP = """
<section><h2>State</h2><table id="group-state"></table></section>
<section><h2>Members</h2><table id="members"></table></section>
<section><h2>Lag</h2><p>total lag: <b id="total-lag">-</b></p>
<canvas id="lag-chart" class="chart" width="720" height="200"></canvas>
<table id="group-partitions"></table></section>
"""

_METRICS = """
<section class="charts">
<div><h2>Produce</h2><canvas id="chart-produce" class="chart" width="560" height="180"></canvas></div>
<div><h2>Fetch</h2><canvas id="chart-fetch" class="chart" width="560" height="180"></canvas></div>
<div><h2>Produce latency</h2><canvas id="chart-produce-latency" class="chart" width="560" height="180"></canvas></div>
<div><h2>Fetch latency</h2><canvas id="chart-fetch-latency" class="chart" width="560" height="180"></canvas></div>
</section>
<section><h2>Gauges</h2><table id="gauges"></table></section>
"""


def _page(summary: str, *params: str) -> dict:
    return {"get": {"summary": summary, "parameters": [
        {"name": p, "in": "path", "required": True, "schema": {"type": "string"}} for p in params],
        "responses": {"200": {"description": "the page (HTML); its script reads the JSON routes",
                              "content": {"text/html": {"schema": {"type": "string"}}}}}}}


def _asset_doc(content_type: str) -> dict:
    return {"get": {"summary": "web console asset (open)", "responses": {"200": {
        "description": "static file", "content": {content_type: {"schema": {"type": "string"}}}}}}}


OPENAPI_PATHS = {   # merged into the broker's /openapi.json (http_api/broker/openapi.py)
    "/ui": {"get": {"summary": "web console: redirect to /ui/",
                    "responses": {"302": {"description": "Location: /ui/"},
                                  "200": {"description": "/ui/ (redirect followed)",
                                          "content": {"text/html": {"schema": {"type": "string"}}}}}}},
    "/ui/": _page("web console: cluster overview"),
    "/ui/topics/{topic}": _page("web console: a topic (partitions, configs, live tail, produce form)", "topic"),
    "/ui/groups": _page("web console: consumer groups"),
    "/ui/groups/{group}": _page("web console: a consumer group (members, offsets, lag chart)", "group"),
    "/ui/metrics": _page("web console: live charts from /metrics"),
    LOG_DIRS_PATH: {"get": {"summary": "this broker's log dirs (disk use) and local replica sizes "
                                       "(Kafka's DescribeLogDirs; DESCRIBE on the cluster)",
                            "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": {
                                "type": "object", "required": ["broker_id", "log_dirs", "partitions", "size_bytes"],
                                "properties": {"broker_id": {"type": "integer"}, "log_dirs": {"type": "array"},
                                               "partitions": {"type": "array"},
                                               "size_bytes": {"type": "integer"}}}}}}}}},
    **{f"/ui/static/{name}": _asset_doc(ct) for name, ct in _ASSETS.items()},
}


class ConsoleRoutes:
    """The console's handlers for one broker."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self.broker_id = ctx.config.broker_id

    async def redirect(self, request: web.Request) -> web.Response:
        raise web.HTTPFound("/ui/")

    async def overview(self, request: web.Request) -> web.Response:
        return _shell("Cluster overview", "overview", self.broker_id, _OVERVIEW)

    async def topic(self, request: web.Request) -> web.Response:
        t = request.match_info["topic"]
        return _shell(f"Topic {t}", "topic", self.broker_id, _TOPIC, topic=t)

    async def groups(self, request: web.Request) -> web.Response:
        return _shell("Consumer groups", "groups", self.broker_id, _GROUPS)

    async def group(self, request: web.Request) -> web.Response:
        g = request.match_info["group"]
        return _shell(f"Consumer group {g}", "group", self.broker_id, _GROUP, group=g)

    async def metrics(self, request: web.Request) -> web.Response:
        return _shell("Broker metrics", "metrics", self.broker_id, _METRICS)

    async def log_dirs(self, request: web.Request) -> web.Response:
        return web.json_response(await asyncio.get_running_loop().run_in_executor(None, self._log_dirs))

    def _log_dirs(self) -> dict:
        lm = getattr(self.ctx.deps.replica_manager, "log_manager", None)
        dirs, parts = [], []
        for d in (getattr(lm, "log_dirs", None) or self.ctx.config.log_dirs):
            try:
                u = shutil.disk_usage(d)
                dirs.append({"path": str(d), "total_bytes": u.total, "used_bytes": u.used, "free_bytes": u.free})
            except OSError as e:
                dirs.append({"path": str(d), "error": str(e)})
        for lg in (lm.all_logs() if lm is not None else ()):
            try:
                parts.append({"topic": lg.topic, "partition": lg.partition, "size_bytes": lg.size_bytes,
                              "log_start_offset": lg.log_start_offset, "high_watermark": lg.high_watermark,
                              "log_end_offset": lg.log_end_offset, "dir": str(lg.dir.parent)})
            except Exception:   # a log closed or deleted meanwhile: left out of this answer
                continue
        parts.sort(key=lambda p: (p["topic"], p["partition"]))
        return {"broker_id": self.broker_id, "log_dirs": dirs, "partitions": parts,
                "size_bytes": sum(p["size_bytes"] for p in parts)}


def _asset(name: str, content_type: str):
    body = (STATIC_DIR / name).read_bytes()

    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type=content_type, headers={"Cache-Control": "no-cache"})
    return handler


def install_console(app: web.Application, ctx: Any) -> None:
    """Add the console routes (`/ui/...`) to the broker app."""
    routes = ConsoleRoutes(ctx)
    r = app.router
    r.add_get("/ui", routes.redirect)
    r.add_get("/ui/", routes.overview)
    r.add_get("/ui/topics/{topic}", routes.topic)
    r.add_get("/ui/groups", routes.groups)
    r.add_get("/ui/groups/{group}", routes.group)
    r.add_get("/ui/metrics", routes.metrics)
    r.add_get(LOG_DIRS_PATH, routes.log_dirs)
    for name, content_type in _ASSETS.items():
        r.add_get(f"/ui/static/{name}", _asset(name, content_type))
