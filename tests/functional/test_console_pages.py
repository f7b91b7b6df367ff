"""The web console's server side (http_api/console/) on an in-process broker: page shells
name what they show with names escaped, the assets reference nothing off the broker (no CDN,
no network at run time), and /ui/api/log-dirs reports this broker's disks and replica sizes.
The pages themselves run in a real browser in tests/browser/test_console.py."""
from __future__ import annotations

import re

from http_api.broker.authorization import OPEN_ROUTES
from http_api.console.pages import PAGE_ROUTES, STATIC_PATHS


async def test_pages_are_shells_that_escape_names_and_load_only_local_assets(broker):
    c = broker.client
    r = await c.get("/ui", allow_redirects=False)
    assert r.status == 302 and r.headers["Location"] == "/ui/"
    pages = {"/ui/": "overview", "/ui/groups": "groups", "/ui/metrics": "metrics",
             "/ui/topics/orders": "topic", "/ui/groups/billing": "group"}
    assert len(pages) == len(PAGE_ROUTES) - 1           # every page but the /ui redirect
    for path, page in pages.items():
        r = await c.get(path)
        assert r.status == 200 and r.content_type == "text/html", await r.text()
        html = await r.text()
        assert f'data-page="{page}"' in html and 'data-broker-id="1"' in html
        # only this broker's own assets: nothing from another origin
        assert set(re.findall(r'(?:src|href)="([^"]+)"', html)) <= {
            "/ui/static/console.js", "/ui/static/console.css", "data:,", "/ui/", "/ui/groups", "/ui/metrics"}, html
    r = await c.get("/ui/topics/%3Cimg%20src%3Dx%20onerror%3Dalert(1)%3E")
    html = await r.text()
    assert "<img" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    for path in sorted(STATIC_PATHS):
        r = await c.get(path)
        assert r.status == 200, path
        text = await r.text()
        assert not re.search(r"https?://", text), f"{path} references another origin"
    assert (await c.get("/ui/static/console.js")).content_type == "application/javascript"
    assert STATIC_PATHS <= OPEN_ROUTES        # the assets load before the browser has credentials


async def test_log_dirs_report_disk_use_and_local_replica_sizes(broker):
    c = broker.client
    r = await c.post("/v1/topics", json={"name": "sized", "partitions": 2, "replication_factor": 1})
    assert r.status == 201, await r.text()
    r = await c.post("/v1/topics/sized/partitions/1/records", json={"records": [{"value": "x" * 1000}] * 3})
    assert r.status == 200, await r.text()
    doc = await (await c.get("/ui/api/log-dirs")).json()
    assert doc["broker_id"] == 1 and doc["log_dirs"]
    for d in doc["log_dirs"]:
        assert d["total_bytes"] >= d["used_bytes"] > 0 and d["free_bytes"] >= 0
    parts = {(p["topic"], p["partition"]): p for p in doc["partitions"]}
    assert parts[("sized", 0)]["size_bytes"] == 0 and parts[("sized", 0)]["high_watermark"] == 0
    one = parts[("sized", 1)]
    assert one["size_bytes"] > 3000 and one["log_end_offset"] == 3 and one["log_start_offset"] == 0
    assert doc["size_bytes"] == sum(p["size_bytes"] for p in doc["partitions"])
