"""Transaction routes and the transaction coordinator shell (asyncio) of one broker (KIP-98).

A transactional id lives in partition crc32(id) % transaction_state_num_partitions of the
internal, compacted `__transaction_state` topic (created on first use through the
controller, replication factor min(transaction_state_replication_factor, registered
brokers)); its coordinator is that partition's leader, exactly as groups and
`__consumer_offsets` (groups.py). Other brokers forward the request there.

On the coordinator, a pure `TransactionCoordinatorState` (partitions/transactions) per led
partition, rebuilt by replaying the partition when this broker becomes its leader. Every
state change is written (acks=all) before it is acted on; a transaction in
PrepareCommit/PrepareAbort is then completed by `_complete`: a COMMIT/ABORT marker (control
batch) to every partition of the transaction through its leader (local append, or
`POST /internal/v1/txn-markers` on the leader), retried until each is written; the group
offsets sent to the transaction are committed (commit only); then CompleteCommit/
CompleteAbort is written. A new coordinator resumes Prepare* states after its load. A timer
aborts transactions past their timeout (with a bumped epoch: the late producer is fenced).
Operations on one transactional id are serialised by a lock per id.

Routes (API.md, Transactions):
  POST /v1/transactions/{txid}/init     {"transaction_timeout_ms"?} -> {"producer_id", "producer_epoch"}
  POST /v1/transactions/{txid}/records  {"producer_id", "producer_epoch", "records": [{"topic",
                                         "partition"?, "key"?, "value", "headers"?}], "sequences"?: [{"topic",
                                         "partition", "base_sequence"}]} -> {"offsets": [...]}
  POST /v1/transactions/{txid}/offsets  {"producer_id", "producer_epoch", "group", "offsets": [...]}
  POST /v1/transactions/{txid}/commit   {"producer_id", "producer_epoch"}
  POST /v1/transactions/{txid}/abort    {"producer_id", "producer_epoch"}
  POST /internal/v1/txn-markers         (brokers) write markers on the partitions led here
  POST /internal/v1/transactions/{txid}/verify  (partition leaders, KIP-890 part 1) are these
                                         partitions in the producer's ongoing transaction?
                                         (txn_verification.py)
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import re
from typing import Any

import aiohttp
from aiohttp import web

from http_api.broker.context import BrokerContext
from http_api.broker.group_offsets import validate_group_id
from http_api.broker.groups import FORWARDED_HEADER
from http_api.broker.internal_auth import INTERNAL_TOKEN_HEADER
from http_api.broker.produce import ProduceRoutes
from http_api.broker.txn_verification import FORWARDING_TRANSACTIONAL_ID, VERIFIER_KEY, TransactionVerifier
from http_api.broker.producer_ids import ProducerIdAllocator
from http_api.wire import codecs
from http_api.wire.auth import forwarding_headers
from http_api.wire.codecs import JSON
from http_api.wire.partitioner import partition_for_key
from partitions import internal_topics
from partitions.clock import SYSTEM_CLOCK, Clock
from partitions.errors import ErrorCode, KraftlogError
from partitions.log import record_batch as rb
from partitions.log import transactions as ptxn
from partitions.replication.replica_manager import ACKS_ALL
from partitions.transactions.coordinator import TransactionCoordinatorState, TxnMetadata, TxnState
from partitions.transactions import coordinator as tc

log = logging.getLogger("kraftlog.transactions")

TXN_TOPIC = internal_topics.TRANSACTION_STATE_TOPIC
COORDINATOR_WAIT_MS = 10_000
LOAD_READ_BYTES = 1 << 20
MARKER_RETRY_MS = (50, 1_000)            # backoff bounds of marker and offset-commit retries
DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000  # Kafka's transaction.timeout.ms default
_TXID_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
SERVICE_KEY: web.AppKey = web.AppKey("transaction_coordinator", object)
# fault injection for crash tests only: a freshly decided commit/abort waits this long before
# its markers (a resumed one after a coordinator load never waits); unset in production
TEST_MARKER_DELAY_ENV = "KRAFTLOG_TEST_TXN_MARKER_DELAY_MS"


def _json(doc: Any, status: int = 200) -> web.Response:
    return web.Response(body=json.dumps(doc).encode(), status=status, content_type=JSON)


def _check_txid(txid: str) -> None:
    if not _TXID_RE.match(txid):
        raise KraftlogError(ErrorCode.INVALID_REQUEST,
                            f"transactional id {txid!r} is invalid: use 1-249 characters from [A-Za-z0-9._-]")


def _int_field(doc: dict, name: str) -> int:
    v = doc.get(name)
    if isinstance(v, bool) or not isinstance(v, int):
        raise KraftlogError(ErrorCode.INVALID_REQUEST, f"{name}: an integer is required (from init)")
    return v


def _sequences(doc: dict, items: list, placed: dict[tuple[str, int], list[int]]) -> dict[tuple[str, int], int]:
    """The records body's optional `"sequences": [{"topic", "partition", "base_sequence"}]`:
    the client's base sequence per partition under its (producer id, epoch), as a Kafka
    transactional producer assigns them, so the leader's producer state answers a resent
    request with the original offsets instead of appending again. With sequences, every
    record names its partition and every written partition has exactly one entry; without
    them the batches carry sequence -1 (no duplicate detection)."""
    raw = doc.get("sequences")
    if raw is None:
        return {}
    hint = 'sequences: a list of {"topic", "partition", "base_sequence" >= 0}, one per partition written'
    if not isinstance(raw, list):
        raise KraftlogError(ErrorCode.INVALID_REQUEST, hint)
    out: dict[tuple[str, int], int] = {}
    for s in raw:
        if not isinstance(s, dict):
            raise KraftlogError(ErrorCode.INVALID_REQUEST, hint)
        t, p, seq = s.get("topic"), s.get("partition"), s.get("base_sequence")
        if (not isinstance(t, str) or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in (p, seq))
                or (t, p) in out):
            raise KraftlogError(ErrorCode.INVALID_REQUEST, hint)
        out[(t, p)] = seq
    for i, item in enumerate(items):
        if item.get("partition") is None:
            raise KraftlogError(ErrorCode.INVALID_REQUEST,
                                f"records[{i}].partition is required with sequences (the client places records)")
    if set(out) != set(placed):
        raise KraftlogError(ErrorCode.INVALID_REQUEST, f"{hint}: got {sorted(out)} for partitions {sorted(placed)}")
    return out


class _Loaded:
    """One led `__transaction_state` partition: its state once loaded, its leader epoch."""

    def __init__(self, partition: int, leader_epoch: int, state: TransactionCoordinatorState) -> None:
        self.partition = partition
        self.leader_epoch = leader_epoch
        self.state = state
        self.ready = asyncio.get_running_loop().create_future()
        self.task: asyncio.Task | None = None


class TransactionCoordinator:
    """The broker's transaction coordinator shell (see module docstring)."""

    def __init__(self, ctx: BrokerContext, clock: Clock = SYSTEM_CLOCK) -> None:
        self.ctx = ctx
        self.clock = clock
        self.config = ctx.config
        self.deps = ctx.deps
        self.rm = ctx.deps.replica_manager
        self.produce = ProduceRoutes(ctx)
        token = ctx.internal_token
        self._internal_headers = {INTERNAL_TOKEN_HEADER: token} if token else {}
        self.internal_headers = self._internal_headers
        self.verifier = TransactionVerifier(self)
        self.loaded: dict[int, _Loaded] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._completing: dict[str, asyncio.Task] = {}
        self._create_lock = asyncio.Lock()
        self._expiry_task: asyncio.Task | None = None
        self.markers_written = 0
        self.transactions_aborted_on_timeout = 0

    # ---- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        self.deps.metadata.add_listener(self.on_metadata)
        if self.deps.metadata.image is not None:
            self.on_metadata(self.deps.metadata.image)
        self._expiry_task = asyncio.ensure_future(self._expiry_loop())

    async def stop(self) -> None:
        if self._expiry_task is not None:
            self._expiry_task.cancel()
        for task in list(self._completing.values()):
            task.cancel()
        for p in list(self.loaded):
            self._unload(p)

    def on_metadata(self, image) -> None:
        led = image.partitions_led_by(TXN_TOPIC, self.config.broker_id)
        for p in list(self.loaded):
            if led.get(p) != self.loaded[p].leader_epoch:
                self._unload(p)
        for p, epoch in led.items():
            if p not in self.loaded:
                ld = self.loaded[p] = _Loaded(p, epoch, TransactionCoordinatorState(self.config.transaction_max_timeout_ms))
                ld.task = asyncio.ensure_future(self._load(ld))

    def _unload(self, p: int) -> None:
        ld = self.loaded.pop(p, None)
        if ld is None:
            return
        if ld.task is not None and not ld.task.done():
            ld.task.cancel()
        if not ld.ready.done():
            ld.ready.set_exception(KraftlogError(ErrorCode.NOT_COORDINATOR,
                                                 f"broker {self.config.broker_id} stopped leading {TXN_TOPIC}-{p}; retry"))
            ld.ready.exception()
        log.info("transaction coordinator for %s-%d unloaded (leadership moved)", TXN_TOPIC, p)

    async def _load(self, ld: _Loaded) -> None:
        """Replay the partition, then resume every transaction left in Prepare*."""
        try:
            lg = self.rm.logs.get((TXN_TOPIC, ld.partition))
            if lg is not None:
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
                                ld.state.replay(r.key, r.value)
                    offset = max(data.next_offset, offset + 1)
                    await asyncio.sleep(0)
            if not ld.ready.done():
                ld.ready.set_result(None)
            pending = ld.state.pending_completions()
            log.info("transaction coordinator for %s-%d loaded %d transactional ids, resuming %d",
                     TXN_TOPIC, ld.partition, len(ld.state.txns), len(pending))
            for md in pending:
                self._start_completion(ld, md, resumed=True)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.exception("loading %s-%d failed", TXN_TOPIC, ld.partition)
            if not ld.ready.done():
                ld.ready.set_exception(KraftlogError(ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                                     f"loading transaction state failed: {e}; retry"))
            self.loaded.pop(ld.partition, None)

    async def _expiry_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.transaction_abort_timed_out_check_interval_ms / 1000)
            try:
                await self.abort_timed_out_once()
            except Exception as e:  # noqa: BLE001 - leadership moving: the next coordinator does it
                log.info("aborting timed-out transactions failed: %s", e)

    async def abort_timed_out_once(self) -> int:
        """Abort (PrepareAbort with a bumped epoch, then markers) every Ongoing transaction
        past its timeout in the loaded partitions; returns how many were started."""
        n = 0
        for ld in list(self.loaded.values()):
            if not ld.ready.done() or ld.ready.exception() is not None:
                continue
            for md in ld.state.expired(self.clock.now_ms()):
                async with self._lock(md.transactional_id):
                    again = [m for m in ld.state.expired(self.clock.now_ms())
                             if m.transactional_id == md.transactional_id]
                    if not again:
                        continue
                    await self._write(ld, again[0])
                    log.info("transaction of %r timed out after %d ms: aborting (producer epoch now %d)",
                             md.transactional_id, md.timeout_ms, again[0].producer_epoch)
                    self.transactions_aborted_on_timeout += 1
                    self._start_completion(ld, again[0])
                    n += 1
        return n

    # ---- storage -----------------------------------------------------------------------

    def _lock(self, txid: str) -> asyncio.Lock:
        lock = self._locks.get(txid)
        if lock is None:
            lock = self._locks[txid] = asyncio.Lock()
        return lock

    async def _write(self, ld: _Loaded, md: TxnMetadata) -> None:
        """Append `md` to the partition (acks=all), then apply it: the log leads the cache."""
        if self.loaded.get(ld.partition) is not ld:
            raise KraftlogError(ErrorCode.NOT_COORDINATOR, f"{TXN_TOPIC}-{ld.partition} moved; retry")
        k, v = tc.record(md)
        try:
            await self.rm.append(TXN_TOPIC, ld.partition, rb.build_batch([rb.Record(k, v)]), acks=ACKS_ALL,
                                 timeout_ms=self.config.request_timeout_ms)
        except KraftlogError as e:
            if e.code in (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.LEADER_NOT_AVAILABLE,
                          ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.FENCED_LEADER_EPOCH):
                raise KraftlogError(ErrorCode.NOT_COORDINATOR,
                                    f"writing to {TXN_TOPIC}-{ld.partition} failed ({e.code.name}); "
                                    "the transaction coordinator moved: retry") from None
            raise
        if self.loaded.get(ld.partition) is ld:
            ld.state.apply(md)

    # ---- completion (markers) ------------------------------------------------------------

    def _start_completion(self, ld: _Loaded, md: TxnMetadata, resumed: bool = False) -> asyncio.Task:
        txid = md.transactional_id
        task = self._completing.get(txid)
        if task is None or task.done():
            task = asyncio.ensure_future(self._complete(ld, md, resumed))
            self._completing[txid] = task
            task.add_done_callback(lambda t, k=txid: self._completing.pop(k, None)
                                   if self._completing.get(k) is t else None)
        return task

    async def _complete(self, ld: _Loaded, md: TxnMetadata, resumed: bool = False) -> None:
        """Markers to every partition (retried until written), the group offsets (commit),
        then Complete*. Stops if this broker stops coordinating the partition: the new
        coordinator resumes from the Prepare* record."""
        delay_ms = int(os.environ.get(TEST_MARKER_DELAY_ENV, "0") or 0)
        if delay_ms > 0 and not resumed:
            log.warning("%s=%d: waiting before the markers of %r (crash tests only)", TEST_MARKER_DELAY_ENV,
                        delay_ms, md.transactional_id)
            await asyncio.sleep(delay_ms / 1000)
        commit = md.committing
        pending = list(md.partitions)
        delay = MARKER_RETRY_MS[0]
        while pending:
            if self.loaded.get(ld.partition) is not ld:
                return
            results = await self._write_markers(pending, md.producer_id, md.producer_epoch, commit, ld.leader_epoch)
            failed = [tp for tp, err in zip(pending, results) if err is not None]
            for tp, err in zip(pending, results):
                if err is not None:
                    log.info("marker for %r on %s-%d not written yet (%s); retrying", md.transactional_id,
                             tp[0], tp[1], err)
            self.markers_written += len(pending) - len(failed)
            pending = failed
            if pending:
                await asyncio.sleep(delay / 1000)
                delay = min(delay * 2, MARKER_RETRY_MS[1])
        if commit and md.offsets:
            await self._commit_group_offsets(ld, md)
        # no lock: while the id is in Prepare*, every other change of it is refused
        # (CONCURRENT_TRANSACTIONS) or waits for this task, so this is its only writer
        while ld.state.txns.get(md.transactional_id) == md and self.loaded.get(ld.partition) is ld:
            try:
                await self._write(ld, ld.state.complete(md, self.clock.now_ms()))
                return
            except KraftlogError as e:
                if e.code is ErrorCode.NOT_COORDINATOR:
                    return
                log.info("writing the completion of %r failed (%s); retrying", md.transactional_id, e)
                await asyncio.sleep(MARKER_RETRY_MS[1] / 1000)

    async def _write_markers(self, tps: list[tuple[str, int]], pid: int, epoch: int, commit: bool,
                             coordinator_epoch: int) -> list[str | None]:
        """One marker per partition through its leader; per partition None or the error."""
        marker = ptxn.build_marker_batch(pid, epoch, commit, coordinator_epoch=coordinator_epoch)
        by_leader: dict[str | None, list[int]] = {}
        out: list[str | None] = [None] * len(tps)
        for i, (t, p) in enumerate(tps):
            part = self.rm.partitions.get((t, p))
            if part is not None and part.is_leader:
                by_leader.setdefault(None, []).append(i)
                continue
            leader_id, url = self.rm.leader_info(t, p)
            if leader_id < 0 or not url or leader_id == self.config.broker_id:
                out[i] = f"{t}-{p} has no leader"
                continue
            by_leader.setdefault(url, []).append(i)

        async def local(i: int) -> None:
            t, p = tps[i]
            try:
                await self.rm.append(t, p, marker, acks=ACKS_ALL, timeout_ms=self.config.request_timeout_ms)
            except KraftlogError as e:
                out[i] = f"{e.code.name}: {e.message}"
            except Exception as e:  # noqa: BLE001 - retried
                out[i] = str(e)

        async def remote(url: str, idx: list[int]) -> None:
            body = {"producer_id": pid, "producer_epoch": epoch, "commit": commit,
                    "coordinator_epoch": coordinator_epoch,
                    "partitions": [{"topic": tps[i][0], "partition": tps[i][1]} for i in idx]}
            try:
                async with self.deps.http_session.post(
                        f"{url.rstrip('/')}/internal/v1/txn-markers", json=body,
                        headers={**self._internal_headers, "Accept": JSON},
                        timeout=aiohttp.ClientTimeout(total=self.config.request_timeout_ms / 1000 + 5)) as resp:
                    doc = await resp.json(content_type=None)
                    if resp.status != 200:
                        raise RuntimeError(f"HTTP {resp.status}: {doc}")
                    for i, res in zip(idx, doc["results"]):
                        out[i] = res.get("error")
            except Exception as e:  # noqa: BLE001 - retried
                for i in idx:
                    out[i] = f"leader at {url}: {e}"

        await asyncio.gather(*(local(i) for i in by_leader.pop(None, [])),
                             *(remote(url, idx) for url, idx in by_leader.items()))
        return out

    async def _commit_group_offsets(self, ld: _Loaded, md: TxnMetadata) -> None:
        """Commit the offsets sent to the transaction through the group routes (the group
        coordinator may be another broker); retried until accepted."""
        groups: dict[str, list[dict]] = {}
        for g, t, p, o in md.offsets:
            groups.setdefault(g, []).append({"topic": t, "partition": p, "offset": o})
        me = self.ctx.image.brokers.get(self.config.broker_id)
        base = (me.url if me is not None else self.config.url).rstrip("/")
        for g, offsets in groups.items():
            delay = MARKER_RETRY_MS[0]
            while self.loaded.get(ld.partition) is ld:
                try:
                    async with self.deps.http_session.post(
                            f"{base}/v1/groups/{g}/offsets", json={"offsets": offsets},
                            headers={**self._internal_headers, **forwarding_headers(), "Accept": JSON},
                            timeout=aiohttp.ClientTimeout(total=self.config.request_timeout_ms / 1000 + 5)) as resp:
                        if resp.status == 200:
                            break
                        err = await resp.text()
                        if 400 <= resp.status < 500 and resp.status not in (408, 421, 429):
                            log.error("transaction of %r: group %s refused its offsets (%s): dropped",
                                      md.transactional_id, g, err)
                            break
                        raise RuntimeError(f"HTTP {resp.status}: {err}")
                except Exception as e:  # noqa: BLE001 - retried
                    log.info("transaction of %r: committing offsets of group %s failed (%s); retrying",
                             md.transactional_id, g, e)
                await asyncio.sleep(delay / 1000)
                delay = min(delay * 2, MARKER_RETRY_MS[1])

    async def _wait_completion(self, txid: str) -> bool:
        """Wait (bounded by request_timeout_ms) for the completion of `txid`; True if done."""
        task = self._completing.get(txid)
        if task is None:
            return True
        try:
            await asyncio.wait_for(asyncio.shield(task), self.config.request_timeout_ms / 1000)
            return True
        except asyncio.TimeoutError:
            return False

    # ---- coordinator election and forwarding ----------------------------------------------

    async def _ensure_topic(self) -> None:
        if TXN_TOPIC in self.ctx.image.topics:
            return
        async with self._create_lock:
            img = self.ctx.image
            if TXN_TOPIC in img.topics:
                return
            live = sum(1 for b in img.brokers.values() if not b.fenced)
            rf = max(1, min(self.config.transaction_state_replication_factor, len(img.brokers)))
            if live < rf:
                raise KraftlogError(ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                    f"{TXN_TOPIC} needs {rf} live brokers (transaction_state_replication_factor="
                                    f"{self.config.transaction_state_replication_factor}); {live} are live: retry")
            try:
                await self.deps.controller.create_topic(TXN_TOPIC, self.config.transaction_state_num_partitions, rf,
                                                        {"cleanup.policy": "compact"})
                log.info("created %s with %d partitions, replication factor %d", TXN_TOPIC,
                         self.config.transaction_state_num_partitions, rf)
            except KraftlogError as e:
                if e.code is not ErrorCode.TOPIC_ALREADY_EXISTS:
                    raise
            await self.deps.metadata.wait_until(lambda i: TXN_TOPIC in i.topics, COORDINATOR_WAIT_MS / 1000)

    async def coordinator_of(self, txid: str) -> tuple[int, int, str | None]:
        await self._ensure_topic()

        def has_leader(img) -> bool:
            t = img.topics.get(TXN_TOPIC)
            if t is None:
                return False
            reg = t.partitions.get(tc.partition_for(txid, len(t.partitions)))
            return reg is not None and reg.leader >= 0
        await self.deps.metadata.wait_until(has_leader, COORDINATOR_WAIT_MS / 1000)
        img = self.ctx.image
        t = img.topics.get(TXN_TOPIC)
        if t is None:
            raise KraftlogError(ErrorCode.COORDINATOR_NOT_AVAILABLE, f"{TXN_TOPIC} is not visible yet; retry")
        p = tc.partition_for(txid, len(t.partitions))
        leader = t.partitions[p].leader
        b = img.brokers.get(leader)
        return p, leader, (b.url if b is not None else None)

    async def route(self, request: web.Request, fn) -> web.Response:
        txid = request.match_info["txid"]
        _check_txid(txid)
        p, leader, url = await self.coordinator_of(txid)
        if leader == self.config.broker_id:
            ld = self.loaded.get(p)
            if ld is not None:
                try:
                    await asyncio.wait_for(asyncio.shield(ld.ready), COORDINATOR_WAIT_MS / 1000)
                except asyncio.TimeoutError:
                    raise KraftlogError(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                                        f"transaction state of {TXN_TOPIC}-{p} is still loading; retry") from None
                if self.loaded.get(p) is ld:
                    doc = await self.ctx.read_document(request)
                    if not isinstance(doc, dict):
                        raise KraftlogError(ErrorCode.INVALID_REQUEST, "body must be a JSON object")
                    async with self._lock(txid):
                        return await fn(ld, txid, doc)
        if request.headers.get(FORWARDED_HEADER) or url is None or leader == self.config.broker_id:
            raise KraftlogError(ErrorCode.NOT_COORDINATOR,
                                f"broker {self.config.broker_id} is not the coordinator of transactional id "
                                f"{txid!r}; send it to broker {leader} at {url}", coordinator_id=leader,
                                coordinator_url=url)
        return await self._forward(request, url)

    async def _forward(self, request: web.Request, url: str) -> web.Response:
        body = await request.read()
        headers = {FORWARDED_HEADER: str(self.config.broker_id), "Accept": JSON, **forwarding_headers()}
        ct = request.headers.get("Content-Type")
        if ct:
            headers["Content-Type"] = ct
        try:
            async with self.deps.http_session.request(
                    request.method, url.rstrip("/") + request.rel_url.path_qs, data=body or None, headers=headers,
                    timeout=aiohttp.ClientTimeout(total=2 * self.config.request_timeout_ms / 1000 + 10)) as resp:
                out = await resp.read()
                return web.Response(body=out, status=resp.status,
                                    content_type=codecs.media_type(resp.headers.get("Content-Type")) or JSON)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            raise KraftlogError(ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                f"cannot reach the transaction coordinator at {url}: {e}; retry") from None

    # ---- entry points of the Kafka listener (http_api/kafka/apis.py) ------------------------

    async def run_local(self, txid: str, fn):
        """`fn(loaded)` under `txid`'s lock on this broker, which must be its coordinator
        (Kafka clients find it with FindCoordinator first): NOT_COORDINATOR otherwise,
        COORDINATOR_LOAD_IN_PROGRESS while its partition is loading."""
        _check_txid(txid)
        p, leader, _url = await self.coordinator_of(txid)
        ld = self.loaded.get(p) if leader == self.config.broker_id else None
        if ld is None:
            raise KraftlogError(ErrorCode.NOT_COORDINATOR,
                                f"broker {self.config.broker_id} is not the coordinator of transactional id "
                                f"{txid!r} (broker {leader} is); find the coordinator again", coordinator_id=leader)
        try:
            await asyncio.wait_for(asyncio.shield(ld.ready), COORDINATOR_WAIT_MS / 1000)
        except asyncio.TimeoutError:
            raise KraftlogError(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                                f"transaction state of {TXN_TOPIC}-{p} is still loading; retry") from None
        if self.loaded.get(p) is not ld:
            raise KraftlogError(ErrorCode.NOT_COORDINATOR, f"{TXN_TOPIC}-{p} moved; find the coordinator again")
        async with self._lock(txid):
            return await fn(ld)

    async def add_offsets_anywhere(self, txid: str, pid: int, epoch: int, group: str,
                                   offsets: list[tuple[str, int, int]]) -> None:
        """TxnOffsetCommit: group offsets join `txid`'s transaction on its coordinator, here
        or (the group's coordinator is often another broker) through that broker's route."""
        p, leader, url = await self.coordinator_of(txid)
        if leader == self.config.broker_id:
            async def go(ld: _Loaded) -> None:
                await self._write(ld, ld.state.add_offsets(txid, pid, epoch, group, offsets, self.clock.now_ms()))
            return await self.run_local(txid, go)
        body = {"producer_id": pid, "producer_epoch": epoch, "group": group,
                "offsets": [{"topic": t, "partition": q, "offset": o} for t, q, o in offsets]}
        await self.post_to_coordinator(txid, url, f"/v1/transactions/{txid}/offsets", body, forwarded=True,
                                       status_error=ErrorCode.UNKNOWN_SERVER_ERROR)

    async def post_to_coordinator(self, txid: str, url: str | None, path: str, body: dict, *, forwarded: bool,
                                  status_error: ErrorCode) -> dict:
        """POST `body` to `path` on `txid`'s coordinator at `url` (another broker) with the
        cluster token; its JSON answer. Unreachable: COORDINATOR_NOT_AVAILABLE (retry); an
        error answer is raised as its own code, else as `status_error`. `forwarded` marks a
        client request relayed on the client's behalf (no second forward, client identity)."""
        if url is None or self.deps.http_session is None:
            raise KraftlogError(ErrorCode.COORDINATOR_NOT_AVAILABLE, f"the coordinator of {txid!r} has no address; retry")
        headers = {**self._internal_headers, "Accept": JSON}
        if forwarded:
            headers.update({FORWARDED_HEADER: str(self.config.broker_id), **forwarding_headers()})
        try:
            async with self.deps.http_session.post(
                    f"{url.rstrip('/')}{path}", json=body, headers=headers,
                    timeout=aiohttp.ClientTimeout(total=self.config.request_timeout_ms / 1000 + 5)) as resp:
                doc = await resp.json(content_type=None)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as e:
            raise KraftlogError(ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                f"cannot reach the transaction coordinator at {url}: {e}; retry") from None
        if resp.status != 200:
            raise KraftlogError.from_body(doc, fallback=f"HTTP {resp.status}") or KraftlogError(
                status_error, f"the transaction coordinator answered HTTP {resp.status}")
        return doc

    # ---- handlers ----------------------------------------------------------------------

    async def init(self, request: web.Request) -> web.Response:
        async def go(ld: _Loaded, txid: str, doc: dict) -> web.Response:
            timeout = doc.get("transaction_timeout_ms", DEFAULT_TRANSACTION_TIMEOUT_MS)
            if isinstance(timeout, bool) or not isinstance(timeout, int):
                raise KraftlogError(ErrorCode.INVALID_TRANSACTION_TIMEOUT,
                                    "transaction_timeout_ms must be an integer (milliseconds)")
            md = await self.init_producer(ld, txid, timeout)
            return _json({"producer_id": md.producer_id, "producer_epoch": md.producer_epoch})
        return await self.route(request, go)

    async def init_producer(self, ld: _Loaded, txid: str, timeout_ms: int) -> TxnMetadata:
        """InitProducerId of `txid` (under its lock): the epoch bump that fences the previous
        producer, after aborting what it left open; the new metadata."""
        ld.state.check_timeout(timeout_ms)
        for _ in range(3):
            if not await self._wait_completion(txid):
                raise KraftlogError(ErrorCode.CONCURRENT_TRANSACTIONS,
                                    f"the previous transaction of {txid!r} is still completing; retry")
            new_pid = -1
            if txid not in ld.state.txns or ld.state.txns[txid].producer_epoch >= tc.MAX_EPOCH:
                new_pid = await self._next_producer_id()
            md = ld.state.init(txid, timeout_ms, new_pid, self.clock.now_ms())
            await self._write(ld, md)
            if md.state is TxnState.PREPARE_ABORT:  # the old epoch left one open: abort it first
                log.info("init of %r aborts the transaction its previous producer left open", txid)
                self._start_completion(ld, md)
                continue
            return md
        raise KraftlogError(ErrorCode.CONCURRENT_TRANSACTIONS, f"transaction of {txid!r} is completing; retry")

    async def _next_producer_id(self) -> int:
        if self.deps.producer_ids is None:
            self.deps.producer_ids = ProducerIdAllocator(self.deps.controller, self.config.broker_id, lambda: -1).next
        return await self.deps.producer_ids()

    async def records(self, request: web.Request) -> web.Response:
        async def go(ld: _Loaded, txid: str, doc: dict) -> web.Response:
            pid, epoch = _int_field(doc, "producer_id"), _int_field(doc, "producer_epoch")
            items = doc.get("records")
            if not isinstance(items, list) or not items:
                raise KraftlogError(ErrorCode.INVALID_REQUEST, "records: a non-empty list is required")
            ld.state.current(txid, pid, epoch)  # fenced producers learn it before anything is parsed
            topics: list[str] = []
            plain: list[dict] = []
            for i, item in enumerate(items):
                if not isinstance(item, dict) or not isinstance(item.get("topic"), str):
                    raise KraftlogError(ErrorCode.INVALID_REQUEST, f"records[{i}].topic: a topic name is required")
                internal_topics.check_client_write(item["topic"], "produce")
                topics.append(item["topic"])
                plain.append({k: v for k, v in item.items() if k != "topic"})
            parsed = codecs.parse_records({"records": plain}, binary_ok=False,
                                          max_records=self.config.request_max_records)
            placed: dict[tuple[str, int], list[int]] = {}
            for i, (t, r) in enumerate(zip(topics, parsed)):
                n = len((await self.ctx.ensure_topic(t)).partitions)
                p = r.partition
                if p is None:
                    p = partition_for_key(r.key, n) if r.key is not None else self.produce.round_robin.next(t, n)
                elif p >= n:
                    raise KraftlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                        f"records[{i}].partition: topic {t!r} has partitions 0..{n - 1}, not {p}")
                placed.setdefault((t, p), []).append(i)
            sequences = _sequences(doc, items, placed)
            md = ld.state.add_partitions(txid, pid, epoch, list(placed), self.clock.now_ms())
            if md is not None:
                await self._write(ld, md)  # the partitions join before any record is written
            token = FORWARDING_TRANSACTIONAL_ID.set(txid)   # remote leaders verify with it (KIP-890)
            try:
                results = await asyncio.gather(*(
                    self.produce._append_anywhere(t, p, [ptxn.build_transactional_batch(
                        [rb.Record(parsed[i].key, parsed[i].value, tuple(parsed[i].headers), parsed[i].timestamp)
                         for i in idx], pid, epoch, base_sequence=sequences.get((t, p), -1))], ACKS_ALL)
                    for (t, p), idx in placed.items()))
            finally:
                FORWARDING_TRANSACTIONAL_ID.reset(token)
            offsets: list[dict | None] = [None] * len(parsed)
            for ((t, p), idx), res in zip(placed.items(), results):
                if isinstance(res, KraftlogError):
                    if res.code is ErrorCode.INVALID_PRODUCER_EPOCH:
                        raise KraftlogError(ErrorCode.PRODUCER_FENCED, f"{t}-{p}: {res.message}")
                    raise res
                for j, i in enumerate(idx):   # a duplicate older than the leader's 5 cached batches: -1
                    offsets[i] = {"topic": t, "partition": p, "offset": res + j if res >= 0 else -1}
            return _json({"offsets": offsets})
        return await self.route(request, go)

    async def offsets(self, request: web.Request) -> web.Response:
        async def go(ld: _Loaded, txid: str, doc: dict) -> web.Response:
            pid, epoch = _int_field(doc, "producer_id"), _int_field(doc, "producer_epoch")
            group = doc.get("group")
            if not isinstance(group, str):
                raise KraftlogError(ErrorCode.INVALID_REQUEST, "group: a group id is required")
            validate_group_id(group)
            items = doc.get("offsets")
            if not isinstance(items, list):
                raise KraftlogError(ErrorCode.INVALID_REQUEST, "offsets: a list of {topic, partition, offset}")
            offsets = []
            for i, o in enumerate(items):
                try:
                    t, p, off = o["topic"], o["partition"], o["offset"]
                    if not isinstance(t, str) or isinstance(p, bool) or isinstance(off, bool) or p < 0 or off < 0:
                        raise TypeError
                    offsets.append((t, int(p), int(off)))
                except (KeyError, TypeError, ValueError):
                    raise KraftlogError(ErrorCode.INVALID_REQUEST,
                                        f"offsets[{i}]: {{topic, partition >= 0, offset >= 0}} required") from None
            await self._write(ld, ld.state.add_offsets(txid, pid, epoch, group, offsets, self.clock.now_ms()))
            return _json({})
        return await self.route(request, go)

    async def _end(self, request: web.Request, commit: bool) -> web.Response:
        async def go(ld: _Loaded, txid: str, doc: dict) -> web.Response:
            pid, epoch = _int_field(doc, "producer_id"), _int_field(doc, "producer_epoch")
            return _json({"state": (await self.end_transaction(ld, txid, pid, epoch, commit)).value})
        return await self.route(request, go)

    async def end_transaction(self, ld: _Loaded, txid: str, pid: int, epoch: int, commit: bool) -> TxnState:
        """EndTxn (under `txid`'s lock): the decision written, then its markers awaited
        (bounded by request_timeout_ms); the state reached."""
        md = ld.state.end(txid, pid, epoch, commit, self.clock.now_ms())
        if md is None:
            return ld.state.txns[txid].state
        if ld.state.txns.get(txid) != md:
            await self._write(ld, md)  # the decision is durable from here on
        self._start_completion(ld, md)
        done = await self._wait_completion(txid)
        return ld.state.txns[txid].state if done else md.state

    async def commit(self, request: web.Request) -> web.Response:
        return await self._end(request, True)

    async def abort(self, request: web.Request) -> web.Response:
        return await self._end(request, False)

    async def verify_local(self, txid: str, pid: int, epoch: int,
                           tps: list[tuple[str, int]]) -> dict[tuple[str, int], ErrorCode | None]:
        """KIP-890 verifyOnly on this broker, the coordinator of `txid`: per partition None
        if it is in the producer's ongoing transaction, else INVALID_TXN_STATE. No lock:
        the records route holds `txid`'s lock while the leaders it writes to ask this."""
        _check_txid(txid)
        p, leader, _url = await self.coordinator_of(txid)
        ld = self.loaded.get(p) if leader == self.config.broker_id else None
        if ld is None:
            raise KraftlogError(ErrorCode.NOT_COORDINATOR,
                                f"broker {self.config.broker_id} is not the coordinator of transactional id "
                                f"{txid!r} (broker {leader} is); retry")
        try:
            await asyncio.wait_for(asyncio.shield(ld.ready), COORDINATOR_WAIT_MS / 1000)
        except asyncio.TimeoutError:
            raise KraftlogError(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                                f"transaction state of {TXN_TOPIC}-{p} is still loading; retry") from None
        return ld.state.verify_partitions(txid, pid, epoch, tps)

    async def internal_verify(self, request: web.Request) -> web.Response:
        """AddPartitionsToTxn verifyOnly for partition leaders (txn_verification.py)."""
        txid = request.match_info["txid"]
        doc = await self.ctx.read_document(request)
        try:
            pid, epoch = int(doc["producer_id"]), int(doc["producer_epoch"])
            tps = [(str(x["topic"]), int(x["partition"])) for x in doc["partitions"]]
        except (KeyError, TypeError, ValueError):
            raise KraftlogError(ErrorCode.INVALID_REQUEST, "body: {producer_id, producer_epoch, "
                                                           "partitions: [{topic, partition}]}") from None
        errors = await self.verify_local(txid, pid, epoch, tps)
        return _json({"results": [{"topic": t, "partition": p, "error_code": e.name if e is not None else None}
                                  for (t, p), e in errors.items()]})

    async def internal_markers(self, request: web.Request) -> web.Response:
        """WriteTxnMarkers: a COMMIT/ABORT marker on each listed partition led here."""
        doc = await self.ctx.read_document(request)
        try:
            pid, epoch = int(doc["producer_id"]), int(doc["producer_epoch"])
            commit, cepoch = bool(doc["commit"]), int(doc.get("coordinator_epoch", 0))
            tps = [(str(x["topic"]), int(x["partition"])) for x in doc["partitions"]]
        except (KeyError, TypeError, ValueError):
            raise KraftlogError(ErrorCode.INVALID_REQUEST, "body: {producer_id, producer_epoch, commit, "
                                                           "partitions: [{topic, partition}]}") from None
        marker = ptxn.build_marker_batch(pid, epoch, commit, coordinator_epoch=cepoch)

        async def one(t: str, p: int) -> dict:
            try:
                await self.rm.append(t, p, marker, acks=ACKS_ALL, timeout_ms=self.config.request_timeout_ms)
                return {"topic": t, "partition": p, "error": None}
            except KraftlogError as e:
                return {"topic": t, "partition": p, "error": f"{e.code.name}: {e.message}"}
        return _json({"results": await asyncio.gather(*(one(t, p) for t, p in tps))})


def install_transaction_routes(app: web.Application, ctx: BrokerContext,
                               clock: Clock = SYSTEM_CLOCK) -> TransactionCoordinator:
    tc_ = TransactionCoordinator(ctx, clock)
    app[SERVICE_KEY] = tc_
    app[VERIFIER_KEY] = tc_.verifier
    r = app.router
    r.add_post("/v1/transactions/{txid}/init", tc_.init)
    r.add_post("/v1/transactions/{txid}/records", tc_.records)
    r.add_post("/v1/transactions/{txid}/offsets", tc_.offsets)
    r.add_post("/v1/transactions/{txid}/commit", tc_.commit)
    r.add_post("/v1/transactions/{txid}/abort", tc_.abort)
    r.add_post("/internal/v1/txn-markers", tc_.internal_markers)
    r.add_post("/internal/v1/transactions/{txid}/verify", tc_.internal_verify)

    async def _run(app: web.Application):
        tc_.start()
        yield
        await tc_.stop()

    app.cleanup_ctx.append(_run)
    return tc_
