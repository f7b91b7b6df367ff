"""The Kafka APIs of one broker over the same parts the HTTP API uses (`BrokerContext`: the
replica manager, the metadata view, the controller client; the group coordinator shell for
committed offsets; `ClassicGroups` for JoinGroup/SyncGroup membership).

Every handler takes kio's decoded request and returns a plain dict that `protocol.build`
turns into the response entity of the request's version (fields a version lacks are
dropped), or NO_RESPONSE (acks=0 produce). Errors are answered per partition / topic /
group with Kafka's codes (kraftlog's `ErrorCode` names are Kafka's), never raised out of the
connection; only an unparseable request closes it.
"""
from __future__ import annotations

import asyncio
import datetime
import logging
import uuid
from typing import Any, Awaitable, Callable

from kio.schema.errors import ErrorCode as K

from http_api.broker import tiering, txn_verification
from http_api.broker.context import BrokerContext, validate_topic_name
from http_api.broker.group_offsets import validate_group_id
from http_api.broker.topics import TopicRoutes
from http_api.kafka import protocol
from http_api.kafka.classic_groups import ClassicGroupError, ClassicGroups
from http_api.kafka.fetch_codec import encode_fetch_response
from http_api.kafka.protocol import API_VERSIONS, API_VERSIONS_KEY, FrameError, build, kafka_error
from http_api.broker.authorization import CLUSTER, grant_hint
from http_api.kafka.protocol import Denied
from http_api.kafka.sasl import MECHANISMS, SaslFailed, SaslSession
from http_api.loop_slices import gather_in_slices
from metadata_quorum.security.acl import Operation as Op, ResourceType as RT
from http_api.wire.auth import _current_principal   # what forwarding_headers() names (set per request)
from http_api.kafka.records import (InvalidRecord, batches_below, check_client_batch, kafka_to_stored,
                                    split_kafka_batches, stored_to_kafka)
from partitions import internal_topics
from partitions.errors import ErrorCode, KraftlogError
from partitions.groups.records import OFFSETS_TOPIC
from partitions.log.errors import CorruptRecordError, RecordTooLargeError
from partitions.replication.replica_manager import ACKS_ALL, ACKS_NONE

log = logging.getLogger("kraftlog.kafka")

# partitions of a Metadata answer built per turn of the event loop (100,000 partitions: not in one turn)
METADATA_SLICE_PARTITIONS = 2000

NO_RESPONSE = object()
FETCH_KEY = 1
_ZERO_UUID = uuid.UUID(int=0)
_ADMIN_WAIT_MS_MAX = 30_000
TOPIC_RESOURCE, BROKER_RESOURCE = 2, 4
READ_COMMITTED = 1          # Fetch / ListOffsets isolation_level
TRANSACTION_KEY_TYPE = 1    # FindCoordinator key_type of a transactional id
TXN_API_KEYS = frozenset({24, 25, 26, 28})   # AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, TxnOffsetCommit
SASL_HANDSHAKE_KEY = 17
SASL_API_KEYS = (SASL_HANDSHAKE_KEY, 36)       # SaslHandshake, SaslAuthenticate
# the APIs whose handlers check the principal's ACLs (every served API but ApiVersions/SASL)
AUTHORIZED_API_KEYS = frozenset({0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15, 16, 18, 19, 20, 21, 22, 23, 24, 25, 26,
                                 28, 32, 37, 42, 44, 60})
# first request version answering PRODUCER_FENCED (older ones get INVALID_PRODUCER_EPOCH), KIP-588
_FENCED_SINCE = {22: 4, 24: 2, 25: 2, 26: 2, 28: 3}


def _ms(td) -> int:
    return int(td.total_seconds() * 1000) if isinstance(td, datetime.timedelta) else int(td)


def _error_of(e: BaseException) -> tuple[K, str]:
    if isinstance(e, KraftlogError):
        return kafka_error(e), e.message
    if isinstance(e, RecordTooLargeError):
        return K.message_too_large, str(e)
    if isinstance(e, CorruptRecordError):
        return K.corrupt_message, str(e)
    return K.unknown_server_error, f"{type(e).__name__}: {e}"


def _code(e: KraftlogError | ClassicGroupError) -> K:
    return e.code if isinstance(e, ClassicGroupError) else kafka_error(e)


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


class KafkaApis:
    """Decode -> handle -> encode for one broker's Kafka listener (see the module docstring)."""

    def __init__(self, ctx: BrokerContext, group_coordinator, *, broker_id: int, kafka_address: Callable[[], str],
                 transactions=None, sasl_authenticator=None, authorizer=None) -> None:
        self.ctx = ctx
        self.config = ctx.config
        self.rm = ctx.rm
        self.gc = group_coordinator
        self.txn = transactions   # http_api.broker.transactions.TransactionCoordinator (None: no transaction APIs)
        self.sasl = sasl_authenticator   # http_api.wire.auth.Authenticator: SASL required (None: no SASL)
        # http_api.broker.authorization.BrokerAuthorizer (None: no authentication, no checks); every
        # served API checks its ACLs (AUTHORIZED_API_KEYS), any other API closes the connection
        self.authz = authorizer
        self.broker_id = broker_id
        self.kafka_address = kafka_address   # this broker's advertised host:port (known once bound)
        self.groups = ClassicGroups(ctx.config)
        self._handlers: dict[int, Callable[[Any, protocol.RequestHeader], Awaitable[Any]]] = {
            0: self.produce, 1: self.fetch, 2: self.list_offsets, 3: self.metadata,
            8: self.offset_commit, 9: self.offset_fetch, 10: self.find_coordinator,
            11: self.join_group, 12: self.heartbeat, 13: self.leave_group, 14: self.sync_group,
            15: self.describe_groups, 16: self.list_groups, 18: self.api_versions,
            19: self.create_topics, 20: self.delete_topics, 21: self.delete_records, 22: self.init_producer_id,
            23: self.offset_for_leader_epoch, 32: self.describe_configs, 37: self.create_partitions,
            42: self.delete_groups, 44: self.incremental_alter_configs, 60: self.describe_cluster,
            24: self.add_partitions_to_txn, 25: self.add_offsets_to_txn, 26: self.end_txn,
            28: self.txn_offset_commit,
        }

    def start(self) -> None:
        self.groups.start()

    async def stop(self) -> None:
        await self.groups.stop()

    # ---- dispatch ------------------------------------------------------------------------

    def _served(self, api_key: int) -> tuple[str, int, int] | None:
        if (api_key in TXN_API_KEYS and self.txn is None) or (api_key in SASL_API_KEYS and self.sasl is None):
            return None
        return API_VERSIONS.get(api_key)

    async def handle(self, frame: bytes, session: SaslSession | None = None) -> bytes | list | object:
        """The answer frame to one request frame (NO_RESPONSE for acks=0; a Fetch answer is a
        list of buffers, its records not joined into the frame: `writer.writelines`). With SASL on,
        `session` is the connection's: until it authenticated, only ApiVersions,
        SaslHandshake and SaslAuthenticate are served (anything else closes the connection,
        as Kafka's broker does)."""
        api_key, version, correlation_id = protocol.peek_header(frame)
        served = self._served(api_key)
        if self.sasl is not None and (session is None or not session.authenticated) \
                and api_key not in (API_VERSIONS_KEY, *SASL_API_KEYS):
            raise FrameError(f"API key {api_key} before SASL authentication (SaslHandshake + SaslAuthenticate "
                             f"with {' or '.join(MECHANISMS)} first)")
        if self.authz is not None and api_key not in AUTHORIZED_API_KEYS and api_key not in SASL_API_KEYS:
            raise FrameError(f"API key {api_key} has no authorization rule on this listener (a kraftlog bug); refused")
        if served is None or not served[1] <= version <= served[2]:
            if api_key == API_VERSIONS_KEY:   # Kafka answers an unknown ApiVersions version with v0
                return protocol.encode_response(API_VERSIONS_KEY, 0, correlation_id, build(
                    protocol.response_type(API_VERSIONS_KEY, 0),
                    {"error_code": K.unsupported_version, "api_keys": self._api_keys()}))
            name = served[0] if served else "unknown"
            raise FrameError(f"API key {api_key} ({name}) version {version} is not served "
                             f"(served: {served[1]}-{served[2]})" if served else
                             f"API key {api_key} is not served by this listener")
        header = protocol.parse_header(frame, protocol.request_type(api_key, version).__flexible__)
        header.principal = session.principal if session is not None else None
        request = protocol.decode_request(frame, header)
        if api_key in SASL_API_KEYS:
            doc = self._sasl(api_key, request, session)
        else:
            if session is not None and session.principal is not None:
                _current_principal.set(session.principal)   # forwarded HTTP calls act for this principal
            doc = await self._handlers[api_key](request, header)
        if doc is NO_RESPONSE:
            return NO_RESPONSE
        if api_key == FETCH_KEY:   # hand-tuned: the records are passed on as their own buffers
            parts = encode_fetch_response(version, correlation_id, doc)
            if parts is not None:
                return parts
        return protocol.encode_response(api_key, version, correlation_id,
                                        build(protocol.response_type(api_key, version), doc))

    # ---- helpers -------------------------------------------------------------------------

    def _image(self):
        return self.ctx.image

    def _broker_address(self, broker_id: int) -> tuple[str, int] | None:
        img = self.ctx.deps.metadata.image
        if broker_id == self.broker_id:
            return split_address(self.kafka_address())
        b = img.brokers.get(broker_id) if img is not None else None
        if b is None or not b.kafka_address:
            return None
        return split_address(b.kafka_address)

    def _kafka_brokers(self, img) -> list[dict]:
        out = []
        for b in sorted(img.brokers.values(), key=lambda b: b.id):
            addr = self._broker_address(b.id)
            if addr is None or (b.fenced and b.id != self.broker_id):
                continue
            out.append({"node_id": b.id, "host": addr[0], "port": addr[1], "rack": b.rack})
        if not any(x["node_id"] == self.broker_id for x in out):
            host, port = split_address(self.kafka_address())
            out.append({"node_id": self.broker_id, "host": host, "port": port, "rack": self.config.rack})
        return out

    def _controller_id(self, img, brokers: list[dict]) -> int:
        """A live broker (clients send admin requests there): the active controller's node
        when it is a listed broker (combined mode), else the lowest listed broker."""
        ids = [b["node_id"] for b in brokers]
        return img.controller_id if img.controller_id in ids else min(ids)

    def _check_leader_epoch(self, topic: str, partition: int, current_leader_epoch: int | None) -> None:
        if current_leader_epoch is None or current_leader_epoch < 0:
            return
        part = self.rm.partitions.get((topic, partition))
        if part is None:
            return
        if current_leader_epoch < part.leader_epoch:
            raise KraftlogError(ErrorCode.FENCED_LEADER_EPOCH,
                                f"{topic}-{partition}: leader epoch {current_leader_epoch} is older than "
                                f"{part.leader_epoch}; refresh metadata")
        if current_leader_epoch > part.leader_epoch:
            raise KraftlogError(ErrorCode.UNKNOWN_LEADER_EPOCH,
                                f"{topic}-{partition}: leader epoch {current_leader_epoch} is newer than this "
                                f"broker's {part.leader_epoch}; retry")

    def _current_leader(self, topic: str, partition: int) -> dict:
        img = self.ctx.deps.metadata.image
        reg = img.partition(topic, partition) if img is not None else None
        if reg is None:
            return {"leader_id": -1, "leader_epoch": -1}
        return {"leader_id": reg.leader, "leader_epoch": reg.leader_epoch}

    # ---- authorization (Kafka's ACL operations per request, as http_api/broker/authorization.py)

    def _may(self, header, op: Op, rt: RT, name: str) -> bool:
        if self.authz is None or header.principal is None:
            return True
        return self.authz.allowed(header.principal, op, rt, name)

    def _require(self, header, op: Op, rt: RT, name: str) -> None:
        """Denied (Kafka's *_AUTHORIZATION_FAILED of `rt`) unless the principal may."""
        if not self._may(header, op, rt, name):
            raise Denied(rt, grant_hint(header.principal, op, rt, name))

    def _require_create(self, header, topic: str) -> None:
        if not self._may(header, Op.CREATE, RT.CLUSTER, CLUSTER):
            self._require(header, Op.CREATE, RT.TOPIC, topic)

    def _api_keys(self) -> list[dict]:
        return [{"api_key": k, "min_version": lo, "max_version": hi} for k, (_n, lo, hi) in API_VERSIONS.items()
                if self._served(k) is not None]

    def _sasl(self, api_key: int, req, session: SaslSession) -> dict:
        """SaslHandshake (the mechanism) and SaslAuthenticate (one round of its exchange);
        a failed exchange is answered, then the connection closes (`session.close`)."""
        if api_key == SASL_HANDSHAKE_KEY:
            if session.handshake(req.mechanism):
                session.unframed = req.__version__ == 0   # v0: the SASL tokens follow as bare frames
                return {"error_code": K.none, "mechanisms": MECHANISMS}
            session.close = True
            code = K.illegal_sasl_state if session.mechanism is not None else K.unsupported_sasl_mechanism
            return {"error_code": code, "mechanisms": MECHANISMS}
        try:
            out = session.step(bytes(req.auth_bytes))
        except SaslFailed as e:
            session.close = True
            log.info("Kafka SASL authentication from %s failed: %s", session.address, e)
            return {"error_code": K.sasl_authentication_failed, "error_message": f"{e}", "auth_bytes": b"",
                    "session_lifetime": 0}
        return {"error_code": K.none, "error_message": None, "auth_bytes": out, "session_lifetime": 0}

    # ---- ApiVersions, Metadata, DescribeCluster ------------------------------------------

    async def api_versions(self, req, header) -> dict:
        return {"error_code": K.none, "api_keys": self._api_keys(), "throttle_time": 0}

    async def metadata(self, req, header) -> dict:
        img = self._image()
        topics_req = req.topics
        auto_create = getattr(req, "allow_auto_topic_creation", True) and self.config.auto_create_topics_enable
        if topics_req is None or (header.api_version == 0 and not topics_req):
            names = [n for n in sorted(img.topics) if self._may(header, Op.DESCRIBE, RT.TOPIC, n)]
        else:
            names = [t.name for t in topics_req if t.name is not None]
        topics = []
        since_yield = 0
        for name in names:
            if since_yield >= METADATA_SLICE_PARTITIONS:   # 100,000 partitions: not in one turn of the loop
                since_yield = 0
                await asyncio.sleep(0)
            if not self._may(header, Op.DESCRIBE, RT.TOPIC, name):
                topics.append({"error_code": K.topic_authorization_failed, "name": name, "topic_id": _ZERO_UUID,
                               "is_internal": False, "partitions": ()})
                continue
            t = img.topics.get(name)
            if t is None:
                try:
                    validate_topic_name(name)
                    if auto_create:
                        self._require_create(header, name)
                    else:
                        raise KraftlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist")
                    await self.ctx.ensure_topic(name)
                    img = self._image()
                    t = img.topics.get(name)
                except KraftlogError as e:
                    topics.append({"error_code": kafka_error(e), "name": name, "topic_id": _ZERO_UUID,
                                   "is_internal": False, "partitions": ()})
                    continue
                if t is None:
                    topics.append({"error_code": K.leader_not_available, "name": name, "topic_id": _ZERO_UUID,
                                   "partitions": ()})
                    continue
            parts = []
            since_yield += len(t.partitions)
            for p in sorted(t.partitions.values(), key=lambda p: p.partition):
                live = [r for r in p.replicas if r in img.brokers and not img.brokers[r].fenced]
                parts.append({
                    "error_code": K.none if p.leader >= 0 else K.leader_not_available,
                    "partition_index": p.partition, "leader_id": p.leader, "leader_epoch": p.leader_epoch,
                    "replica_nodes": tuple(p.replicas), "isr_nodes": tuple(p.isr),
                    "offline_replicas": tuple(r for r in p.replicas if r not in live)})
            try:
                topic_id = uuid.UUID(t.topic_id) if t.topic_id else _ZERO_UUID
            except (ValueError, TypeError, AttributeError):
                topic_id = _ZERO_UUID
            topics.append({"error_code": K.none, "name": name, "topic_id": topic_id,
                           "is_internal": name == OFFSETS_TOPIC, "partitions": parts})
        brokers = self._kafka_brokers(img)
        return {"throttle_time": 0, "brokers": brokers, "cluster_id": img.cluster_id or None,
                "controller_id": self._controller_id(img, brokers), "topics": topics}

    async def describe_cluster(self, req, header) -> dict:
        if not self._may(header, Op.DESCRIBE, RT.CLUSTER, CLUSTER):
            return {"throttle_time": 0, "error_code": K.cluster_authorization_failed, "endpoint_type": 1,
                    "error_message": grant_hint(header.principal, Op.DESCRIBE, RT.CLUSTER, CLUSTER),
                    "cluster_id": "", "controller_id": -1, "brokers": ()}
        img = self._image()
        brokers = self._kafka_brokers(img)
        return {"throttle_time": 0, "error_code": K.none, "error_message": None, "endpoint_type": 1,
                "cluster_id": img.cluster_id or "kraftlog", "controller_id": self._controller_id(img, brokers),
                "brokers": [{"broker_id": b["node_id"], "host": b["host"], "port": b["port"], "rack": b["rack"]}
                            for b in brokers]}

    # ---- Produce, InitProducerId -----------------------------------------------------------

    async def produce(self, req, header) -> dict | object:
        acks = int(req.acks)
        if acks not in (0, 1, -1):
            return {"responses": [{"name": t.name, "partition_responses": [
                {"index": p.index, "error_code": K.invalid_required_acks, "base_offset": -1,
                 "error_message": f"acks={acks} is not valid; use 0, 1 or -1 (all)"} for p in t.partition_data]}
                for t in req.topic_data], "throttle_time": 0}
        transactional = req.transactional_id is not None
        if transactional and self.txn is None:
            if acks == ACKS_NONE:
                return NO_RESPONSE
            return {"responses": [{"name": t.name, "partition_responses": [
                {"index": p.index, "error_code": K.transactional_id_authorization_failed, "base_offset": -1,
                 "error_message": "this broker has no transaction coordinator"} for p in t.partition_data]}
                for t in req.topic_data], "throttle_time": 0}
        if transactional and not self._may(header, Op.WRITE, RT.TRANSACTIONAL_ID, req.transactional_id):
            if acks == ACKS_NONE:
                return NO_RESPONSE
            return {"responses": [{"name": t.name, "partition_responses": [
                {"index": p.index, "error_code": K.transactional_id_authorization_failed, "base_offset": -1,
                 "error_message": grant_hint(header.principal, Op.WRITE, RT.TRANSACTIONAL_ID, req.transactional_id)}
                for p in t.partition_data]} for t in req.topic_data], "throttle_time": 0}
        timeout_ms = min(_ms(req.timeout) or self.config.request_timeout_ms, self.config.request_timeout_ms)
        jobs = []
        for t in req.topic_data:
            for p in t.partition_data:
                jobs.append((t.name, p.index, p.records))
        results = await gather_in_slices(   # a slice of partitions per turn of the loop (http_api/loop_slices.py)
            lambda job: self._produce_partition(job[0], job[1], job[2], acks, timeout_ms, transactional, header,
                                                req.transactional_id), jobs)
        if acks == ACKS_NONE:
            return NO_RESPONSE
        by_topic: dict[str, list] = {}
        for (t, _p, _r), res in zip(jobs, results):
            by_topic.setdefault(t, []).append(res)
        return {"responses": [{"name": t, "partition_responses": rs} for t, rs in by_topic.items()],
                "throttle_time": 0}

    async def _produce_partition(self, topic: str, partition: int, records, acks: int, timeout_ms: int,
                                 transactional: bool = False, header=None, transactional_id: str | None = None) -> dict:
        try:
            if header is not None:
                self._require(header, Op.WRITE, RT.TOPIC, topic)
            internal_topics.check_client_write(topic, "produce")   # only coordinators write internal topics
            if not records:
                raise CorruptRecordError("the produce request carries no record batch for this partition")
            self.rm.leader_partition(topic, partition)   # NOT_LEADER_OR_FOLLOWER before converting anything
            max_msg = self._max_message_bytes(topic)
            converted = [kafka_to_stored(b, max_batch_bytes=max_msg) for b in split_kafka_batches(records)]
            for _stored, h in converted:
                check_client_batch(h, transactional)
            stored = [c[0] for c in converted]
            if transactional:   # KIP-890: only into the producer's ongoing transaction
                await txn_verification.verify_kafka_produce(self.txn, transactional_id, topic, partition, stored)
            res = await self.rm.append(topic, partition, stored[0] if len(stored) == 1 else b"".join(stored),
                                       acks=ACKS_ALL if acks == -1 else acks, timeout_ms=timeout_ms)
            m = self.ctx.metrics
            m.produce_bytes.inc(len(records))
            if res.duplicate and res.first_offset < 0:
                return {"index": partition, "error_code": K.duplicate_sequence_number, "base_offset": -1,
                        "log_start_offset": res.log_start_offset,
                        "error_message": "duplicate of a batch appended before the last 5 of this producer"}
            lat = None
            if res.log_append_time_ms > 0:
                lat = datetime.datetime.fromtimestamp(res.log_append_time_ms / 1000, tz=datetime.timezone.utc)
            return {"index": partition, "error_code": K.none, "base_offset": res.first_offset,
                    "log_append_time": lat, "log_start_offset": res.log_start_offset}
        except InvalidRecord as e:
            return {"index": partition, "error_code": K.invalid_record, "base_offset": -1, "error_message": str(e)}
        except Exception as e:  # noqa: BLE001 - answered per partition
            code, msg = _error_of(e)
            if code is K.unknown_server_error:
                log.exception("Kafka produce to %s-%s failed", topic, partition)
            out = {"index": partition, "error_code": code, "base_offset": -1, "error_message": msg}
            if code is K.not_leader_or_follower:
                out["current_leader"] = self._current_leader(topic, partition)
            return out

    def _max_message_bytes(self, topic: str) -> int:
        raw = self.rm.topic_config(topic).get("max.message.bytes")
        try:
            return int(raw) if raw is not None else self.config.message_max_bytes
        except ValueError:
            return self.config.message_max_bytes

    async def init_producer_id(self, req, header) -> dict:
        if req.transactional_id is not None:
            if not self._may(header, Op.WRITE, RT.TRANSACTIONAL_ID, req.transactional_id):
                return {"throttle_time": 0, "error_code": K.transactional_id_authorization_failed,
                        "producer_id": -1, "producer_epoch": -1}
            return await self._init_transactional(req, header)
        if not self._may(header, Op.IDEMPOTENT_WRITE, RT.CLUSTER, CLUSTER) and not any(
                self._may(header, Op.WRITE, RT.TOPIC, t) for t in self._image().topics):   # as Kafka 3
            return {"throttle_time": 0, "error_code": K.cluster_authorization_failed, "producer_id": -1,
                    "producer_epoch": -1}
        try:
            pid = await self.ctx.deps.producer_ids()
        except Exception as e:  # noqa: BLE001
            code, _msg = _error_of(e)
            if code is K.unknown_server_error:
                code = K.coordinator_not_available
            return {"throttle_time": 0, "error_code": code, "producer_id": -1, "producer_epoch": -1}
        return {"throttle_time": 0, "error_code": K.none, "producer_id": pid, "producer_epoch": 0}

    # ---- Fetch, ListOffsets, OffsetForLeaderEpoch --------------------------------------------

    async def fetch(self, req, header) -> dict:
        max_wait_ms = min(_ms(req.max_wait), self.config.fetch_max_wait_ms)
        min_bytes = max(0, int(req.min_bytes))
        total_max = max(1, min(int(getattr(req, "max_bytes", self.config.fetch_max_bytes)), self.config.fetch_max_bytes))
        committed = int(getattr(req, "isolation_level", 0)) == READ_COMMITTED
        wanted = [(t.topic, p.partition, p.fetch_offset, p.partition_max_bytes, getattr(p, "current_leader_epoch", -1))
                  for t in req.topics for p in t.partitions]
        denied = {t for t, *_ in wanted if not self._may(header, Op.READ, RT.TOPIC, t)}
        remote = await self._remote_reads(wanted, denied, committed)
        results = self._read_all(wanted, total_max, committed, denied, remote)
        size = sum(len(r[1]) for r in results if r[0] is None)
        if size < min_bytes and max_wait_ms > 0 and not self.rm.closing:
            # a partition answers nothing yet: wait for bytes beyond what it read (read_committed:
            # beyond its records above the LSO, so the marker that moves the LSO wakes it)
            waits = [asyncio.ensure_future(self.rm.fetch(t, p, off, max_bytes=r[5] + 1, min_bytes=r[5] + 1,
                                                         max_wait_ms=max_wait_ms))
                     for (t, p, off, _mb, _e), r in zip(wanted, results) if r[0] is None and not r[1]]
            if waits:
                try:
                    await asyncio.wait(waits, timeout=max_wait_ms / 1000, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for w in waits:
                        if not w.done():
                            w.cancel()
                    for w in waits:
                        try:
                            await w
                        except (asyncio.CancelledError, Exception):
                            pass
                results = self._read_all(wanted, total_max, committed, denied, remote)
        by_topic: dict[str, list] = {}
        for (t, p, _off, _mb, _e), (err, data, hw, lso, stable, _raw, aborted) in zip(wanted, results):
            entry = {"partition_index": p, "error_code": K.none if err is None else kafka_error(err),
                     "high_watermark": hw, "last_stable_offset": stable, "log_start_offset": lso,
                     "aborted_transactions": aborted, "preferred_read_replica": -1,
                     "records": stored_to_kafka(data) if data else b""}
            if err is not None and err.code in (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.FENCED_LEADER_EPOCH):
                entry["current_leader"] = self._current_leader(t, p)
            by_topic.setdefault(t, []).append(entry)
        self.ctx.metrics.fetch_bytes.inc(sum(len(r[1]) for r in results))
        return {"throttle_time": 0, "error_code": K.none, "session_id": 0,
                "responses": [{"topic": t, "partitions": ps} for t, ps in by_topic.items()]}

    async def _remote_reads(self, wanted: list, denied, committed: bool = False) -> dict:
        """Partition index -> the remote store's answer (or its error) for fetch offsets below
        the local log start of a tiered partition (docs/TIERED_STORAGE.md); empty without
        tiered storage."""
        if tiering.remote_log_manager(self.ctx) is None:
            return {}
        out: dict = {}
        for i, (t, p, off, part_max, _epoch) in enumerate(wanted):
            if t in denied:
                continue
            try:
                res = await tiering.remote_fetch(self.ctx, t, p, off, max(1, part_max))
            except KraftlogError as e:
                out[i] = e
                continue
            if res is not None:
                if committed:   # read_committed: the aborted transactions the store's indexes hold
                    try:
                        res.aborted = await tiering.remote_aborted_transactions(self.ctx, t, p, off, res.next_offset)
                    except KraftlogError as e:
                        out[i] = e
                        continue
                out[i] = res
        return out

    def _read_all(self, wanted: list, total_max: int, committed: bool = False, denied=frozenset(),
                  remote: dict | None = None) -> list[tuple]:
        """(error, stored bytes, high watermark, log start offset, last stable offset, bytes
        read before the LSO cut, aborted transactions or None) per partition; the first
        partition with data always gets at least one batch (KIP-74), later ones what is left.

        read_committed (isolation_level 1, KIP-98): only batches below the LSO, control
        batches included, and the aborted transactions they overlap ({producer_id,
        first_offset}): the client drops an aborted producer's batches from its first offset
        up to its ABORT marker."""
        out = []
        left = total_max
        for i, (t, p, off, part_max, epoch) in enumerate(wanted):
            try:
                if t in denied:
                    raise Denied(RT.TOPIC, f"READ on topic {t!r} is not granted")
                self._check_leader_epoch(t, p, epoch)
                res = (remote or {}).get(i)
                if isinstance(res, KraftlogError):
                    raise res
                if res is None:
                    res = self.rm._read_committed(t, p, off, max(1, min(part_max, left)) if left > 0 else 1)
                data = res.records if left > 0 else b""
                raw = len(res.records)
                lg = self.rm.logs.get((t, p))
                stable = res.high_watermark if lg is None else lg.last_stable_offset(res.high_watermark)
                aborted = None
                if committed:
                    data, upper = batches_below(data, stable)
                    found = lg.aborted_transactions(off, upper) if lg is not None and data else []
                    if data and getattr(res, "aborted", None):   # served by the store (_remote_reads)
                        found = tiering.merge_aborted(found, [a for a in res.aborted if a.first_offset < upper])
                    aborted = [{"producer_id": a.producer_id, "first_offset": a.first_offset} for a in found]
                left -= len(data)
                out.append((None, data, res.high_watermark, res.log_start_offset, stable, raw, aborted))
            except KraftlogError as e:
                out.append((e, b"", -1, -1, -1, 0, None))
            except Exception as e:  # noqa: BLE001
                log.exception("Kafka fetch of %s-%s failed", t, p)
                out.append((KraftlogError(ErrorCode.UNKNOWN_SERVER_ERROR, str(e)), b"", -1, -1, -1, 0, None))
        return out

    async def list_offsets(self, req, header) -> dict:
        committed = int(getattr(req, "isolation_level", 0)) == READ_COMMITTED
        topics = []
        for t in req.topics:
            parts = []
            for p in t.partitions:
                entry = {"partition_index": p.partition_index, "error_code": K.none, "timestamp": -1, "offset": -1}
                try:
                    self._require(header, Op.DESCRIBE, RT.TOPIC, t.name)
                    self._check_leader_epoch(t.name, p.partition_index, getattr(p, "current_leader_epoch", -1))
                    part, _lg = self.rm.leader_partition(t.name, p.partition_index)
                    offs = self.rm.offsets(t.name, p.partition_index)
                    ts = int(p.timestamp)
                    if ts == -2:   # a tiered partition's log start is the remote one
                        entry["offset"] = (await tiering.offsets_doc(self.ctx, t.name, p.partition_index,
                                                                     offs))["log_start_offset"]
                    elif ts in (-1, -3):
                        entry["offset"] = offs["high_watermark"]
                        lg = self.rm.logs.get((t.name, p.partition_index))
                        if committed and lg is not None:   # read_committed's latest is the LSO
                            entry["offset"] = lg.last_stable_offset(offs["high_watermark"])
                    else:
                        found = self.rm.offset_for_timestamp(t.name, p.partition_index, ts)
                        found = await tiering.offset_for_timestamp(self.ctx, t.name, p.partition_index, ts, found)
                        if found < offs["high_watermark"]:
                            entry["offset"], entry["timestamp"] = found, ts
                    entry["leader_epoch"] = part.leader_epoch
                except KraftlogError as e:
                    entry["error_code"] = kafka_error(e)
                parts.append(entry)
            topics.append({"name": t.name, "partitions": parts})
        return {"throttle_time": 0, "topics": topics}

    async def offset_for_leader_epoch(self, req, header) -> dict:
        topics = []
        for t in req.topics:
            parts = []
            for p in t.partitions:
                entry = {"partition": p.partition, "error_code": K.none, "leader_epoch": -1, "end_offset": -1}
                try:
                    self._require(header, Op.DESCRIBE, RT.TOPIC, t.topic)
                    cur = getattr(p, "current_leader_epoch", -1)
                    self._check_leader_epoch(t.topic, p.partition, cur)
                    epoch, end = self.rm.epoch_end_offset(t.topic, p.partition, int(p.leader_epoch),
                                                          cur if cur >= 0 else None)
                    entry["leader_epoch"], entry["end_offset"] = epoch, end
                except KraftlogError as e:
                    entry["error_code"] = kafka_error(e)
                parts.append(entry)
            topics.append({"topic": t.topic, "partitions": parts})
        return {"throttle_time": 0, "topics": topics}

    # ---- transactions (KIP-98) on the coordinator of http_api/broker/transactions.py --------

    def _txn_error(self, e: KraftlogError, header) -> K:
        """Kafka's code for a coordinator error; PRODUCER_FENCED is INVALID_PRODUCER_EPOCH
        for request versions older than KIP-588's (as Kafka's broker answers them)."""
        code = kafka_error(e)
        if code is K.producer_fenced and header.api_version < _FENCED_SINCE.get(header.api_key, 0):
            return K.invalid_producer_epoch
        return code

    async def _init_transactional(self, req, header) -> dict:
        txid = req.transactional_id
        timeout_ms = _ms(req.transaction_timeout)
        pid, epoch = int(getattr(req, "producer_id", -1)), int(getattr(req, "producer_epoch", -1))

        async def go(ld):
            if pid >= 0:   # KIP-360: a producer asking to bump its own epoch must still be current
                md = ld.state.txns.get(txid)
                if md is None or md.producer_id != pid or md.producer_epoch != epoch:
                    raise KraftlogError(ErrorCode.PRODUCER_FENCED,
                                        f"producer {pid} epoch {epoch} is not the current producer of {txid!r}")
            return await self.txn.init_producer(ld, txid, timeout_ms)
        try:
            md = await self.txn.run_local(txid, go)
        except KraftlogError as e:
            return {"throttle_time": 0, "error_code": self._txn_error(e, header), "producer_id": -1,
                    "producer_epoch": -1}
        return {"throttle_time": 0, "error_code": K.none, "producer_id": md.producer_id,
                "producer_epoch": md.producer_epoch}

    async def add_partitions_to_txn(self, req, header) -> dict:
        txid = req.v3_and_below_transactional_id
        pid, epoch = int(req.v3_and_below_producer_id), int(req.v3_and_below_producer_epoch)
        wanted = [(t.name, int(p)) for t in req.v3_and_below_topics for p in t.partitions]
        img = self._image()
        errors: dict[tuple[str, int], K] = {}
        txid_ok = self._may(header, Op.WRITE, RT.TRANSACTIONAL_ID, txid)
        for t, p in wanted:
            if not txid_ok:
                errors[(t, p)] = K.transactional_id_authorization_failed
            elif not self._may(header, Op.WRITE, RT.TOPIC, t):
                errors[(t, p)] = K.topic_authorization_failed
            elif t in internal_topics.INTERNAL_TOPICS:
                errors[(t, p)] = K.topic_authorization_failed
            elif img.partition(t, p) is None:
                errors[(t, p)] = K.unknown_topic_or_partition
        if errors:   # as Kafka: nothing joins, the valid partitions are OPERATION_NOT_ATTEMPTED
            codes = {tp: errors.get(tp, K.operation_not_attempted) for tp in wanted}
        else:
            async def go(ld):
                md = ld.state.add_partitions(txid, pid, epoch, wanted, self.txn.clock.now_ms())
                if md is not None:
                    await self.txn._write(ld, md)   # the partitions join before any record is written
            try:
                await self.txn.run_local(txid, go)
                codes = {tp: K.none for tp in wanted}
            except KraftlogError as e:
                code = self._txn_error(e, header)
                codes = {tp: code for tp in wanted}
        by_topic: dict[str, list] = {}
        for (t, p), code in codes.items():
            by_topic.setdefault(t, []).append({"partition_index": p, "partition_error_code": code})
        return {"throttle_time": 0, "results_by_topic_v3_and_below": [
            {"name": t, "results_by_partition": ps} for t, ps in by_topic.items()]}

    async def add_offsets_to_txn(self, req, header) -> dict:
        """The group's offsets will join the transaction (TxnOffsetCommit sends them); the
        transaction is open from here on (Ongoing), as Kafka's AddOffsetsToTxn makes it."""
        txid, group = req.transactional_id, req.group_id
        pid, epoch = int(req.producer_id), int(req.producer_epoch)

        async def go(ld):
            await self.txn._write(ld, ld.state.add_offsets(txid, pid, epoch, group, [], self.txn.clock.now_ms()))
        try:
            self._require(header, Op.WRITE, RT.TRANSACTIONAL_ID, txid)
            self._require(header, Op.READ, RT.GROUP, group)
            validate_group_id(group)
            await self.txn.run_local(txid, go)
        except KraftlogError as e:
            return {"throttle_time": 0, "error_code": self._txn_error(e, header)}
        return {"throttle_time": 0, "error_code": K.none}

    async def txn_offset_commit(self, req, header) -> dict:
        """Offsets sent to the transaction (sendOffsetsToTransaction): kept by the
        transaction coordinator and committed to the group with the transaction's commit,
        dropped by its abort; invisible to the group until then."""
        entries = [(t.name, int(p.partition_index), int(p.committed_offset)) for t in req.topics for p in t.partitions]
        code = K.none
        try:
            self._require(header, Op.WRITE, RT.TRANSACTIONAL_ID, req.transactional_id)
            self._require(header, Op.READ, RT.GROUP, req.group_id)
            for t in {t for t, _p, _o in entries}:
                self._require(header, Op.READ, RT.TOPIC, t)
            validate_group_id(req.group_id)
            img = self._image()
            for t, p, o in entries:
                if img.partition(t, p) is None:
                    raise KraftlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{t}-{p} does not exist")
                if o < 0:
                    raise KraftlogError(ErrorCode.INVALID_REQUEST, f"{t}-{p}: offset {o} is negative")
            await self.txn.add_offsets_anywhere(req.transactional_id, int(req.producer_id), int(req.producer_epoch),
                                                req.group_id, entries)
        except KraftlogError as e:
            code = self._txn_error(e, header)
            if code is K.not_coordinator:   # the transaction coordinator moved: the client retries
                code = K.coordinator_not_available
        by_topic: dict[str, list] = {}
        for t, p, _o in entries:
            by_topic.setdefault(t, []).append({"partition_index": p, "error_code": code})
        return {"throttle_time": 0, "topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()]}

    async def end_txn(self, req, header) -> dict:
        """Commit or abort: answered once the decision is written and (bounded by
        request_timeout_ms) its markers are on every partition, so a read_committed
        consumer sees a committed transaction right after commit_transaction returns."""
        txid = req.transactional_id
        pid, epoch, commit = int(req.producer_id), int(req.producer_epoch), bool(req.committed)
        try:
            self._require(header, Op.WRITE, RT.TRANSACTIONAL_ID, txid)
            await self.txn.run_local(txid, lambda ld: self.txn.end_transaction(ld, txid, pid, epoch, commit))
        except KraftlogError as e:
            return {"throttle_time": 0, "error_code": self._txn_error(e, header)}
        return {"throttle_time": 0, "error_code": K.none}

    # ---- coordinator, groups, offsets ---------------------------------------------------

    async def find_coordinator(self, req, header) -> dict:
        key_type = int(getattr(req, "key_type", 0))
        what = "transactional id" if key_type == TRANSACTION_KEY_TYPE else "group"
        try:
            self._require(header, Op.DESCRIBE, RT.TRANSACTIONAL_ID if key_type == TRANSACTION_KEY_TYPE else RT.GROUP,
                          req.key)
            if key_type == TRANSACTION_KEY_TYPE and self.txn is not None:
                _p, leader, _url = await self.txn.coordinator_of(req.key)
            elif key_type == 0:
                validate_group_id(req.key)
                _p, leader, _url = await self.gc.coordinator_of(req.key)
            else:
                raise KraftlogError(ErrorCode.INVALID_REQUEST, f"coordinator key type {key_type} is not served "
                                    "(0: group, 1: transactional id)")
            addr = self._broker_address(leader) if leader >= 0 else None
            if addr is None:
                raise KraftlogError(ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                    f"the coordinator of {what} {req.key!r} has no Kafka listener yet; retry")
        except KraftlogError as e:
            return {"throttle_time": 0, "error_code": kafka_error(e), "error_message": e.message,
                    "node_id": -1, "host": "", "port": -1}
        return {"throttle_time": 0, "error_code": K.none, "error_message": None, "node_id": leader,
                "host": addr[0], "port": addr[1]}

    async def _on_coordinator(self, group: str, fn):
        """Run `fn(loaded)` on this broker's copy of the group's `__consumer_offsets`
        partition; NOT_COORDINATOR when another broker coordinates the group."""
        from partitions.groups.coordinator import GroupError
        validate_group_id(group)
        p, leader, _url = await self.gc.coordinator_of(group)
        if leader != self.broker_id:
            raise KraftlogError(ErrorCode.NOT_COORDINATOR,
                                f"broker {self.broker_id} does not coordinate group {group!r}; find its coordinator")
        try:
            ld = await self.gc._local(p)
        except asyncio.TimeoutError:
            raise KraftlogError(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, f"group {group!r} is still loading") from None
        if ld is None:
            raise KraftlogError(ErrorCode.NOT_COORDINATOR, f"group {group!r} moved; find its coordinator again")
        try:
            return await fn(ld)
        except GroupError as e:
            code = ErrorCode.__members__.get(e.code, ErrorCode.INVALID_REQUEST)
            raise KraftlogError(code, e.message) from None

    async def offset_commit(self, req, header) -> dict:
        group = req.group_id
        generation = int(getattr(req, "generation_id_or_member_epoch", -1))
        member_id = req.member_id or ""
        entries = [(t.name, p.partition_index, int(p.committed_offset), p.committed_metadata)
                   for t in req.topics for p in t.partitions]

        def answer(code: K) -> dict:
            by_topic: dict[str, list] = {}
            for t, p, _o, _m in entries:
                by_topic.setdefault(t, []).append({"partition_index": p, "error_code": code})
            return {"throttle_time": 0, "topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()]}

        try:
            self._require(header, Op.READ, RT.GROUP, group)
            for t in {t for t, _p, _o, _m in entries}:
                self._require(header, Op.READ, RT.TOPIC, t)
            self.groups.check_commit(group, member_id, generation)
            img = self._image()
            for t, p, o, _m in entries:
                if img.partition(t, p) is None:
                    raise KraftlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{t}-{p} does not exist")
                if o < 0:
                    raise KraftlogError(ErrorCode.INVALID_REQUEST, f"{t}-{p}: offset {o} is negative")

            async def go(ld):
                records = ld.state.prepare_commit(group, entries, self.gc.clock.now_ms())
                await self.gc._append(ld, records, apply=True)
            await self._on_coordinator(group, go)
        except (KraftlogError, ClassicGroupError) as e:
            return answer(_code(e))
        return answer(K.none)

    async def offset_fetch(self, req, header) -> dict:
        group = req.group_id
        wanted = None if req.topics is None else [(t.name, list(t.partition_indexes)) for t in req.topics]
        try:
            self._require(header, Op.DESCRIBE, RT.GROUP, group)

            async def go(ld):
                await self.gc._read_barrier(ld)
                return {(t, p): om for t, p, om in ld.state.fetch_offsets(group)}
            committed = await self._on_coordinator(group, go)
        except KraftlogError as e:
            code = kafka_error(e)
            topics = [{"name": t, "partitions": [{"partition_index": p, "committed_offset": -1, "metadata": "",
                                                  "error_code": code} for p in ps]} for t, ps in (wanted or [])]
            return {"throttle_time": 0, "topics": topics, "error_code": code}
        if wanted is None:
            grouped: dict[str, list] = {}
            for (t, p) in sorted(committed):
                grouped.setdefault(t, []).append(p)
            wanted = [(t, ps) for t, ps in grouped.items() if self._may(header, Op.DESCRIBE, RT.TOPIC, t)]
        topics = []
        for t, ps in wanted:
            parts = []
            if not self._may(header, Op.DESCRIBE, RT.TOPIC, t):
                topics.append({"name": t, "partitions": [
                    {"partition_index": p, "committed_offset": -1, "metadata": "",
                     "error_code": K.topic_authorization_failed} for p in ps]})
                continue
            for p in ps:
                om = committed.get((t, p))
                parts.append({"partition_index": p, "committed_offset": om.offset if om is not None else -1,
                              "committed_leader_epoch": -1,
                              "metadata": (om.metadata if om is not None else "") or "", "error_code": K.none})
            topics.append({"name": t, "partitions": parts})
        return {"throttle_time": 0, "topics": topics, "error_code": K.none}

    async def _group_call(self, group: str, fn):
        """Classic membership calls run where the group's offsets live (the coordinator)."""
        async def go(_ld):
            return await fn()
        return await self._on_coordinator(group, go)

    async def join_group(self, req, header) -> dict:
        try:
            self._require(header, Op.READ, RT.GROUP, req.group_id)
            return await self._group_call(req.group_id, lambda: self.groups.join(req, header))
        except (KraftlogError, ClassicGroupError) as e:
            return {"throttle_time": 0, "error_code": _code(e), "generation_id": -1, "protocol_name": None,
                    "protocol_type": None, "leader": "", "member_id": req.member_id or "", "members": ()}

    async def sync_group(self, req, header) -> dict:
        try:
            self._require(header, Op.READ, RT.GROUP, req.group_id)
            return await self._group_call(req.group_id, lambda: self.groups.sync(req))
        except (KraftlogError, ClassicGroupError) as e:
            return {"throttle_time": 0, "error_code": _code(e), "assignment": b""}

    async def heartbeat(self, req, header) -> dict:
        try:
            self._require(header, Op.READ, RT.GROUP, req.group_id)
            await self._group_call(req.group_id, lambda: self.groups.heartbeat(req))
        except (KraftlogError, ClassicGroupError) as e:
            return {"throttle_time": 0, "error_code": _code(e)}
        return {"throttle_time": 0, "error_code": K.none}

    async def leave_group(self, req, header) -> dict:
        members = [m.member_id for m in req.members] if hasattr(req, "members") else [req.member_id]
        try:
            self._require(header, Op.READ, RT.GROUP, req.group_id)
            await self._group_call(req.group_id, lambda: self.groups.leave(req.group_id, members))
        except (KraftlogError, ClassicGroupError) as e:
            return {"throttle_time": 0, "error_code": _code(e), "members": ()}
        return {"throttle_time": 0, "error_code": K.none,
                "members": [{"member_id": m, "group_instance_id": None, "error_code": K.none} for m in members]}

    async def list_groups(self, req, header) -> dict:
        all_groups = self._may(header, Op.DESCRIBE, RT.CLUSTER, CLUSTER)
        return {"throttle_time": 0, "error_code": K.none, "groups": [
            g for g in self.groups.listed() if all_groups or self._may(header, Op.DESCRIBE, RT.GROUP, g["group_id"])]}

    async def describe_groups(self, req, header) -> dict:
        return {"throttle_time": 0, "groups": [
            self.groups.described(g) if self._may(header, Op.DESCRIBE, RT.GROUP, g) else
            {"error_code": K.group_authorization_failed, "group_id": g, "group_state": "", "protocol_type": "",
             "protocol_data": "", "members": ()} for g in req.groups]}

    # ---- admin ---------------------------------------------------------------------------

    async def create_topics(self, req, header) -> dict:
        wait_ms = min(max(_ms(req.timeout), 0) or self.config.metadata_wait_ms, _ADMIN_WAIT_MS_MAX)
        return {"throttle_time": 0, "topics": await asyncio.gather(
            *(self._create_topic(t, bool(getattr(req, "validate_only", False)), wait_ms, header) for t in req.topics))}

    async def _create_topic(self, t, validate_only: bool, wait_ms: int, header) -> dict:
        out = {"name": t.name, "topic_id": _ZERO_UUID, "error_code": K.none, "error_message": None,
               "num_partitions": -1, "replication_factor": -1, "configs": ()}
        try:
            self._require_create(header, t.name)
            validate_topic_name(t.name)
            internal_topics.check_client_write(t.name, "creation")   # its coordinator creates it
            if t.assignments:
                raise KraftlogError(ErrorCode.INVALID_REQUEST, "manual replica assignments are not supported; "
                                    "give num_partitions and replication_factor")
            n = int(t.num_partitions) if t.num_partitions > 0 else self.config.num_partitions
            rf = int(t.replication_factor) if t.replication_factor > 0 else self.config.default_replication_factor
            configs = TopicRoutes._check_configs({c.name: c.value for c in t.configs if c.value is not None})
            if t.name in self._image().topics:
                raise KraftlogError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {t.name!r} already exists")
            out["num_partitions"], out["replication_factor"] = n, rf
            if validate_only:
                return out
            await self.ctx.deps.controller.create_topic(t.name, n, rf, configs)
            await self.ctx.deps.metadata.wait_until(
                lambda img: t.name in img.topics and all(p.leader >= 0 for p in img.topics[t.name].partitions.values()),
                wait_ms / 1000)
            ti = self._image().topics.get(t.name)
            if ti is not None and ti.topic_id:
                try:
                    out["topic_id"] = uuid.UUID(ti.topic_id)
                except ValueError:
                    pass
        except KraftlogError as e:
            out["error_code"], out["error_message"] = kafka_error(e), e.message
        return out

    async def delete_topics(self, req, header) -> dict:
        wait_ms = min(max(_ms(req.timeout), 0) or self.config.metadata_wait_ms, _ADMIN_WAIT_MS_MAX)

        async def one(name: str) -> dict:
            try:
                self._require(header, Op.DELETE, RT.TOPIC, name)
                if name not in self._image().topics:
                    raise KraftlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist")
                if name == OFFSETS_TOPIC:
                    raise KraftlogError(ErrorCode.INVALID_TOPIC_EXCEPTION, f"{name} is an internal topic")
                await self.ctx.deps.controller.delete_topic(name)
                self.ctx.deps.groups.delete_topic(name)
                await self.ctx.deps.metadata.wait_until(lambda img: name not in img.topics, wait_ms / 1000)
                return {"name": name, "error_code": K.none, "error_message": None}
            except KraftlogError as e:
                return {"name": name, "error_code": kafka_error(e), "error_message": e.message}
        return {"throttle_time": 0, "responses": await asyncio.gather(*(one(n) for n in req.topic_names))}

    async def create_partitions(self, req, header) -> dict:
        wait_ms = min(max(_ms(req.timeout), 0) or self.config.metadata_wait_ms, _ADMIN_WAIT_MS_MAX)

        async def one(t) -> dict:
            try:
                self._require(header, Op.ALTER, RT.TOPIC, t.name)
                if t.name not in self._image().topics:
                    raise KraftlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {t.name!r} does not exist")
                if t.assignments:
                    raise KraftlogError(ErrorCode.INVALID_REQUEST, "manual replica assignments are not supported")
                count = int(t.count)
                if not req.validate_only:
                    await self.ctx.deps.controller.create_partitions(t.name, count)
                    await self.ctx.deps.metadata.wait_until(
                        lambda img: t.name in img.topics and len(img.topics[t.name].partitions) >= count,
                        wait_ms / 1000)
                return {"name": t.name, "error_code": K.none, "error_message": None}
            except KraftlogError as e:
                return {"name": t.name, "error_code": kafka_error(e), "error_message": e.message}
        return {"throttle_time": 0, "results": await asyncio.gather(*(one(t) for t in req.topics))}

    async def delete_records(self, req, header) -> dict:
        """Advance log start offsets (the partition leader only; -1 = the high watermark)."""
        topics = []
        for t in req.topics:
            parts = []
            for p in t.partitions:
                entry = {"partition_index": p.partition_index, "low_watermark": -1, "error_code": K.none}
                try:
                    self._require(header, Op.DELETE, RT.TOPIC, t.name)
                    internal_topics.check_client_write(t.name, "delete-records")
                    entry["low_watermark"] = await self.rm.delete_records(t.name, p.partition_index, int(p.offset))
                except KraftlogError as e:
                    entry["error_code"] = kafka_error(e)
                except Exception as e:  # noqa: BLE001 - answered per partition (OffsetOutOfRange, ...)
                    entry["error_code"] = _error_of(e)[0]
                    if "out of range" in str(e):
                        entry["error_code"] = K.offset_out_of_range
                parts.append(entry)
            topics.append({"name": t.name, "partitions": parts})
        return {"throttle_time": 0, "topics": topics}

    async def delete_groups(self, req, header) -> dict:
        async def one(group: str) -> dict:
            try:
                self._require(header, Op.DELETE, RT.GROUP, group)
                g = self.groups.groups.get(group)
                if g is not None and g.members:
                    raise KraftlogError(ErrorCode.NON_EMPTY_GROUP, f"group {group!r} has members")

                async def go(ld):
                    await self.gc._append(ld, ld.state.delete_group(group), apply=True)
                await self._on_coordinator(group, go)
                self.groups.groups.pop(group, None)
                return {"group_id": group, "error_code": K.none}
            except (KraftlogError, ClassicGroupError) as e:
                return {"group_id": group, "error_code": _code(e)}
        return {"throttle_time": 0, "results": [await one(g) for g in req.groups_names]}

    async def incremental_alter_configs(self, req, header) -> dict:
        """Topic configs: SET (0) and DELETE (1); APPEND/SUBTRACT (list configs) are refused."""
        out = []
        for r in req.resources:
            entry = {"error_code": K.none, "error_message": None, "resource_type": int(r.resource_type),
                     "resource_name": r.resource_name}
            try:
                if int(r.resource_type) != TOPIC_RESOURCE:
                    raise KraftlogError(ErrorCode.INVALID_REQUEST, "only topic configs can be altered here")
                self._require(header, Op.ALTER_CONFIGS, RT.TOPIC, r.resource_name)
                name = r.resource_name
                if name not in self._image().topics:
                    raise KraftlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist")
                sets = {c.name: c.value for c in r.configs if int(c.config_operation) == 0}
                deletes = {c.name: None for c in r.configs if int(c.config_operation) == 1}
                if any(int(c.config_operation) not in (0, 1) for c in r.configs):
                    raise KraftlogError(ErrorCode.INVALID_REQUEST, "APPEND and SUBTRACT are not supported; use SET")
                changes = {**TopicRoutes._check_configs({k: v for k, v in sets.items() if v is not None}), **deletes}
                if not req.validate_only:
                    await self.ctx.deps.controller.alter_configs(name, changes)
                    await self.ctx.deps.metadata.wait_until(
                        lambda img: name in img.topics and all(img.topics[name].configs.get(k) == v
                                                               for k, v in changes.items()),
                        self.config.metadata_wait_ms / 1000)
            except KraftlogError as e:
                entry["error_code"], entry["error_message"] = kafka_error(e), e.message
            out.append(entry)
        return {"throttle_time": 0, "responses": out}

    async def describe_configs(self, req, header) -> dict:
        img = self._image()
        results = []
        for r in req.resources:
            rtype, name = int(r.resource_type), r.resource_name
            keys = set(r.configuration_keys) if r.configuration_keys is not None else None
            out = {"error_code": K.none, "error_message": None, "resource_type": rtype, "resource_name": name,
                   "configs": ()}
            if rtype in (TOPIC_RESOURCE, BROKER_RESOURCE) and not self._may(
                    header, Op.DESCRIBE_CONFIGS, RT.TOPIC if rtype == TOPIC_RESOURCE else RT.CLUSTER,
                    name if rtype == TOPIC_RESOURCE else CLUSTER):
                out["error_code"] = K.topic_authorization_failed if rtype == TOPIC_RESOURCE else \
                    K.cluster_authorization_failed
            elif rtype == TOPIC_RESOURCE:
                t = img.topics.get(name)
                if t is None:
                    out["error_code"], out["error_message"] = K.unknown_topic_or_partition, f"topic {name!r} does not exist"
                else:
                    out["configs"] = [self._config_entry(k, v, 1) for k, v in sorted(t.configs.items())
                                      if keys is None or k in keys]
            elif rtype == BROKER_RESOURCE:
                values = dict(img.broker_configs.get(name, {}) or {})
                out["configs"] = [self._config_entry(k, v, 4) for k, v in sorted(values.items())
                                  if keys is None or k in keys]
            else:
                out["error_code"], out["error_message"] = K.invalid_request, f"resource type {rtype} is not supported"
            results.append(out)
        return {"throttle_time": 0, "results": results}

    @staticmethod
    def _config_entry(name: str, value: Any, source: int) -> dict:
        return {"name": name, "value": None if value is None else str(value), "read_only": False,
                "config_source": source, "is_default": False, "is_sensitive": False, "synonyms": (),
                "config_type": 0, "documentation": None}
