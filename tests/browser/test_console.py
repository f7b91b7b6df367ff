"""The web console (/ui/, issue 22) in a real headless browser: Debian's chromium driven by
Playwright (no browser download), against a real `kraftlog serve` node.

Each page loads with no console errors; the topic page's live tail shows records produced
during the test (JSON pretty-printed, bytes as hex, headers) and its form produces one; the
group page's lag chart moves as the group consumes; the metrics charts show the produce
rate. A screenshot of each page goes to a directory under the pytest tmp dir and, when
$KRAFTLOG_SCREENSHOTS_DIR is set, there too.
"""
from __future__ import annotations

import base64
import json
import os
import shutil
import time
import urllib.error
import urllib.request

import pytest

from deploy.local_node import LocalNode

pytestmark = [pytest.mark.integration]

TOPIC = "orders"
GROUP = "billing"
WAIT_MS = 30_000          # a page condition on a loaded machine


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    assert path, ("Debian's chromium is not installed: `make test` installs it (apt-get install chromium); "
                  "the browser tests drive the system browser and never download one")
    return path


class Http:
    def __init__(self, url: str) -> None:
        self.url = url

    def __call__(self, method: str, path: str, body=None, timeout: float = 30.0):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = LocalNode(str(tmp_path_factory.mktemp("console-node")))
    n.start(timeout=90)
    try:
        http = Http(n.url)
        http("POST", "/v1/topics", {"name": TOPIC, "partitions": 2, "replication_factor": 1})
        deadline = time.monotonic() + 60
        while True:     # writable once the leaders are elected
            try:
                http("POST", f"/v1/topics/{TOPIC}/records",
                     {"records": [{"partition": p, "key": f"k{i}", "value": f"seed-{p}-{i}"}
                                  for p in (0, 1) for i in range(5)]})
                break
            except urllib.error.HTTPError:
                assert time.monotonic() < deadline, n.output[-3000:]
                time.sleep(0.2)
        yield n, http
    finally:
        n.stop()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright
    pw = sync_playwright().start()
    try:
        b = pw.chromium.launch(executable_path=_chromium(), headless=True,
                               args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        try:
            yield b
        finally:
            b.close()
    finally:
        pw.stop()


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    dirs = [tmp_path_factory.mktemp("console-screenshots")]
    if os.environ.get("KRAFTLOG_SCREENSHOTS_DIR"):
        dirs.append(os.environ["KRAFTLOG_SCREENSHOTS_DIR"])
        os.makedirs(dirs[-1], exist_ok=True)

    def save(page, name: str) -> None:
        png = page.screenshot(full_page=True)
        for d in dirs:
            with open(os.path.join(str(d), f"{name}.png"), "wb") as f:
                f.write(png)
    save.dirs = dirs
    return save


@pytest.fixture
def page(browser, node):
    """A fresh page that records console errors and uncaught exceptions; none may occur."""
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    p = ctx.new_page()
    p.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    p.on("console", lambda m: errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
    p.on("pageerror", lambda e: errors.append(f"uncaught: {e}"))
    p.errors = errors
    try:
        yield p
    finally:
        ctx.close()
    assert not errors, errors


def _last(page, canvas: str) -> list:
    return json.loads(page.eval_on_selector(canvas, "c => c.dataset.last || 'null'") or "null")


def test_overview_shows_brokers_quorum_topics_and_disk(node, page, shots):
    n, _ = node
    page.goto(n.url + "/ui/")
    page.wait_for_selector(f"#topics a[href='/ui/topics/{TOPIC}']")
    brokers = page.inner_text("#brokers")
    assert "controller" in brokers and "this broker" in brokers and n.url in brokers, brokers
    topics = page.inner_text("#topics")
    assert TOPIC in topics and "\t2\t1\t0" in topics, topics      # partitions, RF, under-replicated
    page.wait_for_selector("#quorum td")
    assert "leader" in page.inner_text("#quorum")
    page.wait_for_selector("#disk td.num")
    assert "KiB" in page.inner_text("#disk") or "MiB" in page.inner_text("#disk") or "GiB" in page.inner_text("#disk")
    shots(page, "overview")


def test_topic_page_tails_a_partition_live_and_produces_from_the_form(node, page, shots):
    n, http = node
    page.goto(f"{n.url}/ui/topics/{TOPIC}")
    page.wait_for_selector("#partitions td.num")
    page.wait_for_selector("#tail-status[data-state=open]")
    # records produced after the tail connected: JSON, bytes, headers
    doc = {"order": 7, "items": ["tea", "cake"]}
    out = http("POST", f"/v1/topics/{TOPIC}/partitions/0/records",
               {"records": [{"key": "o-7", "value": json.dumps(doc), "headers": {"source": "browser-test"}},
                            {"key": "raw", "value_b64": base64.b64encode(b"\x00\xff\x10kr").decode()}]})
    first = out["offsets"][0]["offset"]
    row = page.wait_for_selector(f"#tail tbody tr[data-offset='{first}']")
    cells = row.query_selector_all("td")
    assert cells[2].inner_text() == "o-7"
    assert cells[3].inner_text() == json.dumps(doc, indent=2)     # pretty-printed
    assert "source: browser-test" in cells[4].inner_text()
    hex_row = page.wait_for_selector(f"#tail tbody tr[data-offset='{first + 1}']")
    assert hex_row.query_selector(".hex").inner_text() == "00ff 106b 72"
    # the produce form: the record it writes shows up in the tail
    page.select_option("#produce select[name=partition]", "0")
    page.fill("#produce input[name=key]", "form-key")
    page.fill("#produce textarea[name=value]", "written from the console")
    page.fill("#produce textarea[name=headers]", "via=form")
    page.click("#produce button[type=submit]")
    page.wait_for_selector("#produce-result[data-offset]")
    offset = page.get_attribute("#produce-result", "data-offset")
    assert int(offset) == first + 2
    row = page.wait_for_selector(f"#tail tbody tr[data-offset='{offset}']")
    assert "written from the console" in row.inner_text() and "via: form" in row.inner_text()
    got = http("GET", f"/v1/topics/{TOPIC}/partitions/0/records?offset={offset}")["records"][0]
    assert got["value"] == "written from the console" and got["headers"] == {"via": "form"}
    shots(page, "topic")


def test_group_lag_chart_moves_as_the_group_consumes(node, page, shots):
    n, http = node
    ends = {p: http("GET", f"/v1/topics/{TOPIC}/partitions/{p}/offsets")["high_watermark"] for p in (0, 1)}
    http("POST", f"/v1/groups/{GROUP}/offsets", {"offsets": [{"topic": TOPIC, "partition": p, "offset": 0}
                                                            for p in (0, 1)]})
    lag = sum(ends.values())
    # a member joins (it is assigned both partitions) and consumes below
    member = http("POST", f"/v1/groups/{GROUP}/join", {"subscribed_topics": [TOPIC], "client_id": "console-test",
                                                       "session_timeout_ms": 120_000})
    assert sorted(a["partition"] for a in member["assignment"]) == [0, 1], member
    page.goto(f"{n.url}/ui/groups/{GROUP}")
    page.wait_for_function(f"() => JSON.parse(document.getElementById('lag-chart').dataset.last || '[-1]')[0] === {lag}")
    members = page.inner_text("#members")
    assert "console-test" in members and f"{TOPIC}/0, {TOPIC}/1" in members, members
    before = page.eval_on_selector("#lag-chart", "c => c.toDataURL()")
    # the member consumes: fetch each partition and commit the position after what it read
    for p in (0, 1):
        got = http("GET", f"/v1/topics/{TOPIC}/partitions/{p}/records?offset=0&max_bytes=1048576")
        http("POST", f"/v1/groups/{GROUP}/offsets",
             {"member_id": member["member_id"], "member_epoch": member["member_epoch"],
              "offsets": [{"topic": TOPIC, "partition": p, "offset": got["next_offset"]}]})
        remaining = sum(ends[q] for q in (0, 1) if q > p) + (ends[p] - got["next_offset"])
        page.wait_for_function(
            f"() => JSON.parse(document.getElementById('lag-chart').dataset.last)[0] === {remaining}")
    history = [v[0] for v in json.loads(page.eval_on_selector("#lag-chart", "c => c.dataset.history"))]
    assert history[0] == lag and history[-1] == 0, history
    assert ends[1] in history, history        # the step after partition 0 was consumed
    assert page.eval_on_selector("#lag-chart", "c => c.toDataURL()") != before
    assert page.inner_text("#total-lag") == "0"
    shots(page, "group")
    http("POST", f"/v1/groups/{GROUP}/leave", {"member_id": member["member_id"]})
    page.goto(f"{n.url}/ui/groups")
    page.wait_for_selector(f"#groups a[href='/ui/groups/{GROUP}']")
    shots(page, "groups")


def test_metrics_charts_show_the_produce_rate_live(node, page, shots):
    n, http = node
    page.goto(f"{n.url}/ui/metrics")
    page.wait_for_selector("#gauges td")
    deadline = time.monotonic() + WAIT_MS / 1000
    while True:     # produce until three scrape intervals (1 s polls) have seen it
        http("POST", f"/v1/topics/{TOPIC}/records", {"records": [{"value": f"m{i}"} for i in range(50)]})
        last = _last(page, "#chart-produce")
        history = json.loads(page.eval_on_selector("#chart-produce", "c => c.dataset.history || '[]'"))
        if sum(1 for v in history if v[0] > 0) >= 3:
            break
        assert time.monotonic() < deadline, f"the produce chart never showed a rate: {last}"
        page.wait_for_timeout(300)
    latency = json.loads(page.eval_on_selector("#chart-produce-latency", "c => c.dataset.history || '[]'"))
    assert any(v[0] is not None and v[0] > 0 for v in latency), latency     # mean produce latency, ms
    shots(page, "metrics")
    assert all(os.path.exists(os.path.join(str(d), "metrics.png")) for d in shots.dirs)


def _secure_config(tmp_path) -> str:
    users = tmp_path / "users.json"
    users.write_text(json.dumps({"admin": "admin-pw", "carol": "carol-pw"}))
    path = tmp_path / "node.toml"
    path.write_text(f'[security]\nauthentication = ["basic"]\nauthorizer = "acl"\nsuper_users = ["User:admin"]\n'
                    f'bootstrap_users_file = "{users}"\n')
    return str(path)


def test_console_with_authentication_shows_what_each_user_may_see(browser, tmp_path, shots):
    """Security on: the page asks for Basic credentials (401), the page's own fetches and its
    SSE tail run as that user, and a user without cluster permissions gets the pages with
    only what their ACLs allow (the refused sections say why)."""
    n = LocalNode(str(tmp_path / "data"), extra_args=["--config", _secure_config(tmp_path)])
    try:
        n.start(timeout=90)
        admin = {"Authorization": "Basic " + base64.b64encode(b"admin:admin-pw").decode()}

        def call(method, path, body=None):
            req = urllib.request.Request(n.url + path, data=json.dumps(body).encode() if body is not None else None,
                                         method=method, headers={"Content-Type": "application/json", **admin})
            with urllib.request.urlopen(req, timeout=30) as resp:
                return json.loads(resp.read() or b"null")

        deadline = time.monotonic() + 60
        while True:     # the bootstrap users reach the broker through the metadata
            try:
                call("POST", "/v1/topics", {"name": "secured", "partitions": 1, "replication_factor": 1})
                break
            except urllib.error.HTTPError as e:
                assert e.code == 401 and time.monotonic() < deadline, e.read()
                time.sleep(0.2)
        call("POST", "/v1/topics", {"name": "hidden", "partitions": 1, "replication_factor": 1})
        call("POST", "/v1/admin/acls", {"principal": "User:carol", "resource_type": "TOPIC",
                                        "resource_name": "secured", "operation": "READ"})
        # no credentials: the page challenges the browser (headless chromium then gives up
        # with ERR_INVALID_AUTH_CREDENTIALS, so the answer itself is checked here)
        try:
            urllib.request.urlopen(n.url + "/ui/", timeout=30)
            raise AssertionError("/ui/ answered without credentials")
        except urllib.error.HTTPError as e:
            assert e.code == 401 and "Basic" in e.headers["WWW-Authenticate"], e.read()
        with urllib.request.urlopen(n.url + "/ui/static/console.js", timeout=30) as resp:
            assert resp.status == 200           # the assets are public
        # the super user: everything, the tail included
        ctx = browser.new_context(http_credentials={"username": "admin", "password": "admin-pw"})
        try:
            p = ctx.new_page()
            p.set_default_timeout(WAIT_MS)
            errors: list[str] = []
            p.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            p.on("pageerror", lambda e: errors.append(f"uncaught: {e}"))
            p.goto(n.url + "/ui/")
            p.wait_for_selector("#topics a[href='/ui/topics/hidden']")
            p.wait_for_selector("#quorum td")
            assert "leader" in p.inner_text("#quorum")
            shots(p, "secure-overview-admin")
            p.goto(n.url + "/ui/topics/secured")
            p.wait_for_selector("#tail-status[data-state=open]")
            off = call("POST", "/v1/topics/secured/records", {"records": [{"value": "as admin"}]})["offsets"][0]["offset"]
            assert "as admin" in p.wait_for_selector(f"#tail tbody tr[data-offset='{off}']").inner_text()
            assert not errors, errors
        finally:
            ctx.close()
        # carol may READ (so DESCRIBE) one topic and nothing on the cluster
        ctx = browser.new_context(http_credentials={"username": "carol", "password": "carol-pw"})
        try:
            p = ctx.new_page()
            p.set_default_timeout(WAIT_MS)
            errors = []
            p.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            p.on("pageerror", lambda e: errors.append(f"uncaught: {e}"))
            p.goto(n.url + "/ui/")
            p.wait_for_selector("#topics a[href='/ui/topics/secured']")
            p.wait_for_selector("#quorum td")
            assert "hidden" not in p.inner_text("#topics")
            assert "CLUSTER_AUTHORIZATION_FAILED" in p.inner_text("#quorum")
            assert "CLUSTER_AUTHORIZATION_FAILED" in p.inner_text("#disk")
            shots(p, "secure-overview-carol")
            # the refused reads are the only errors the browser reports (its own 403 log lines)
            deadline = time.monotonic() + WAIT_MS / 1000
            while not errors and time.monotonic() < deadline:
                p.wait_for_timeout(100)
            assert errors and all("status of 403" in e for e in errors), errors
            assert p.goto(n.url + "/ui/topics/hidden").status == 403
        finally:
            ctx.close()
    finally:
        n.stop()
