"""How the Python client talks to brokers: bootstrap URLs, one aiohttp session, typed errors
(`Transport`), and the cached cluster metadata the producer and consumer route by
(`MetadataCache`: partition counts, leader URLs).

Following metadata (docs/AVAILABILITY.md part E): connects are bounded by
`connect_timeout_ms`; a broker that timed out or refused a connection is *suspect* for
`broker_suspect_ms` and skipped while another broker can answer; a metadata refresh asks
every known broker that is not suspect in parallel, each bounded by
`request_attempt_timeout_ms`, and per partition the answer with the highest leader epoch
wins."""
from __future__ import annotations

import asyncio
import json
import os
import random
import ssl
import time
from typing import Any, Iterable

import aiohttp

from http_api.client.http1 import Http1Pool
from http_api.wire import codecs
from http_api.wire.auth import client_headers_from_env
from http_api.wire.tls import cli_client_context
from partitions.errors import ErrorCode, KraftlogError

DEFAULT_URL = "http://127.0.0.1:8082"


def default_bootstrap() -> str:
    return os.environ.get("KRAFTLOG_URL") or DEFAULT_URL


def _urls(bootstrap: str | Iterable[str] | None) -> list[str]:
    if bootstrap is None:
        bootstrap = default_bootstrap()
    if isinstance(bootstrap, str):
        bootstrap = bootstrap.split(",")
    out = [u.strip().rstrip("/") for u in bootstrap if u.strip()]
    if not out:
        raise ValueError("give at least one broker URL (e.g. http://127.0.0.1:8082)")
    return out


def _base(url: str) -> str:
    """scheme://host:port of a URL."""
    parts = url.split("/", 3)
    return "/".join(parts[:3]) if len(parts) >= 3 else url


def _error_from(status: int, body: bytes) -> KraftlogError:
    try:
        doc = json.loads(body) if body else {}
    except ValueError:
        doc = {}
    err = KraftlogError.from_body(doc)
    if err is not None:
        return err
    return KraftlogError(ErrorCode.UNKNOWN_SERVER_ERROR, f"broker answered HTTP {status}: {body[:200]!r}")


DEFAULT_REQUEST_ATTEMPT_TIMEOUT_MS = 2_000
DEFAULT_CONNECT_TIMEOUT_MS = 1_000


class Transport:
    """HTTP to brokers: bootstrap rotation, JSON helpers, typed errors, and the brokers
    currently suspect (timed out or refused a connection less than `broker_suspect_ms` ago).

    Invariant: a request is never bounded by less than it was before part E
    (`request_timeout_ms` + 5 s) unless it is safe to repeat (metadata and other GETs)."""

    def __init__(self, bootstrap, *, client_id: str | None, request_timeout_ms: int,
                 session: aiohttp.ClientSession | None = None,
                 request_attempt_timeout_ms: int = DEFAULT_REQUEST_ATTEMPT_TIMEOUT_MS,
                 connect_timeout_ms: int = DEFAULT_CONNECT_TIMEOUT_MS, broker_suspect_ms: int | None = None,
                 ca_file: str | None = None, ssl_context: ssl.SSLContext | None = None,
                 user: str | None = None, password: str | None = None, token: str | None = None) -> None:
        self.urls = _urls(bootstrap)
        # credentials (API.md Security): HTTP Basic user/password or a bearer token; none given:
        # $KRAFTLOG_TOKEN, or $KRAFTLOG_USER + $KRAFTLOG_PASSWORD
        try:
            self.auth_headers = client_headers_from_env(user, password, token)
        except ValueError as e:
            raise KraftlogError(ErrorCode.INVALID_CONFIG, str(e)) from None
        # https brokers: verified against `ca_file` / $KRAFTLOG_CA_FILE (else the system's trust store)
        try:
            self.ssl_context = ssl_context or cli_client_context(ca_file)
        except (ValueError, OSError, ssl.SSLError) as e:
            raise KraftlogError(ErrorCode.INVALID_CONFIG, f"cannot use the CA file: {e}") from None
        self.client_id = client_id or f"kraftlog-py-{os.getpid()}"
        self.request_timeout_ms = request_timeout_ms
        # one attempt never waits longer than the whole request may
        self.request_attempt_timeout_ms = max(1, min(request_attempt_timeout_ms, request_timeout_ms))
        self.connect_timeout_ms = max(1, min(connect_timeout_ms, self.request_attempt_timeout_ms))
        self.broker_suspect_ms = (broker_suspect_ms if broker_suspect_ms is not None
                                  else max(1_000, 2 * self.request_attempt_timeout_ms))
        self._suspect: dict[str, float] = {}   # broker base URL -> monotonic time it stops being suspect
        self._session = session
        self._own = session is None
        # produce and fetch requests (`hot=True`) go through the client's own keep-alive HTTP/1.1
        # connections (http1.py), everything else through aiohttp; a session given by the caller
        # carries every request (its connector's TLS settings apply). False: aiohttp for all.
        self.own_http_connections = session is None
        self._pool: Http1Pool | None = None
        self._next = random.randrange(len(self.urls))

    @property
    def attempt_timeout_s(self) -> float:
        return self.request_attempt_timeout_ms / 1000

    def mark_suspect(self, url: str) -> None:
        """`url` (a broker base URL or any URL on it) timed out or refused: skip it for a while."""
        self._suspect[_base(url)] = time.monotonic() + self.broker_suspect_ms / 1000

    def is_suspect(self, url: str) -> bool:
        until = self._suspect.get(_base(url))
        if until is None:
            return False
        if time.monotonic() >= until:
            del self._suspect[_base(url)]
            return False
        return True

    async def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=256, keepalive_timeout=60,
                                               ssl=self.ssl_context if self.ssl_context is not None else True),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout_ms / 1000))
            self._own = True
        return self._session

    def bootstrap_url(self) -> str:
        """The next bootstrap broker, skipping suspect ones while another one is not suspect."""
        for _ in range(len(self.urls)):
            url = self.urls[self._next % len(self.urls)]
            if not self.is_suspect(url):
                return url
            self._next += 1
        return self.urls[self._next % len(self.urls)]

    def rotate(self) -> None:
        self._next += 1

    async def request(self, method: str, url: str, *, json_body: Any = None, data: bytes | None = None,
                      content_type: str | None = None, accept: str = codecs.JSON, params: dict | None = None,
                      timeout_s: float | None = None, hot: bool = False) -> tuple[int, Any, bytes]:
        """-> (status, headers, body); raises KraftlogError for 4xx/5xx, and
        BROKER_NOT_AVAILABLE for connection failures. `hot` (produce and fetch requests):
        through the client's own HTTP/1.1 connections unless `own_http_connections` is off."""
        headers = {"Accept": accept, "X-Client-Id": self.client_id, **self.auth_headers}
        if json_body is not None:
            data = json.dumps(json_body).encode()
            content_type = codecs.JSON
        if content_type:
            headers["Content-Type"] = content_type
        total_s = timeout_s if timeout_s is not None else self.request_timeout_ms / 1000 + 5
        try:
            if hot and self.own_http_connections:
                if self._pool is None:
                    self._pool = Http1Pool(self.ssl_context)
                status, resp_headers, body = await self._pool.request(
                    method, url, headers=headers, body=data, params=params, timeout_s=total_s,
                    connect_timeout_s=self.connect_timeout_ms / 1000)
                if status >= 400:
                    raise _error_from(status, bytes(body))
                return status, resp_headers, body
            s = await self.session()
            to = aiohttp.ClientTimeout(total=total_s, sock_connect=self.connect_timeout_ms / 1000)
            async with s.request(method, url, data=data, headers=headers, params=params, timeout=to) as resp:
                body = await resp.read()
                if resp.status >= 400:
                    raise _error_from(resp.status, body)
                return resp.status, resp.headers, body
        except (aiohttp.ClientSSLError, ssl.SSLError, ssl.CertificateError) as e:
            self.mark_suspect(url)
            raise KraftlogError(ErrorCode.BROKER_NOT_AVAILABLE,
                                f"TLS handshake with the broker at {url} failed: {e}; give the cluster's CA "
                                "certificate with --ca-file or $KRAFTLOG_CA_FILE (kraftlog cluster up --secure "
                                "writes DATA_DIR/ca.pem)") from None
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            self.mark_suspect(url)
            raise KraftlogError(ErrorCode.BROKER_NOT_AVAILABLE,
                                f"cannot reach broker at {url}: {e or type(e).__name__}; check that the broker "
                                "is running and --bootstrap / KRAFTLOG_URL points at it") from None

    async def bootstrap_json(self, method: str, path: str, **kw) -> tuple[int, Any]:
        """Call `path` on a bootstrap broker, trying the next one on connection failure."""
        last: Exception | None = None
        if method == "GET" and "timeout_s" not in kw:
            kw["timeout_s"] = self.attempt_timeout_s   # safe to repeat on the next broker
        for _ in range(len(self.urls)):
            url = self.bootstrap_url() + path
            try:
                status, _, body = await self.request(method, url, **kw)
                return status, (json.loads(body) if body else None)
            except KraftlogError as e:
                if e.code is not ErrorCode.BROKER_NOT_AVAILABLE:
                    raise
                last = e
                self.rotate()
        raise last  # type: ignore[misc]

    async def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self._own and self._session is not None:
            await self._session.close()
            self._session = None


DEFAULT_METADATA_MAX_AGE_MS = 300_000   # Kafka's metadata.max.age.ms


class MetadataCache:
    """Cached cluster metadata: partition counts and leader URLs.

    Older than `metadata_max_age_ms` (Kafka's metadata.max.age.ms), the next lookup refreshes
    it first, so partitions added to a topic are used without an error to trigger it; when
    that refresh fails the cached metadata keeps serving (the next lookup tries again)."""

    def __init__(self, transport: Transport, metadata_max_age_ms: int = DEFAULT_METADATA_MAX_AGE_MS) -> None:
        if metadata_max_age_ms < 0:
            raise ValueError(f"metadata_max_age_ms must be >= 0, got {metadata_max_age_ms}")
        self.t = transport
        self.metadata_max_age_ms = metadata_max_age_ms
        self.doc: dict | None = None
        self._topics: dict[str, dict] = {}
        self.fetched_at = 0.0
        self._refreshing: asyncio.Task | None = None

    def broker_urls(self) -> list[str]:
        """Every broker this client knows: bootstrap URLs, then those named by metadata."""
        out = list(self.t.urls)
        if self.doc is not None:
            for b in self.doc.get("brokers", []):
                u = str(b.get("url") or "").rstrip("/")
                if u and u not in out:
                    out.append(u)
        return out

    async def refresh(self) -> dict:
        """Fresh metadata from every known broker that is not suspect, in parallel (one shared
        refresh at a time); per partition the highest leader epoch wins."""
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.ensure_future(self._fetch_newest())
        doc = await asyncio.shield(self._refreshing)
        self.doc = doc
        self._topics = {t["name"]: t for t in doc["topics"]}
        self.fetched_at = time.monotonic()
        return doc

    async def _fetch_newest(self) -> dict:
        urls = self.broker_urls()
        healthy = [u for u in urls if not self.t.is_suspect(u)]
        answers: list[dict] = []
        errors: list[BaseException] = []
        for group in ([healthy, [u for u in urls if u not in healthy]] if healthy else [urls]):
            if not group:
                continue
            results = await asyncio.gather(*(self._one(u) for u in group), return_exceptions=True)
            for r in results:
                if isinstance(r, dict):
                    answers.append(r)
                elif isinstance(r, asyncio.CancelledError):
                    raise r
                elif isinstance(r, BaseException):
                    errors.append(r)
            if answers:
                return merge_metadata(answers)
        # nobody answered: a broker's own error says more than a connection failure
        typed = [e for e in errors if isinstance(e, KraftlogError) and e.code is not ErrorCode.BROKER_NOT_AVAILABLE]
        if typed or errors:
            raise (typed or errors)[-1]
        raise KraftlogError(ErrorCode.BROKER_NOT_AVAILABLE, "no broker answered")

    async def _one(self, url: str) -> dict:
        _, _, body = await self.t.request("GET", url + "/v1/metadata", timeout_s=self.t.attempt_timeout_s)
        return json.loads(body)

    def _topic(self, topic: str) -> dict | None:
        if self.doc is None:
            return None
        return self._topics.get(topic)

    def stale(self) -> bool:
        """Older than metadata_max_age_ms (or never fetched)."""
        return self.doc is None or (time.monotonic() - self.fetched_at) * 1000 >= self.metadata_max_age_ms

    async def _refresh_if_stale(self) -> None:
        if not self.stale():
            return
        if self.doc is None:
            await self.refresh()
            return
        try:
            await self.refresh()
        except KraftlogError:
            pass   # keep serving what we have; the next lookup tries again

    async def partitions(self, topic: str) -> int:
        await self._refresh_if_stale()
        t = self._topic(topic)
        if t is None:
            await self.refresh()
            t = self._topic(topic)
        return len(t["partitions"]) if t else 0

    @staticmethod
    def _partition(t: dict | None, partition: int) -> dict | None:
        if t is None:
            return None
        return next((p for p in t["partitions"] if p["partition"] == partition), None)

    async def leader_url(self, topic: str, partition: int, refresh: bool = False) -> str:
        if refresh or self.doc is None:
            await self.refresh()
        else:
            await self._refresh_if_stale()
        t = self._topic(topic)
        if self._partition(t, partition) is None:   # unknown topic, or a partition added since
            await self.refresh()
            t = self._topic(topic)
        if t is None:
            raise KraftlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {topic!r} does not exist; create it first")
        p = self._partition(t, partition)
        if p is None:
            raise KraftlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                f"topic {topic!r} has no partition {partition}")
        brokers = {b["id"]: b["url"] for b in self.doc["brokers"]}
        url = brokers.get(p["leader"])
        if url is None:
            raise KraftlogError(ErrorCode.LEADER_NOT_AVAILABLE, f"{topic}-{partition} has no leader right now; retry")
        return url.rstrip("/")


def merge_metadata(answers: list[dict]) -> dict:
    """One metadata document from several brokers' answers: per partition the entry with the
    highest leader epoch (ties: the first answer), brokers united by id. A broker that lags
    the controller therefore never hides a leader change another broker already applied."""
    if len(answers) == 1:
        return answers[0]
    base = dict(answers[0])
    brokers: dict = {}
    topics: dict[str, dict] = {}
    order: list[str] = []
    for doc in answers:
        for b in doc.get("brokers", []):
            brokers.setdefault(b["id"], b)
        for t in doc.get("topics", []):
            name = t["name"]
            if name not in topics:
                topics[name] = {**t, "partitions": {p["partition"]: p for p in t["partitions"]}}
                order.append(name)
                continue
            parts = topics[name]["partitions"]
            for p in t["partitions"]:
                cur = parts.get(p["partition"])
                if cur is None or p.get("leader_epoch", -1) > cur.get("leader_epoch", -1):
                    parts[p["partition"]] = p
    base["brokers"] = list(brokers.values())
    base["topics"] = [{**topics[n], "partitions": [topics[n]["partitions"][k] for k in sorted(topics[n]["partitions"])]}
                      for n in order]
    return base
