"""`Consumer`: reads partitions it was assigned (or every partition of subscribed topics)
with long polls, keeping one fetch in flight per partition; positions, seek, and commits
to a consumer group (membership in `http_api.client.groups`).
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any, Iterable

import aiohttp

from http_api.client.columns import RecordColumns, decode_columns
from http_api.client.groups import GroupMembership
from http_api.client.transport import (DEFAULT_CONNECT_TIMEOUT_MS, DEFAULT_METADATA_MAX_AGE_MS,
                                       DEFAULT_REQUEST_ATTEMPT_TIMEOUT_MS, MetadataCache, Transport)
from http_api.wire import codecs
from partitions.errors import ErrorCode, KraftlogError
from partitions.log import record_batch as rb

@dataclass
class ConsumerRecord:
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple = ()


class Consumer:
    """Long-polling consumer of assigned partitions (see module docstring).

    auto_offset_reset: where to start without a committed offset, or after an
    OFFSET_OUT_OF_RANGE: "earliest" (log start) or "latest" (high watermark).

    With a group_id, `subscribe()` joins the consumer group (http_api/client/groups.py): the
    coordinator assigns partitions, a background task heartbeats, each poll reconciles
    (revoked partitions are committed, then released). At-least-once by default: with
    enable_auto_commit the positions of records returned by earlier polls are committed every
    auto_commit_interval_ms, on revocation and on close; commit() commits explicitly."""

    def __init__(self, bootstrap=None, *, group_id: str | None = None, auto_offset_reset: str = "latest",
                 max_wait_ms: int = 500, max_bytes: int = 1024 * 1024, request_timeout_ms: int = 30_000,
                 client_id: str | None = None, session: aiohttp.ClientSession | None = None,
                 enable_auto_commit: bool = True, auto_commit_interval_ms: int = 5_000,
                 session_timeout_ms: int | None = None, assignor: str | None = None,
                 request_attempt_timeout_ms: int = DEFAULT_REQUEST_ATTEMPT_TIMEOUT_MS,
                 connect_timeout_ms: int = DEFAULT_CONNECT_TIMEOUT_MS,
                 user: str | None = None, password: str | None = None, token: str | None = None,
                 ca_file: str | None = None, isolation_level: str = "read_uncommitted",
                 metadata_max_age_ms: int = DEFAULT_METADATA_MAX_AGE_MS) -> None:
        if auto_offset_reset not in ("earliest", "latest"):
            raise ValueError("auto_offset_reset must be 'earliest' or 'latest'")
        if isolation_level not in ("read_uncommitted", "read_committed"):
            raise ValueError("isolation_level must be 'read_uncommitted' or 'read_committed'")
        # read_committed: only records below the last stable offset, never aborted ones (KIP-98)
        self.isolation_level = isolation_level
        self.t = Transport(bootstrap, client_id=client_id, request_timeout_ms=request_timeout_ms, session=session,
                           request_attempt_timeout_ms=request_attempt_timeout_ms,
                           connect_timeout_ms=connect_timeout_ms,
                           user=user, password=password, token=token, ca_file=ca_file)   # credentials: API.md Security
        self.meta = MetadataCache(self.t, metadata_max_age_ms)   # Kafka's metadata.max.age.ms
        self.group_id = group_id
        self.auto_offset_reset = auto_offset_reset
        self.max_wait_ms = max_wait_ms
        self.max_bytes = max_bytes
        self._assigned: list[tuple[str, int]] = []
        self._positions: dict[tuple[str, int], int] = {}
        self._inflight: dict[tuple[str, int], tuple[int, asyncio.Task]] = {}
        self._subscribed: list[str] = []
        # consumer group membership (subscribe() with a group_id)
        self.enable_auto_commit = enable_auto_commit
        self.auto_commit_interval_ms = auto_commit_interval_ms
        self.session_timeout_ms = session_timeout_ms
        self.assignor = assignor
        self.membership = None
        self._last_auto_commit = time.monotonic()
        self._committed_cache: dict | None = None

    # assignment
    def assign(self, partitions: Iterable[tuple[str, int]]) -> None:
        self._assigned = list(partitions)

    async def subscribe(self, topics: Iterable[str]) -> None:
        """With a group_id: join the group, which assigns partitions of `topics` among its
        members. Without: assign every partition of `topics`."""
        self._subscribed = list(topics)
        if self.group_id:
            self.membership = GroupMembership(self.t, self.group_id, self._subscribed,
                                              session_timeout_ms=self.session_timeout_ms, assignor=self.assignor,
                                              client_id=self.t.client_id)
            await self.membership.start()
            self._assigned = []
            await self._reconcile()
            return
        await self.meta.refresh()
        assigned = []
        for t in self._subscribed:
            n = await self.meta.partitions(t)
            if n == 0:
                raise KraftlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                    f"topic {t!r} does not exist; create it or check the name")
            assigned.extend((t, p) for p in range(n))
        self._assigned = assigned

    def assignment(self) -> list[tuple[str, int]]:
        return list(self._assigned)

    async def _offsets(self, tp) -> dict:
        url = await self.meta.leader_url(*tp)
        _, _, body = await self.t.request("GET", f"{url}/v1/topics/{tp[0]}/partitions/{tp[1]}/offsets")
        return json.loads(body)

    def _end(self, offs: dict) -> int:
        """The end a consumer of this isolation level starts from: read_committed the last
        stable offset (records of a transaction open now are read once it commits, as Kafka)."""
        if self.isolation_level == "read_committed" and "last_stable_offset" in offs:
            return offs["last_stable_offset"]
        return offs["high_watermark"]

    async def _reset(self, tp) -> int:
        offs = await self._offsets(tp)
        pos = offs["log_start_offset"] if self.auto_offset_reset == "earliest" else self._end(offs)
        self._positions[tp] = pos
        return pos

    async def _reconcile(self) -> None:
        """Apply the group's latest assignment: commit and release revoked partitions (drop
        lost ones without committing), start owning added ones at their committed offsets."""
        m = self.membership
        if m is None or not m.changed.is_set():
            return
        revoked, added, lost = m.pending_changes()
        if revoked:
            if not lost and self.enable_auto_commit:
                offs = {tp: self._positions[tp] for tp in revoked if tp in self._positions}
                try:
                    await self.commit(offs)
                except KraftlogError:
                    pass  # the next owner re-reads from the last commit (at-least-once)
            for tp in revoked:
                self._drop_inflight(tp)
                self._positions.pop(tp, None)
        self._committed_cache = None
        owned = (frozenset(self._assigned) - revoked) | added if not lost else added
        self._assigned = sorted(owned)
        for tp in added:
            self._positions.pop(tp, None)
        m.ack(owned)

    async def _maybe_auto_commit(self) -> None:
        if self.membership is None or not self.enable_auto_commit:
            return
        if time.monotonic() - self._last_auto_commit < self.auto_commit_interval_ms / 1000:
            return
        self._last_auto_commit = time.monotonic()
        offs = {tp: o for tp, o in self._positions.items() if tp in self._assigned}
        if offs:
            try:
                await self.commit(offs)
            except KraftlogError:
                pass  # retried at the next interval; at-least-once either way

    async def position(self, tp) -> int:
        if tp not in self._positions:
            if self.membership is not None:  # one offsets fetch per rebalance, not one per partition
                if self._committed_cache is None:
                    _, doc = await self.t.bootstrap_json("GET", f"/v1/groups/{self.group_id}/offsets")
                    self._committed_cache = {(e["topic"], e["partition"]): e["offset"] for e in doc["offsets"]}
                committed = self._committed_cache.get(tuple(tp))
            else:
                committed = await self.committed(tp) if self.group_id else None
            if committed is not None:
                self._positions[tp] = committed
            else:
                await self._reset(tp)
        return self._positions[tp]

    def seek(self, tp, offset: int) -> None:
        self._positions[tp] = offset
        self._drop_inflight(tp)

    async def seek_to_beginning(self, tp) -> None:
        self.seek(tp, (await self._offsets(tp))["log_start_offset"])

    async def seek_to_end(self, tp) -> None:
        self.seek(tp, self._end(await self._offsets(tp)))

    def _drop_inflight(self, tp) -> None:
        entry = self._inflight.pop(tp, None)
        if entry is not None:
            entry[1].cancel()

    async def _fetch(self, tp, offset: int, max_wait_ms: int) -> tuple[bytes, Any]:
        url = await self.meta.leader_url(*tp)
        _, headers, body = await self.t.request(
            "GET", f"{url}/v1/topics/{tp[0]}/partitions/{tp[1]}/records", accept=codecs.RAW_BATCH,
            params={"offset": str(offset), "max_bytes": str(self.max_bytes), "max_wait_ms": str(max_wait_ms),
                    **({"isolation_level": self.isolation_level} if self.isolation_level != "read_uncommitted"
                       else {})},
            # a fetch is safe to repeat: a leader silent past its long poll plus one attempt
            # timeout is marked suspect and the next poll refreshes metadata (part E)
            timeout_s=max_wait_ms / 1000 + self.t.attempt_timeout_s, hot=True)
        return body, headers

    async def poll(self, timeout_ms: int | None = None) -> list[ConsumerRecord]:
        """Records from any assigned partition; waits up to timeout_ms (long poll)."""
        wait_ms = self.max_wait_ms if timeout_ms is None else timeout_ms
        out: list[ConsumerRecord] = []
        for tp, pos, body, headers in await self._completed_fetches(wait_ms):
            nxt = pos
            topic, p = tp
            for header, batch in rb.iter_batches(body, validate=False):
                nxt = max(nxt, header.next_offset)
                if header.is_control:
                    continue
                records = rb.decode_records(batch, validate=False)
                if header.base_offset < pos:   # a batch that starts before the position
                    records = [r for r in records if r.offset >= pos]
                out.extend([ConsumerRecord(topic, p, r.offset, r.timestamp, r.key, r.value, r.headers)
                            for r in records])
            self._advance(tp, pos, nxt, headers, wait_ms)
        return out

    async def poll_columns(self, timeout_ms: int | None = None) -> list[RecordColumns]:
        """`poll()` for high rates: the same records as one `RecordColumns` per record batch
        (columns of offsets, timestamps, keys, values, headers; values are views of the
        fetched bytes) instead of one ConsumerRecord per record. Positions, fetch-ahead and
        commits as `poll()`."""
        wait_ms = self.max_wait_ms if timeout_ms is None else timeout_ms
        out: list[RecordColumns] = []
        for tp, pos, body, headers in await self._completed_fetches(wait_ms):
            batches, nxt = decode_columns(tp[0], tp[1], body, pos)
            self._advance(tp, pos, nxt, headers, wait_ms)
            out += batches
        return out

    async def _completed_fetches(self, wait_ms: int) -> list[tuple]:
        """Send a fetch for every assigned partition without one in flight, wait up to
        wait_ms for any to answer; -> (tp, position, body, headers) of each answered fetch
        still at its partition's position (errors handled: reset, metadata refresh)."""
        if self.membership is not None:
            await self._maybe_auto_commit()
            await self._reconcile()
            if not self._assigned:  # nothing assigned (yet): wait for the group to give us some
                try:
                    await asyncio.wait_for(self.membership.changed.wait(), wait_ms / 1000)
                except asyncio.TimeoutError:
                    pass
                await self._reconcile()
                if not self._assigned:
                    return []
        if not self._assigned:
            raise RuntimeError("assign() or subscribe() first")
        for tp in self._assigned:
            pos = await self.position(tp)
            entry = self._inflight.get(tp)
            if entry is None or entry[0] != pos:
                self._drop_inflight(tp)
                self._inflight[tp] = (pos, asyncio.ensure_future(self._fetch(tp, pos, wait_ms)))
        tasks = [t for _, t in self._inflight.values()]
        if self.membership is not None:  # a rebalance interrupts the long poll
            tasks.append(asyncio.ensure_future(self.membership.changed.wait()))
        await asyncio.wait(tasks, timeout=wait_ms / 1000 + 1, return_when=asyncio.FIRST_COMPLETED)
        if self.membership is not None:
            tasks[-1].cancel()
        done = []
        for tp, (pos, task) in list(self._inflight.items()):
            if not task.done():
                continue
            del self._inflight[tp]
            try:
                body, headers = task.result()
            except asyncio.CancelledError:
                continue
            except KraftlogError as e:
                if e.code is ErrorCode.OFFSET_OUT_OF_RANGE:
                    await self._reset(tp)
                    continue
                if e.code.retriable:
                    await self.meta.refresh()
                    continue
                raise
            if self._positions.get(tp) != pos:
                continue  # seeked meanwhile
            done.append((tp, pos, body, headers))
        return done

    def _advance(self, tp, pos: int, nxt: int, headers, wait_ms: int) -> int:
        """Move tp's position past the fetched batches and fetch ahead from there; -> it."""
        if self.isolation_level == "read_committed" and headers is not None:
            # the broker passed over aborted batches and markers: continue after them
            nxt = max(nxt, int(headers.get(codecs.HEADER_NEXT_OFFSET, nxt)))
        self._positions[tp] = nxt
        if nxt > pos and tp in self._assigned:
            # fetch ahead: the next records travel while the application handles these
            self._inflight[tp] = (nxt, asyncio.ensure_future(self._fetch(tp, nxt, wait_ms)))
        return nxt

    async def commit(self, offsets: dict | None = None) -> None:
        """Commit positions (or `offsets` {(topic, p): next offset}) to the group."""
        if not self.group_id:
            raise ValueError("commit needs a group_id")
        offs = offsets if offsets is not None else dict(self._positions)
        body: dict = {"offsets": [{"topic": t, "partition": p, "offset": o} for (t, p), o in offs.items()]}
        if self.membership is not None:
            if offsets is None:
                body["offsets"] = [e for e in body["offsets"] if (e["topic"], e["partition"]) in self._assigned]
            body.update(self.membership.commit_fields())
        if not body["offsets"]:
            return
        # retriable errors (coordinator moving / loading, broker down) are retried until
        # request_timeout_ms; fencing errors (ILLEGAL_GENERATION, ...) are raised at once
        deadline = time.monotonic() + self.t.request_timeout_ms / 1000
        while True:
            try:
                if self.membership is not None:   # straight to the coordinator
                    await self.membership.request("POST", f"/v1/groups/{self.group_id}/offsets", body)
                else:
                    await self.t.bootstrap_json("POST", f"/v1/groups/{self.group_id}/offsets", json_body=body)
                return
            except KraftlogError as e:
                if not e.code.retriable or time.monotonic() > deadline:
                    raise
                self.t.rotate()
                await asyncio.sleep(0.1)

    async def committed(self, tp) -> int | None:
        if not self.group_id:
            return None
        _, doc = await self.t.bootstrap_json("GET", f"/v1/groups/{self.group_id}/offsets")
        for e in doc["offsets"]:
            if (e["topic"], e["partition"]) == tuple(tp):
                return e["offset"]
        return None

    async def close(self) -> None:
        for tp in list(self._inflight):
            self._drop_inflight(tp)
        if self.membership is not None:
            if self.enable_auto_commit:
                try:
                    await self.commit()
                except KraftlogError:
                    pass
            await self.membership.close()
        await self.t.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()
