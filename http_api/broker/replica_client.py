"""Broker-to-broker replication routes: wire format and the follower's HTTP transport.

`POST /internal/v1/replica-fetch`, JSON request:
    {"replica_id", "broker_epoch", "max_wait_ms", "max_bytes", "partition_max_bytes",
     "partitions": [{"topic", "partition", "offset", "leader_epoch", "high_watermark"}]}
answer (`application/vnd.kraftlog.replica-fetch`): a 4-byte big-endian length N, N bytes of
JSON `{"partitions": [{"topic", "partition", "size", "high_watermark", "log_start_offset",
"log_end_offset"} or {"topic", "partition", "error_code", "message", ...}]}`, then the raw
batches of each partition back to back (`size` bytes each, in header order).

Incremental fetch sessions (KIP-227, `partitions/replication/fetch_session.py`): a follower
that speaks them adds `"session_id"` and `"session_epoch"` (0 and 0: start a session, a full
fetch) and `"forgotten": [{"topic", "partition"}]`; in a session `partitions` names only
those added or changed. The answer header then carries `"session_id"` (the session's id)
and, when the session is unknown or the epoch is not the expected one, `"session_error"`
(`FETCH_SESSION_ID_NOT_FOUND` / `INVALID_FETCH_SESSION_EPOCH`, no partitions: fetch in full
again); its `partitions` hold only those with records, an error or a new high watermark /
log start offset. Both sides without these fields behave as before (full fetches): a
rolling restart mixes them safely, and a follower whose leader's answer has no
`session_id` keeps fetching in full.

`POST /internal/v1/epoch-end-offsets` (OffsetsForLeaderEpoch), JSON request:
    {"replica_id", "partitions": [{"topic", "partition", "leader_epoch", "epoch"}]}
answer: {"partitions": [{"topic", "partition", "epoch", "end_offset"} or an error entry]}.
"""
from __future__ import annotations

import asyncio
import json
import struct
from dataclasses import dataclass

from partitions.errors import ErrorCode, KraftlogError
from http_api.broker.internal_auth import INTERNAL_TOKEN_HEADER
from http_api.broker.replica_connection import ConnectionRefused, ProtocolError, ReplicaConnectionPool

INTERNAL_PREFIX = "/internal/v1"
# the leader's answer must start within a fetch's long-poll wait plus this (an
# OffsetsForLeaderEpoch answer within this), and its bytes may not pause longer: a leader
# that went silent mid-request (cut off, no RST) is asked again this soon, not after the
# request timeout (issue 24). Well above a healthy leader's answer time: a false timeout
# costs one re-sent fetch.
REPLICA_READ_TIMEOUT_MS = 1_500
# ... plus this much per partition the request names: a full fetch (or a session re-sent in
# full) of tens of thousands of partitions takes the leader seconds to parse, fill into its
# session and read before its answer can start (issue 25: after a kill -9 at 100,000
# partitions a survivor's full fetch of 50,000 partitions timed out at 2 s again and again,
# each retry a new full fetch replacing the one the leader was working on, for minutes)
REPLICA_READ_TIMEOUT_PER_PARTITION_US = 200
REPLICA_FETCH_MEDIA = "application/vnd.kraftlog.replica-fetch"
_LEN = struct.Struct(">I")


@dataclass
class PartitionData:
    """One partition of a replica-fetch answer (error is None on success)."""

    topic: str
    partition: int
    records: bytes | memoryview = b""
    high_watermark: int = -1
    log_start_offset: int = -1
    log_end_offset: int = -1
    error: KraftlogError | None = None


def error_entry(topic: str, partition: int, err: KraftlogError) -> dict:
    return {"topic": topic, "partition": partition, "error_code": err.code.name, "message": err.message,
            **err.extra}


def _entry_error(e: dict) -> KraftlogError | None:
    return KraftlogError.from_body(e, ignore=("topic", "partition"))


class FetchAnswer(list):
    """A replica-fetch answer: its `PartitionData` list, with the session fields of the
    header (`session_id` None: the leader has no sessions)."""

    session_id: int | None = None
    session_error: str | None = None


def encode_fetch_header(entries: list[dict], **extra) -> bytes:
    """Length prefix + JSON header; the partitions' batches follow (written without joining:
    a fetch answer carries megabytes, and copies of them dominated the leader's CPU).
    `extra`: header fields besides `partitions` (the session's)."""
    head = json.dumps({"partitions": entries, **extra}, separators=(",", ":")).encode()
    return _LEN.pack(len(head)) + head


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


def decode_fetch_response(body) -> FetchAnswer:
    """Parse a replica-fetch answer; each partition's records are a memoryview slice of
    `body` (no copy). A malformed answer is CORRUPT_MESSAGE."""
    view = memoryview(body)
    if len(view) < 4:
        raise KraftlogError(ErrorCode.CORRUPT_MESSAGE, "replica-fetch answer is truncated")
    (n,) = _LEN.unpack_from(view, 0)
    try:
        head = json.loads(bytes(view[4:4 + n]))
        entries = head["partitions"]
        session_id = head.get("session_id")
        session_id = None if session_id is None else int(session_id)
        session_error = head.get("session_error")
    except (ValueError, KeyError, TypeError, AttributeError):
        raise KraftlogError(ErrorCode.CORRUPT_MESSAGE, "replica-fetch answer header is not the expected JSON") from None
    pos = 4 + n

    def read(size: int) -> memoryview:
        nonlocal pos
        pos += size
        if pos > len(view):
            raise KraftlogError(ErrorCode.CORRUPT_MESSAGE, "replica-fetch answer is shorter than its header says")
        return view[pos - size:pos]
    try:
        out = FetchAnswer(_entries_to_data(entries, read))
    except (KeyError, TypeError, ValueError):
        raise KraftlogError(ErrorCode.CORRUPT_MESSAGE, "replica-fetch answer has a malformed partition entry") from None
    out.session_id, out.session_error = session_id, (str(session_error) if session_error else None)
    return out


def _error(status: int, body: bytes) -> KraftlogError:
    try:
        err = KraftlogError.from_body(json.loads(body))
    except ValueError:
        err = None
    return err or KraftlogError(ErrorCode.UNKNOWN_SERVER_ERROR, f"leader answered HTTP {status}")


class ReplicaTransport:
    """The follower side of the internal routes over `ReplicaConnectionPool` (lean HTTP/1.1,
    the answer body received straight into one buffer; each partition's records are a
    memoryview slice of it, appended without a copy). An unreachable leader, a timeout or
    a garbled answer is BROKER_NOT_AVAILABLE, with `refused=True` when nothing listens at
    its address (the fetcher then reports the leader to the controller). A request is bounded
    by `request_timeout_ms` in all and by `read_timeout_ms` while its answer is awaited
    (`REPLICA_READ_TIMEOUT_MS`). Fetches use incremental fetch sessions (KIP-227)."""

    supports_fetch_sessions = True

    def __init__(self, request_timeout_ms: int = 30_000, connect_timeout_ms: int = 3_000,
                 internal_token: str | None = None, ssl_context=None,
                 read_timeout_ms: int = REPLICA_READ_TIMEOUT_MS) -> None:
        if read_timeout_ms <= 0:
            raise ValueError(f"read_timeout_ms={read_timeout_ms} must be positive")
        self.request_timeout_ms = request_timeout_ms
        self.read_timeout_ms = read_timeout_ms
        self.pool = ReplicaConnectionPool(connect_timeout_ms / 1000, ssl_context=ssl_context)
        self.headers = {INTERNAL_TOKEN_HEADER: internal_token} if internal_token else {}

    async def close(self) -> None:
        self.pool.close()

    def first_byte_timeout_ms(self, wait_ms: int, partitions: int) -> float:
        """How soon the answer to a request naming `partitions` must start: the long-poll
        wait, `read_timeout_ms`, and REPLICA_READ_TIMEOUT_PER_PARTITION_US per partition."""
        return wait_ms + self.read_timeout_ms + partitions * REPLICA_READ_TIMEOUT_PER_PARTITION_US / 1000

    async def _post(self, leader_url: str, route: str, doc: dict, timeout_s: float, wait_ms: int = 0):
        """`wait_ms`: the leader may hold the answer this long (a long poll) before its read bound."""
        url = f"{leader_url.rstrip('/')}{INTERNAL_PREFIX}/{route}"
        body = json.dumps(doc, separators=(",", ":")).encode()
        first_byte_ms = self.first_byte_timeout_ms(wait_ms, len(doc.get("partitions", ())))
        try:
            # asyncio.timeout, not wait_for: no inner task whose late error nobody retrieves
            async with asyncio.timeout(max(timeout_s, first_byte_ms / 1000)):
                answer = await self.pool.post(leader_url, f"{INTERNAL_PREFIX}/{route}", body, headers=self.headers,
                                              first_byte_timeout_s=first_byte_ms / 1000,
                                              idle_timeout_s=self.read_timeout_ms / 1000)
        except ConnectionRefused as e:
            raise KraftlogError(ErrorCode.BROKER_NOT_AVAILABLE, f"leader at {url} unreachable: {e}",
                                refused=True) from None
        except (ProtocolError, ValueError, asyncio.TimeoutError, OSError) as e:   # ssl.SSLError is an OSError
            raise KraftlogError(ErrorCode.BROKER_NOT_AVAILABLE,
                                f"leader at {url} unreachable: {e or type(e).__name__}") from None
        if answer.status >= 400:
            raise _error(answer.status, bytes(answer.body))
        return answer.body

    async def fetch(self, leader_url: str, replica_id: int, broker_epoch: int, partitions: list[dict], *,
                    max_bytes: int, partition_max_bytes: int, max_wait_ms: int,
                    session: tuple[int, int, list[dict]] | None = None) -> FetchAnswer:
        """One long poll; each partition's records are a memoryview of the answer buffer.
        `session`: (session id, epoch, forgotten [{topic, partition}]) of an incremental
        fetch session; None: a sessionless full fetch."""
        doc = {"replica_id": replica_id, "broker_epoch": broker_epoch, "max_wait_ms": max_wait_ms,
               "max_bytes": max_bytes, "partition_max_bytes": partition_max_bytes, "partitions": partitions}
        if session is not None:
            doc["session_id"], doc["session_epoch"], doc["forgotten"] = session
        body = await self._post(leader_url, "replica-fetch", doc, max_wait_ms / 1000 + self.request_timeout_ms / 1000,
                                wait_ms=max_wait_ms)
        try:
            return decode_fetch_response(body)
        except KraftlogError as e:   # garbled on the way: like a dropped connection, fetch again
            raise KraftlogError(ErrorCode.BROKER_NOT_AVAILABLE, f"leader at {leader_url}: {e.message}") from None

    async def epoch_end_offsets(self, leader_url: str, replica_id: int,
                                partitions: list[dict]) -> list[tuple[str, int, int, int, KraftlogError | None]]:
        """-> [(topic, partition, epoch, end_offset, error)]"""
        body = await self._post(leader_url, "epoch-end-offsets", {"replica_id": replica_id, "partitions": partitions},
                                self.request_timeout_ms / 1000)
        out = []
        for e in json.loads(bytes(body))["partitions"]:
            err = _entry_error(e)
            out.append((e["topic"], int(e["partition"]), int(e.get("epoch", -1)), int(e.get("end_offset", -1)), err))
        return out
