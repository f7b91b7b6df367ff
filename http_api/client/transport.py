"""How the Python client talks to brokers: bootstrap URLs, one aiohttp session, typed errors
(`Transport`), and the cached cluster metadata the producer and consumer route by
(`MetadataCache`: partition counts, leader URLs)."""
from __future__ import annotations

import asyncio
import json
import os
import random
import time
from typing import Any, Iterable

import aiohttp

from http_api.wire import codecs
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


def _error_from(status: int, body: bytes) -> KraftlogError:
    try:
        doc = json.loads(body) if body else {}
    except ValueError:
        doc = {}
    err = KraftlogError.from_body(doc)
    if err is not None:
        return err
    return KraftlogError(ErrorCode.UNKNOWN_SERVER_ERROR, f"broker answered HTTP {status}: {body[:200]!r}")


class Transport:
    """HTTP to brokers: bootstrap rotation, JSON helpers, typed errors."""

    def __init__(self, bootstrap, *, client_id: str | None, request_timeout_ms: int,
                 session: aiohttp.ClientSession | None = None) -> None:
        self.urls = _urls(bootstrap)
        self.client_id = client_id or f"kraftlog-py-{os.getpid()}"
        self.request_timeout_ms = request_timeout_ms
        self._session = session
        self._own = session is None
        self._next = random.randrange(len(self.urls))

    async def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=256, keepalive_timeout=60),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=5))
            self._own = True
        return self._session

    def bootstrap_url(self) -> str:
        url = self.urls[self._next % len(self.urls)]
        return url

    def rotate(self) -> None:
        self._next += 1

    async def request(self, method: str, url: str, *, json_body: Any = None, data: bytes | None = None,
                      content_type: str | None = None, accept: str = codecs.JSON, params: dict | None = None,
                      timeout_s: float | None = None) -> tuple[int, Any, bytes]:
        """-> (status, headers, body); raises KraftlogError for 4xx/5xx, and
        BROKER_NOT_AVAILABLE for connection failures."""
        s = await self.session()
        headers = {"Accept": accept, "X-Client-Id": self.client_id}
        if json_body is not None:
            data = json.dumps(json_body).encode()
            content_type = codecs.JSON
        if content_type:
            headers["Content-Type"] = content_type
        to = aiohttp.ClientTimeout(total=timeout_s if timeout_s is not None else self.request_timeout_ms / 1000 + 5)
        try:
            async with s.request(method, url, data=data, headers=headers, params=params, timeout=to) as resp:
                body = await resp.read()
                if resp.status >= 400:
                    raise _error_from(resp.status, body)
                return resp.status, resp.headers, body
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            raise KraftlogError(ErrorCode.BROKER_NOT_AVAILABLE,
                                f"cannot reach broker at {url}: {e or type(e).__name__}; check that the broker "
                                "is running and --bootstrap / KRAFTLOG_URL points at it") from None

    async def bootstrap_json(self, method: str, path: str, **kw) -> tuple[int, Any]:
        """Call `path` on a bootstrap broker, trying the next one on connection failure."""
        last: Exception | None = None
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
        if self._own and self._session is not None:
            await self._session.close()
            self._session = None


class MetadataCache:
    """Cached cluster metadata: partition counts and leader URLs."""

    def __init__(self, transport: Transport) -> None:
        self.t = transport
        self.doc: dict | None = None
        self._topics: dict[str, dict] = {}
        self.fetched_at = 0.0
        self._refreshing: asyncio.Task | None = None

    async def refresh(self) -> dict:
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.ensure_future(self.t.bootstrap_json("GET", "/v1/metadata"))
        _, doc = await asyncio.shield(self._refreshing)
        self.doc = doc
        self._topics = {t["name"]: t for t in doc["topics"]}
        self.fetched_at = time.monotonic()
        return doc

    def _topic(self, topic: str) -> dict | None:
        if self.doc is None:
            return None
        return self._topics.get(topic)

    async def partitions(self, topic: str) -> int:
        t = self._topic(topic)
        if t is None:
            await self.refresh()
            t = self._topic(topic)
        return len(t["partitions"]) if t else 0

    async def leader_url(self, topic: str, partition: int, refresh: bool = False) -> str:
        if refresh or self.doc is None:
            await self.refresh()
        t = self._topic(topic)
        if t is None:
            await self.refresh()
            t = self._topic(topic)
        if t is None:
            raise KraftlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {topic!r} does not exist; create it first")
        p = next((p for p in t["partitions"] if p["partition"] == partition), None)
        if p is None:
            raise KraftlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                f"topic {topic!r} has no partition {partition}")
        brokers = {b["id"]: b["url"] for b in self.doc["brokers"]}
        url = brokers.get(p["leader"])
        if url is None:
            raise KraftlogError(ErrorCode.LEADER_NOT_AVAILABLE, f"{topic}-{partition} has no leader right now; retry")
        return url.rstrip("/")
