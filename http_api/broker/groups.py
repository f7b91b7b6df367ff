"""Consumer group routes and the group coordinator shell (asyncio) of one broker.

Job: serve `/v1/groups...` on every broker. A group lives in partition
crc32(group) % offsets_topic_num_partitions of the internal compacted topic
`__consumer_offsets` (auto-created through the controller on first use, replication
factor min(offsets_topic_replication_factor, registered brokers), once that many are
live); its *coordinator* is that
partition's leader. Any other broker forwards the request there (header
`X-Kraftlog-Forwarded` stops loops: a forwarded request reaching a non-coordinator gets
421 NOT_COORDINATOR with `coordinator_id` / `coordinator_url`).

On the coordinator, a pure `GroupCoordinatorState` (partitions/groups) per led partition
holds groups and committed offsets. It is rebuilt by reading the partition back when this
broker becomes its leader (requests wait for the load) and dropped when it stops leading.
Every change is appended to the partition with acks=all before it is answered; offset
commits enter the cache only once written. Reads of group state (offsets fetch, describe)
first pass a read barrier (`_read_barrier`: a marker committed at the loaded leader epoch),
so a deposed coordinator never answers from its stale cache. A timer removes members whose
session expired.

Routes (JSON; see API.md for the two offsets routes, kept exactly):
  POST /v1/groups/{g}/join        {"subscribed_topics", "member_id"?, "session_timeout_ms"?,
                                   "rebalance_timeout_ms"?, "assignor"?, "client_id"?}
  POST /v1/groups/{g}/heartbeat   {"member_id", "member_epoch", "owned"?: [{"topic","partition"}],
                                   "subscribed_topics"?}
     both answer {"member_id", "member_epoch", "heartbeat_interval_ms", "session_timeout_ms",
                  "assignment": [{"topic", "partition"}]}
  POST /v1/groups/{g}/leave       {"member_id"}
  POST /v1/groups/{g}/offsets     {"offsets": [{"topic","partition","offset","metadata"?}],
                                   "member_id"?, "member_epoch"? (or "generation_id")}
  GET  /v1/groups/{g}/offsets     {"offsets": [{"topic","partition","offset"}]}
  GET  /v1/groups                 {"groups": [{"group_id","state","members","coordinator_id"}]}
  GET  /v1/groups/{g}             state, members (assignment, epochs) and per-partition
                                  committed offset, high watermark, log end offset, lag
  GET  /v1/groups/{g}/coordinator {"partition", "coordinator_id", "coordinator_url"}
  DELETE /v1/groups/{g}           204: an empty group and its offsets forgotten (409 NON_EMPTY_GROUP)
"""
from __future__ import annotations

import asyncio
import json
import logging
import uuid
from typing import Any

import aiohttp
from aiohttp import web

from http_api.broker.context import BrokerContext
from http_api.broker.group_offsets import validate_group_id
from http_api.broker.internal_auth import INTERNAL_TOKEN_HEADER
from http_api.wire import codecs
from http_api.wire.auth import forwarding_headers
from http_api.wire.codecs import JSON
from partitions.errors import ErrorCode, KraftlogError
from partitions.clock import SYSTEM_CLOCK, Clock
from partitions.groups import records as grec
from partitions.groups.coordinator import GroupConfig, GroupCoordinatorState, GroupError
from partitions.log import record_batch as rb
from partitions.replication.replica_manager import ACKS_ALL, ACKS_LEADER

log = logging.getLogger("kraftlog.groups")

OFFSETS_TOPIC = grec.OFFSETS_TOPIC
FORWARDED_HEADER = "X-Kraftlog-Forwarded"
EXPIRY_CHECK_INTERVAL_MS = 100
LOAD_READ_BYTES = 1 << 20
MEMBER_ID_MAX_CHARS = 255
COORDINATOR_WAIT_MS = 10_000     # how long a request waits for a coordinator to be elected / loaded
SERVICE_KEY: web.AppKey = web.AppKey("group_coordinator", object)


def _error(e: GroupError) -> KraftlogError:
    code = ErrorCode.__members__.get(e.code, ErrorCode.INVALID_REQUEST)  # GroupError names a Kafka code
    return KraftlogError(code, e.message)


async def _done() -> None:
    return None


# errors of the __consumer_offsets append, as a group client should read them (as Kafka maps them)
_APPEND_ERRORS = {
    ErrorCode.NOT_LEADER_OR_FOLLOWER: ErrorCode.NOT_COORDINATOR,
    ErrorCode.LEADER_NOT_AVAILABLE: ErrorCode.NOT_COORDINATOR,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: ErrorCode.NOT_COORDINATOR,
    ErrorCode.NOT_ENOUGH_REPLICAS: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.KAFKA_STORAGE_ERROR: ErrorCode.COORDINATOR_NOT_AVAILABLE,
}


async def _as_coordinator_error(aw, partition: int):
    try:
        return await aw
    except KraftlogError as e:
        code = _APPEND_ERRORS.get(e.code)
        if code is None:
            raise
        raise KraftlogError(code, f"writing to {OFFSETS_TOPIC}-{partition} failed ({e.code.name}: {e.message}); "
                                  "the group coordinator is moving or under-replicated: retry") from None


def _json(doc: Any, status: int = 200) -> web.Response:
    return web.Response(body=json.dumps(doc).encode(), status=status, content_type=JSON)


class _Loaded:
    """One led `__consumer_offsets` partition: its state once loaded, and its leader epoch."""

    def __init__(self, partition: int, leader_epoch: int, state: GroupCoordinatorState) -> None:
        self.partition = partition
        self.leader_epoch = leader_epoch
        self.state = state
        self.ready = asyncio.get_running_loop().create_future()
        self.task: asyncio.Task | None = None
        self.writes_in_flight = 0   # appends decided but not yet acknowledged (offset expiry waits for 0)


class GroupCoordinator:
    """The broker's group coordinator shell (see module docstring)."""

    def __init__(self, ctx: BrokerContext, clock: Clock = SYSTEM_CLOCK) -> None:
        self.ctx = ctx
        self.clock = clock
        self.config = ctx.config
        self.deps = ctx.deps
        self.rm = ctx.deps.replica_manager
        token = ctx.internal_token
        self._internal_headers = {INTERNAL_TOKEN_HEADER: token} if token else {}
        c = self.config
        self.group_config = GroupConfig(
            session_timeout_ms=c.group_session_timeout_ms,
            group_min_session_timeout_ms=c.group_min_session_timeout_ms,
            group_max_session_timeout_ms=c.group_max_session_timeout_ms,
            heartbeat_interval_ms=c.group_heartbeat_interval_ms,
            rebalance_timeout_ms=c.group_rebalance_timeout_ms)
        self.loaded: dict[int, _Loaded] = {}
        self._create_lock = asyncio.Lock()
        self._expiry_task: asyncio.Task | None = None
        self._retention_task: asyncio.Task | None = None
        self._topics: dict[str, int] = {}

    # ---- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        self.deps.metadata.add_listener(self.on_metadata)
        if self.deps.metadata.image is not None:
            self.on_metadata(self.deps.metadata.image)
        self._expiry_task = asyncio.ensure_future(self._expiry_loop())
        self._retention_task = asyncio.ensure_future(self._offsets_retention_loop())

    async def stop(self) -> None:
        for task in (self._expiry_task, self._retention_task):
            if task is not None:
                task.cancel()
        for p in list(self.loaded):
            self._unload(p)

    def on_metadata(self, image) -> None:
        """Load partitions we now lead, drop the ones we stopped leading, follow topic changes."""
        led = image.partitions_led_by(OFFSETS_TOPIC, self.config.broker_id)
        for p in list(self.loaded):
            if led.get(p) != self.loaded[p].leader_epoch:
                self._unload(p)
        for p, epoch in led.items():
            if p not in self.loaded:
                st = GroupCoordinatorState(self.group_config, self._topics)
                ld = self.loaded[p] = _Loaded(p, epoch, st)
                ld.task = asyncio.ensure_future(self._load(ld))
        topics = {name: len(t.partitions) for name, t in image.topics.items()}
        if topics != self._topics:
            gone = set(self._topics) - set(topics)
            self._topics = topics
            for ld in self.loaded.values():
                if ld.ready.done() and not ld.ready.exception():
                    asyncio.ensure_future(self._topics_changed(ld, topics, gone))

    async def _topics_changed(self, ld: _Loaded, topics: dict, gone: set) -> None:
        try:
            records = ld.state.update_topics(topics, self.clock.now_ms())
            for t in gone:
                records += ld.state.delete_topic_offsets(t)
            await self._append(ld, records, apply=True)
        except Exception as e:  # leadership moving: the next coordinator recomputes
            log.info("__consumer_offsets-%s: writing topic changes failed: %s", ld.partition, e)

    def _unload(self, p: int) -> None:
        ld = self.loaded.pop(p, None)
        if ld is None:
            return
        if ld.task is not None and not ld.task.done():
            ld.task.cancel()
        if not ld.ready.done():
            ld.ready.set_exception(KraftlogError(ErrorCode.NOT_COORDINATOR,
                                                 f"broker {self.config.broker_id} stopped leading "
                                                 f"{OFFSETS_TOPIC}-{p}; retry"))
            ld.ready.exception()  # retrieved: no "never retrieved" warning
        log.info("group coordinator for %s-%d unloaded (leadership moved)", OFFSETS_TOPIC, p)

    async def _load(self, ld: _Loaded) -> None:
        """Replay the partition from its log start to its log end into a fresh state."""
        try:
            t0 = self.clock.monotonic_ms()
            lg = self.rm.logs.get((OFFSETS_TOPIC, ld.partition))
            n = 0
            if lg is not None:
                now = self.clock.now_ms()
                offset, end = lg.log_start_offset, lg.log_end_offset
                while offset < end:
                    data = lg.read(offset, LOAD_READ_BYTES, max_offset=end)
                    if not data.records:
                        break
                    for header, batch in rb.iter_batches(data.records, validate=False):
                        if header.is_control:
                            continue
                        for r in rb.decode_records(batch, validate=False):
                            if offset <= r.offset < end:
                                ld.state.replay(r.key, r.value, r.offset, now)
                                n += 1
                    offset = max(data.next_offset, offset + 1)
                    await asyncio.sleep(0)
            ld.state.topics = dict(self._topics)
            records = ld.state.refresh_targets(self.clock.now_ms())   # topics may have changed meanwhile
            if not ld.ready.done():
                ld.ready.set_result(None)
            if records:
                try:
                    await self._append(ld, records)
                except KraftlogError as e:  # leadership moving again: the next load redoes it
                    log.info("%s-%d: writing refreshed targets failed: %s", OFFSETS_TOPIC, ld.partition, e)
            log.info("group coordinator for %s-%d loaded %d records (%d groups) in %.0f ms",
                     OFFSETS_TOPIC, ld.partition, n, len(ld.state.groups), self.clock.monotonic_ms() - t0)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.exception("loading %s-%d failed", OFFSETS_TOPIC, ld.partition)
            if not ld.ready.done():
                ld.ready.set_exception(KraftlogError(ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                                     f"loading group state failed: {e}; retry"))
            self.loaded.pop(ld.partition, None)

    async def _expiry_loop(self) -> None:
        while True:
            await asyncio.sleep(EXPIRY_CHECK_INTERVAL_MS / 1000)
            for ld in list(self.loaded.values()):
                if not ld.ready.done() or ld.ready.exception() is not None:
                    continue
                nxt = ld.state.next_expiry_ms()
                if nxt is None or nxt > self.clock.now_ms():
                    continue
                try:
                    waits = []
                    for gid, mid, records in ld.state.expire(self.clock.now_ms()):
                        log.info("group %s: member %s expired (no heartbeat within its session timeout)", gid, mid)
                        waits.append(self._append(ld, records))
                    for r in await asyncio.gather(*waits, return_exceptions=True):
                        if isinstance(r, Exception):
                            raise r
                except Exception as e:
                    log.info("__consumer_offsets-%s: writing expiries failed: %s", ld.partition, e)

    async def _offsets_retention_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.offsets_retention_check_interval_ms / 1000)
            await self.expire_offsets_once()

    async def expire_offsets_once(self, now_ms: int | None = None) -> int:
        """Write tombstones for committed offsets past `offsets_retention_minutes` in every
        loaded partition (Kafka's offsets retention; the rule is in coordinator.py). A
        partition with writes in flight is skipped until the next check: a commit decided
        but not yet applied must not be deleted by a tombstone. Returns records written."""
        now = self.clock.now_ms() if now_ms is None else now_ms
        retention_ms = self.config.offsets_retention_minutes * 60_000
        written = 0
        for ld in list(self.loaded.values()):
            if not ld.ready.done() or ld.ready.exception() is not None or ld.writes_in_flight:
                continue
            records = ld.state.expire_offsets(now, retention_ms)
            if not records:
                continue
            try:
                await self._append(ld, records, apply=True)
                written += len(records)
                log.info("%s-%d: %d expired offset / group records written (offsets_retention_minutes=%d)",
                         OFFSETS_TOPIC, ld.partition, len(records), self.config.offsets_retention_minutes)
            except Exception as e:  # leadership moving: the next coordinator expires them
                log.info("%s-%d: writing expired offsets failed: %s", OFFSETS_TOPIC, ld.partition, e)
        return written

    # ---- storage -----------------------------------------------------------------------

    def _append(self, ld: _Loaded, records: list, *, apply: bool = False):
        """Start appending `records` now (call it right after deciding, with no await in
        between: appends then reach the log in decision order, as tasks start FIFO) and
        return an awaitable for the acks=all completion. Writes are pipelined (several wait
        for replication at once); a write outlives a cancelled request, and offset records
        enter the cache when written, whoever is still waiting."""
        if not records:
            return _done()
        batch = rb.build_batch([rb.Record(k, v) for k, v in records])
        task = asyncio.ensure_future(self.rm.append(OFFSETS_TOPIC, ld.partition, batch, acks=ACKS_ALL,
                                                    timeout_ms=self.config.offsets_commit_timeout_ms))
        ld.writes_in_flight += 1

        def written(t: asyncio.Task) -> None:
            ld.writes_in_flight -= 1
            if not t.cancelled() and t.exception() is None and apply and self.loaded.get(ld.partition) is ld:
                ld.state.apply(records, t.result().first_offset, self.clock.now_ms())
        task.add_done_callback(written)
        return _as_coordinator_error(asyncio.shield(task), ld.partition)

    async def _read_barrier(self, ld: _Loaded) -> None:
        """Make a read of group state linearizable (offsets fetch, describe): prove that this
        broker still leads the partition at the epoch `ld` was loaded at, after the request
        arrived, before answering from the cache (a deposed, partitioned coordinator may still
        believe it leads). A marker record (one fixed key: compaction keeps one) is appended and
        must become committed (HW past it) at that same leader epoch: then every ISR follower
        fetched it from us at this epoch, so none led a newer epoch when the request arrived,
        and a new leader can only come from the ISR. The marker is appended with acks=1 and
        its commit awaited through a committed-read long poll, not acks=all (a read makes no
        durability promise); it still needs an ISR of min.insync.replicas, since the HW holds
        below it (KIP-966). RF=1: committed at once.
        Failure is a retriable NOT_COORDINATOR / COORDINATOR_NOT_AVAILABLE, never the cache."""
        p = ld.partition

        def still_leader() -> None:
            part = self.rm.partitions.get((OFFSETS_TOPIC, p))
            if (self.loaded.get(p) is not ld or part is None or not part.is_leader
                    or part.leader_epoch != ld.leader_epoch):
                raise KraftlogError(ErrorCode.NOT_COORDINATOR,
                                    f"broker {self.config.broker_id} no longer leads {OFFSETS_TOPIC}-{p} at "
                                    f"leader epoch {ld.leader_epoch}; refresh the coordinator "
                                    "(GET /v1/groups/<group>/coordinator) and retry")
        still_leader()
        batch = rb.build_batch([rb.Record(grec.barrier_key(), grec.barrier_value(self.config.broker_id,
                                                                                  ld.leader_epoch))])
        timeout_ms = self.config.offsets_commit_timeout_ms
        try:
            res = await self.rm.append(OFFSETS_TOPIC, p, batch, acks=ACKS_LEADER)
            got = await self.rm.fetch(OFFSETS_TOPIC, p, res.last_offset, max_bytes=1, max_wait_ms=timeout_ms)
        except KraftlogError as e:
            raise KraftlogError(_APPEND_ERRORS.get(e.code, ErrorCode.COORDINATOR_NOT_AVAILABLE),
                                f"confirming the leadership of {OFFSETS_TOPIC}-{p} failed ({e.code.name}: "
                                f"{e.message}); the group coordinator may have moved: refresh it and retry") from None
        if not got.records:
            raise KraftlogError(ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                f"the in-sync replicas of {OFFSETS_TOPIC}-{p} did not confirm broker "
                                f"{self.config.broker_id} as its leader within {timeout_ms} ms "
                                "(offsets_commit_timeout_ms); the coordinator may be moving: refresh it and retry")
        still_leader()

    async def _ensure_offsets_topic(self) -> None:
        img = self.ctx.image
        if OFFSETS_TOPIC in img.topics:
            return
        async with self._create_lock:
            if OFFSETS_TOPIC in self.ctx.image.topics:
                return
            # as Kafka (KRaft): RF = min(offsets.topic.replication.factor, registered brokers),
            # and no creation until that many are live (a fenced broker may be restarting)
            live = sum(1 for b in img.brokers.values() if not b.fenced)
            rf = max(1, min(self.config.offsets_topic_replication_factor, len(img.brokers)))
            if live < rf:
                raise KraftlogError(ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                    f"{OFFSETS_TOPIC} needs {rf} live brokers to be created with replication "
                                    f"factor {rf} (offsets_topic_replication_factor="
                                    f"{self.config.offsets_topic_replication_factor}); {live} are live: retry "
                                    "once the others are up")
            try:
                await self.deps.controller.create_topic(OFFSETS_TOPIC, self.config.offsets_topic_num_partitions,
                                                        rf, {"cleanup.policy": "compact"})
                log.info("created %s with %d partitions, replication factor %d", OFFSETS_TOPIC,
                         self.config.offsets_topic_num_partitions, rf)
            except KraftlogError as e:
                if e.code is not ErrorCode.TOPIC_ALREADY_EXISTS:
                    raise
            await self.deps.metadata.wait_until(lambda i: OFFSETS_TOPIC in i.topics, COORDINATOR_WAIT_MS / 1000)

    async def coordinator_of(self, group: str) -> tuple[int, int, str | None]:
        """(partition, leader id, leader url) of the group's `__consumer_offsets` partition,
        waiting (bounded) for the topic and a leader to exist."""
        await self._ensure_offsets_topic()

        def has_leader(img) -> bool:
            t = img.topics.get(OFFSETS_TOPIC)
            if t is None:
                return False
            reg = t.partitions.get(grec.partition_for_group(group, len(t.partitions)))
            return reg is not None and reg.leader >= 0
        await self.deps.metadata.wait_until(has_leader, COORDINATOR_WAIT_MS / 1000)
        img = self.ctx.image
        t = img.topics.get(OFFSETS_TOPIC)
        if t is None:
            raise KraftlogError(ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                f"{OFFSETS_TOPIC} is not visible yet; retry in a moment")
        p = grec.partition_for_group(group, len(t.partitions))
        leader = t.partitions[p].leader
        b = img.brokers.get(leader)
        return p, leader, (b.url if b is not None else None)

    async def _local(self, p: int) -> _Loaded | None:
        ld = self.loaded.get(p)
        if ld is None:
            return None
        await asyncio.wait_for(asyncio.shield(ld.ready), COORDINATOR_WAIT_MS / 1000)
        if self.loaded.get(p) is not ld:
            raise KraftlogError(ErrorCode.NOT_COORDINATOR, "group coordinator moved while loading; retry")
        return ld

    # ---- request plumbing ----------------------------------------------------------------

    async def route(self, request: web.Request, group: str, fn) -> web.Response:
        """Run `fn(ld)` on the coordinator (here), or forward the request to it."""
        validate_group_id(group)
        p, leader, url = await self.coordinator_of(group)
        if leader == self.config.broker_id:
            try:
                ld = await self._local(p)
            except asyncio.TimeoutError:
                raise KraftlogError(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                                    f"group state of {OFFSETS_TOPIC}-{p} is still loading; retry") from None
            if ld is not None:
                try:
                    return await fn(ld)
                except GroupError as e:
                    raise _error(e) from None
        if request.headers.get(FORWARDED_HEADER) or url is None or leader == self.config.broker_id:
            raise KraftlogError(ErrorCode.NOT_COORDINATOR,
                                f"broker {self.config.broker_id} is not the coordinator of group {group!r}; "
                                f"send it to broker {leader} at {url}", coordinator_id=leader,
                                coordinator_url=url)
        return await self._forward(request, url)

    async def _forward(self, request: web.Request, url: str) -> web.Response:
        session = self.deps.http_session
        if session is None:
            raise KraftlogError(ErrorCode.COORDINATOR_NOT_AVAILABLE, "forwarding is not configured")
        body = await request.read()
        # the coordinator authorizes the client, not this broker (auth.forwarding_headers)
        headers = {FORWARDED_HEADER: str(self.config.broker_id), "Accept": JSON, **forwarding_headers()}
        ct = request.headers.get("Content-Type")
        if ct:
            headers["Content-Type"] = ct
        try:
            async with session.request(request.method, url.rstrip("/") + request.rel_url.path_qs,
                                       data=body or None, headers=headers,
                                       timeout=aiohttp.ClientTimeout(
                                           total=self.config.offsets_commit_timeout_ms / 1000 + 10)) as resp:
                out = await resp.read()
                return web.Response(body=out, status=resp.status,
                                    content_type=codecs.media_type(resp.headers.get("Content-Type")) or JSON)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            raise KraftlogError(ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                f"cannot reach the group coordinator at {url}: {e}; retry") from None

    async def _doc(self, request: web.Request) -> dict:
        doc = await self.ctx.read_document(request)
        if not isinstance(doc, dict):
            raise KraftlogError(ErrorCode.INVALID_REQUEST, "body must be a JSON object")
        return doc

    # ---- handlers ----------------------------------------------------------------------

    async def join(self, request: web.Request) -> web.Response:
        group = request.match_info["group"]
        doc = await self._doc(request)
        topics = doc.get("subscribed_topics")
        if not isinstance(topics, list) or not topics or not all(isinstance(t, str) for t in topics):
            raise KraftlogError(ErrorCode.INVALID_REQUEST,
                                'subscribed_topics: give a non-empty list of topic names')
        member_id = doc.get("member_id") or None
        opts = {}
        for k in ("session_timeout_ms", "rebalance_timeout_ms"):
            v = doc.get(k)
            if v is not None:
                if isinstance(v, bool) or not isinstance(v, int):
                    raise KraftlogError(ErrorCode.INVALID_REQUEST, f"{k}: must be an integer")
                opts[k] = v
        for k in ("assignor", "client_id"):
            v = doc.get(k)
            if v is not None:
                if not isinstance(v, str):
                    raise KraftlogError(ErrorCode.INVALID_REQUEST, f"{k}: must be a string")
                opts[k] = v
        if member_id is not None and (not isinstance(member_id, str) or len(member_id) > MEMBER_ID_MAX_CHARS):
            raise KraftlogError(ErrorCode.INVALID_REQUEST,
                                f"member_id: must be a string of at most {MEMBER_ID_MAX_CHARS} characters "
                                "(a fresh uuid per consumer instance), or omitted")
        opts.setdefault("client_id", request.headers.get("X-Client-Id", ""))

        async def go(ld: _Loaded) -> web.Response:
            res, records = ld.state.join(group, member_id or uuid.uuid4().hex, topics, self.clock.now_ms(), **opts)
            await self._append(ld, records)
            return _json(res.to_json())
        return await self.route(request, group, go)

    async def heartbeat(self, request: web.Request) -> web.Response:
        group = request.match_info["group"]
        doc = await self._doc(request)
        member_id, epoch = doc.get("member_id"), doc.get("member_epoch")
        if not isinstance(member_id, str) or isinstance(epoch, bool) or not isinstance(epoch, int):
            raise KraftlogError(ErrorCode.INVALID_REQUEST,
                                'body must be {"member_id": str, "member_epoch": int, "owned"?: [...]}')
        owned = doc.get("owned")
        if owned is not None:
            owned = _parse_tps(owned, "owned")
        topics = doc.get("subscribed_topics")
        if topics is not None and (not isinstance(topics, list) or not all(isinstance(t, str) for t in topics)):
            raise KraftlogError(ErrorCode.INVALID_REQUEST, "subscribed_topics: must be a list of topic names")

        async def go(ld: _Loaded) -> web.Response:
            res, records = ld.state.heartbeat(group, member_id, epoch, self.clock.now_ms(), owned=owned,
                                              subscribed_topics=topics)
            await self._append(ld, records)
            return _json(res.to_json())
        return await self.route(request, group, go)

    async def leave(self, request: web.Request) -> web.Response:
        group = request.match_info["group"]
        doc = await self._doc(request)
        member_id = doc.get("member_id")
        if not isinstance(member_id, str):
            raise KraftlogError(ErrorCode.INVALID_REQUEST, 'body must be {"member_id": str}')

        async def go(ld: _Loaded) -> web.Response:
            records = ld.state.leave(group, member_id, self.clock.now_ms())
            await self._append(ld, records)
            return _json({"member_id": member_id, "member_epoch": -1})
        return await self.route(request, group, go)

    async def commit_offsets(self, request: web.Request) -> web.Response:
        group = request.match_info["group"]
        validate_group_id(group)
        doc = await self._doc(request)
        entries = doc.get("offsets")
        if not isinstance(entries, list):
            raise KraftlogError(ErrorCode.INVALID_REQUEST,
                                'offsets: body must be {"offsets": [{"topic", "partition", "offset"}]}')
        img = self.ctx.image
        parsed = []
        for i, e in enumerate(entries):
            if not isinstance(e, dict):
                raise KraftlogError(ErrorCode.INVALID_REQUEST, f"offsets[{i}]: must be an object")
            t, p, o, meta = e.get("topic"), e.get("partition"), e.get("offset"), e.get("metadata")
            if not isinstance(t, str):
                raise KraftlogError(ErrorCode.INVALID_REQUEST, f"offsets[{i}].topic: must be a string")
            for fname, v in (("partition", p), ("offset", o)):
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    raise KraftlogError(ErrorCode.INVALID_REQUEST,
                                        f"offsets[{i}].{fname}: must be an integer >= 0, got {v!r}")
            if meta is not None and not isinstance(meta, str):
                raise KraftlogError(ErrorCode.INVALID_REQUEST, f"offsets[{i}].metadata: must be a string")
            if img.partition(t, p) is None:
                raise KraftlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                    f"offsets[{i}]: {t}-{p} does not exist")
            parsed.append((t, p, o, meta))
        member_id = doc.get("member_id")
        epoch = doc.get("member_epoch", doc.get("generation_id"))
        if member_id is not None and not isinstance(member_id, str):
            raise KraftlogError(ErrorCode.INVALID_REQUEST, "member_id: must be a string")
        if epoch is not None and (isinstance(epoch, bool) or not isinstance(epoch, int)):
            raise KraftlogError(ErrorCode.INVALID_REQUEST, "member_epoch: must be an integer")

        async def go(ld: _Loaded) -> web.Response:
            records = ld.state.prepare_commit(group, parsed, self.clock.now_ms(), member_id=member_id,
                                              member_epoch=epoch)
            await self._append(ld, records, apply=True)
            return _json({"offsets": [{"topic": t, "partition": p, "offset": o} for t, p, o, _ in parsed]})
        return await self.route(request, group, go)

    async def fetch_offsets(self, request: web.Request) -> web.Response:
        group = request.match_info["group"]

        async def go(ld: _Loaded) -> web.Response:
            await self._read_barrier(ld)    # never answer from the cache of a deposed coordinator
            await self._import_legacy(ld, group)
            return _json({"offsets": [{"topic": t, "partition": p, "offset": om.offset}
                                      for t, p, om in ld.state.fetch_offsets(group)]})
        return await self.route(request, group, go)

    async def _import_legacy(self, ld: _Loaded, group: str) -> None:
        """Offsets committed before `__consumer_offsets` existed (per-broker file,
        http_api/broker/group_offsets.py) are written into the group on its first offsets fetch, when
        the file is on the coordinator's broker (always, on a single node)."""
        legacy = self.deps.groups
        if legacy is None or group in ld.state.groups or ld.state.fetch_offsets(group):
            return
        img = self.ctx.image
        entries = [(e["topic"], e["partition"], e["offset"]) for e in legacy.fetch(group)
                   if img.partition(e["topic"], e["partition"]) is not None]
        if entries:
            await self._append(ld, ld.state.prepare_commit(group, entries, self.clock.now_ms()), apply=True)
            log.info("group %s: imported %d offsets from the legacy per-broker store", group, len(entries))
        if legacy.fetch(group):
            await legacy.forget(group)   # imported once: a later delete of the group must not revive them

    async def delete_group(self, request: web.Request) -> web.Response:
        group = request.match_info["group"]

        async def go(ld: _Loaded) -> web.Response:
            await self._append(ld, ld.state.delete_group(group), apply=True)
            return web.Response(status=204)
        return await self.route(request, group, go)

    async def coordinator(self, request: web.Request) -> web.Response:
        group = request.match_info["group"]
        validate_group_id(group)
        p, leader, url = await self.coordinator_of(group)
        return _json({"group_id": group, "partition": p, "coordinator_id": leader, "coordinator_url": url})

    async def describe(self, request: web.Request) -> web.Response:
        group = request.match_info["group"]

        async def go(ld: _Loaded) -> web.Response:
            await self._read_barrier(ld)
            now = self.clock.now_ms()
            d = ld.state.describe(group, now)
            if d is None:
                raise KraftlogError(ErrorCode.GROUP_ID_NOT_FOUND,
                                    f"group {group!r} has no members and no committed offsets; "
                                    "list groups with GET /v1/groups")
            committed = {(t, p): om.offset for t, p, om in ld.state.fetch_offsets(group)}
            owner = {}
            tps = set(committed)
            for m in d["members"]:
                for t, p in m["assigned"] + m["pending_revocation"]:
                    owner[(t, p)] = m["member_id"]
                for t in m["subscribed_topics"]:
                    tps.update((t, p) for p in range(self._topics.get(t, 0)))
            ends = await asyncio.gather(*(self._partition_end(t, p) for t, p in sorted(tps)))
            parts = []
            for (t, p), (hw, leo) in zip(sorted(tps), ends):
                c = committed.get((t, p))
                parts.append({"topic": t, "partition": p, "committed_offset": c, "high_watermark": hw,
                              "log_end_offset": leo,
                              "lag": (max(0, hw - c) if hw is not None and c is not None else None),
                              "member_id": owner.get((t, p))})
            d["coordinator_id"] = self.config.broker_id
            d["partitions"] = parts
            d["total_lag"] = sum(x["lag"] for x in parts if x["lag"] is not None)
            return _json(d)
        return await self.route(request, group, go)

    async def _partition_end(self, topic: str, partition: int) -> tuple[int | None, int | None]:
        """(high watermark, log end offset) of a partition from its leader (None when unknown)."""
        part = self.rm.partitions.get((topic, partition))
        if part is not None and part.is_leader:
            lg = self.rm.logs.get((topic, partition))
            return part.high_watermark, (lg.log_end_offset if lg is not None else None)
        leader, url = self.rm.leader_info(topic, partition)
        if url is None or self.deps.http_session is None:
            return None, None
        try:
            async with self.deps.http_session.get(
                    f"{url.rstrip('/')}/v1/topics/{topic}/partitions/{partition}/offsets",
                    timeout=aiohttp.ClientTimeout(total=5)) as resp:
                if resp.status != 200:
                    return None, None
                doc = await resp.json()
                return doc.get("high_watermark"), doc.get("log_end_offset")
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError):
            return None, None

    def _local_groups(self) -> list[dict]:
        out = []
        for ld in self.loaded.values():
            if ld.ready.done() and ld.ready.exception() is None:
                for g in ld.state.list_groups():
                    out.append(dict(g, coordinator_id=self.config.broker_id))
        return out

    async def list_groups(self, request: web.Request) -> web.Response:
        """Every group of the cluster: ask each broker leading an offsets partition."""
        img = self.ctx.image
        t = img.topics.get(OFFSETS_TOPIC)
        leaders = sorted({reg.leader for reg in t.partitions.values() if reg.leader >= 0}) if t else []
        groups: list[dict] = []
        errors = []
        for b in leaders:
            if b == self.config.broker_id:
                groups += self._local_groups()
                continue
            broker = img.brokers.get(b)
            try:
                async with self.deps.http_session.get(f"{broker.url.rstrip('/')}/internal/v1/groups",
                                                      headers=self._internal_headers,
                                                      timeout=aiohttp.ClientTimeout(total=5)) as resp:
                    doc = await resp.json()
                    groups += doc["groups"]
            except Exception as e:  # noqa: BLE001 - reported, the rest is still listed
                errors.append(f"broker {b}: {e}")
        body = {"groups": self._current_coordinators_only(groups, t)}
        if errors:
            body["errors"] = errors
        return _json(body)

    @staticmethod
    def _current_coordinators_only(groups: list[dict], offsets_topic) -> list[dict]:
        """One entry per group, from the broker this broker's metadata says leads its
        offsets partition: a deposed coordinator that has not yet seen the change (a
        partitioned one) may still hold the group; its listing is dropped."""
        n = len(offsets_topic.partitions) if offsets_topic else 0
        out: dict[str, dict] = {}
        for g in groups:
            reg = offsets_topic.partitions.get(grec.partition_for_group(g["group_id"], n)) if n else None
            if reg is not None and reg.leader == g.get("coordinator_id"):
                out[g["group_id"]] = g
        return [out[k] for k in sorted(out)]

    async def internal_list_groups(self, request: web.Request) -> web.Response:
        return _json({"groups": self._local_groups()})


def _parse_tps(items: Any, name: str) -> list[tuple[str, int]]:
    if not isinstance(items, list):
        raise KraftlogError(ErrorCode.INVALID_REQUEST, f"{name}: must be a list of {{topic, partition}}")
    out = []
    for i, e in enumerate(items):
        if not isinstance(e, dict) or not isinstance(e.get("topic"), str) or isinstance(e.get("partition"), bool) \
                or not isinstance(e.get("partition"), int):
            raise KraftlogError(ErrorCode.INVALID_REQUEST, f"{name}[{i}]: must be {{\"topic\": str, \"partition\": int}}")
        out.append((e["topic"], e["partition"]))
    return out


def _register_metrics(gc: GroupCoordinator, registry) -> None:
    import prometheus_client as prom

    def count(fn):
        return lambda: sum(fn(ld.state) for ld in list(gc.loaded.values())
                           if ld.ready.done() and ld.ready.exception() is None)
    g = prom.Gauge("kraftlog_groups", "Consumer groups coordinated by this broker", registry=registry)
    g.set_function(count(lambda st: len(st.groups)))
    g = prom.Gauge("kraftlog_group_members", "Members of the groups coordinated by this broker", registry=registry)
    g.set_function(count(lambda st: sum(len(x.members) for x in st.groups.values())))
    g = prom.Gauge("kraftlog_group_coordinator_partitions",
                   "__consumer_offsets partitions this broker leads and has loaded", registry=registry)
    g.set_function(count(lambda st: 1))


def install_group_routes(app: web.Application, ctx: BrokerContext, clock: Clock = SYSTEM_CLOCK) -> GroupCoordinator:
    """Add the consumer group routes to the broker app; the coordinator starts with the app."""
    gc = GroupCoordinator(ctx, clock)
    app[SERVICE_KEY] = gc
    if ctx.deps.registry is not None:
        _register_metrics(gc, ctx.deps.registry)
    r = app.router
    r.add_get("/v1/groups", gc.list_groups)
    r.add_get("/v1/groups/{group}", gc.describe)
    r.add_delete("/v1/groups/{group}", gc.delete_group)
    r.add_get("/v1/groups/{group}/coordinator", gc.coordinator)
    r.add_post("/v1/groups/{group}/join", gc.join)
    r.add_post("/v1/groups/{group}/heartbeat", gc.heartbeat)
    r.add_post("/v1/groups/{group}/leave", gc.leave)
    r.add_post("/v1/groups/{group}/offsets", gc.commit_offsets)
    r.add_get("/v1/groups/{group}/offsets", gc.fetch_offsets)
    r.add_get("/internal/v1/groups", gc.internal_list_groups)

    async def _run(app: web.Application):
        gc.start()
        yield
        await gc.stop()

    app.cleanup_ctx.append(_run)
    return gc
