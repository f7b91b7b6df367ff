"""Consumer instances of the Confluent REST Proxy v2 API (`/consumers/{group}/instances/{name}`).

A `ConsumerInstance` is a kraftlog consumer (`http_api.client.Consumer`, bootstrapped at
this broker and acting for the principal that created the instance) that lives between
requests: subscribing joins the group through the existing group coordinator (its
membership heartbeats in the background, so the instance keeps its partitions between
polls), `assignments` assigns partitions by hand, positions seek, `records` polls, commits
go to the group's committed offsets in `__consumer_offsets`. Operations on one instance run
one at a time (its lock).

`ConsumerInstances` holds them per (group, name) on this broker (like Confluent's proxy, an
instance lives on the proxy that created it: its `base_uri` names this broker) and deletes
an instance idle for `consumer_instance_timeout_ms` (Confluent's `consumer.instance.timeout.ms`,
default 300000), closing its consumer (which commits, with auto commit, and leaves the group).
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable

from http_api.rest_proxy import errors as rpe

log = logging.getLogger("kraftlog.rest_proxy")

CONSUMER_INSTANCE_TIMEOUT_MS = 300_000     # Confluent's consumer.instance.timeout.ms
CONSUMER_REQUEST_TIMEOUT_MS = 1_000        # Confluent's consumer.request.timeout.ms: a records poll waits this long
CONSUMER_REQUEST_MAX_BYTES = 64 << 20      # Confluent's consumer.request.max.bytes
AUTO_COMMIT_INTERVAL_MS = 5_000            # Kafka's auto.commit.interval.ms
EXPIRY_CHECK_INTERVAL_MS = 1_000

FORMATS = ("binary", "json")
RESETS = {"earliest": "earliest", "smallest": "earliest", "latest": "latest", "largest": "latest"}


class ConsumerInstance:
    """One consumer instance (see the module docstring). `mode` is None, "subscribe" or
    "assign": the two are exclusive (Confluent's 40903)."""

    def __init__(self, group: str, name: str, fmt: str, principal: str, options: dict,
                 make_consumer: Callable[..., Any]) -> None:
        self.group = group
        self.name = name
        self.format = fmt
        self.principal = principal
        self.options = options              # auto_offset_reset, enable_auto_commit
        self.request_timeout_ms = options.pop("request_timeout_ms", CONSUMER_REQUEST_TIMEOUT_MS)
        self._make = make_consumer
        self.consumer = make_consumer(**options)
        self.mode: str | None = None
        self.topics: list[str] = []
        self.lock = asyncio.Lock()
        self.last_used = time.monotonic()
        self.closed = False

    def touch(self) -> None:
        self.last_used = time.monotonic()

    async def reset(self) -> None:
        """Drop subscription and assignment: the consumer is closed (it commits with auto
        commit, and leaves the group) and a fresh one takes its place."""
        old, self.consumer = self.consumer, self._make(**self.options)
        self.mode, self.topics = None, []
        await old.close()

    async def subscribe(self, topics: list[str]) -> None:
        if self.mode == "assign":
            raise rpe.RestProxyError(rpe.ILLEGAL_STATE, "Illegal state: Subscription to topics, partitions and "
                                     "pattern are mutually exclusive (this instance has assigned partitions)")
        if self.mode == "subscribe":
            await self.reset()          # a new subscription replaces the old one (Kafka's subscribe)
        await self.consumer.subscribe(topics)
        self.mode, self.topics = "subscribe", list(topics)

    async def assign(self, tps: list[tuple[str, int]]) -> None:
        if self.mode == "subscribe":
            raise rpe.RestProxyError(rpe.ILLEGAL_STATE, "Illegal state: Subscription to topics, partitions and "
                                     "pattern are mutually exclusive (this instance is subscribed)")
        self.consumer.assign(tps)
        self.mode = "assign" if tps else None

    def assignment(self) -> list[tuple[str, int]]:
        return sorted(self.consumer.assignment())

    def _require_assigned(self, tps) -> None:
        assigned = set(self.consumer.assignment())
        for tp in tps:
            if tp not in assigned:
                raise rpe.RestProxyError(rpe.ILLEGAL_STATE, f"Illegal state: No current assignment for partition "
                                         f"{tp[0]}-{tp[1]}")

    async def seek(self, offsets: list[tuple[str, int, int]]) -> None:
        self._require_assigned([(t, p) for t, p, _ in offsets])
        for t, p, o in offsets:
            self.consumer.seek((t, p), o)

    async def seek_to(self, tps: list[tuple[str, int]], where: str) -> None:
        self._require_assigned(tps)
        for tp in tps:
            if where == "beginning":
                await self.consumer.seek_to_beginning(tp)
            else:
                await self.consumer.seek_to_end(tp)

    async def poll(self, timeout_ms: int, max_bytes: int) -> list:
        """Records of one poll, at most about `max_bytes` of keys and values (at least one
        record); the rest is sought back and returned by the next poll."""
        if self.mode is None:
            raise rpe.RestProxyError(rpe.ILLEGAL_STATE, "Illegal state: Consumer is not subscribed to any topics or "
                                     "assigned any partitions")
        records = await self.consumer.poll(timeout_ms)
        out, size = [], 0
        for i, r in enumerate(records):
            n = len(r.key or b"") + len(r.value or b"")
            if out and size + n > max_bytes:
                first: dict = {}
                for rest in records[i:]:
                    tp = (rest.topic, rest.partition)
                    first[tp] = min(first.get(tp, rest.offset), rest.offset)
                for tp, off in first.items():
                    self.consumer.seek(tp, off)
                break
            out.append(r)
            size += n
        return out

    async def commit(self, offsets: list[tuple[str, int, int]] | None) -> None:
        """Commit the positions of what was read (None) or the given offsets: as Confluent's
        proxy, an entry names the last offset consumed and offset + 1 is committed."""
        if offsets is None:
            await self.consumer.commit()
        else:
            await self.consumer.commit({(t, p): o + 1 for t, p, o in offsets})

    async def committed(self, tps: list[tuple[str, int]]) -> list[dict]:
        out = []
        for t, p in tps:
            off = await self.consumer.committed((t, p))
            if off is not None:
                out.append({"topic": t, "partition": p, "offset": off, "metadata": ""})
        return out

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            await self.consumer.close()


class ConsumerInstances:
    """The consumer instances of this broker's proxy, with idle expiry (see the module docstring)."""

    def __init__(self, instance_timeout_ms: int = CONSUMER_INSTANCE_TIMEOUT_MS) -> None:
        self.instance_timeout_ms = instance_timeout_ms
        self.instances: dict[tuple[str, str], ConsumerInstance] = {}
        self._task: asyncio.Task | None = None

    def reserve(self, group: str, name: str) -> None:
        if (group, name) in self.instances:
            raise rpe.RestProxyError(rpe.CONSUMER_ALREADY_EXISTS, "Consumer with specified consumer ID already exists "
                                     f"in the specified consumer group. ({name!r} in group {group!r}: delete it "
                                     "first or choose another name)")

    def add(self, inst: ConsumerInstance) -> None:
        self.reserve(inst.group, inst.name)
        self.instances[(inst.group, inst.name)] = inst

    def get(self, group: str, name: str, principal: str) -> ConsumerInstance:
        inst = self.instances.get((group, name))
        if inst is None:
            raise rpe.instance_not_found(group, name)
        if inst.principal != principal:
            raise rpe.RestProxyError(40301, f"consumer instance {name!r} of group {group!r} belongs to "
                                     f"{inst.principal}, not {principal}", 403)
        inst.touch()
        return inst

    async def delete(self, group: str, name: str, principal: str) -> None:
        inst = self.get(group, name, principal)
        self.instances.pop((group, name), None)
        async with inst.lock:
            await inst.close()

    async def expire_once(self, now: float | None = None) -> int:
        """Delete every instance idle longer than the timeout (not one serving a request)."""
        now = time.monotonic() if now is None else now
        n = 0
        for key, inst in list(self.instances.items()):
            if inst.lock.locked() or (now - inst.last_used) * 1000 < self.instance_timeout_ms:
                continue
            self.instances.pop(key, None)
            log.info("consumer instance %s of group %s expired (idle %d ms > consumer_instance_timeout_ms=%d)",
                     inst.name, inst.group, int((now - inst.last_used) * 1000), self.instance_timeout_ms)
            try:
                await inst.close()
            except Exception as e:  # noqa: BLE001 - its session expires at the coordinator instead
                log.info("closing expired consumer instance %s failed: %s", inst.name, e)
            n += 1
        return n

    async def _expiry_loop(self) -> None:
        while True:
            await asyncio.sleep(min(EXPIRY_CHECK_INTERVAL_MS, max(10, self.instance_timeout_ms // 4)) / 1000)
            await self.expire_once()

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._expiry_loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for key, inst in list(self.instances.items()):
            self.instances.pop(key, None)
            try:
                await asyncio.wait_for(inst.close(), 5)
            except Exception:  # noqa: BLE001 - shutting down: sessions expire at the coordinator
                pass
