// kraftlog web console: fills the server-rendered page shells from the broker's JSON routes
// (same origin, so the browser's credentials for the page go along) and keeps them live.
// Hand-written, no dependencies. Every value shown comes from the cluster and is put in the
// page as text (never as HTML).
"use strict";

const body = document.body;
const PAGE = body.dataset.page;
const BROKER_ID = Number(body.dataset.brokerId);
const REFRESH_MS = 2000;
const COLORS = ["#2f5fb3", "#d9480f", "#2b8a3e", "#862e9c", "#c92a2a", "#0b7285", "#5c940d", "#e67700"];

// ---- helpers -----------------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") e.className = v; else e.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

class ApiError extends Error {
  constructor(status, code, message) { super(`${status} ${code}: ${message}`); this.status = status; this.code = code; }
}

async function api(path, options) {
  const resp = await fetch(path, Object.assign({ credentials: "same-origin", headers: { "Accept": "application/json" } }, options || {}));
  const text = await resp.text();
  let doc = null;
  try { doc = text ? JSON.parse(text) : null; } catch (e) { doc = null; }
  if (!resp.ok) {
    throw new ApiError(resp.status, (doc && doc.error_code) || resp.statusText, (doc && doc.message) || text);
  }
  return doc;
}

// Optional data (a route the principal may not read): the error instead of the data.
async function maybe(path) {
  try { return await api(path); } catch (e) { return { _error: e }; }
}

function showError(e) {
  const box = document.getElementById("error");
  if (!e) { box.hidden = true; return; }
  box.textContent = String(e.message || e);
  box.hidden = false;
}

function fillTable(id, headers, rows, empty) {
  const t = document.getElementById(id);
  const head = el("tr", {}, headers.map(h => el("th", { class: h.startsWith("#") ? "num" : null }, h.replace(/^#/, ""))));
  const bodyRows = rows.length ? rows : [el("tr", {}, el("td", { colspan: headers.length, class: "muted" }, empty || "none"))];
  t.replaceChildren(el("thead", {}, head), el("tbody", {}, bodyRows));
}

function row(cells, cls) {
  return el("tr", { class: cls }, cells.map(c => (c instanceof Node && c.tagName === "TD") ? c : el("td", {}, c)));
}

function num(v) { return el("td", { class: "num" }, v === null || v === undefined ? "-" : String(v)); }

function bytes(n) {
  if (n === null || n === undefined) return "-";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return `${i ? n.toFixed(1) : n} ${u[i]}`;
}

function list(xs) { return xs && xs.length ? xs.join(", ") : "-"; }

function errorRow(id, cols, e) {
  fillTable(id, cols, [row([el("td", { colspan: cols.length, class: "muted" }, String(e.message))])]);
}

function every(ms, fn) {
  const tick = async () => {
    try { await fn(); showError(null); } catch (e) { showError(e); }
    setTimeout(tick, ms);
  };
  tick();
}

function enc(s) { return encodeURIComponent(s); }

// ---- record rendering: text, JSON pretty-printed, hex for bytes ---------------------------

function b64hex(b64) {
  const bin = atob(b64);
  let out = "";
  for (let i = 0; i < bin.length; i++) out += bin.charCodeAt(i).toString(16).padStart(2, "0") + (i % 2 ? " " : "");
  return out.trim();
}

function renderBytes(rec, field) {
  if (rec[field + "_b64"] !== undefined && rec[field + "_b64"] !== null) {
    return el("span", { class: "hex", title: "bytes (hex)" }, b64hex(rec[field + "_b64"]));
  }
  const v = rec[field];
  if (v === null || v === undefined) return el("span", { class: "muted" }, "null");
  const s = String(v).trim();
  if ((s.startsWith("{") && s.endsWith("}")) || (s.startsWith("[") && s.endsWith("]"))) {
    try { return el("pre", { class: "json" }, JSON.stringify(JSON.parse(s), null, 2)); } catch (e) { /* text */ }
  }
  return el("pre", {}, String(v));
}

function renderHeaders(h) {
  const entries = Object.entries(h || {});
  if (!entries.length) return el("span", { class: "muted" }, "-");
  return el("pre", {}, entries.map(([k, v]) => `${k}: ${v}`).join("\n"));
}

// ---- a small live line chart on a canvas --------------------------------------------------

class LineChart {
  constructor(canvas, series, unit, maxPoints) {
    this.canvas = canvas; this.series = series; this.unit = unit || ""; this.maxPoints = maxPoints || 120;
    this.points = [];   // [timeMs, [v per series]]
  }
  push(values) {
    this.points.push([Date.now(), values]);
    if (this.points.length > this.maxPoints) this.points.shift();
    this.canvas.dataset.last = JSON.stringify(values);
    this.canvas.dataset.points = String(this.points.length);
    this.canvas.dataset.history = JSON.stringify(this.points.map(p => p[1]));
    this.draw();
  }
  draw() {
    const c = this.canvas, g = c.getContext("2d"), W = c.width, H = c.height, L = 56, R = 10, T = 22, B = 18;
    g.clearRect(0, 0, W, H);
    let max = 0;
    for (const [, vs] of this.points) for (const v of vs) if (v !== null && isFinite(v)) max = Math.max(max, v);
    max = max > 0 ? max * 1.1 : 1;
    g.strokeStyle = "#d9dee7"; g.fillStyle = "#6b7280"; g.font = "11px sans-serif"; g.lineWidth = 1;
    for (let i = 0; i <= 4; i++) {
      const y = T + (H - T - B) * i / 4;
      g.beginPath(); g.moveTo(L, y); g.lineTo(W - R, y); g.stroke();
      g.fillText(fmt(max * (4 - i) / 4) + this.unit, 2, y + 4);
    }
    const n = this.points.length, span = Math.min(this.maxPoints, Math.max(30, n));
    const dx = (W - L - R) / (span - 1);
    this.series.forEach((name, s) => {
      g.strokeStyle = COLORS[s % COLORS.length]; g.lineWidth = 2; g.beginPath();
      let started = false, end = null;
      this.points.forEach(([, vs], i) => {
        const v = vs[s];
        if (v === null || v === undefined || !isFinite(v)) return;
        const x = L + (span - n + i) * dx, y = T + (H - T - B) * (1 - v / max);
        if (started) g.lineTo(x, y); else { g.moveTo(x, y); started = true; }
        end = [x, y];
      });
      g.stroke();
      if (end) { g.beginPath(); g.arc(end[0], end[1], 2.5, 0, 2 * Math.PI); g.fillStyle = COLORS[s % COLORS.length]; g.fill(); }
      const last = n ? this.points[n - 1][1][s] : null;
      g.fillStyle = COLORS[s % COLORS.length];
      g.fillText(`${name}: ${last === null || last === undefined ? "-" : fmt(last) + this.unit}`, L + 4 + s * 150, 12);
    });
  }
}

function fmt(v) {
  if (v === null || v === undefined || !isFinite(v)) return "-";
  if (v >= 1e6) return (v / 1e6).toFixed(1) + "M";
  if (v >= 1e3) return (v / 1e3).toFixed(1) + "k";
  if (v >= 10 || v === 0) return v.toFixed(0);
  return v.toPrecision(2);
}

// ---- overview -----------------------------------------------------------------------------

async function overview() {
  const md = await api("/v1/metadata");
  const [states, quorum, dirs] = await Promise.all([maybe("/v1/brokers"), maybe("/v1/admin/quorum"), maybe("/ui/api/log-dirs")]);
  const led = {};
  for (const t of md.topics) for (const p of t.partitions) led[p.leader] = (led[p.leader] || 0) + 1;
  const state = {};
  for (const b of (states.brokers || [])) state[b.id] = b.state;
  fillTable("brokers", ["id", "url", "rack", "state", "fenced", "#partitions led"], md.brokers.map(b => row([
    el("td", {}, String(b.id), b.id === BROKER_ID ? " " : null, b.id === BROKER_ID ? el("span", { class: "badge" }, "this broker") : null,
       b.id === md.controller_id ? " " : null, b.id === md.controller_id ? el("span", { class: "badge" }, "controller") : null),
    el("a", { href: b.url + "/ui/" }, b.url), b.rack || "-", state[b.id] || "-",
    b.fenced ? el("span", { class: "badge bad" }, "fenced") : "no", num(led[b.id] || 0),
  ], b.fenced ? "fenced" : null)));
  const qcols = ["voter", "address", "#lag", "state", ""];
  if (quorum._error) errorRow("quorum", qcols, quorum._error);
  else fillTable("quorum", qcols, quorum.voters.map(v => row([String(v.id), v.address, num(v.lag), v.state || "voter",
    v.id === quorum.leader_id ? el("span", { class: "badge" }, "leader") : ""])));
  const topicBytes = {};
  for (const p of (dirs.partitions || [])) topicBytes[p.topic] = (topicBytes[p.topic] || 0) + p.size_bytes;
  fillTable("topics", ["topic", "#partitions", "#RF", "#under-replicated", "#size (this broker)"], md.topics.map(t => {
    const urp = t.partitions.filter(p => p.isr.length < p.replicas.length).length;
    const rf = t.partitions.length ? t.partitions[0].replicas.length : 0;
    return row([el("a", { href: "/ui/topics/" + enc(t.name) }, t.name), num(t.partitions.length), num(rf),
      el("td", { class: "num" }, urp ? el("span", { class: "badge bad" }, String(urp)) : "0"),
      num(dirs._error ? null : bytes(topicBytes[t.name] || 0))], urp ? "urp" : null);
  }), "no topics");
  const dcols = ["log dir", "#used", "#free", "#total", "#kraftlog logs"];
  if (dirs._error) errorRow("disk", dcols, dirs._error);
  else {
    const perDir = {};
    for (const p of dirs.partitions) perDir[p.dir] = (perDir[p.dir] || 0) + p.size_bytes;
    fillTable("disk", dcols, dirs.log_dirs.map(d => row([d.path, num(bytes(d.used_bytes)), num(bytes(d.free_bytes)),
      num(bytes(d.total_bytes)), num(bytes(perDir[d.path] || 0))])));
  }
}

// ---- topic --------------------------------------------------------------------------------

let tail = null;

async function topicPage() {
  const topic = body.dataset.topic;
  const md = await api("/v1/topics/" + enc(topic));
  const [dirs, meta] = await Promise.all([maybe("/ui/api/log-dirs"), maybe("/v1/metadata")]);
  const local = {};
  for (const p of (dirs.partitions || [])) if (p.topic === topic) local[p.partition] = p;
  const offsets = await Promise.all(md.partitions.map(p => p.leader === BROKER_ID
    ? maybe(`/v1/topics/${enc(topic)}/partitions/${p.partition}/offsets`) : Promise.resolve(null)));
  const urls = {};
  for (const b of (meta.brokers || [])) urls[b.id] = b.url;
  fillTable("partitions", ["#partition", "leader", "replicas", "ISR", "ELR", "#high watermark", "#log start", "#size (this broker)"],
    md.partitions.map((p, i) => {
      const o = offsets[i] && !offsets[i]._error ? offsets[i] : null, l = local[p.partition];
      const leader = p.leader === BROKER_ID || !urls[p.leader] ? String(p.leader)
        : el("a", { href: `${urls[p.leader]}/ui/topics/${enc(topic)}` }, String(p.leader));
      return row([num(p.partition), leader, list(p.replicas), list(p.isr), list(p.elr),
        num(o ? o.high_watermark : (l ? l.high_watermark : null)), num(o ? o.log_start_offset : (l ? l.log_start_offset : null)),
        num(l ? bytes(l.size_bytes) : null)], p.isr.length < p.replicas.length ? "urp" : null);
    }));
  fillTable("configs", ["name", "value"], Object.entries(md.configs || {}).sort().map(([k, v]) => row([k, String(v)])),
    "no topic overrides (broker defaults)");
  for (const sel of [document.getElementById("tail-partition"), document.querySelector("#produce select[name=partition]")]) {
    const have = new Set([...sel.options].map(o => o.value));
    for (const p of md.partitions) if (!have.has(String(p.partition))) sel.append(el("option", { value: p.partition }, `${p.partition}`));
  }
  if (!tail) startTail(topic, md, urls).catch(showError);
}

async function startTail(topic, md, urls) {
  const sel = document.getElementById("tail-partition");
  const status = document.getElementById("tail-status");
  const tbody = document.querySelector("#tail tbody");
  if (tail && tail.source) tail.source.close();
  tail = { partition: Number(sel.value) };
  tbody.replaceChildren();
  const p = md.partitions.find(x => x.partition === tail.partition);
  if (!p) return;
  if (p.leader !== BROKER_ID) {
    // the stream is served by the partition leader only; its console has the tail
    status.replaceChildren("led by broker " + p.leader + ": ",
      urls[p.leader] ? el("a", { href: `${urls[p.leader]}/ui/topics/${enc(topic)}` }, "open its console") : "leader unknown");
    return;
  }
  const base = `/v1/topics/${enc(topic)}/partitions/${p.partition}`;
  const o = await api(base + "/offsets");
  const from = Math.max(o.log_start_offset, o.high_watermark - 20);
  const source = new EventSource(`${base}/records/stream?offset=${from}`);
  tail.source = source;
  status.textContent = "connecting";
  source.onopen = () => { status.textContent = `live from offset ${from}`; status.dataset.state = "open"; };
  source.onmessage = (ev) => {
    const r = JSON.parse(ev.data);
    const tr = row([num(r.offset), new Date(r.timestamp).toISOString().replace("T", " ").replace("Z", ""),
      renderBytes(r, "key"), renderBytes(r, "value"), renderHeaders(r.headers)], "new");
    tr.dataset.offset = String(r.offset);
    tbody.prepend(tr);
    setTimeout(() => tr.classList.remove("new"), 1500);
    while (tbody.rows.length > 200) tbody.deleteRow(tbody.rows.length - 1);
  };
  source.addEventListener("error", (ev) => {
    if (ev.data) status.textContent = "stream error: " + ev.data;   // server `event: error`: the EventSource reconnects
    else { status.textContent = "reconnecting"; status.dataset.state = "reconnecting"; }
  });
}

function produceForm() {
  const form = document.getElementById("produce");
  const out = document.getElementById("produce-result");
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const f = new FormData(form);
    const rec = { value: f.get("value") };
    if (f.get("key")) rec.key = f.get("key");
    const headers = {};
    for (const line of String(f.get("headers") || "").split("\n")) {
      const i = line.indexOf("=");
      if (i > 0) headers[line.slice(0, i).trim()] = line.slice(i + 1).trim();
    }
    if (Object.keys(headers).length) rec.headers = headers;
    if (f.get("partition") !== "") rec.partition = Number(f.get("partition"));
    out.textContent = "producing";
    try {
      const r = await api(`/v1/topics/${enc(body.dataset.topic)}/records`, {
        method: "POST", headers: { "Content-Type": "application/json", "Accept": "application/json" },
        body: JSON.stringify({ records: [rec] }) });
      const o = r.offsets[0];
      out.textContent = `written: partition ${o.partition}, offset ${o.offset}`;
      out.dataset.offset = String(o.offset);
    } catch (e) { out.textContent = String(e.message); }
  });
}

// ---- consumer groups ----------------------------------------------------------------------

async function groupsPage() {
  const d = await api("/v1/groups");
  fillTable("groups", ["group", "state", "#members", "coordinator"], d.groups.map(g => row([
    el("a", { href: "/ui/groups/" + enc(g.group_id) }, g.group_id), g.state, num(g.members), String(g.coordinator_id)])),
    "no groups");
}

let lagChart = null;

async function groupPage() {
  const g = await api("/v1/groups/" + enc(body.dataset.group));
  fillTable("group-state", ["state", "assignor", "#group epoch", "coordinator"],
    [row([g.state, g.assignor || "-", num(g.group_epoch), String(g.coordinator_id)])]);
  fillTable("members", ["member", "client", "subscribed", "assigned"], (g.members || []).map(m => row([
    m.member_id, m.client_id || "-", list(m.subscribed_topics), list((m.assigned || []).map(a => a.join("/")))])), "no members");
  const parts = g.partitions || [];
  fillTable("group-partitions", ["topic", "#partition", "#committed", "#high watermark", "#lag", "member"], parts.map(p => row([
    p.topic, num(p.partition), num(p.committed_offset), num(p.high_watermark), num(p.lag), p.member_id || "-"],
    p.lag ? "urp" : null)), "no committed offsets");
  document.getElementById("total-lag").textContent = String(g.total_lag);
  const names = ["total"].concat(parts.map(p => `${p.topic}/${p.partition}`));
  if (!lagChart || lagChart.series.join() !== names.join()) {
    const old = lagChart;
    lagChart = new LineChart(document.getElementById("lag-chart"), names, "", 120);
    if (old) lagChart.points = old.points.map(([t, v]) => [t, [v[0]]]);
  }
  lagChart.push([g.total_lag].concat(parts.map(p => p.lag)));
}

// ---- metrics ------------------------------------------------------------------------------

function parseProm(text) {
  const out = {};   // name -> [{labels, value}]
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?\s+(\S+)/);
    if (!m) continue;
    const labels = {};
    for (const kv of (m[3] || "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[kv[1]] = kv[2];
    (out[m[1]] = out[m[1]] || []).push({ labels, value: Number(m[4]) });
  }
  return out;
}

function total(prom, name, pred) {
  return (prom[name] || []).filter(s => !pred || pred(s.labels)).reduce((a, s) => a + s.value, 0);
}

// p-quantile of the observations between two scrapes of a histogram (upper bucket bound)
function quantile(prev, cur, name, q) {
  const buckets = (cur[name + "_bucket"] || []).map(s => {
    const before = (prev[name + "_bucket"] || []).find(p => p.labels.le === s.labels.le);
    return [Number(s.labels.le === "+Inf" ? Infinity : s.labels.le), s.value - (before ? before.value : 0)];
  }).sort((a, b) => a[0] - b[0]);
  const n = buckets.length ? buckets[buckets.length - 1][1] : 0;
  if (!n) return null;
  for (const [le, c] of buckets) if (c >= q * n) return isFinite(le) ? le * 1000 : null;
  return null;
}

const charts = {};
let lastScrape = null;

async function metricsPage() {
  if (!charts.produce) {
    charts.produce = new LineChart(document.getElementById("chart-produce"), ["records/s", "requests/s", "KiB/s"], "");
    charts.fetch = new LineChart(document.getElementById("chart-fetch"), ["requests/s", "KiB/s", "replica KiB/s"], "");
    charts.produceLatency = new LineChart(document.getElementById("chart-produce-latency"), ["mean", "p99"], " ms");
    charts.fetchLatency = new LineChart(document.getElementById("chart-fetch-latency"), ["mean", "p99"], " ms");
  }
  const resp = await fetch("/metrics", { credentials: "same-origin" });
  const text = await resp.text();
  if (!resp.ok) throw new ApiError(resp.status, "metrics", text);
  const cur = parseProm(text), now = Date.now();
  if (lastScrape) {
    const prev = lastScrape.prom, dt = (now - lastScrape.t) / 1000;
    const rate = (name, pred) => Math.max(0, (total(cur, name, pred) - total(prev, name, pred)) / dt);
    const mean = (name) => {
      const c = total(cur, name + "_count") - total(prev, name + "_count");
      return c > 0 ? 1000 * (total(cur, name + "_sum") - total(prev, name + "_sum")) / c : null;
    };
    charts.produce.push([rate("kraftlog_produce_records_total"), rate("kraftlog_produce_requests_total"),
      rate("kraftlog_produce_bytes_total") / 1024]);
    charts.fetch.push([rate("kraftlog_fetch_requests_total"), rate("kraftlog_fetch_bytes_total") / 1024,
      rate("kraftlog_replica_fetch_bytes_total") / 1024]);
    charts.produceLatency.push([mean("kraftlog_produce_latency_seconds"), quantile(prev, cur, "kraftlog_produce_latency_seconds", 0.99)]);
    charts.fetchLatency.push([mean("kraftlog_fetch_latency_seconds"), quantile(prev, cur, "kraftlog_fetch_latency_seconds", 0.99)]);
  }
  lastScrape = { prom: cur, t: now };
  const gauges = ["kraftlog_partitions", "kraftlog_leader_partitions", "kraftlog_under_replicated_partitions",
    "kraftlog_long_polls_waiting", "kraftlog_groups", "kraftlog_group_members", "kraftlog_metadata_lag_records",
    "kraftlog_metadata_lag_ms"].filter(n => cur[n]);
  fillTable("gauges", ["metric", "#value"], gauges.map(n => row([n, num(total(cur, n))])));
}

// ---- start --------------------------------------------------------------------------------

if (PAGE === "overview") every(REFRESH_MS, overview);
else if (PAGE === "topic") {
  produceForm();
  every(REFRESH_MS * 2, topicPage);
  document.getElementById("tail-partition").addEventListener("change", async () => {
    const md = await api("/v1/topics/" + enc(body.dataset.topic));
    const meta = await maybe("/v1/metadata");
    const urls = {};
    for (const b of (meta.brokers || [])) urls[b.id] = b.url;
    startTail(body.dataset.topic, md, urls).catch(showError);
  });
}
else if (PAGE === "groups") every(REFRESH_MS, groupsPage);
else if (PAGE === "group") every(1000, groupPage);
else if (PAGE === "metrics") every(1000, metricsPage);
