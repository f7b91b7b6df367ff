"""Client side of consumer group membership (used by `http_api.client.Consumer`).

`GroupMembership` joins a group with the subscribed topics and heartbeats in a background
task (every `heartbeat_interval_ms` the coordinator gives, at once when the consumer has
released partitions). The coordinator's answer is the partitions this member may consume;
the consumer reconciles at its next poll:

    revoked, added, lost = membership.pending_changes()
    ... commit positions of `revoked` (unless lost), stop fetching them ...
    membership.ack(owned)      # next heartbeat tells the coordinator they are released

Partitions are released only after that commit, and the coordinator gives them to another
member only once released, so two members never consume the same partition and the next
owner starts at the last position committed by the previous one. When the coordinator
fences this member (UNKNOWN_MEMBER_ID / FENCED_MEMBER_EPOCH: session expired), every
partition is *lost* (dropped without committing: another member may own them already) and
the member rejoins with epoch 0. Any broker accepts the requests (it forwards to the
coordinator); connection failures rotate to the next bootstrap broker.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from typing import Any, Iterable

from partitions.errors import ErrorCode, KraftlogError

log = logging.getLogger("kraftlog.client.group")

TopicPartition = tuple[str, int]
RETRY_BACKOFF_MS = 100
COORDINATOR_REFRESH_S = 10.0      # re-ask where the coordinator is (leadership may have moved)
FENCED_CODES = (ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_MEMBER_EPOCH)
# answers meaning "not here (any more)": retry through a bootstrap broker, which forwards
REDIRECT_CODES = (ErrorCode.BROKER_NOT_AVAILABLE, ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE)


class GroupMembership:
    """One member of a consumer group; see the module docstring for the protocol."""

    def __init__(self, transport: Any, group_id: str, topics: Iterable[str], *, session_timeout_ms: int | None = None,
                 rebalance_timeout_ms: int | None = None, assignor: str | None = None,
                 client_id: str | None = None) -> None:
        self.t = transport
        self.group_id = group_id
        self.topics = sorted(set(topics))
        self.session_timeout_ms = session_timeout_ms
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.assignor = assignor
        self.client_id = client_id
        # the member id is the client's (as in KIP-848): a retried join is the same member
        self.member_id: str = uuid.uuid4().hex
        self.member_epoch = 0
        self.heartbeat_interval_ms = 1000
        self.owned: frozenset = frozenset()        # what the consumer holds (acknowledged)
        self.assignment: frozenset = frozenset()   # what the coordinator last said we may hold
        self.lost = False
        self.changed = asyncio.Event()             # a new assignment to reconcile
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._closed = False
        self.joined = asyncio.Event()
        self.coordinator_url: str | None = None
        self._coordinator_found_at = 0.0

    @property
    def path(self) -> str:
        return f"/v1/groups/{self.group_id}"

    async def start(self, timeout_ms: int = 30_000) -> None:
        """Join (retrying retriable errors: coordinator being elected or loading), then heartbeat."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        while True:
            try:
                await self._join()
                break
            except KraftlogError as e:
                if not e.code.retriable or loop.time() > deadline:
                    raise
                await asyncio.sleep(RETRY_BACKOFF_MS / 1000)
        self._task = asyncio.ensure_future(self._run())

    async def _join(self) -> None:
        body: dict = {"subscribed_topics": self.topics, "member_id": self.member_id}
        for k in ("session_timeout_ms", "rebalance_timeout_ms", "assignor", "client_id"):
            v = getattr(self, k)
            if v is not None:
                body[k] = v
        _, doc = await self._call("join", body)
        self._apply(doc)
        self.joined.set()

    def _apply(self, doc: dict) -> None:
        self.member_id = doc["member_id"]
        self.member_epoch = doc["member_epoch"]
        self.heartbeat_interval_ms = max(10, int(doc.get("heartbeat_interval_ms", 1000)))
        new = frozenset((a["topic"], a["partition"]) for a in doc["assignment"])
        if new != self.assignment or new != self.owned:
            self.assignment = new
            self.changed.set()

    async def _call(self, op: str, body: dict) -> tuple[int, Any]:
        return await self.request("POST", f"{self.path}/{op}", body)

    async def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """Send to the group's coordinator directly (found with GET .../coordinator, refreshed
        every COORDINATOR_REFRESH_S); when it cannot be reached, through a bootstrap broker
        (which forwards to wherever the coordinator is now)."""
        now = time.monotonic()
        if self.coordinator_url is None or now - self._coordinator_found_at > COORDINATOR_REFRESH_S:
            await self._find_coordinator()
        url = self.coordinator_url
        if url:
            try:
                status, _, raw = await self.t.request(method, url + path, json_body=body)
                return status, (json.loads(raw) if raw else None)
            except KraftlogError as e:
                if e.code not in REDIRECT_CODES:
                    raise
                self.coordinator_url = None   # moved or down: ask a bootstrap broker
        return await self.t.bootstrap_json(method, path, json_body=body)

    async def _find_coordinator(self) -> None:
        self._coordinator_found_at = time.monotonic()
        try:
            _, doc = await self.t.bootstrap_json("GET", f"{self.path}/coordinator")
            self.coordinator_url = (doc.get("coordinator_url") or "").rstrip("/") or None
        except KraftlogError as e:
            log.info("group %s: finding the coordinator failed (%s); going through a bootstrap broker",
                     self.group_id, e)
            self.coordinator_url = None

    async def _run(self) -> None:
        while not self._closed:
            try:
                await asyncio.wait_for(self._wake.wait(), self.heartbeat_interval_ms / 1000)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            if self._closed:
                return
            try:
                await self.heartbeat_once()
            except asyncio.CancelledError:
                raise
            except KraftlogError as e:
                if e.code in FENCED_CODES:
                    log.warning("group %s: member %s fenced (%s); its partitions are lost, rejoining",
                                self.group_id, self.member_id, e.code.name)
                    self.lost = True
                    self.member_epoch = 0
                    self.assignment = frozenset()
                    self.changed.set()
                    await self._rejoin()
                else:
                    log.info("group %s: heartbeat failed (%s); retrying", self.group_id, e)
                    await asyncio.sleep(RETRY_BACKOFF_MS / 1000)
            except Exception as e:  # noqa: BLE001 - keep heartbeating
                log.warning("group %s: heartbeat error %s", self.group_id, e)
                await asyncio.sleep(RETRY_BACKOFF_MS / 1000)

    async def _rejoin(self) -> None:
        while not self._closed:
            try:
                await self._join()
                return
            except KraftlogError as e:
                log.info("group %s: rejoin failed (%s); retrying", self.group_id, e)
                await asyncio.sleep(RETRY_BACKOFF_MS / 1000)

    async def heartbeat_once(self) -> None:
        _, doc = await self._call("heartbeat", {
            "member_id": self.member_id, "member_epoch": self.member_epoch,
            "owned": [{"topic": t, "partition": p} for t, p in sorted(self.owned)]})
        self._apply(doc)

    def pending_changes(self) -> tuple[frozenset, frozenset, bool]:
        """(revoked, added, lost) between what the consumer holds and the latest assignment."""
        self.changed.clear()
        lost = self.lost
        self.lost = False
        if lost:
            return self.owned, self.assignment, True
        return self.owned - self.assignment, self.assignment - self.owned, False

    def ack(self, owned: Iterable[TopicPartition]) -> None:
        """The consumer now holds exactly `owned`; heartbeat at once when partitions were released."""
        owned = frozenset(owned)
        released = bool(self.owned - owned)
        self.owned = owned
        if released or owned != self.assignment:
            self._wake.set()

    def commit_fields(self) -> dict:
        return {"member_id": self.member_id, "member_epoch": self.member_epoch}

    async def close(self, leave: bool = True) -> None:
        self._closed = True
        self._wake.set()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        if leave and self.joined.is_set():
            try:
                await self._call("leave", {"member_id": self.member_id})
            except KraftlogError as e:
                log.info("group %s: leave failed (%s); the session will expire", self.group_id, e)
