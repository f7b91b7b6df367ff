"""A small synchronous HTTP client for the broker API, made for Spark executors.

Executors run plain Python worker processes: no event loop, so this uses http.client with
one keep-alive connection per broker per process (`_POOL`), reconnecting once when a kept
connection was closed by the broker. `Cluster` caches metadata and routes partition
requests to leaders, following 421 NOT_LEADER_OR_FOLLOWER answers (their `leader_url`)
and refreshing metadata on retriable errors until `request_timeout_ms` runs out.

Nothing here is pickled: InputPartitions carry URLs, and each process builds its own.
"""
from __future__ import annotations

import functools
import http.client
import json
import threading
import time
import urllib.parse

RAW_BATCH_TYPE = "application/vnd.kraftlog.batch"
CBOR_TYPE = "application/cbor"
request_timeout_ms_default = 30_000
retry_backoff_ms_default = 100
socket_timeout_s_default = 60.0

RETRIABLE = {
    "NOT_LEADER_OR_FOLLOWER", "LEADER_NOT_AVAILABLE", "UNKNOWN_TOPIC_OR_PARTITION",
    "NOT_ENOUGH_REPLICAS", "NOT_ENOUGH_REPLICAS_AFTER_APPEND", "REQUEST_TIMED_OUT",
    "BROKER_NOT_AVAILABLE", "FENCED_LEADER_EPOCH", "UNKNOWN_LEADER_EPOCH",
    "KAFKA_STORAGE_ERROR", "THROTTLING_QUOTA_EXCEEDED",
}


class BrokerError(Exception):
    """An error answer from a broker: HTTP status plus the Kafka-style error code."""

    def __init__(self, status: int, error_code: str, message: str, body: dict | None = None,
                 url: str = ""):
        super().__init__(f"{error_code} (HTTP {status}) from {url}: {message}")
        self.status = status
        self.error_code = error_code
        self.message = message
        self.body = body or {}
        self.url = url

    @property
    def retriable(self) -> bool:
        return self.error_code in RETRIABLE or self.status in (502, 503, 504)


class BrokerUnreachable(Exception):
    """No broker answered; check `kraftlog.bootstrap.servers` and that the cluster runs."""


class _ConnectionPool:
    """One keep-alive HTTPConnection per (thread, host) in this process."""

    def __init__(self):
        self._local = threading.local()

    def _conns(self) -> dict:
        conns = getattr(self._local, "conns", None)
        if conns is None:
            conns = self._local.conns = {}
        return conns

    def request(self, method: str, url: str, body: bytes | None = None,
                headers: dict | None = None, timeout: float = socket_timeout_s_default,
                ca_file: str | None = None):
        parts = urllib.parse.urlsplit(url)
        key = (parts.scheme, parts.netloc, ca_file)
        path = parts.path + ("?" + parts.query if parts.query else "")
        conns = self._conns()
        for attempt in (0, 1):
            conn = conns.get(key)
            fresh = conn is None
            if fresh:
                if parts.scheme == "https":   # verified against kraftlog.ca_file (else the system's CAs)
                    conn = http.client.HTTPSConnection(parts.netloc, timeout=timeout, context=_ssl_context(ca_file))
                else:
                    conn = http.client.HTTPConnection(parts.netloc, timeout=timeout)
                conns[key] = conn
            try:
                conn.timeout = timeout
                if conn.sock is not None:
                    conn.sock.settimeout(timeout)
                conn.request(method, path, body=body, headers=headers or {})
                resp = conn.getresponse()
                data = resp.read()
                if resp.getheader("connection", "").lower() == "close":
                    conn.close()
                    conns.pop(key, None)
                return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
            except (http.client.RemoteDisconnected, http.client.CannotSendRequest,
                    http.client.BadStatusLine, BrokenPipeError, ConnectionResetError) as exc:
                conn.close()
                conns.pop(key, None)
                if fresh or attempt == 1:
                    raise BrokerUnreachable(f"{method} {url}: {exc!r}") from exc
            except OSError as exc:
                conn.close()
                conns.pop(key, None)
                raise BrokerUnreachable(f"{method} {url}: {exc!r}") from exc
        raise AssertionError("unreachable")

    def close(self):
        for conn in self._conns().values():
            conn.close()
        self._conns().clear()


_POOL = _ConnectionPool()


@functools.lru_cache(maxsize=8)
def _ssl_context(ca_file: str | None):
    import ssl
    return ssl.create_default_context(cafile=ca_file)


def _error_from(status: int, data: bytes, url: str) -> BrokerError:
    try:
        body = json.loads(data.decode("utf-8")) if data else {}
    except ValueError:
        try:
            import cbor2
            body = cbor2.loads(data)
        except Exception:
            body = {"message": data[:200].decode("utf-8", "replace")}
    if not isinstance(body, dict):
        body = {"message": str(body)}
    code = body.get("error_code") or http.client.responses.get(status, "UNKNOWN_SERVER_ERROR")
    return BrokerError(status, str(code), str(body.get("message", "")), body, url)


def decode_json_records(records: list) -> list:
    """Fetch answer records (JSON or CBOR) -> [(offset, timestamp, key, value, headers)]."""
    import base64
    out = []
    for r in records:
        key = r.get("key")
        if key is None and r.get("key_b64") is not None:
            key = base64.b64decode(r["key_b64"])
        elif isinstance(key, str):
            key = key.encode("utf-8")
        value = r.get("value")
        if value is None and r.get("value_b64") is not None:
            value = base64.b64decode(r["value_b64"])
        elif isinstance(value, str):
            value = value.encode("utf-8")
        headers = r.get("headers") or {}
        if isinstance(headers, dict):
            headers = list(headers.items())
        headers = [(k, v.encode("utf-8") if isinstance(v, str) else v) for k, v in headers]
        out.append((int(r["offset"]), int(r.get("timestamp") or 0), key, value, headers))
    return out


class Cluster:
    """Metadata cache and leader routing over a list of bootstrap broker URLs."""

    def __init__(self, bootstrap_servers, request_timeout_ms: int = request_timeout_ms_default,
                 client_id: str = "kraftlog-spark", security=None):
        self.bootstrap = [u.rstrip("/") for u in bootstrap_servers]
        # credentials and CA (options.ClientSecurity: kraftlog.user/password/token/ca_file)
        self._auth_headers = security.headers() if security is not None else {}
        self._ca_file = security.ca_file if security is not None else None
        self.request_timeout_ms = request_timeout_ms
        self.client_id = client_id
        self._metadata: dict | None = None
        self._leaders: dict = {}  # (topic, partition) -> url

    # -- plumbing --------------------------------------------------------------------

    def _call(self, method: str, url: str, body: bytes | None = None, headers: dict | None = None,
              timeout: float = socket_timeout_s_default):
        hdrs = {"X-Client-Id": self.client_id, **self._auth_headers}
        hdrs.update(headers or {})
        status, rhdrs, data = _POOL.request(method, url, body, hdrs, timeout, self._ca_file)
        if status >= 400:
            raise _error_from(status, data, url)
        return status, rhdrs, data

    def _any_broker(self, method: str, path: str, body=None, headers=None):
        """Try every known broker URL in turn (bootstrap first, then metadata ones)."""
        urls = list(self.bootstrap)
        if self._metadata:
            urls += [b["url"].rstrip("/") for b in self._metadata.get("brokers", []) if b.get("url")]
        errors = []
        deadline = time.monotonic() + self.request_timeout_ms / 1000
        while True:
            for url in dict.fromkeys(urls):
                try:
                    return self._call(method, url + path, body, headers)
                except BrokerUnreachable as exc:
                    errors.append(str(exc))
                except BrokerError as exc:
                    if not exc.retriable:
                        raise
                    errors.append(str(exc))
            if time.monotonic() > deadline:
                raise BrokerUnreachable("no broker answered " + path + ": " + "; ".join(errors[-3:]))
            time.sleep(retry_backoff_ms_default / 1000)

    def metadata(self, refresh: bool = False) -> dict:
        if self._metadata is None or refresh:
            _, _, data = self._any_broker("GET", "/v1/metadata")
            md = json.loads(data)
            self._metadata = md
            urls = {b["id"]: b["url"].rstrip("/") for b in md.get("brokers", []) if b.get("url")}
            self._leaders = {}
            for topic in md.get("topics", []):
                for part in topic.get("partitions", []):
                    url = urls.get(part.get("leader"))
                    if url:
                        self._leaders[(topic["name"], int(part["partition"]))] = url
        return self._metadata

    def topic_partitions(self, refresh: bool = False) -> dict:
        """{topic: [partition ids]} from metadata."""
        md = self.metadata(refresh)
        return {t["name"]: sorted(int(p["partition"]) for p in t.get("partitions", []))
                for t in md.get("topics", [])}

    def leader_url(self, topic: str, partition: int) -> str:
        url = self._leaders.get((topic, partition))
        if url is None:
            self.metadata(refresh=True)
            url = self._leaders.get((topic, partition))
        return url or self.bootstrap[0]

    def partition_call(self, topic: str, partition: int, method: str, suffix: str, query: dict | None = None,
                       body: bytes | None = None, headers: dict | None = None,
                       timeout_ms: int | None = None):
        """A request to the leader of (topic, partition), following redirects and retrying."""
        path = (f"/v1/topics/{urllib.parse.quote(topic, safe='')}/partitions/{partition}/{suffix}")
        if query:
            path += "?" + urllib.parse.urlencode(query)
        deadline = time.monotonic() + (timeout_ms or self.request_timeout_ms) / 1000
        while True:
            url = self.leader_url(topic, partition)
            try:
                return self._call(method, url + path, body, headers,
                                  timeout=max(socket_timeout_s_default, (timeout_ms or 0) / 1000))
            except BrokerError as exc:
                if not exc.retriable or time.monotonic() > deadline:
                    raise
                leader = exc.body.get("leader_url")
                if leader:
                    self._leaders[(topic, partition)] = leader.rstrip("/")
                else:
                    time.sleep(retry_backoff_ms_default / 1000)
                    self.metadata(refresh=True)
            except BrokerUnreachable:
                if time.monotonic() > deadline:
                    raise
                time.sleep(retry_backoff_ms_default / 1000)
                try:
                    self.metadata(refresh=True)
                except BrokerUnreachable:
                    pass

    # -- API ---------------------------------------------------------------------------

    def offsets(self, topic: str, partition: int) -> tuple:
        """(log_start_offset, high_watermark)."""
        _, _, data = self.partition_call(topic, partition, "GET", "offsets")
        body = json.loads(data)
        return int(body["log_start_offset"]), int(body["high_watermark"])

    def offset_for_timestamp(self, topic: str, partition: int, timestamp_ms: int) -> int | None:
        """Offset of the first record with timestamp >= ms, None when there is none yet."""
        _, _, data = self.partition_call(topic, partition, "GET", "offsets",
                                         query={"timestamp": int(timestamp_ms)})
        off = json.loads(data).get("offset")
        return None if off is None or int(off) < 0 else int(off)

    def fetch(self, topic: str, partition: int, offset: int, max_bytes: int,
              max_wait_ms: int = 0, raw: bool = True) -> dict:
        """One fetch. Returns {"batches": bytes} (raw) or {"records": [...]} plus offsets."""
        accept = RAW_BATCH_TYPE if raw else CBOR_TYPE
        _, hdrs, data = self.partition_call(
            topic, partition, "GET", "records",
            query={"offset": offset, "max_bytes": max_bytes, "max_wait_ms": max_wait_ms},
            headers={"Accept": accept}, timeout_ms=max_wait_ms + self.request_timeout_ms)
        ctype = hdrs.get("content-type", "").split(";")[0].strip()
        if ctype == RAW_BATCH_TYPE:
            return {"batches": data,
                    "high_watermark": int(hdrs.get("x-kraftlog-high-watermark", -1)),
                    "next_offset": int(hdrs.get("x-kraftlog-next-offset", offset)),
                    "log_start_offset": int(hdrs.get("x-kraftlog-log-start-offset", -1))}
        if ctype == CBOR_TYPE:
            import cbor2
            body = cbor2.loads(data)
        else:
            body = json.loads(data)
        return {"records": decode_json_records(body.get("records", [])),
                "high_watermark": int(body.get("high_watermark", -1)),
                "next_offset": int(body.get("next_offset", offset)),
                "log_start_offset": int(body.get("log_start_offset", -1))}

    def produce_raw(self, topic: str, partition: int, batch: bytes, acks: str = "all") -> dict:
        _, _, data = self.partition_call(topic, partition, "POST", "records", query={"acks": acks},
                                         body=batch, headers={"Content-Type": RAW_BATCH_TYPE,
                                                              "Accept": "application/json"})
        return json.loads(data) if data else {}

    def produce_records(self, topic: str, partition: int, records: list, acks: str = "all") -> dict:
        """CBOR produce of [{"key", "value", "headers"}] dicts (bytes allowed) to one partition."""
        import cbor2
        _, _, data = self.partition_call(topic, partition, "POST", "records", query={"acks": acks},
                                         body=cbor2.dumps({"records": records}),
                                         headers={"Content-Type": CBOR_TYPE, "Accept": "application/json"})
        return json.loads(data) if data else {}

    def init_producer_id(self) -> dict:
        """A fresh idempotent producer id: {"producer_id", "producer_epoch"}."""
        _, _, data = self._any_broker("POST", "/v1/producer-ids", body=b"{}",
                                      headers={"Content-Type": "application/json"})
        return json.loads(data)

    # -- admin helpers used by tests, examples and the bench -----------------------------

    def create_topic(self, name: str, partitions: int = 1, replication_factor: int = 1,
                     configs: dict | None = None) -> dict:
        body = json.dumps({"name": name, "partitions": partitions,
                           "replication_factor": replication_factor, "configs": configs or {}})
        _, _, data = self._any_broker("POST", "/v1/topics", body.encode(),
                                      {"Content-Type": "application/json"})
        self._metadata = None
        return json.loads(data) if data else {}

    def delete_records(self, topic: str, partition: int, before_offset: int) -> int:
        _, _, data = self.partition_call(topic, partition, "POST", "delete-records",
                                         body=json.dumps({"before_offset": before_offset}).encode(),
                                         headers={"Content-Type": "application/json"})
        return int(json.loads(data)["log_start_offset"])

    def wait_for_topic(self, name: str, partitions: int, timeout_s: float = 30.0) -> None:
        """Poll metadata until every partition of `name` has a leader."""
        deadline = time.monotonic() + timeout_s
        while True:
            md = self.metadata(refresh=True)
            for t in md.get("topics", []):
                if t["name"] == name:
                    parts = [p for p in t.get("partitions", []) if p.get("leader", -1) not in (None, -1)]
                    if len(parts) >= partitions:
                        return
            if time.monotonic() > deadline:
                raise TimeoutError(f"topic {name!r} has no leader for all {partitions} partitions "
                                   f"after {timeout_s}s")
            time.sleep(0.05)
