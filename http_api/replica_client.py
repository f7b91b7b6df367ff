"""Broker-to-broker replication routes: wire format and the follower's HTTP transport.

`POST /internal/v1/replica-fetch`, JSON request:
    {"replica_id", "broker_epoch", "max_wait_ms", "max_bytes", "partition_max_bytes",
     "partitions": [{"topic", "partition", "offset", "leader_epoch", "high_watermark"}]}
answer (`application/vnd.kraftlog.replica-fetch`): a 4-byte big-endian length N, N bytes of
JSON `{"partitions": [{"topic", "partition", "size", "high_watermark", "log_start_offset",
"log_end_offset"} or {"topic", "partition", "error_code", "message", ...}]}`, then the raw
batches of each partition back to back (`size` bytes each, in header order).

`POST /internal/v1/epoch-end-offsets` (OffsetsForLeaderEpoch), JSON request:
    {"replica_id", "partitions": [{"topic", "partition", "leader_epoch", "epoch"}]}
answer: {"partitions": [{"topic", "partition", "epoch", "end_offset"} or an error entry]}.
"""
from __future__ import annotations

import asyncio
import json
import struct
from dataclasses import dataclass

import aiohttp

from http_api.errors import ErrorCode, KraftlogError

INTERNAL_PREFIX = "/internal/v1"
REPLICA_FETCH_MEDIA = "application/vnd.kraftlog.replica-fetch"
_LEN = struct.Struct(">I")


@dataclass
class PartitionData:
    """One partition of a replica-fetch answer (error is None on success)."""

    topic: str
    partition: int
    records: bytes = b""
    high_watermark: int = -1
    log_start_offset: int = -1
    log_end_offset: int = -1
    error: KraftlogError | None = None


def error_entry(topic: str, partition: int, err: KraftlogError) -> dict:
    return {"topic": topic, "partition": partition, "error_code": err.code.name, "message": err.message,
            **err.extra}


def _entry_error(e: dict) -> KraftlogError | None:
    if "error_code" not in e:
        return None
    code = ErrorCode.__members__.get(e["error_code"], ErrorCode.UNKNOWN_SERVER_ERROR)
    extra = {k: v for k, v in e.items() if k not in ("error_code", "message", "topic", "partition")}
    return KraftlogError(code, str(e.get("message", "")), **extra)


def encode_fetch_header(entries: list[dict]) -> bytes:
    """Length prefix + JSON header; the partitions' batches follow (written without joining:
    a fetch answer carries megabytes, and copies of them dominated the leader's CPU)."""
    head = json.dumps({"partitions": entries}, separators=(",", ":")).encode()
    return _LEN.pack(len(head)) + head


def encode_fetch_response(entries: list[dict], chunks: list[bytes]) -> bytes:
    return b"".join([encode_fetch_header(entries), *chunks])


def _entries_to_data(entries: list[dict], read) -> list[PartitionData]:
    out = []
    for e in entries:
        err = _entry_error(e)
        if err is not None:
            out.append(PartitionData(e["topic"], e["partition"], error=err))
            continue
        out.append(PartitionData(e["topic"], int(e["partition"]), read(int(e["size"])), int(e["high_watermark"]),
                                 int(e["log_start_offset"]), int(e["log_end_offset"])))
    return out


def decode_fetch_response(body: bytes) -> list[PartitionData]:
    if len(body) < 4:
        raise KraftlogError(ErrorCode.CORRUPT_MESSAGE, "replica-fetch answer is truncated")
    (n,) = _LEN.unpack_from(body, 0)
    head = json.loads(body[4:4 + n])
    pos = 4 + n

    def read(size: int) -> bytes:
        nonlocal pos
        pos += size
        return body[pos - size:pos]
    return _entries_to_data(head["partitions"], read)


def _error(status: int, body: bytes) -> KraftlogError:
    try:
        doc = json.loads(body)
        code = ErrorCode.__members__.get(doc.get("error_code", ""), ErrorCode.UNKNOWN_SERVER_ERROR)
        extra = {k: v for k, v in doc.items() if k not in ("error_code", "message")}
        return KraftlogError(code, str(doc.get("message", "")), **extra)
    except (ValueError, AttributeError):
        return KraftlogError(ErrorCode.UNKNOWN_SERVER_ERROR, f"leader answered HTTP {status}")


class HttpReplicaTransport:
    """The follower side of the internal routes (one keep-alive session for all leaders)."""

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

    async def _post(self, url: str, doc: dict, timeout_s: float) -> bytes:
        try:
            async with self._s().post(url, json=doc, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
                body = await r.read()
                if r.status >= 400:
                    raise _error(r.status, body)
                return body
        except aiohttp.ClientConnectorError as e:  # refused / unresolvable: the process is gone
            raise KraftlogError(ErrorCode.BROKER_NOT_AVAILABLE, f"leader at {url} unreachable: {e}",
                                refused=True) from None
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            raise KraftlogError(ErrorCode.BROKER_NOT_AVAILABLE,
                                f"leader at {url} unreachable: {e or type(e).__name__}") from None

    async def fetch(self, leader_url: str, replica_id: int, broker_epoch: int, partitions: list[dict], *,
                    max_bytes: int, partition_max_bytes: int, max_wait_ms: int) -> list[PartitionData]:
        """One long poll; each partition's batches are read from the stream as their own
        bytes object (one copy: no whole-body join, no slicing)."""
        url = f"{leader_url.rstrip('/')}{INTERNAL_PREFIX}/replica-fetch"
        doc = {"replica_id": replica_id, "broker_epoch": broker_epoch, "max_wait_ms": max_wait_ms,
               "max_bytes": max_bytes, "partition_max_bytes": partition_max_bytes, "partitions": partitions}
        try:
            async with self._s().post(url, json=doc, timeout=aiohttp.ClientTimeout(
                    total=max_wait_ms / 1000 + self.request_timeout_ms / 1000)) as r:
                if r.status >= 400:
                    raise _error(r.status, await r.read())
                (n,) = _LEN.unpack(await r.content.readexactly(4))
                head = json.loads(await r.content.readexactly(n))
                out = []
                for e in head["partitions"]:
                    err = _entry_error(e)
                    if err is not None:
                        out.append(PartitionData(e["topic"], e["partition"], error=err))
                        continue
                    size = int(e["size"])
                    data = await r.content.readexactly(size) if size else b""
                    out.append(PartitionData(e["topic"], int(e["partition"]), data, int(e["high_watermark"]),
                                             int(e["log_start_offset"]), int(e["log_end_offset"])))
                return out
        except aiohttp.ClientConnectorError as e:
            raise KraftlogError(ErrorCode.BROKER_NOT_AVAILABLE, f"leader at {url} unreachable: {e}",
                                refused=True) from None
        except (aiohttp.ClientError, asyncio.TimeoutError, asyncio.IncompleteReadError, OSError) as e:
            raise KraftlogError(ErrorCode.BROKER_NOT_AVAILABLE,
                                f"leader at {url} unreachable: {e or type(e).__name__}") from None

    async def epoch_end_offsets(self, leader_url: str, replica_id: int,
                                partitions: list[dict]) -> list[tuple[str, int, int, int, KraftlogError | None]]:
        """-> [(topic, partition, epoch, end_offset, error)]"""
        body = await self._post(f"{leader_url.rstrip('/')}{INTERNAL_PREFIX}/epoch-end-offsets",
                                {"replica_id": replica_id, "partitions": partitions}, self.request_timeout_ms / 1000)
        out = []
        for e in json.loads(body)["partitions"]:
            err = _entry_error(e)
            out.append((e["topic"], int(e["partition"]), int(e.get("epoch", -1)), int(e.get("end_offset", -1)), err))
        return out
