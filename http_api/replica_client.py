"""HTTP transport of the replica fetcher: follower -> leader internal routes."""
from __future__ import annotations

import asyncio
import json

import aiohttp

from http_api import codecs
from http_api.errors import ErrorCode, KraftlogError

INTERNAL_PREFIX = "/internal/v1"


def _error(status: int, body: bytes) -> KraftlogError:
    try:
        doc = json.loads(body)
        code = ErrorCode.__members__.get(doc.get("error_code", ""), ErrorCode.UNKNOWN_SERVER_ERROR)
        extra = {k: v for k, v in doc.items() if k not in ("error_code", "message")}
        return KraftlogError(code, str(doc.get("message", "")), **extra)
    except (ValueError, AttributeError):
        return KraftlogError(ErrorCode.UNKNOWN_SERVER_ERROR, f"leader answered HTTP {status}")


class HttpReplicaTransport:
    """`fetch` and `epoch_end_offset` against a leader's internal routes."""

    def __init__(self, session: aiohttp.ClientSession | None = None, request_timeout_ms: int = 30_000) -> None:
        self._session = session
        self.request_timeout_ms = request_timeout_ms

    def _s(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=3))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _get(self, url: str, params: dict, timeout_s: float) -> tuple[bytes, dict]:
        try:
            async with self._s().get(url, params=params, timeout=aiohttp.ClientTimeout(total=timeout_s),
                                     headers={"Accept": codecs.RAW_BATCH}) as r:
                body = await r.read()
                if r.status >= 400:
                    raise _error(r.status, body)
                return body, dict(r.headers)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            raise KraftlogError(ErrorCode.BROKER_NOT_AVAILABLE, f"leader at {url} unreachable: {e}") from None

    async def fetch(self, leader_url: str, topic: str, partition: int, *, offset: int, replica_id: int,
                    leader_epoch: int, max_bytes: int, max_wait_ms: int) -> tuple[bytes, int, int]:
        """-> (batches, leader high watermark, leader log start offset)"""
        body, headers = await self._get(
            f"{leader_url.rstrip('/')}{INTERNAL_PREFIX}/replica-fetch/{topic}/{partition}",
            {"offset": str(offset), "replica_id": str(replica_id), "leader_epoch": str(leader_epoch),
             "max_bytes": str(max_bytes), "max_wait_ms": str(max_wait_ms)},
            max_wait_ms / 1000 + self.request_timeout_ms / 1000)
        return (body, int(headers[codecs.HEADER_HIGH_WATERMARK]), int(headers[codecs.HEADER_LOG_START_OFFSET]))

    async def epoch_end_offset(self, leader_url: str, topic: str, partition: int, epoch: int) -> tuple[int, int]:
        body, _ = await self._get(f"{leader_url.rstrip('/')}{INTERNAL_PREFIX}/epoch-end-offset/{topic}/{partition}",
                                  {"epoch": str(epoch)}, self.request_timeout_ms / 1000)
        doc = json.loads(body)
        return int(doc["epoch"]), int(doc["end_offset"])
