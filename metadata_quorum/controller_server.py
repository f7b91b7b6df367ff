"""The controller process: one voter of the metadata quorum plus the controller HTTP API.

    python -m metadata_quorum.controller_server --node-id 1 --data-dir DIR \
        --http-host 127.0.0.1 --http-port 9093 --raft-port 9193 \
        --voters "1@127.0.0.1:9193:9093,2@127.0.0.1:9194:9094,3@127.0.0.1:9195:9095" \
        --password SECRET --cluster-id CLUSTER

From Python: `run_controller(ControllerConfig(...))` blocks until SIGINT/SIGTERM (call it
on the main thread of its own process: pysyncobj's tick thread must share the GIL with as
little as possible, see DESIGN.md section 2); `run_controller_async(config)` is the same
inside a running loop on the main thread.

The raft leader is the *active controller* once its LeaderChangeRecord (epoch = raft term)
is committed; only then does it accept writes and run the periodic lease check. Others
answer writes with 421 NOT_CONTROLLER and {"leader_id", "leader_url"}. Writes are decided
by the pure QuorumController against the committed image and proposed as one atomic batch
carrying the controller epoch and the request id (from the body's "request_id" or the
X-Request-Id header) so retries after an unknown outcome are idempotent.

Routes (prefix /controller/v1, JSON): see docs/ARCHITECTURE.md "Controller API".
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import random
import signal
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from aiohttp import web

from http_api.wire.hardening import HardenedAppRunner, HttpLimits
from http_api.wire.auth import AuthMiddleware, Authenticator, broker_id_of, say_unauthenticated
from http_api.wire.middleware import ErrorMiddleware
from http_api.wire.reachability import connection_refused
from partitions.clock import SYSTEM_CLOCK, Clock
from partitions.errors import ErrorCode, KraftlogError
from metadata_quorum.controller import ControllerSettings, QuorumController
from metadata_quorum.controller_security import ControllerSecurityRoutes
from metadata_quorum.image import MetadataImage
from metadata_quorum.security.config import SecurityConfig
from metadata_quorum.records import (BrokerMembershipRecord, BrokerRegistrationChangeRecord, FenceBrokerRecord,
                                     LeaderChangeRecord, PartitionChangeRecord, RegisterBrokerRecord, UnfenceBrokerRecord,
                                     entry_items, record_to_dict)
from metadata_quorum.quorum_routes import QuorumRoutes
from metadata_quorum.state_machine import GC_FREEZE_MIN_RECORDS_DEFAULT, FullCollectionHold, MetadataStateMachine
from raft.election_backoff import ELECTION_BACKOFF_MAX_S_DEFAULT
from raft.log import RAFT_FRAME_MAX_BYTES_DEFAULT, NotLeaderError, OutcomeUnknownError

log = logging.getLogger("kraftlog.controller")

# how often the event loop looks whether the state machine's lock is free (`_sm_locked`)
SM_LOCK_POLL_S = 0.002
# per committed write, partition changes logged one line each; the rest are counted in one line
DECISION_LOG_PARTITION_LINES_MAX = 100

PREFIX = "/controller/v1"


@dataclass(frozen=True)
class Voter:
    node_id: int
    host: str
    raft_port: int
    http_port: int
    scheme: str = "http"     # https when the controllers' TLS is on

    @property
    def raft_address(self) -> str:
        return f"{self.host}:{self.raft_port}"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.http_port}"


def parse_voters(spec: str) -> dict[int, Voter]:
    """"1@host:raft_port:http_port,2@..." -> {1: Voter(...), ...}"""
    voters: dict[int, Voter] = {}
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            nid, rest = part.split("@", 1)
            host, raft_port, http_port = rest.rsplit(":", 2)
            voters[int(nid)] = Voter(int(nid), host, int(raft_port), int(http_port))
        except ValueError:
            raise ValueError(f"bad voter {part!r}: expected ID@HOST:RAFT_PORT:HTTP_PORT") from None
    if not voters:
        raise ValueError("--voters must list at least one controller")
    return voters


def format_voters(voters: dict[int, Voter]) -> str:
    return ",".join(f"{v.node_id}@{v.host}:{v.raft_port}:{v.http_port}" for v in voters.values())


@dataclass
class ControllerConfig:
    """Everything a controller process needs. `voters` maps node id -> Voter (this node
    included); `http_host`/`http_port` default to this node's voter entry."""

    node_id: int
    data_dir: str
    voters: dict
    password: Optional[str] = None
    cluster_id: str = "kraftlog-cluster"
    http_host: Optional[str] = None
    http_port: Optional[int] = None
    settings: ControllerSettings = field(default_factory=ControllerSettings)   # the controller role's decisions
    maintenance_interval_ms: int = 200
    unreachable_probe_timeout_ms: int = 1000   # probe of a broker reported unreachable (refused = fence now)
    # probe of a broker reported silent (part B), in a thread (a busy event loop cannot fake a
    # timeout): a TCP connect from this host (not connected within this long = cut off), then
    # GET /healthz (no answer within the second limit = not serving: stopped, or behind a
    # proxy or load balancer that accepts for it)
    broker_silence_probe_timeout_ms: int = 300
    broker_silence_probe_answer_timeout_ms: int = 1000
    # a connected probe left unanswered is tried this many times in a row before it counts (a
    # live broker whose event loop is busy for a second applying a large metadata change, e.g.
    # another broker's fencing at 30,000 partitions, answers the next one; a stopped one does not)
    broker_silence_probe_answer_attempts: int = 2
    propose_timeout_ms: int = 5000
    long_poll_max_wait_ms: int = 30_000
    feed_records_per_response_max: int = 5000
    # a feed answer in runs (the reader asked for runs=1) holds up to this many records, of
    # which at most feed_records_per_response_max outside runs: a run costs about 33 bytes
    # of JSON a record, and a fencing at 100,000 partitions (33,335 records, 1.1 MB in runs)
    # came in seven answers one after the other while the survivors waited for it (issue 25)
    feed_run_records_per_response_max: int = 50_000
    # an apply of this many records or more freezes the image out of full garbage collections
    # (state_machine.py); 0 = never
    gc_freeze_min_records: int = GC_FREEZE_MIN_RECORDS_DEFAULT
    raft_min_timeout_s: float = 0.3
    raft_max_timeout_s: float = 0.6
    # the longest election timeout after elections that elected nobody (raft/election_backoff.py)
    raft_election_backoff_max_s: float = ELECTION_BACKOFF_MAX_S_DEFAULT
    append_entries_period_s: float = 0.05
    auto_tick_period_s: float = 0.015
    connection_retry_time_s: float = 0.5
    leader_fallback_timeout_s: float = 1.5
    raft_log_compaction_min_entries: int = 5000
    raft_log_compaction_min_time_s: float = 300.0
    raft_log_compaction_split: bool = True   # RaftConfig.log_compaction_split: voters compact in turn
    raft_fsync_journal: bool = True
    raft_frame_max_bytes: int = RAFT_FRAME_MAX_BYTES_DEFAULT   # a peer announcing more is dropped
    # the HTTP edge (http_api/wire/hardening.py): head/body deadlines, connection caps
    http_limits: HttpLimits = field(default_factory=HttpLimits)
    raft_bind_host: Optional[str] = None    # listen for raft here (default: every interface)
    raft_join: bool = False   # joins a running quorum (kraftlog quorum add-controller): no election before it is added
    raft_prevote: bool = False   # raft/prevote.py: a cut-off controller that rejoins forces no election
    security: SecurityConfig = field(default_factory=SecurityConfig)   # [security]: TLS of the HTTP API, ...

    def __post_init__(self):
        if isinstance(self.voters, str):
            self.voters = parse_voters(self.voters)
        scheme = self.security.scheme   # every controller of a quorum shares the [security] settings
        self.voters = {nid: dataclasses.replace(v, scheme=scheme) for nid, v in self.voters.items()}
        me = self.voters.get(self.node_id)
        if me is None:
            raise ValueError(f"node id {self.node_id} is not among the voters {sorted(self.voters)}")
        check_election_timeouts(self.raft_min_timeout_s, self.raft_max_timeout_s)
        if self.feed_records_per_response_max < 1 or self.feed_run_records_per_response_max < 1:
            raise ValueError("feed_records_per_response_max and feed_run_records_per_response_max must be >= 1")
        if self.http_host is None:
            self.http_host = me.host
        if self.http_port is None:
            self.http_port = me.http_port

    def raft_config(self):
        from raft.syncobj_log import RaftConfig

        return RaftConfig(
            node_id=self.node_id,
            voters={nid: v.raft_address for nid, v in self.voters.items()},
            data_dir=os.path.join(self.data_dir, "raft"),
            password=self.password,
            raft_min_timeout_s=self.raft_min_timeout_s,
            raft_max_timeout_s=self.raft_max_timeout_s,
            append_entries_period_s=self.append_entries_period_s,
            auto_tick_period_s=self.auto_tick_period_s,
            connection_retry_time_s=self.connection_retry_time_s,
            leader_fallback_timeout_s=self.leader_fallback_timeout_s,
            log_compaction_min_entries=self.raft_log_compaction_min_entries,
            log_compaction_min_time_s=self.raft_log_compaction_min_time_s,
            log_compaction_split=self.raft_log_compaction_split,
            propose_timeout_s=self.propose_timeout_ms / 1000,
            fsync_journal=self.raft_fsync_journal,
            bind_host=self.raft_bind_host,
            frame_max_bytes=self.raft_frame_max_bytes,
            join=self.raft_join,
            prevote=self.raft_prevote,
            election_backoff_max_s=self.raft_election_backoff_max_s,
        )


class ControllerServer:
    """Wires the replicated log, the state machine, the pure controller and aiohttp."""

    def __init__(self, config: ControllerConfig, state_machine: MetadataStateMachine, raft_log,
                 clock: Clock = SYSTEM_CLOCK, rng: Optional[random.Random] = None):
        self.config = config
        self.sm = state_machine
        self.log = raft_log
        self.clock = clock   # leases on its monotonic clock (local soft state); registrations stamped with its wall clock
        self.controller = QuorumController(config.settings, rng or random.Random())
        self._applied = asyncio.Event()
        self._activating: Optional[asyncio.Task] = None
        self._maintenance_task: Optional[asyncio.Task] = None
        self._was_active = False
        self._last_rebalance_ms = 0
        self._probing: set = set()
        self._bg: set = set()   # background probes (part B)
        self._probe_connected_ms: dict[int, int] = {}   # broker id -> when a probe last connected
        # set after a committed write while a split fencing has entries left to write
        # (controller.fence_pending): the maintenance loop writes the next one at once
        # instead of after its interval, so the fencing's entries go out back to back
        self._maintenance_kick = asyncio.Event()
        self.writes = 0
        # [security] authentication: brokers are User:broker-<id>, users come from the image
        self.authenticator = Authenticator(config.security, lambda: self.sm.image.security)
        # users, tokens, ACLs; bootstraps [security] bootstrap_users_file
        self.security = ControllerSecurityRoutes(self, config.security.bootstrap_users_file,
                                                 _json_body, _request_id)
        self.quorum = QuorumRoutes(self, _json_body)   # controller voters: add, remove, describe (quorum_routes.py)
        raft_log.add_listener(self._on_raft_event)

    # ------------------------------------------------------------------ state
    @property
    def image(self) -> MetadataImage:
        return self.sm.image

    @property
    def is_active(self) -> bool:
        img = self.sm.image
        return (self.log.is_leader and img.controller_id == self.config.node_id
                and img.controller_epoch == self.log.term)

    def leader_url(self, leader_id: Optional[int]) -> Optional[str]:
        v = self.config.voters.get(leader_id) if leader_id is not None else None
        return v.url if v is not None else None

    def _not_controller(self) -> KraftlogError:
        leader_id = self.log.leader_id
        if leader_id == self.config.node_id and not self.is_active:
            msg = "this controller was just elected and is not active yet; retry in a moment"
        else:
            msg = "this controller is not the active controller; send writes to leader_url"
        return KraftlogError(ErrorCode.NOT_CONTROLLER, msg, leader_id=leader_id, leader_url=self.leader_url(leader_id))

    def _require_active(self) -> None:
        if not self.is_active:
            raise self._not_controller()

    def _on_raft_event(self) -> None:
        # wake long polls and status waiters
        self._applied.set()
        self._applied = asyncio.Event()
        active = self.is_active
        if active and not self._was_active:
            self.controller.reset_sessions(self.sm.image, self.clock.monotonic_ms())
            log.info("node %s is the active controller (epoch %s)", self.config.node_id, self.log.term)
        self._was_active = active
        if (self.log.is_leader and not active and (self._activating is None or self._activating.done())):
            self._activating = asyncio.get_running_loop().create_task(self._become_active())

    async def _become_active(self) -> None:
        """Commit a LeaderChangeRecord for our term before acting as active controller."""
        while self.log.is_leader and not self.is_active:
            term = self.log.term
            if self.sm.image.controller_epoch >= term:
                await asyncio.sleep(0.01)
                continue
            entry = {"request_id": None, "controller_epoch": term,
                     "records": [record_to_dict(LeaderChangeRecord(self.config.node_id, term))]}
            try:
                await self.log.propose([entry], timeout_s=self.config.propose_timeout_ms / 1000)
            except (NotLeaderError, OutcomeUnknownError) as exc:
                log.info("leader change record not committed: %s", exc)
                await asyncio.sleep(0.02)
        self._on_raft_event_after_activation()

    def _on_raft_event_after_activation(self) -> None:
        if self.is_active and not self._was_active:
            self.controller.reset_sessions(self.sm.image, self.clock.monotonic_ms())
            self._was_active = True

    async def wait_applied(self, timeout_s: float) -> None:
        ev = self._applied
        try:
            await asyncio.wait_for(ev.wait(), timeout_s)
        except asyncio.TimeoutError:
            pass

    # ------------------------------------------------------------------ writes
    async def write(self, decide: Callable[[MetadataImage], list], request_id: Optional[str] = None,
                    attempts: int = 8, reason: "str | Callable[[list], str] | None" = None) -> dict:
        """Decide against the committed image and propose atomically; re-decide when the
        batch lost a race (conflict). Returns the state machine result, or {"noop": True}
        when there was nothing to write, or {"duplicate": True} for a replayed request id.
        Committed fencing, unfencing and ISR/leader changes are logged at INFO with `reason`
        (a string, or a function of the committed records)."""
        for _ in range(attempts):
            self._require_active()
            if request_id is not None and self.sm.seen_request(request_id):
                return {"ok": True, "duplicate": True}
            async with self._sm_locked():
                records, epoch, before, entry = self._decide_entry(decide, request_id)
            if not records:
                return {"ok": True, "noop": True}
            try:
                result = (await self.log.propose([entry], timeout_s=self.config.propose_timeout_ms / 1000))[0]
            except NotLeaderError:
                raise self._not_controller() from None
            except OutcomeUnknownError as exc:
                raise KraftlogError(
                    ErrorCode.REQUEST_TIMED_OUT,
                    f"the outcome of this write is unknown ({exc.reason}); retry with the same request_id",
                ) from None
            self.writes += 1
            if result.get("ok"):
                _log_decisions(records, before, reason(records) if callable(reason) else reason)
                if self.controller.fence_pending:
                    self._maintenance_kick.set()
                return result
            if result.get("stale_epoch"):
                raise self._not_controller()
            await asyncio.sleep(0)  # conflict: decide again on the newer image
        raise KraftlogError(ErrorCode.REQUEST_TIMED_OUT, "the write kept conflicting with concurrent changes; retry")

    @contextlib.asynccontextmanager
    async def _sm_locked(self):
        """Hold the state machine's lock for an await-free block, acquired without blocking
        the event loop: the loop looks every `SM_LOCK_POLL_S` whether the lock is free. The
        raft thread holds it for a whole apply (1-2 s for the 33,337-record fencing at
        100,000 partitions on a loaded host, issue 25); a blocking acquire on the loop
        stopped the whole controller for that long, so heartbeats, silence reports and every
        broker's feed poll timed out together and the survivors fetched the fencing 4-9 s
        after it committed. The block must not await: the lock is a thread's RLock, so
        another coroutine of this loop would enter it too."""
        lock = self.sm.lock
        while not lock.acquire(blocking=False):
            await asyncio.sleep(SM_LOCK_POLL_S)
        try:
            yield
        finally:
            lock.release()

    def _decide_entry(self, decide: Callable[[MetadataImage], list], request_id: Optional[str]) -> tuple:
        """(records, controller epoch, partitions before, raft entry) of `write`. With
        full collections held (FullCollectionHold) unless the state machine never touches
        the collector: a fencing at 100,000 partitions allocates 33,334 records and their
        plain data here, enough to trigger a full collection (about 150 ms of GIL on the
        failover's critical path); the entry is frozen out of later ones when it is large.
        Called under `_sm_locked`."""
        threshold = self.sm.gc_freeze_min_records
        hold = FullCollectionHold() if threshold else None
        if hold is not None:
            hold.hold()
        records: list = []
        try:
            records = decide(self.sm.image)
            epoch = self.sm.image.controller_epoch
            before = _partitions_before(self.sm.image, records)
            entry = {"request_id": request_id, "controller_epoch": epoch,
                     "records": entry_items(records)} if records else None
        finally:
            if hold is not None:
                hold.release(freeze=len(records) >= threshold)
        return records, epoch, before, entry

    # ------------------------------------------------------------------ maintenance
    async def maintenance_loop(self) -> None:
        interval = self.config.maintenance_interval_ms / 1000
        while True:
            try:   # the interval, or less when a split fencing has entries left (_maintenance_kick)
                await asyncio.wait_for(self._maintenance_kick.wait(), interval)
            except asyncio.TimeoutError:
                pass
            self._maintenance_kick.clear()
            if not self.is_active:
                continue
            try:
                await self.security.maintenance()   # users bootstrap, expired tokens
            except Exception as exc:   # retried next round
                log.info("security maintenance failed: %s", exc)
            await self.maintenance_once()

    async def maintenance_once(self) -> None:
        """One round of the active controller's periodic work (controller.maintenance): fence
        an expired session, elect leaders, rebalance. The decision log states the lease the
        decision saw, not one a heartbeat renewed while the fencing was being committed."""
        now = self.clock.monotonic_ms()
        rebalance = now - self._last_rebalance_ms >= self.config.settings.leader_imbalance_check_interval_ms
        if rebalance:
            self._last_rebalance_ms = now
        async with self._sm_locked():
            self._probe_silent_brokers(now)
        seen: dict = {}

        def decide(img: MetadataImage) -> list:
            records = self.controller.maintenance(img, now, rebalance)
            seen.clear()
            seen.update(self.controller.sessions)   # the leases this decision was made on
            return records

        try:
            await self.write(decide, reason=lambda records: self._maintenance_reason(records, now, seen))
        except KraftlogError as exc:
            log.info("maintenance write failed: %s", exc)
        except Exception:
            log.exception("maintenance failed")

    def _probe_silent_brokers(self, now_ms: int) -> None:
        """Start a probe of every broker the core counts as silent (part B), one at a time
        each. Called under `_sm_locked` (it reads the image)."""
        for target in self.controller.silent_brokers(self.sm.image, now_ms):
            # a broker that just accepted a probe is probed again after a second at the earliest
            if target not in self._probing and now_ms - self._probe_connected_ms.get(target, -10**12) >= 1000:
                self._probing.add(target)
                t = asyncio.get_running_loop().create_task(self._probe_and_fence_silent(target))
                self._bg.add(t)
                t.add_done_callback(self._bg.discard)

    async def _probe_and_fence_silent(self, target: int) -> None:
        """Probe a broker reported silent; fence it when the probe does not connect (timed out:
        the host is cut off; refused: its process is gone) and the core still counts it silent."""
        try:
            b = self.sm.image.brokers.get(target)
            if b is None or b.fenced:
                return
            epoch, url = b.epoch, b.url
            timeout_ms = self.config.broker_silence_probe_timeout_ms
            answer_ms = self.config.broker_silence_probe_answer_timeout_ms
            outcome = await asyncio.to_thread(_probe_broker_attempts, url, timeout_ms / 1000, answer_ms / 1000,
                                              self.config.broker_silence_probe_answer_attempts)
            if outcome == "connected":
                self._probe_connected_ms[target] = self.clock.monotonic_ms()
                log.info("broker %s was reported silent but %s accepts connections: not fenced (%s)", target, url,
                         self.controller.silence_reason(target, self.clock.monotonic_ms()))
                return
            if not self.is_active:
                return
            now = self.clock.monotonic_ms()
            why = f"{self.controller.silence_reason(target, now)}; the probe of {url}: " + {
                "timeout": f"no connection within {timeout_ms} ms",
                "refused": "connection refused",
                "no-answer": (f"connected, but no answer to GET /healthz within {answer_ms} ms, "
                              f"{self.config.broker_silence_probe_answer_attempts} time(s) in a row"),
                "closed": "connected, but closed without an answer"}[outcome]
            await self.write(lambda img: self.controller.fence_silent(img, target, epoch, now), reason=why)
        except KraftlogError as exc:
            log.info("fencing silent broker %s failed: %s", target, exc)
        except Exception:
            log.exception("probing silent broker %s failed", target)
        finally:
            self._probing.discard(target)

    def _maintenance_reason(self, records: list, now_ms: int, sessions: dict) -> str:
        """Why the maintenance loop wrote `records` (for the INFO log of fencing decisions).
        `sessions`: the leases the decision saw."""
        fenced = [r.broker_id for r in records if isinstance(r, FenceBrokerRecord)]
        if fenced:
            last = sessions.get(fenced[0])
            silent = f"{now_ms - last} ms" if last is not None else "too long"
            return (f"session expired: no heartbeat from broker {fenced[0]} for {silent} "
                    f"(broker_session_timeout_ms={self.config.settings.broker_session_timeout_ms})")
        return "maintenance: leader election for leaderless partitions or preferred leaders"

    # ------------------------------------------------------------------ app
    async def authorize(self, request: web.Request, principal: str) -> None:
        await authorize_controller_request(self.config.security, request, principal)

    def build_app(self) -> web.Application:
        auth = AuthMiddleware(self.authenticator, self.authorize, open_paths=("/healthz", PREFIX + "/healthz"))
        app = web.Application(middlewares=[auth, _ERRORS], client_max_size=16 * 1024 * 1024)
        r = app.router
        r.add_get("/healthz", self.h_healthz)
        r.add_get(PREFIX + "/healthz", self.h_healthz)
        r.add_get(PREFIX + "/status", self.h_status)
        r.add_get(PREFIX + "/metadata", self.h_metadata)
        r.add_get(PREFIX + "/metadata/records", self.h_metadata_records)
        r.add_post(PREFIX + "/brokers/register", self.h_register)
        r.add_post(PREFIX + "/brokers/heartbeat", self.h_heartbeat)
        r.add_post(PREFIX + "/brokers/controlled-shutdown", self.h_controlled_shutdown)
        r.add_post(PREFIX + "/brokers/unreachable", self.h_broker_unreachable)
        r.add_post(PREFIX + "/brokers/alive", self.h_broker_alive)
        r.add_post(PREFIX + "/alter-partition", self.h_alter_partition)
        r.add_post(PREFIX + "/alter-partitions", self.h_alter_partitions)
        r.add_post(PREFIX + "/topics", self.h_create_topic)
        r.add_delete(PREFIX + "/topics/{topic}", self.h_delete_topic)
        r.add_post(PREFIX + "/topics/{topic}/partitions", self.h_create_partitions)
        r.add_post(PREFIX + "/topics/{topic}/configs", self.h_alter_configs)
        r.add_post(PREFIX + "/producer-ids", self.h_producer_ids)
        r.add_post(PREFIX + "/elect-leaders", self.h_elect_leaders)
        # reassignment (KIP-455) and decommission (metadata_quorum/reassignment.py)
        r.add_post(PREFIX + "/reassignments", self.h_reassign)
        r.add_get(PREFIX + "/reassignments", self.h_list_reassignments)
        r.add_delete(PREFIX + "/reassignments", self.h_cancel_reassignments)
        r.add_get(PREFIX + "/brokers", self.h_brokers)
        r.add_post(PREFIX + "/brokers/{broker_id}/decommission", self.h_decommission)
        r.add_post(PREFIX + "/brokers/{broker_id}/recommission", self.h_recommission)
        self.security.install(r, PREFIX)   # /security/users, /tokens, /acls (controller_security.py)
        self.quorum.install(app, PREFIX)   # /quorum, /quorum/voters (quorum_routes.py)
        return app

    async def h_healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "node_id": self.config.node_id})

    async def h_status(self, request: web.Request) -> web.Response:
        leader_id = self.log.leader_id
        img = self.sm.image
        return web.json_response({
            "node_id": self.config.node_id,
            "is_active": self.is_active,
            "is_leader": self.log.is_leader,
            "term": self.log.term,
            "leader_id": leader_id,
            "leader_url": self.leader_url(leader_id),
            "controller_id": img.controller_id,
            "controller_epoch": img.controller_epoch,
            "metadata_offset": img.offset,
            "ready": self.log.ready,
            "cluster_id": img.cluster_id,
            **self.log.peer_stats.as_dict(),   # raft frames refused (raft/frame_guard.py)
        })

    async def h_metadata(self, request: web.Request) -> web.Response:
        if request.query.get("require_active", "false").lower() in ("1", "true"):
            self._require_active()
        async with self._sm_locked():
            body = self.sm.image.to_metadata_json()
            body["metadata_offset"] = self.sm.image.offset
            body["controller_epoch"] = self.sm.image.controller_epoch
        return web.json_response(body)

    async def h_metadata_records(self, request: web.Request) -> web.Response:
        after = _query_int(request, "after", 0)
        max_wait_ms = min(_query_int(request, "max_wait_ms", 0), self.config.long_poll_max_wait_ms)
        runs = request.query.get("runs") == "1"   # the reader takes partition records in runs (records_of_run)
        page_max = self.config.feed_run_records_per_response_max if runs else self.config.feed_records_per_response_max
        max_records = min(_query_int(request, "max_records", page_max), page_max)
        if after < 0 or max_records < 1:
            raise KraftlogError(ErrorCode.INVALID_REQUEST, "after must be >= 0 and max_records >= 1")
        reader = _query_int(request, "broker_id", -1)
        if reader >= 0:   # a broker's feed: it has every record before `after`
            self.controller.note_metadata_offset(reader, after)
        deadline = time.monotonic() + max_wait_ms / 1000
        while True:
            if after < self.sm.feed_end:
                # the feed's own lock, not the state machine's: a page never waits for an
                # apply in progress (MetadataStateMachine.feed_page)
                page = self.sm.feed_page(after, max_records, runs=runs,
                                         singles_max=self.config.feed_records_per_response_max)
                if page is None:
                    return self._snapshot_response()
                records, metadata_offset, ends = page   # metadata_offset ends the records or lies beyond
                return web.Response(text=feed_page_text(self.sm.image.cluster_id, records, metadata_offset, ends),
                                    content_type="application/json")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            await self.wait_applied(remaining)
        if after > self.sm.feed_end and self.is_active:
            # the caller is ahead of the authoritative log (e.g. unsynced journal lost): resync it
            return self._snapshot_response()
        return web.json_response({"cluster_id": self.sm.image.cluster_id, "records": [],
                                  "metadata_offset": self.sm.feed_end})

    def _snapshot_response(self) -> web.Response:
        offset, snapshot = self.sm.snapshot_json()   # chunked encoding, cached per offset
        return web.Response(text=f'{{"cluster_id": {json.dumps(self.sm.image.cluster_id)}, "snapshot": {snapshot}, '
                                 f'"metadata_offset": {offset}}}', content_type="application/json")

    # ---- brokers
    async def h_register(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        broker_id = body.get("broker_id")
        now = self.clock.monotonic_ms()
        wall_ms = self.clock.now_ms()
        await self.write(lambda img: self.controller.register_broker(
            img, broker_id, body.get("incarnation_id"), body.get("url"), body.get("rack"), now, wall_ms,
            clean_shutdown=body.get("clean_shutdown", True), kafka_address=body.get("kafka_address")),
            reason=f"broker {broker_id} registered a new process (clean_shutdown="
                   f"{body.get('clean_shutdown', True)})")
        b = self.sm.image.brokers.get(broker_id)
        if b is None or b.incarnation_id != body.get("incarnation_id"):
            raise KraftlogError(ErrorCode.DUPLICATE_BROKER_REGISTRATION,
                                f"broker {broker_id} was re-registered concurrently by another incarnation; retry")
        async with self._sm_locked():
            state = self._broker_state(broker_id)
        return web.json_response(state)

    def _broker_state(self, broker_id: int) -> dict:
        """A broker's registration answer; called under `_sm_locked` (the raft thread may be applying)."""
        img = self.sm.image
        b = img.brokers.get(broker_id)
        if b is None:
            raise KraftlogError(ErrorCode.STALE_BROKER_EPOCH, f"broker {broker_id} is not registered; register it first")
        return {
            "broker_id": broker_id,
            "broker_epoch": b.epoch,
            "fenced": b.fenced,
            "in_controlled_shutdown": b.in_controlled_shutdown,
            "should_shutdown": QuorumController.should_shutdown(img, broker_id),
            "metadata_offset": img.offset,
            "controller_epoch": img.controller_epoch,
            "cluster_id": img.cluster_id,
            "heartbeat_interval_ms": self.config.settings.broker_heartbeat_interval_ms,
            "session_timeout_ms": self.config.settings.broker_session_timeout_ms,
        }

    async def h_heartbeat(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        broker_id = body.get("broker_id")
        now = self.clock.monotonic_ms()
        want_shutdown = bool(body.get("want_shutdown", False))
        await self.write(lambda img: self.controller.heartbeat(
            img, broker_id, body.get("broker_epoch"), body.get("metadata_offset", 0), now, want_shutdown,
            log_reports=body.get("log_reports")),
            reason=lambda records: _heartbeat_reason(records, broker_id, body.get("metadata_offset", 0)))
        async with self._sm_locked():
            state = self._broker_state(broker_id)
        return web.json_response(state)

    async def h_controlled_shutdown(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        broker_id = body.get("broker_id")
        now = self.clock.monotonic_ms()
        await self.write(lambda img: self.controller.heartbeat(
            img, broker_id, body.get("broker_epoch"), body.get("metadata_offset", 0), now, True),
            reason=f"controlled shutdown requested by broker {broker_id}")
        async with self._sm_locked():
            state = self._broker_state(broker_id)
        return web.json_response(state)

    async def h_broker_alive(self, request: web.Request) -> web.Response:
        """A broker's stall watchdog: its process is alive though its event loop is busy
        (`QuorumController.note_alive`). Read without the state machine's lock (one dict
        lookup), so a raft apply in progress does not hold the answer."""
        self._require_active()
        body = await _json_body(request)
        counted = self.controller.note_alive(self.sm.image, body.get("broker_id"), body.get("broker_epoch"),
                                             self.clock.monotonic_ms())
        return web.json_response({"counted": counted})

    async def h_broker_unreachable(self, request: web.Request) -> web.Response:
        """A broker reports that connections to `target_id` are refused (its process died:
        kill -9, crash). The controller probes the target's URL itself; only a refused
        connection (not a slow answer: a paused or busy broker keeps its lease) fences it
        at once, so failover does not wait for `broker_session_timeout_ms`."""
        self._require_active()
        body = await _json_body(request)
        reporter, target = body.get("broker_id"), body.get("target_id")
        if body.get("reason") == "silent":
            # part B: the target's fetches (or its answers) stopped; the core decides when
            # it counts, the probe confirms (also re-run by the maintenance loop)
            now = self.clock.monotonic_ms()
            async with self._sm_locked():
                counted = self.controller.report_silent(self.sm.image, reporter, body.get("broker_epoch"), target, now)
                if counted:
                    self._probe_silent_brokers(now)
            return web.json_response({"target_id": target, "fenced": False, "suspected": counted})
        img = self.sm.image
        r = img.brokers.get(reporter) if isinstance(reporter, int) else None
        if r is None or r.fenced or r.epoch != body.get("broker_epoch"):
            raise KraftlogError(ErrorCode.STALE_BROKER_EPOCH,
                                f"broker {reporter} with epoch {body.get('broker_epoch')} is not a live registered "
                                "broker; register first")
        b = img.brokers.get(target) if isinstance(target, int) else None
        if b is None or b.fenced:
            return web.json_response({"target_id": target, "fenced": b is not None and b.fenced})
        epoch = b.epoch
        if target in self._probing:
            return web.json_response({"target_id": target, "fenced": False, "probing": True})
        self._probing.add(target)
        try:
            gone = await connection_refused(b.url, self.config.unreachable_probe_timeout_ms / 1000)
        finally:
            self._probing.discard(target)
        if gone:
            log.warning("broker %s at %s refuses connections (reported by broker %s): fencing it", target,
                        b.url, reporter)
            await self.write(lambda img: self.controller.fence_unreachable(img, target, epoch),
                             reason=f"broker {reporter} reported it unreachable and the probe of {b.url} was refused")
        return web.json_response({"target_id": target, "fenced": gone})

    async def h_alter_partition(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        topic, partition = body.get("topic"), body.get("partition")
        await self.write(lambda img: self.controller.alter_partition(
            img, body.get("broker_id"), body.get("broker_epoch"), topic, partition,
            body.get("leader_epoch"), body.get("partition_epoch"), body.get("new_isr"),
            new_isr_broker_epochs=body.get("new_isr_broker_epochs")), _request_id(request, body),
            reason=f"AlterPartition from leader {body.get('broker_id')}")
        p = self.sm.image.partition(topic, partition)
        if p is None:
            raise KraftlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"partition {topic}-{partition} was deleted")
        out = p.to_json()
        out.update(topic=topic, partition_epoch=p.partition_epoch)
        return web.json_response(out)

    async def h_alter_partitions(self, request: web.Request) -> web.Response:
        """AlterPartition for many partitions of one leader in one write (issue 25):
        {"partitions": [{topic, partition, ...}]} -> {"partitions": [registration or error]}."""
        body = await _json_body(request)
        items = body.get("partitions")
        errors: dict = {}

        def decide(img):
            records, errs = self.controller.alter_partitions(img, body.get("broker_id"), body.get("broker_epoch"),
                                                             items)
            errors.clear()
            errors.update(errs)
            return records
        await self.write(decide, _request_id(request, body),
                         reason=f"AlterPartition from leader {body.get('broker_id')}")
        out = []
        for i, it in enumerate(items):
            topic, partition = it.get("topic"), it.get("partition")
            err = errors.get(i)
            p = self.sm.image.partition(topic, partition) if err is None else None
            if err is None and p is None:
                err = KraftlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"partition {topic}-{partition} was deleted")
            if err is not None:
                out.append({"topic": topic, "partition": partition, **err.to_body()})
                continue
            entry = p.to_json()
            entry.update(topic=topic, partition=partition, partition_epoch=p.partition_epoch)
            out.append(entry)
        return web.json_response({"partitions": out})

    # ---- topics
    async def h_create_topic(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        name = body.get("name")
        rid = _request_id(request, body)
        result = await self.write(lambda img: self.controller.create_topic(
            img, name, body.get("partitions"), body.get("replication_factor"), body.get("configs")), rid)
        async with self._sm_locked():
            topic = self.sm.image.topic_json(name, include_configs=True)
        if topic is None:  # duplicate of a create that was deleted since
            raise KraftlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} was deleted concurrently")
        topic["metadata_offset"] = result.get("offset", self.sm.image.offset)
        return web.json_response(topic, status=201)

    async def h_delete_topic(self, request: web.Request) -> web.Response:
        name = request.match_info["topic"]
        rid = _request_id(request, {})
        result = await self.write(lambda img: self.controller.delete_topic(img, name), rid)
        return web.json_response({"deleted": name, "metadata_offset": result.get("offset", self.sm.image.offset)})

    async def h_create_partitions(self, request: web.Request) -> web.Response:
        name = request.match_info["topic"]
        body = await _json_body(request)
        count = body.get("count")
        rid = _request_id(request, body)
        await self.write(lambda img: self.controller.create_partitions(img, name, count), rid)
        async with self._sm_locked():
            topic = self.sm.image.topic_json(name, include_configs=True)
        if topic is None:
            raise KraftlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} was deleted concurrently")
        return web.json_response(topic)

    async def h_alter_configs(self, request: web.Request) -> web.Response:
        name = request.match_info["topic"]
        body = await _json_body(request)
        rid = _request_id(request, body)
        await self.write(lambda img: self.controller.alter_configs(img, name, body.get("configs")), rid)
        async with self._sm_locked():
            t = self.sm.image.topic(name)
            configs = None if t is None else dict(t.configs)
        if configs is None:
            raise KraftlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist")
        return web.json_response({"name": name, "configs": configs})

    async def h_producer_ids(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        allocated: dict = {}

        def decide(img):
            records, first, size = self.controller.allocate_producer_ids(img, body.get("broker_id"), body.get("broker_epoch"))
            allocated.update(first_producer_id=first, size=size)
            return records

        await self.write(decide)
        return web.json_response(allocated)

    async def h_elect_leaders(self, request: web.Request) -> web.Response:
        body = await _json_body(request, allow_empty=True)
        parts = body.get("partitions")
        wanted = None
        if parts is not None:
            if not isinstance(parts, list) or not all(isinstance(p, dict) for p in parts):
                raise KraftlogError(ErrorCode.INVALID_REQUEST, 'partitions must be a list of {"topic", "partition"}')
            wanted = [(p.get("topic"), p.get("partition")) for p in parts]
        elected: list = []

        def decide(img):
            records = self.controller.elect_preferred_leaders(img, wanted)
            elected[:] = [{"topic": r.topic, "partition": r.partition, "leader": r.leader} for r in records]
            return records

        await self.write(decide, reason="elect-leaders request (preferred leader election)")
        return web.json_response({"elected": elected})


    # ---- reassignment and decommission
    async def _reassignments_json(self) -> dict:
        async with self._sm_locked():
            img = self.sm.image
            return {"reassignments": [reassignment_json(name, p) for name, p in img.reassignments()],
                    "metadata_offset": img.offset}

    async def h_reassign(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        result = await self.write(lambda img: self.controller.alter_partition_reassignments(img, body),
                                  _request_id(request, {}), reason="partition reassignment request")
        out = await self._reassignments_json()
        out["metadata_offset"] = result.get("offset", out["metadata_offset"])
        return web.json_response(out, status=202)

    async def h_list_reassignments(self, request: web.Request) -> web.Response:
        return web.json_response(await self._reassignments_json())

    async def h_cancel_reassignments(self, request: web.Request) -> web.Response:
        async with self._sm_locked():
            cancelled = [{"topic": name, "partition": p.partition} for name, p in self.sm.image.reassignments()]
        result = await self.write(lambda img: self.controller.cancel_reassignments(img),
                                  _request_id(request, {}), reason="reassignment cancel request")
        out = await self._reassignments_json()
        out.update(cancelled=cancelled, metadata_offset=result.get("offset", out["metadata_offset"]))
        return web.json_response(out)

    async def h_brokers(self, request: web.Request) -> web.Response:
        async with self._sm_locked():
            img = self.sm.image
            return web.json_response({"brokers": img.brokers_json(), "metadata_offset": img.offset})

    def _broker_id_param(self, request: web.Request) -> int:
        raw = request.match_info["broker_id"]
        try:
            return int(raw)
        except ValueError:
            raise KraftlogError(ErrorCode.INVALID_REQUEST, f"broker id must be an integer, got {raw!r}") from None

    async def h_decommission(self, request: web.Request) -> web.Response:
        broker_id = self._broker_id_param(request)
        result = await self.write(lambda img: self.controller.decommission_broker(img, broker_id),
                                  _request_id(request, {}), reason=f"decommission of broker {broker_id}")
        return await self._broker_answer(broker_id, result)

    async def h_recommission(self, request: web.Request) -> web.Response:
        broker_id = self._broker_id_param(request)
        result = await self.write(lambda img: self.controller.recommission_broker(img, broker_id),
                                  _request_id(request, {}), reason=f"recommission of broker {broker_id}")
        return await self._broker_answer(broker_id, result)

    async def _broker_answer(self, broker_id: int, result: dict) -> web.Response:
        async with self._sm_locked():
            img = self.sm.image
            entry = next((b for b in img.brokers_json() if b["id"] == broker_id), None)
            out = dict(entry or {"id": broker_id}, replicas=img.replica_count(broker_id),
                       metadata_offset=result.get("offset", img.offset))
        return web.json_response(out)


def reassignment_json(topic: str, p) -> dict:
    """One entry of `GET /v1/reassignments` (without `bytes_remaining`, which the leader knows)."""
    return {"topic": topic, "partition": p.partition, "replicas": list(p.replicas),
            "adding_replicas": list(p.adding_replicas), "removing_replicas": list(p.removing_replicas)}


def feed_page_text(cluster_id: str, records_json: list, metadata_offset: int,
                   batch_ends: Optional[list] = None) -> str:
    """The `GET /metadata/records` answer json.dumps would write for {"cluster_id", "records",
    "metadata_offset"[, "batch_ends"]}, from the records' JSON texts
    (`MetadataStateMachine.records_since_json`). `batch_ends`: the offsets after each entry
    that ends inside the page (a broker may publish up to any of them; feed.FeedState)."""
    ends = "" if batch_ends is None else f', "batch_ends": [{", ".join(str(int(e)) for e in batch_ends)}]'
    return (f'{{"cluster_id": {json.dumps(cluster_id)}, "records": [{", ".join(records_json)}], '
            f'"metadata_offset": {int(metadata_offset)}{ends}}}')


# ---------------------------------------------------------------------- decision log
def _partitions_before(image: MetadataImage, records: list) -> dict:
    """(topic, partition) -> (leader, isr, elr, replicas) before `records`, for the partitions they change."""
    out = {}
    for r in records:
        if isinstance(r, PartitionChangeRecord):
            p = image.partition(r.topic, r.partition)
            if p is not None:
                out[(r.topic, r.partition)] = (p.leader, tuple(p.isr), tuple(p.elr), tuple(p.replicas))
    return out


def _heartbeat_reason(records: list, broker_id: Any, metadata_offset: Any) -> str:
    if any(isinstance(r, FenceBrokerRecord) for r in records):
        return f"controlled shutdown of broker {broker_id}"
    if any(isinstance(r, UnfenceBrokerRecord) for r in records):
        return f"broker {broker_id} heartbeats and caught up with metadata (offset {metadata_offset})"
    return f"heartbeat of broker {broker_id}: log reports allow electing a leader"


def _log_decisions(records: list, before: dict, reason: Optional[str],
                   partition_lines_max: int = DECISION_LOG_PARTITION_LINES_MAX) -> None:
    """One INFO line per committed fence, unfence, registration and ISR/leader change, with
    the reason the controller decided it (issue 24: fencing must be readable from the log).
    Partition changes: the first `partition_lines_max` of a write, then one line counting
    the rest (a fencing at 100,000 partitions wrote 33,334 lines on the critical path)."""
    why = reason or "controller decision"
    partition_lines = 0
    more: dict = {}   # kind of change -> count, for the lines left out
    for r in records:
        if isinstance(r, PartitionChangeRecord) and partition_lines >= partition_lines_max:
            leader, isr, _elr, _replicas = before.get((r.topic, r.partition), (None, None, None, None))
            kind = (f"leader {leader} -> {r.leader}" if leader != r.leader
                    else "isr changed" if isr != tuple(r.isr) else "other")
            more[kind] = more.get(kind, 0) + 1
            continue
        if isinstance(r, FenceBrokerRecord):
            log.warning("fenced broker %s (epoch %s): %s", r.broker_id, r.broker_epoch, why)
        elif isinstance(r, UnfenceBrokerRecord):
            log.info("unfenced broker %s (epoch %s): %s", r.broker_id, r.broker_epoch, why)
        elif isinstance(r, RegisterBrokerRecord):
            log.info("registered broker %s (incarnation %s, fenced until it catches up): %s",
                     r.broker_id, r.incarnation_id, why)
        elif isinstance(r, BrokerRegistrationChangeRecord) and r.in_controlled_shutdown:
            log.info("broker %s (epoch %s) is in controlled shutdown: %s", r.broker_id, r.broker_epoch, why)
        elif isinstance(r, BrokerMembershipRecord):
            log.info("broker %s is %s: %s", r.broker_id, r.state, why)
        elif isinstance(r, PartitionChangeRecord):
            leader, isr, elr, replicas = before.get((r.topic, r.partition), (None, None, None, None))
            parts = []
            if replicas is not None and replicas != tuple(r.replicas):
                moving = (f" (adding {list(r.adding_replicas)}, removing {list(r.removing_replicas)})"
                          if r.adding_replicas or r.removing_replicas else " (no move running)")
                parts.append(f"replicas {list(replicas)} -> {list(r.replicas)}{moving}")
            if leader != r.leader:
                parts.append(f"leader {leader} -> {r.leader} (leader epoch {r.leader_epoch})")
            if isr != tuple(r.isr):
                parts.append(f"isr {list(isr) if isr is not None else '?'} -> {list(r.isr)}")
            if elr != tuple(r.elr):
                parts.append(f"elr {list(elr) if elr is not None else '?'} -> {list(r.elr)}")
            if parts:
                partition_lines += 1
                log.info("%s-%s: %s: %s", r.topic, r.partition, ", ".join(parts), why)
    if more:
        log.info("... and %d more partition changes in the same write (%s): %s", sum(more.values()),
                 ", ".join(f"{k}: {n}" for k, n in sorted(more.items(), key=lambda kv: (-kv[1], kv[0]))), why)


# ---------------------------------------------------------------------- helpers
def _probe_broker(url: Optional[str], connect_timeout_s: float, answer_timeout_s: float) -> str:
    """Probe a broker from this host, blocking (run it in a thread: the kernel times it, so a
    busy event loop cannot turn into a timeout). "timeout" (no TCP connection: the host is cut
    off), "refused" (nothing listens), "no-answer" / "closed" (connected, but no HTTP answer
    to GET /healthz within `answer_timeout_s`: stopped process, or a proxy accepting for a
    dead one), else "connected" (any answer, 503 included). https: the connect only."""
    import socket
    from urllib.parse import urlsplit
    if not url:
        return "connected"
    u = urlsplit(url)
    try:
        sock = socket.create_connection((u.hostname, u.port or 80), timeout=connect_timeout_s)
    except ConnectionRefusedError:
        return "refused"
    except OSError:   # socket.timeout, unreachable
        return "timeout"
    with sock:
        if u.scheme == "https":
            return "connected"
        try:
            sock.settimeout(answer_timeout_s)
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n")
            return "connected" if sock.recv(16) else "closed"
        except socket.timeout:
            return "no-answer"
        except OSError:
            return "closed"


def _probe_broker_attempts(url: Optional[str], connect_timeout_s: float, answer_timeout_s: float,
                           attempts: int) -> str:
    """`_probe_broker`, tried again (up to `attempts` in all) while it says "no-answer": a
    busy process answers a later probe, a stopped one none of them."""
    outcome = _probe_broker(url, connect_timeout_s, answer_timeout_s)
    for _ in range(max(1, attempts) - 1):
        if outcome != "no-answer":
            break
        outcome = _probe_broker(url, connect_timeout_s, answer_timeout_s)
    return outcome


# error answers as json_response gave them (charset=utf-8); never crash on a request
_ERRORS = ErrorMiddleware(log, unexpected_log="controller request failed", charset="utf-8")

# routes a broker calls for itself: the body's broker_id must be the authenticated broker
BROKER_SELF_ROUTES = frozenset(PREFIX + p for p in ("/brokers/register", "/brokers/heartbeat",
                                                    "/brokers/controlled-shutdown", "/brokers/unreachable",
                                                    "/brokers/alive",
                                                    "/alter-partition", "/producer-ids"))


async def authorize_controller_request(security, request: web.Request, principal: str) -> None:
    """With [security] authentication on, the controller API is for cluster principals only:
    brokers (`User:broker-<id>`) and super users; a broker's own routes (registration,
    heartbeats, AlterPartition, ...) only for the broker the body names, so a forged
    registration cannot replace a real broker. 403 CLUSTER_AUTHORIZATION_FAILED otherwise."""
    if not security.secured:
        return None
    me = broker_id_of(principal)
    if request.path in BROKER_SELF_ROUTES:
        try:
            claimed = json.loads(await request.read()).get("broker_id")
        except (ValueError, UnicodeDecodeError, AttributeError):
            return None    # the handler answers the bad body
        if me is None or claimed != me:
            raise KraftlogError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                                f"{principal} may not act as broker {claimed!r}: a broker registers, heartbeats and "
                                f"reports only as itself (authenticate as User:broker-{claimed})")
        return None
    if me is None and principal not in security.super_users:
        raise KraftlogError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                            f"{principal} may not use the controller API: it is for brokers and super users; "
                            "clients use a broker's /v1 API")
    return None


async def _json_body(request: web.Request, allow_empty: bool = False) -> dict:
    raw = await request.read()
    if not raw and allow_empty:
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise KraftlogError(ErrorCode.INVALID_REQUEST, "the body must be a JSON object") from None
    if not isinstance(body, dict):
        raise KraftlogError(ErrorCode.INVALID_REQUEST, "the body must be a JSON object")
    return body


def _query_int(request: web.Request, name: str, default: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise KraftlogError(ErrorCode.INVALID_REQUEST, f"query parameter {name} must be an integer, got {raw!r}") from None


def _request_id(request: web.Request, body: dict) -> Optional[str]:
    rid = body.get("request_id") or request.headers.get("X-Request-Id") or request.query.get("request_id")
    if rid is not None and (not isinstance(rid, str) or len(rid) > 200):
        raise KraftlogError(ErrorCode.INVALID_REQUEST, "request_id must be a string of at most 200 characters")
    return rid


# ---------------------------------------------------------------------- process
async def run_controller_async(config: ControllerConfig, started: Optional[asyncio.Event] = None,
                               stop: Optional[asyncio.Event] = None) -> None:
    """Run a controller inside the running loop (main thread) until `stop` is set or cancelled."""
    from raft.syncobj_log import SyncObjReplicatedLog

    os.makedirs(config.data_dir, exist_ok=True)
    sm = MetadataStateMachine(config.cluster_id, gc_freeze_min_records=config.gc_freeze_min_records)
    raft_log = SyncObjReplicatedLog(config.raft_config(), sm, loop=asyncio.get_running_loop())
    server = ControllerServer(config, sm, raft_log)
    raft_log.start()
    runner = HardenedAppRunner(server.build_app(), config.http_limits, log)
    await runner.setup()
    from http_api.wire.tls import ReloadingServerContext, TcpSite
    tls = ReloadingServerContext.from_security(config.security, name="controller")   # SIGHUP / file change
    say_unauthenticated(config.security, f"controller {config.node_id}", log)
    # a TLS handshake gets the request head's deadline (slowloris before the first byte of HTTP)
    site = TcpSite(runner, config.http_host, config.http_port, reuse_address=True,
                   ssl_context=tls.context if tls is not None else None,
                   handshake_timeout_ms=config.http_limits.request_header_timeout_ms)
    await site.start()
    if tls is not None:
        tls.start()
    maintenance = asyncio.create_task(server.maintenance_loop())
    log.info("controller %s listening on %s://%s:%s (raft %s)", config.node_id, config.security.scheme,
             config.http_host, config.http_port, config.voters[config.node_id].raft_address)
    if started is not None:
        started.set()
    try:
        if stop is None:
            await asyncio.Event().wait()
        else:
            await stop.wait()
    finally:
        maintenance.cancel()
        if tls is not None:
            tls.stop()
        await runner.cleanup()
        raft_log.stop()


def run_controller(config: ControllerConfig) -> None:
    """Blocking entry point: run until SIGINT/SIGTERM. Call on the process's main thread."""

    async def _main():
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, stop.set)
            except (NotImplementedError, RuntimeError):
                pass
        await run_controller_async(config, stop=stop)

    asyncio.run(_main())


def build_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m metadata_quorum.controller_server",
                                description="Run one controller (metadata quorum voter + controller API).")
    p.add_argument("--node-id", type=int, required=True)
    p.add_argument("--data-dir", required=True)
    p.add_argument("--http-host", default=None)
    p.add_argument("--http-port", type=int, default=None)
    p.add_argument("--raft-port", type=int, default=None, help="must match this node's entry in --voters")
    p.add_argument("--voters", default=None, help='"ID@HOST:RAFT_PORT:HTTP_PORT,..." (default: this node alone)')
    p.add_argument("--raft-bind-host", default=None,
                   help="interface the raft port listens on (default: all); the --voters entry stays the "
                        "address others dial, e.g. behind NAT or a proxy")
    p.add_argument("--password", default=os.environ.get("KRAFTLOG_RAFT_PASSWORD"))
    p.add_argument("--cluster-id", default="kraftlog-cluster")
    p.add_argument("--broker-session-timeout-ms", type=int, default=9000)
    p.add_argument("--broker-heartbeat-interval-ms", type=int, default=2000)
    p.add_argument("--leader-imbalance-check-interval-ms", type=int, default=30_000)
    p.add_argument("--broker-silence-fence-ms", type=int, default=ControllerSettings.broker_silence_fence_ms,
                   help="fence a broker reported silent after this long without its heartbeat; 0 = off")
    p.add_argument("--broker-silence-report-max-age-ms", type=int,
                   default=ControllerSettings.broker_silence_report_max_age_ms)
    p.add_argument("--fence-isr-removals-wait-max-ms", type=int,
                   default=ControllerSettings.fence_isr_removals_wait_max_ms,
                   help="a large fencing's ISR-only removals wait at most this long for the other brokers "
                        "to have its leader changes; 0 = write them at once")
    p.add_argument("--feed-records-per-response-max", type=int, default=ControllerConfig.feed_records_per_response_max,
                   help="records per metadata feed answer (outside runs)")
    p.add_argument("--feed-run-records-per-response-max", type=int,
                   default=ControllerConfig.feed_run_records_per_response_max,
                   help="records per metadata feed answer to a reader of runs (brokers)")
    p.add_argument("--min-insync-replicas", type=int, default=1,
                   help="default min.insync.replicas of topics; give the brokers' min_insync_replicas")
    p.add_argument("--raft-log-compaction-min-entries", type=int, default=5000,
                   help="snapshot (pysyncobj full dump) and truncate the raft journal after this many entries")
    p.add_argument("--raft-log-compaction-min-time-s", type=float, default=ControllerConfig.raft_log_compaction_min_time_s,
                   help="... or after this many seconds; with the split on, each voter compacts only in its own "
                        "window of this period")
    p.add_argument("--no-raft-log-compaction-split", action="store_true",
                   help="let every voter compact as soon as it is due (by default voters compact in turn: "
                        "three controllers on one host never fork their snapshot children at once)")
    p.add_argument("--no-raft-fsync", action="store_true",
                   help="do not sync the raft journal per entry (survives kill -9, not power loss)")
    p.add_argument("--security-json", default=None,
                   help="the node's [security] settings (SecurityConfig fields) as a JSON object")
    p.add_argument("--tls-cert-file", default=None, help="serve the controller API over TLS with this certificate")
    p.add_argument("--tls-key-file", default=None)
    p.add_argument("--tls-ca-file", default=None, help="CA that client certificates must chain to")
    p.add_argument("--tls-client-auth", default=None, choices=("none", "requested", "required"))
    p.add_argument("--raft-frame-max-bytes", type=int, default=RAFT_FRAME_MAX_BYTES_DEFAULT,
                   help="largest raft frame a peer may announce; a peer announcing more is dropped")
    p.add_argument("--http-limits-json", default=None,
                   help="HTTP edge limits (HttpLimits fields: request_header_timeout_ms, ...) as a JSON object")
    p.add_argument("--join", action="store_true",
                   help="join a running quorum: no election before the leader has added this node")
    p.add_argument("--raft-prevote", action="store_true",
                   help="pre-vote (raft/prevote.py): a node elects only once a majority would vote for it")
    p.add_argument("--raft-min-timeout-s", type=float, default=ControllerConfig.raft_min_timeout_s,
                   help="raft election timeout, drawn from [min, max] (pysyncobj raftMinTimeout)")
    p.add_argument("--raft-max-timeout-s", type=float, default=ControllerConfig.raft_max_timeout_s)
    p.add_argument("--raft-election-backoff-max-s", type=float, default=ELECTION_BACKOFF_MAX_S_DEFAULT,
                   help="the longest election timeout after elections that elected nobody (binary "
                        "exponential backoff from --raft-max-timeout-s; that value turns it off)")
    p.add_argument("--log-level", default="INFO")
    return p


def security_from_args(args: argparse.Namespace) -> SecurityConfig:
    """--security-json, then the --tls-* flags over it."""
    values = json.loads(args.security_json) if args.security_json else {}
    for name in ("tls_cert_file", "tls_key_file", "tls_ca_file", "tls_client_auth"):
        if getattr(args, name, None) is not None:
            values[name] = getattr(args, name)
    try:
        return SecurityConfig(**values)
    except (TypeError, ValueError) as e:
        raise SystemExit(f"controller [security] settings: {e}") from None


def config_from_args(args: argparse.Namespace) -> ControllerConfig:
    if args.voters:
        voters = parse_voters(args.voters)
    else:
        if args.raft_port is None or args.http_port is None:
            raise SystemExit("give --voters, or --raft-port and --http-port for a single-controller quorum")
        host = args.http_host or "127.0.0.1"
        voters = {args.node_id: Voter(args.node_id, host, args.raft_port, args.http_port)}
    me = voters.get(args.node_id)
    if me is None:
        raise SystemExit(f"--node-id {args.node_id} is not in --voters")
    if args.raft_port is not None and args.raft_port != me.raft_port:
        raise SystemExit(f"--raft-port {args.raft_port} does not match the --voters entry {me.raft_port}; fix one")
    if args.http_port is not None and args.http_port != me.http_port:
        raise SystemExit(f"--http-port {args.http_port} does not match the --voters entry {me.http_port} "
                         "(other controllers redirect clients there); fix one")
    return ControllerConfig(
        node_id=args.node_id,
        data_dir=args.data_dir,
        voters=voters,
        password=args.password,
        cluster_id=args.cluster_id,
        http_host=args.http_host,
        http_port=args.http_port,
        settings=ControllerSettings(
            broker_session_timeout_ms=args.broker_session_timeout_ms,
            broker_heartbeat_interval_ms=args.broker_heartbeat_interval_ms,
            leader_imbalance_check_interval_ms=args.leader_imbalance_check_interval_ms,
            broker_silence_fence_ms=args.broker_silence_fence_ms,
            broker_silence_report_max_age_ms=args.broker_silence_report_max_age_ms,
            fence_isr_removals_wait_max_ms=args.fence_isr_removals_wait_max_ms,
            min_insync_replicas=args.min_insync_replicas,
        ),
        feed_records_per_response_max=args.feed_records_per_response_max,
        feed_run_records_per_response_max=args.feed_run_records_per_response_max,
        raft_fsync_journal=not args.no_raft_fsync,
        raft_log_compaction_min_entries=args.raft_log_compaction_min_entries,
        raft_log_compaction_min_time_s=args.raft_log_compaction_min_time_s,
        raft_log_compaction_split=not args.no_raft_log_compaction_split,
        raft_bind_host=args.raft_bind_host,
        raft_frame_max_bytes=args.raft_frame_max_bytes,
        raft_join=args.join,
        raft_prevote=args.raft_prevote,
        raft_min_timeout_s=args.raft_min_timeout_s,
        raft_max_timeout_s=args.raft_max_timeout_s,
        raft_election_backoff_max_s=args.raft_election_backoff_max_s,
        http_limits=HttpLimits(**json.loads(args.http_limits_json)) if args.http_limits_json else HttpLimits(),
        security=security_from_args(args),
    )


def check_election_timeouts(min_s: float, max_s: float) -> None:
    """The raft election timeout range: ValueError saying what to set when pysyncobj would
    refuse it (with a bare AssertionError at startup)."""
    # pysyncobj: raftMinTimeout > 3 x appendEntriesPeriod (50 ms), raftMaxTimeout > raftMinTimeout
    if not min_s > 0.15:
        raise ValueError(f"raft_min_timeout_s={min_s} must be above 0.15 (three AppendEntries periods "
                         "of 50 ms); KRaft's election timeout is 1 s")
    if not max_s > min_s:
        raise ValueError(f"raft_max_timeout_s={max_s} must be above raft_min_timeout_s={min_s}: each election "
                         "timeout is drawn from [min, max] (e.g. --raft-min-timeout-s 1 --raft-max-timeout-s 2)")


def main(argv: Optional[list] = None) -> None:
    args = build_arg_parser().parse_args(argv)
    logging.basicConfig(level=getattr(logging, args.log_level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = config_from_args(args)
        run_controller(config)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None


if __name__ == "__main__":
    main()
