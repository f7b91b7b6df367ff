"""Produce routes: `POST /v1/topics/{t}/records` (any broker: records are assigned partitions
and each partition's batch is appended locally or forwarded to its leader as a raw batch),
`POST /v1/topics/{t}/partitions/{p}/records` (the leader only: JSON/CBOR records or raw
batches, idempotent producers' duplicates answered with their original offsets) and
`POST /v1/producer-ids`.
"""
from __future__ import annotations

import asyncio
import logging

from aiohttp import web
import aiohttp

from http_api.broker.context import Routes, json_response, partition_param
from http_api.broker.producer_ids import ProducerIdAllocator
from http_api.loop_slices import gather_in_slices
from http_api.broker import txn_verification
from http_api.wire import codecs
from http_api.wire.auth import forwarding_headers
from http_api.wire.codecs import CBOR, JSON, RAW_BATCH
from http_api.wire.errors import ErrorCode, KraftlogError, http_status
from http_api.wire.partitioner import RoundRobin, partition_for_key
from http_api.wire.reachability import connection_refused
from partitions import internal_topics
from partitions.replication.replica_manager import ACKS_ALL, ACKS_NONE, parse_acks

log = logging.getLogger("kraftlog.broker")

METADATA_REFRESH_WAIT_S = 1.0   # topic-level produce: wait this long for newer metadata before retrying
# ... when the partition has no live leader (none in the metadata, or its leader refused the
# connection: its process is gone). Only a metadata change of the partition (the leader's
# fencing, a new leader) helps then, and that wakes the wait at once; the fallback retry is
# for a missed change. At 1 s, the 10,000 partitions a kill -9 left held at 30,000
# partitions retried each second, a quarter of a survivor's event loop while it was
# applying the fencing (issue 25).
NO_LEADER_REFRESH_WAIT_S = 5.0
# a leader that refused a forwarded produce is not connected to again for this long: its
# partitions fail at once as refused (after a kill -9 a request for thousands of partitions
# tried a connection per partition, again after every metadata refresh)
FORWARD_REFUSED_BACKOFF_MS = 500
# ... and after that, one TCP connect tells whether it listens again before the forwards go
# (_probe_refused); a connect that takes longer counts as listening (a busy process)
FORWARD_PROBE_TIMEOUT_MS = 1000
# forwarded produces in flight to one leader at a time; the others wait here, not in aiohttp's
# connector, so each re-checks FORWARD_REFUSED_BACKOFF_MS once it may go (issue 25: after a
# kill -9, 10,000 forwards queued in the connector each tried a refused connection in turn,
# holding the event loop 2-4.5 s)
FORWARD_CONNECTIONS_PER_LEADER = 100


def _nothing_appended(e: KraftlogError) -> bool:
    """Errors raised before any leader appended the batch, so a retry cannot duplicate it:
    no leader, "not the leader" answered up front (it names the leader), refused connection."""
    if e.code is ErrorCode.LEADER_NOT_AVAILABLE:
        return True
    if e.code is ErrorCode.NOT_LEADER_OR_FOLLOWER:
        return "leader_id" in e.extra or "becoming leader" in e.message
    return _refused(e)


def _refused(e: KraftlogError) -> bool:
    """The leader refused the connection (`_forward`): the request was never sent."""
    return e.code is ErrorCode.BROKER_NOT_AVAILABLE and bool(e.extra.get("refused"))


def _no_live_leader(e: KraftlogError) -> bool:
    """The partition has no leader in the metadata, or its leader's process is gone (refused)."""
    return e.code is ErrorCode.LEADER_NOT_AVAILABLE or _refused(e)


class ProduceRoutes(Routes):
    """Produce handlers and producer ids."""

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self.round_robin = RoundRobin()
        self._refused_until: dict[str, float] = {}   # leader URL -> monotonic time (FORWARD_REFUSED_BACKOFF_MS)
        self._forward_slots: dict[str, asyncio.Semaphore] = {}   # leader URL -> FORWARD_CONNECTIONS_PER_LEADER
        self._probing: dict[str, asyncio.Future] = {}   # leader URL -> its probe in flight (_probe_refused)

    async def produce_topic(self, request: web.Request) -> web.Response:
        return await self.ctx.measured(self._produce_topic, request, self.metrics.produce_requests, self.metrics.produce_latency)

    async def _produce_topic(self, request: web.Request) -> web.Response:
        name = request.match_info["topic"]
        internal_topics.check_client_write(name, "produce")
        acks = parse_acks(request.query.get("acks"))
        ct = request.headers.get("Content-Type")
        mt = codecs.media_type(ct)
        if mt == RAW_BATCH:
            raise KraftlogError(ErrorCode.UNSUPPORTED_MEDIA_TYPE,
                                "raw batches carry no partition: send them to "
                                f"/v1/topics/{name}/partitions/{{p}}/records, or send JSON/CBOR records here")
        body = await self.ctx.read_body(request)
        records = codecs.parse_produce_body(ct, body, max_records=self.config.request_max_records)
        topic = await self.ctx.ensure_topic(name)
        n_parts = len(topic.partitions)
        # assign partitions (validate all before storing anything)
        by_partition: dict[int, list[int]] = {}
        for i, r in enumerate(records):
            p = r.partition
            if p is None:
                p = (partition_for_key(r.key, n_parts) if r.key is not None
                     else self.round_robin.next(name, n_parts))
            elif p >= n_parts:
                raise KraftlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                    f"records[{i}].partition: topic {name!r} has partitions 0..{n_parts - 1}, "
                                    f"not {p}")
            by_partition.setdefault(p, []).append(i)
        max_msg = self._max_message_bytes(name)
        built = {p: codecs.build_batches([records[i] for i in idx], max_message_bytes=max_msg)
                 for p, idx in by_partition.items()}
        self.metrics.produce_bytes.inc(len(body))
        self.metrics.produce_records.inc(len(records))
        # started a slice of partitions per turn of the loop: a request naming thousands of
        # partitions does not hold the loop for seconds (http_api/loop_slices.py)
        results = await gather_in_slices(lambda p: self._append_anywhere(name, p, built[p], acks), list(built))
        entries: list[dict | None] = [None] * len(records)
        first_error: KraftlogError | None = None
        for (p, idx), res in zip(by_partition.items(), results):
            if isinstance(res, KraftlogError):
                first_error = first_error or res
                for i in idx:
                    entries[i] = {"partition": p, "error_code": res.code.name, "message": res.message}
            else:
                for j, i in enumerate(idx):
                    entries[i] = {"partition": p, "offset": res + j}
        if acks == ACKS_NONE and first_error is None:
            return web.Response(status=202)
        media = codecs.negotiate_response_type(request.headers.get("Accept"), mt)
        if media == RAW_BATCH:
            media = JSON
        if first_error is not None:
            doc = {"error_code": first_error.code.name, "message": first_error.message, "offsets": entries}
            return json_response(doc, http_status(first_error), media)
        return json_response({"offsets": entries}, 200, media)

    def _max_message_bytes(self, topic: str) -> int:
        raw = self.rm.topic_config(topic).get("max.message.bytes")
        try:
            return int(raw) if raw is not None else self.config.message_max_bytes
        except ValueError:
            return self.config.message_max_bytes

    async def _append_anywhere(self, topic: str, partition: int, batches: list[bytes], acks: int):
        """Append on the local leader or forward to the remote leader. Returns the first
        offset or the KraftlogError (never raises, so one partition's failure is reported
        per record)."""
        payload = batches[0] if len(batches) == 1 else b"".join(batches)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.request_timeout_ms / 1000
        view = self.deps.metadata
        while True:
            route = self._route(topic, partition)
            res = await self._append_once(topic, partition, payload, acks)
            if not (isinstance(res, KraftlogError) and _nothing_appended(res)) or loop.time() >= deadline:
                return res
            # the leader moved (failover, controlled shutdown): wait for newer metadata, retry
            if self._route(topic, partition) == route:   # else it moved while we tried: at once
                # woken only by an update touching this partition (not by every ISR change)
                fallback = NO_LEADER_REFRESH_WAIT_S if _no_live_leader(res) else METADATA_REFRESH_WAIT_S
                await view.partition_change(topic, partition, min(fallback, max(0.0, deadline - loop.time())))

    def _route(self, topic: str, partition: int):
        """Where an append of `topic`-`partition` goes now: (leads here, (leader id, leader URL))."""
        return self.rm.leads((topic, partition)), self.rm.leader_info(topic, partition)

    async def _append_once(self, topic: str, partition: int, payload: bytes, acks: int):
        try:
            part = self.rm.partitions.get((topic, partition))
            if part is not None and part.is_leader:
                res = await self.rm.append(topic, partition, payload, acks=acks,
                                           timeout_ms=self.config.request_timeout_ms)
                return res.first_offset
            leader_id, leader_url = self.rm.leader_info(topic, partition)
            if leader_id < 0 or not leader_url:
                raise KraftlogError(ErrorCode.LEADER_NOT_AVAILABLE, self.rm.no_leader_message(topic, partition))
            if leader_id == self.config.broker_id:
                # metadata says we lead but the replica manager has not caught up yet
                raise KraftlogError(ErrorCode.NOT_LEADER_OR_FOLLOWER,
                                    f"{topic}-{partition}: this broker is becoming leader; retry")
            return await self._forward(leader_url, topic, partition, payload, acks)
        except KraftlogError as e:
            return e
        except Exception as e:  # noqa: BLE001 - reported per record, logged
            log.exception("append to %s-%s failed", topic, partition)
            return KraftlogError(ErrorCode.UNKNOWN_SERVER_ERROR, f"append failed: {e}")

    async def _forward(self, leader_url: str, topic: str, partition: int, payload: bytes, acks: int) -> int:
        session = self.deps.http_session
        if session is None:
            raise KraftlogError(ErrorCode.BROKER_NOT_AVAILABLE, "forwarding is not configured on this broker")
        acks_s = "all" if acks == ACKS_ALL else str(acks)
        url = f"{leader_url.rstrip('/')}/v1/topics/{topic}/partitions/{partition}/records?acks={acks_s}"
        self._check_not_refused(leader_url, topic, partition)
        slots = self._forward_slots.get(leader_url)
        if slots is None:
            slots = self._forward_slots[leader_url] = asyncio.Semaphore(FORWARD_CONNECTIONS_PER_LEADER)
        async with slots:
            self._check_not_refused(leader_url, topic, partition)   # refused while this one waited
            if leader_url in self._refused_until:   # it refused before and its back-off ran out
                await self._probe_refused(leader_url)
                self._check_not_refused(leader_url, topic, partition)
            return await self._forward_now(session, url, leader_url, topic, partition, payload)

    async def _probe_refused(self, leader_url: str) -> None:
        """One TCP connect to a leader that refused before, once its back-off ran out; the
        other forwards to it wait for that answer. Refused again: another back-off; it
        listens (or only times out): the forwards go on (issue 25: at the end of each
        back-off the forwards held for a dead leader's thousands of partitions each tried a
        connection, FORWARD_CONNECTIONS_PER_LEADER at a time, a tenth of a survivor's loop
        while the fencing was on its way)."""
        probe = self._probing.get(leader_url)
        if probe is not None:
            await asyncio.shield(probe)
            return
        loop = asyncio.get_running_loop()
        probe = self._probing[leader_url] = loop.create_future()
        try:
            if await connection_refused(leader_url, FORWARD_PROBE_TIMEOUT_MS / 1000):
                self._refused_until[leader_url] = loop.time() + FORWARD_REFUSED_BACKOFF_MS / 1000
            else:
                self._refused_until.pop(leader_url, None)
        finally:
            del self._probing[leader_url]
            probe.set_result(None)

    def _check_not_refused(self, leader_url: str, topic: str, partition: int) -> None:
        if asyncio.get_running_loop().time() < self._refused_until.get(leader_url, 0.0):
            raise KraftlogError(ErrorCode.BROKER_NOT_AVAILABLE,
                                f"the leader of {topic}-{partition} at {leader_url} refused connections moments ago; "
                                "retry after a metadata refresh", refused=True)

    async def _forward_now(self, session, url: str, leader_url: str, topic: str, partition: int,
                           payload: bytes) -> int:
        loop = asyncio.get_running_loop()
        try:
            # the leader authorizes the client, not this broker (auth.forwarding_headers)
            async with session.post(url, data=payload, headers={"Content-Type": RAW_BATCH, "Accept": JSON,
                                                                **forwarding_headers(),
                                                                **txn_verification.forward_headers()},
                                    timeout=aiohttp.ClientTimeout(
                                        total=self.config.request_timeout_ms / 1000 + 5)) as resp:
                body = await resp.read()
                if resp.status == 202:
                    return -1
                doc = codecs.decode_document(JSON, body) if body else {}
                if resp.status != 200:
                    err = KraftlogError.from_body(doc, fallback=f"leader answered HTTP {resp.status}")
                    if err is None:
                        raise KraftlogError(ErrorCode.UNKNOWN_SERVER_ERROR, f"leader answered HTTP {resp.status}")
                    extra = {k: v for k, v in err.extra.items() if k in ("leader_id", "leader_url")}
                    raise KraftlogError(err.code, err.message, **extra)
                return int(doc["offsets"][0]["offset"])
        except aiohttp.ClientConnectorError as e:  # refused: the request was never sent
            self._refused_until[leader_url] = loop.time() + FORWARD_REFUSED_BACKOFF_MS / 1000
            raise KraftlogError(ErrorCode.BROKER_NOT_AVAILABLE,
                                f"cannot reach the leader of {topic}-{partition} at {leader_url}: {e}; "
                                "retry after a metadata refresh", refused=True) from None
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            raise KraftlogError(ErrorCode.BROKER_NOT_AVAILABLE,
                                f"cannot reach the leader of {topic}-{partition} at {leader_url}: {e}; "
                                "retry after a metadata refresh") from None

    async def produce_partition(self, request: web.Request) -> web.Response:
        return await self.ctx.measured(self._produce_partition, request, self.metrics.produce_requests, self.metrics.produce_latency)

    async def _produce_partition(self, request: web.Request) -> web.Response:
        name = request.match_info["topic"]
        internal_topics.check_client_write(name, "produce")
        partition = partition_param(request)
        acks = parse_acks(request.query.get("acks"))
        ct = request.headers.get("Content-Type")
        mt = codecs.media_type(ct)
        if mt not in (JSON, CBOR, RAW_BATCH):
            raise KraftlogError(ErrorCode.UNSUPPORTED_MEDIA_TYPE,
                                f"Content-Type {mt!r} is not supported; use {JSON}, {CBOR} or {RAW_BATCH}")
        body = await self.ctx.read_body(request)
        max_msg = self._max_message_bytes(name)
        if mt == RAW_BATCH:
            # framing, sizes and counts here; the log checks every CRC before writing anything
            headers = codecs.validate_raw_batches(body, max_message_bytes=max_msg,
                                                  max_records=self.config.request_max_records,
                                                  check_crc=False)
            n_records = sum(h.record_count for h in headers)
            payload = body
        else:
            records = codecs.parse_produce_body(ct, body, max_records=self.config.request_max_records)
            for i, r in enumerate(records):
                if r.partition is not None and r.partition != partition:
                    raise KraftlogError(ErrorCode.INVALID_RECORD,
                                        f"records[{i}].partition is {r.partition} but the URL names partition "
                                        f"{partition}; drop the field or use the topic-level route")
            headers = None
            n_records = len(records)
            if name not in self.image.topics:
                await self.ctx.ensure_topic(name)
            self.rm.leader_partition(name, partition)  # 404/421 before encoding
            payload = b"".join(codecs.build_batches(records, max_message_bytes=max_msg))
        if name not in self.image.topics:
            await self.ctx.ensure_topic(name)
        if headers is not None:  # KIP-890: a transactional batch only in its ongoing transaction
            await txn_verification.verify_http_produce(request, name, partition, headers)
        res = await self.rm.append(name, partition, payload, acks=acks, timeout_ms=self.config.request_timeout_ms)
        self.metrics.produce_bytes.inc(len(body))
        self.metrics.produce_records.inc(n_records)
        if acks == ACKS_NONE:
            return web.Response(status=202)
        media = codecs.negotiate_response_type(request.headers.get("Accept"), mt)
        if media == RAW_BATCH:
            media = JSON
        duplicate = res.duplicate
        unknown = duplicate and res.first_offset < 0  # appended before the cached 5 batches
        if headers is not None:
            entries = []
            off = res.first_offset
            for h in headers:
                last = off + h.last_offset_delta
                entries.append({"partition": partition, "offset": -1 if unknown else off,
                                "last_offset": -1 if unknown else last})
                off = last + 1
        else:
            entries = [{"partition": partition, "offset": -1 if unknown else res.first_offset + j}
                       for j in range(n_records)]
        if duplicate:  # an idempotent resend: nothing appended; offsets are the original ones (or -1)
            for e in entries:
                e["duplicate"] = True
        return json_response({"offsets": entries}, 200, media)

    async def init_producer_id(self, request: web.Request) -> web.Response:
        """A producer id for an idempotent producer (blocks come from the controller)."""
        if self.deps.producer_ids is None:
            self.deps.producer_ids = ProducerIdAllocator(self.deps.controller, self.config.broker_id, lambda: -1).next
        pid = await self.deps.producer_ids()
        return json_response({"producer_id": pid, "producer_epoch": 0})
