"""The broker process: storage + metadata follower + lifecycle + HTTP API.

    python -m http_api.broker.server --config-json '{"broker_id": 1, ...}'   (BrokerConfig fields)
    python -m http_api.broker.server --broker-id 1 --http-port 8082 --log-dir DIR --controller-url URL

Startup: open the LogManager (recovery, off the event loop), bind the HTTP port (healthz
answers 503 until ready), follow metadata from the controllers, register and heartbeat
(BrokerLifecycle), apply every metadata change to the ReplicaManager, run retention and
checkpoints periodically. SIGTERM/SIGINT: controlled shutdown (leaderships move away),
stop serving, close the logs (writes the clean-shutdown marker so the next start skips
recovery).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

import aiohttp
from aiohttp import web
import prometheus_client as prom

from http_api.broker.app import BrokerDeps, create_app
from http_api.broker.config import BrokerConfig
from http_api.broker.group_offsets import GroupOffsetStore
from http_api.broker.loop_lag import EventLoopLagMonitor
from http_api.broker.internal_auth import CLUSTER_SECRET_ENV, broker_cluster_secret, internal_token
from http_api.broker.metadata_view import MetadataView
from http_api.broker.producer_ids import ProducerIdAllocator
from http_api.broker.replica_client import ReplicaTransport
from http_api.wire.auth import broker_auth_headers, say_unauthenticated
from http_api.wire.hardening import HardenedAppRunner, HardeningCollector, HttpLimits
from http_api.wire.tls import ReloadingServerContext, TcpSite, TlsMetricsCollector, internal_client_context
from partitions.errors import ErrorCode, KraftlogError
from partitions.replication.loop_share import next_wait_s
from partitions.replication.replica_fetcher import ReplicaFetcherManager
from partitions.replication.replica_manager import ReplicaManager

log = logging.getLogger("kraftlog.broker")

CONTROLLED_SHUTDOWN_TIMEOUT_S = 10.0
# aiohttp waits this long (in two phases) for busy connections at stop; long polls and acks=all
# waits are answered by ReplicaManager.begin_shutdown first, so 1 s is plenty (5 s made a
# rolling restart stop take 10 s while followers kept their keep-alive fetch connections busy)
SHUTDOWN_HANDLERS_WAIT_S = 1.0
REGISTER_RETRY_BACKOFF_S = 0.5
METADATA_POLL_MAX_WAIT_MS = 2000
ISR_CHECK_INTERVAL_MS = 1000
ALTER_PARTITION_RETRY_MS = 5000   # ask again when an answered AlterPartition brings no metadata
ALTER_PARTITIONS_BATCH = 1000     # ISR changes per batched AlterPartition request (controller max: 2000)
# a metadata change of this many records or more (a large topic, a broker's fencing) is logged
# with how long the broker took to apply it (issue 25: the stages of a failover at scale)
METADATA_CHANGE_LOG_MIN_RECORDS = 1000


def alive_note_sender(active_url, broker_epoch, broker_id: int, headers: dict, ssl_context=None,
                      timeout_s: float = 1.0, controller_urls: tuple = ()):
    """The stall watchdog's `on_stall` (runs in its thread, blocking): `POST
    /controller/v1/brokers/alive` to the active controller with this broker's epoch
    (`QuorumController.note_alive`). `active_url` / `broker_epoch`: callables read at each
    note; nothing is sent before the broker registered. When the controller we think active
    does not take the note (no answer, or no longer active: the quorum changed leader while
    our loop was too busy to follow), the others in `controller_urls` are tried in turn: a new
    active controller has heard from nobody, and counts a broker reported silent as silent
    until it does (`QuorumController.silent_brokers`)."""
    import urllib.request

    from metadata_quorum.client import PREFIX
    handlers = [urllib.request.ProxyHandler({})]   # straight to the controller, never an environment proxy
    if ssl_context is not None:
        handlers.append(urllib.request.HTTPSHandler(context=ssl_context))
    opener = urllib.request.build_opener(*handlers)

    def send(stalled_ms: float) -> None:
        url, epoch = active_url(), broker_epoch()
        if epoch is None:
            return
        body = json.dumps({"broker_id": broker_id, "broker_epoch": epoch, "stalled_ms": int(stalled_ms)}).encode()
        urls = ([url.rstrip("/")] if url else []) + [u.rstrip("/") for u in controller_urls if u and u != url]
        failure: Exception | None = None
        for u in urls:
            req = urllib.request.Request(u + PREFIX + "/brokers/alive", data=body, method="POST",
                                         headers={**headers, "Content-Type": "application/json"})
            try:
                with opener.open(req, timeout=timeout_s) as resp:
                    resp.read()
                return
            except OSError as exc:   # HTTPError (not active), URLError, timeout: the next one
                failure = exc
        if failure is not None:
            raise failure
    return send


class Broker:
    """One broker's running parts; `start()` then `stop()`."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="broker-io")
        self.log_manager = None
        self.runner: Optional[web.AppRunner] = None
        self.kafka = None   # the Kafka listener (http_api/kafka/server.py) once bound
        self.tasks: list[asyncio.Task] = []
        self.lifecycle = None
        self.follower = None
        self.client = None
        self.ready = False
        self._reported: dict[int, float] = {}
        self._bg: set = set()
        self.tls = None
        self.http_session = None

    async def _blocking(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def start(self) -> None:
        from metadata_quorum.client import BrokerLifecycle, ControllerClient, MetadataFollower
        from metadata_quorum.heartbeat_thread import BrokerHeartbeatThread
        from metadata_quorum.state_machine import GC_FREEZE_MIN_RECORDS_DEFAULT
        from metadata_quorum.feed import change_of
        from partitions.log.config import LogConfig
        from partitions.log.log_manager import LogManager

        cfg = self.config
        for d in cfg.log_dirs:
            os.makedirs(d, exist_ok=True)
        os.makedirs(cfg.state_dir, exist_ok=True)
        self._lock_fd = _lock_dir(cfg.state_dir)
        t0 = time.monotonic()
        self.log_manager = LogManager(cfg.log_dirs, LogConfig())
        await self._blocking(self.log_manager.open_all)
        n = len(self.log_manager.partitions())
        log.info("broker %s opened %d logs in %.0f ms %s", cfg.broker_id, n, (time.monotonic() - t0) * 1000,
                 "after a clean shutdown (recovery skipped)" if self.log_manager.clean_shutdown or n == 0
                 else "after an unclean shutdown (recovered from the recovery points)")

        # a fresh incarnation per process: leaderships are served only once the metadata
        # holds this incarnation's registration (not the previous process's)
        self.lifecycle_incarnation = uuid.uuid4().hex
        self.rm = ReplicaManager(cfg.broker_id, self.log_manager, min_insync_replicas=cfg.min_insync_replicas,
                                 request_timeout_ms=cfg.request_timeout_ms,
                                 max_concurrent_long_polls=cfg.long_poll_max_requests, executor=self.executor,
                                 topic_ids_path=os.path.join(cfg.state_dir, "partition-topic-ids.json"),
                                 incarnation_id=self.lifecycle_incarnation,
                                 replica_fetch_silence_max_ms=cfg.replica_fetch_silence_max_ms or None)
        self.view = MetadataView(self.rm)
        # TLS ([security]): the listener's context reloads on SIGHUP / file change, and the
        # node's client certificate (replica fetches, controller, forwarding) rotates with it
        try:
            self.tls = ReloadingServerContext.from_security(cfg.security, name="broker")
        except ValueError as e:   # says which file is wrong
            raise SystemExit(str(e)) from None
        client_ssl = internal_client_context(cfg.security)
        if self.tls is not None and client_ssl is not None:
            self.tls.attach(client_ssl)
        # authentication ([security]): this broker is User:broker-<id> to controllers and brokers
        # (its certificate, or Basic with broker_password_file); the raft secret is not ours then
        say_unauthenticated(cfg.security, f"broker {cfg.broker_id}", log)
        auth_headers = broker_auth_headers(cfg.security, cfg.broker_id)
        self.replica_transport = ReplicaTransport(request_timeout_ms=cfg.request_timeout_ms,
                                                  internal_token=internal_token(cfg.cluster_secret),
                                                  ssl_context=client_ssl)
        self.replica_transport.headers.update(auth_headers)
        self.fetcher = ReplicaFetcherManager(
            self.rm, self.replica_transport, cfg.broker_id,
            broker_epoch=lambda: getattr(self.lifecycle, "broker_epoch", None) or -1,
            fetch_wait_max_ms=cfg.replica_fetch_wait_max_ms, backoff_ms=cfg.replica_fetch_backoff_ms,
            on_leader_unreachable=self._report_unreachable)
        self.view.add_listener(self.fetcher.sync)
        self.client = ControllerClient(cfg.controller_urls, request_timeout_ms=cfg.request_timeout_ms,
                                       try_timeout_ms=cfg.controller_request_timeout_ms,
                                       long_poll_margin_ms=cfg.controller_long_poll_margin_ms,
                                       retry_backoff_ms=cfg.controller_retry_backoff_ms,
                                       leader_check_after_ms=cfg.controller_leader_check_after_ms,
                                       ssl_context=client_ssl, headers=auth_headers)
        self.producer_ids = ProducerIdAllocator(self.client, cfg.broker_id,
                                                lambda: getattr(self.lifecycle, "broker_epoch", None))

        async def on_change(image, _changed=None):
            info = change_of(image)
            n = len(info.records) if info is not None and info.records is not None else 0
            t0 = time.monotonic()
            await self.view.update(image)
            if n >= METADATA_CHANGE_LOG_MIN_RECORDS:
                t1 = time.monotonic()
                published = self.view.published_at or t1
                log.info("metadata change of %d records (offsets %s-%d) applied in %.0f ms (%d held produces woken "
                         "during it, by leaderships taken up); the produces it woke went on within %.0f ms", n,
                         info.base_offset, image.offset, (published - t0) * 1000, self.view.woken_during_apply,
                         (t1 - published) * 1000)

        # short metadata long polls: a controller shutting down waits for open polls to end
        self.follower = MetadataFollower(self.client, on_change, max_wait_ms=METADATA_POLL_MAX_WAIT_MS,
                                         gc_freeze_min_records=GC_FREEZE_MIN_RECORDS_DEFAULT,
                                         broker_id=cfg.broker_id)
        self.lifecycle = BrokerLifecycle(self.client, cfg.broker_id, cfg.url, cfg.rack, self.follower)
        self.lifecycle.incarnation_id = self.lifecycle_incarnation
        self.lifecycle.clean_shutdown = self.log_manager.clean_shutdown
        self.lifecycle.log_reports_fn = self._log_reports
        from partitions.log.log_scheduler import LogScheduler
        self.log_scheduler = LogScheduler(
            self.log_manager, cleaner_enable=cfg.log_cleaner_enable, cleaner_threads=cfg.log_cleaner_threads,
            cleaner_backoff_ms=cfg.log_cleaner_backoff_ms, cleaner_process=cfg.log_cleaner_process,
            retention_check_interval_ms=cfg.log_retention_check_interval_ms,
            dedupe_buffer_size_bytes=cfg.log_cleaner_dedupe_buffer_size_bytes // max(1, cfg.log_cleaner_threads),
            io_max_bytes_per_second=cfg.log_cleaner_io_max_bytes_per_second / max(1, cfg.log_cleaner_threads))
        deps = BrokerDeps(replica_manager=self.rm, metadata=self.view, controller=self.client,
                          groups=GroupOffsetStore(os.path.join(cfg.state_dir, "group-offsets.json")),
                          health=self._health, producer_ids=self.producer_ids.next,
                          log_scheduler=self.log_scheduler)
        if client_ssl is not None:   # forwarding and group listings to other brokers: https
            self.http_session = deps.http_session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=client_ssl), headers=auth_headers)
        if self.tls is not None:
            deps.registry.register(TlsMetricsCollector([self.tls]))
        # kraftlog_event_loop_lag_ms (issue 25); its watchdog thread tells the controller this
        # process is alive while the loop is busy (not fenced as stopped or cut off)
        self.loop_lag = EventLoopLagMonitor(on_stall=alive_note_sender(
            lambda: self.client.active_url, lambda: getattr(self.lifecycle, "broker_epoch", None),
            cfg.broker_id, auth_headers, client_ssl, controller_urls=tuple(self.client.controller_urls)))
        prom.Gauge("kraftlog_event_loop_lag_ms", "Longest event-loop stall of the last 10-20 s (ms)",
                   registry=deps.registry).set_function(self.loop_lag.lag_ms)
        self.tasks.append(asyncio.create_task(self.loop_lag.run(), name="event-loop-lag"))
        app = create_app(cfg, deps)
        # handler_cancellation: a long poll whose client went away stops waiting (frees its slot)
        # hardened edge: head/body deadlines, connection caps, rate-limited rejection log
        self.runner = HardenedAppRunner(app, HttpLimits.from_settings(cfg), log, handler_cancellation=True,
                                        shutdown_timeout=SHUTDOWN_HANDLERS_WAIT_S)
        deps.registry.register(HardeningCollector(self.runner.guard))   # kraftlog_http_edge_*
        await self.runner.setup()
        # a TLS handshake gets the request head's deadline (slowloris before the first byte of HTTP)
        site = TcpSite(self.runner, cfg.http_host, cfg.http_port, reuse_address=True, backlog=1024,
                       ssl_context=self.tls.context if self.tls is not None else None,
                       handshake_timeout_ms=cfg.request_header_timeout_ms)
        await site.start()
        if self.tls is not None:
            self.tls.start()
        log.info("broker %s listening on %s", cfg.broker_id, cfg.url)
        self.kafka = await self._start_kafka(app) if cfg.kafka_port else None
        self.tasks.append(asyncio.create_task(self.follower.run(), name="metadata-follower"))
        while True:
            try:
                await self.lifecycle.start(heartbeat_thread=BrokerHeartbeatThread(
                    self.lifecycle, loop_stall_max_ms=cfg.heartbeat_loop_stall_max_ms))
                break
            except Exception as e:  # controller not up yet: keep trying, say so
                log.warning("registering with the controllers %s failed (%s); retrying", cfg.controller_urls, e)
                await asyncio.sleep(REGISTER_RETRY_BACKOFF_S)
        self.log_scheduler.start()  # retention + log cleaner threads (partitions/log/log_scheduler.py)
        self.tasks.append(asyncio.create_task(self._periodic(cfg.offset_checkpoint_interval_ms,
                                                             self.log_manager.checkpoint), name="checkpoint"))
        self.tasks.append(asyncio.create_task(self._periodic(cfg.log_flush_scheduler_interval_ms,
                                                             self.log_manager.flush_needed), name="flush.ms"))
        self.tasks.append(asyncio.create_task(self._isr_loop(), name="isr"))
        # issue 24 part B: peers whose replication traffic stopped are reported to the controller
        from partitions.replication.silence_reporter import PeerSilenceReporter
        self.silence_reporter = PeerSilenceReporter(
            self.rm, self.fetcher, cfg.broker_id, self._report_silent, self._peer_is_live,
            replica_silence_report_ms=cfg.replica_silence_report_ms, isolation=self._isolation)
        self.tasks.append(asyncio.create_task(self.silence_reporter.run(), name="silence-reports"))
        self.tasks.append(asyncio.create_task(self._await_ready(), name="ready"))

    async def _start_kafka(self, app):
        """The Kafka listener (http_api/kafka/) over this app's context and group coordinator;
        its advertised host:port goes into this broker's registration. A port in use is
        logged and the broker serves HTTP only (its registration then has no Kafka address)."""
        from http_api.broker.app import BROKER_KEY
        from http_api.broker.groups import SERVICE_KEY
        from http_api.kafka.apis import KafkaApis
        from http_api.kafka.server import KafkaListener
        from http_api.kafka.server import unsecured_listener_refusal
        cfg = self.config
        refusal = unsecured_listener_refusal(cfg)
        if refusal is not None:
            log.warning("broker %s: %s", cfg.broker_id, refusal)
            return None
        lst = cfg.listeners
        address = ""
        from http_api.broker.transactions import SERVICE_KEY as TXN_SERVICE_KEY
        ctx = app[BROKER_KEY]
        apis = KafkaApis(ctx, app[SERVICE_KEY], broker_id=cfg.broker_id, kafka_address=lambda: address,
                         transactions=app.get(TXN_SERVICE_KEY),
                         sasl_authenticator=ctx.authenticator if cfg.security.authentication else None,
                         authorizer=ctx.authorizer if cfg.security.authentication else None)
        listener = KafkaListener(apis, lst.kafka_bind_host, cfg.kafka_port,
                                 request_max_bytes=cfg.kafka_request_max_bytes,
                                 connections_max_idle_ms=cfg.kafka_connections_max_idle_ms,
                                 connections_max=cfg.connections_max, connections_max_per_ip=cfg.connections_max_per_ip,
                                 ssl_context=self.tls.context if self.tls is not None else None)
        try:
            await listener.start()
        except OSError as e:
            log.error("broker %s: Kafka listener not started, cannot bind %s:%s (%s); serving HTTP only. "
                      "Free the port or set kafka_port (0 turns the listener off)", cfg.broker_id,
                      lst.kafka_bind_host, cfg.kafka_port, e)
            return None
        address = f"{lst.kafka_host_advertised}:{listener.bound_port}"
        apis.start()
        self.lifecycle.kafka_address = address
        log.info("broker %s Kafka listener on %s", cfg.broker_id, address)
        return listener

    def _health(self) -> tuple[bool, dict]:
        lc = self.lifecycle
        info = {"broker_id": self.config.broker_id,
                "broker_epoch": getattr(lc, "broker_epoch", None),
                "fenced": getattr(lc, "is_fenced", True),
                "metadata_offset": getattr(getattr(self.follower, "image", None), "offset", 0)}
        return self.ready, info

    async def _await_ready(self) -> None:
        # heartbeat as soon as our metadata covers our registration: the controller
        # unfences us then, instead of at the next periodic heartbeat
        try:
            epoch = self.lifecycle.broker_epoch
            if epoch is not None and self.lifecycle.is_fenced:
                await self.follower.wait_for_offset(epoch + 1, timeout=10)
                await self.lifecycle.heartbeat_once()
        except Exception as e:  # the periodic heartbeat will retry
            log.info("early heartbeat failed: %s", e)
        await self.lifecycle.wait_unfenced(timeout=3600)
        # unfenced = our metadata has caught up: logs it does not assign to us are stray
        try:
            await self.view.wait_until(lambda img: img.offset >= self.follower.image.offset, 5)
            stray = await self.rm.remove_stray_logs(self.view.image)
            if stray:
                log.info("removed %d stray logs: %s", len(stray), stray)
        except Exception:
            log.exception("removing stray logs failed")
        self.ready = True
        log.info("broker %s is ready (unfenced) at %s", self.config.broker_id, self.config.url)

    def _log_reports(self) -> list:
        """(last leader epoch, log end offset) of our logs of partitions awaiting unclean
        recovery that name this broker (the controller elects the longest; KIP-966)."""
        image = self.follower.image if self.follower is not None else None
        if image is None:
            return []
        me = self.config.broker_id
        out = []
        # awaiting recovery implies leaderless: the image's leaderless index, not a walk of
        # every partition on every heartbeat (1 s of the event loop at 30,000 partitions under load)
        for t, p in image.leaderless_partitions():
            if not p.awaiting_recovery or me not in p.last_known_elr:
                continue
            lg = self.log_manager.get(t.name, p.partition)
            part = self.rm.partitions.get((t.name, p.partition))
            if part is None or part.partition_epoch != p.partition_epoch:
                continue    # the replica manager has not applied this state yet
            out.append({"topic": t.name, "partition": p.partition, "partition_epoch": p.partition_epoch,
                        "last_epoch": lg.latest_epoch if lg is not None else -1,
                        "log_end_offset": lg.log_end_offset if lg is not None else 0})
        return out

    def _report_unreachable(self, leader_id: int) -> None:
        """A leader refuses our fetch connections: ask the controller to check and fence it
        (at most one report per leader per `replica_fetch_backoff_ms` * 5)."""
        now = time.monotonic()
        last = self._reported.get(leader_id, 0.0)
        epoch = getattr(self.lifecycle, "broker_epoch", None)
        if epoch is None or now - last < self.config.replica_fetch_backoff_ms * 5 / 1000:
            return
        self._reported[leader_id] = now

        async def report():
            try:
                res = await self.client.report_unreachable(self.config.broker_id, epoch, leader_id)
                log.info("reported broker %s unreachable: %s", leader_id, res)
            except Exception as e:  # the lease expiry fences it anyway
                log.info("reporting broker %s unreachable failed: %s", leader_id, e)
        t = asyncio.ensure_future(report())
        self._bg.add(t)
        t.add_done_callback(self._bg.discard)

    async def _report_silent(self, target_id: int, silent_ms: int) -> dict:
        epoch = getattr(self.lifecycle, "broker_epoch", None)
        if epoch is None or self.lifecycle.is_fenced:
            return {"skipped": "this broker is not registered and unfenced"}
        return await self.client.report_silent(self.config.broker_id, epoch, target_id, silent_ms,
                                               timeout_ms=self.config.replica_silence_report_ms * 2)

    def _isolation(self) -> tuple:
        """(ms since a heartbeat last succeeded or None, the leader lease: the session timeout
        minus one heartbeat interval) for the isolated-leader rule (issue 24 part D)."""
        lc = self.lifecycle
        lease = (lc.session_timeout_ms or 9000) - (lc.heartbeat_interval_ms or 2000)
        return lc.heartbeat_silence_ms(), lease

    def _peer_is_live(self, broker_id: int) -> bool:
        image = self.follower.image if self.follower is not None else None
        b = image.brokers.get(broker_id) if image is not None else None
        return b is not None and not b.fenced

    async def _isr_loop(self) -> None:
        """Leader side: shrink the ISR of lagging followers (and of silent ones while acks=all
        produces wait for them: `replica_fetch_silence_max_ms`), expand it with caught-up
        ones, through AlterPartition (the controller checks leader and partition epochs).

        One proposal per partition epoch is in flight; it is asked again when it failed
        without an answer (controller unreachable, failover, lost answer) or got no
        metadata within ALTER_PARTITION_RETRY_MS. Proposed additions count for the HW
        (Partition.propose_isr_change) until the metadata answers or the controller
        refuses for good (`isr_change_rejected`)."""
        pending: dict[tuple[str, int], tuple[int, float]] = {}   # key -> (partition epoch asked, when)
        # a follower silent for replica_fetch_silence_max_ms while acks=all waits must be out of
        # the ISR within about that time plus one check: look every fifth of it
        silence = self.config.replica_fetch_silence_max_ms
        took_s = 0.0
        while True:
            # Kafka checks every replica.lag.time.max.ms / 2 (topic configs may lower it)
            lag = min([self.config.replica_lag_time_max_ms] +
                      [self.rm.replica_lag_time_max_ms(t, self.config.replica_lag_time_max_ms)
                       for t in list(self.rm._topic_configs)])
            interval = min(ISR_CHECK_INTERVAL_MS, lag // 2, silence // 5 if silence > 0 else ISR_CHECK_INTERVAL_MS)
            # a check of thousands of partitions (a follower broker died) runs less often
            await asyncio.sleep(next_wait_s(max(50, interval) / 1000, took_s))
            epoch = self.lifecycle.broker_epoch if self.lifecycle is not None else None
            if epoch is None:
                continue
            due = []
            changes = await self.rm.isr_changes_sliced(self.config.replica_lag_time_max_ms)
            took_s = self.rm.isr_check_busy_s
            for part, new_isr in changes:
                key = (part.topic, part.partition)
                asked = pending.get(key)
                now = time.monotonic()
                if asked is not None and asked[0] == part.partition_epoch \
                        and now - asked[1] < ALTER_PARTITION_RETRY_MS / 1000:
                    continue  # asked for this partition epoch; wait for the metadata
                pending[key] = (part.partition_epoch, now)
                due.append((part, new_isr, part.partition_epoch))
            if len(due) == 1:
                await self._alter_isr(epoch, *due[0], pending)
            for i in range(0, len(due) if len(due) > 1 else 0, ALTER_PARTITIONS_BATCH):
                await self._alter_isrs(epoch, due[i:i + ALTER_PARTITIONS_BATCH], pending)

    async def _alter_isr(self, epoch: int, part, new_isr: list, asked_epoch: int, pending: dict) -> None:
        """One AlterPartition (see `_isr_loop`)."""
        key = (part.topic, part.partition)
        if not self.rm.shrink_still_due(part, new_isr, self.config.replica_lag_time_max_ms):
            pending.pop(key, None)   # the follower fetched meanwhile: judged again next check
            return
        try:
            await self.client.alter_partition(self.config.broker_id, epoch, part.topic, part.partition,
                                              part.leader_epoch, asked_epoch, new_isr,
                                              part.broker_epochs(new_isr))
            log.info("%s-%s: ISR %s -> %s", part.topic, part.partition, part.isr, new_isr)
        except KraftlogError as e:
            self._isr_refused(part, new_isr, asked_epoch, e, pending)
        except Exception as e:  # noqa: BLE001 - unknown outcome: keep the additions, ask again
            log.info("AlterPartition %s-%s -> %s failed: %s", part.topic, part.partition, new_isr, e)
            pending.pop(key, None)

    async def _alter_isrs(self, epoch: int, batch: list, pending: dict) -> None:
        """The ISR changes of many led partitions in one AlterPartition request (issue 25:
        after a broker failure a leader of thousands of partitions shrinks them all with one
        controller write, not one round trip each). Per partition as `_alter_isr`; a shrink
        whose followers fetched while earlier batches went out is left out (`shrink_still_due`)."""
        kept = []
        for part, new_isr, asked_epoch in batch:
            if self.rm.shrink_still_due(part, new_isr, self.config.replica_lag_time_max_ms):
                kept.append((part, new_isr, asked_epoch))
            else:
                pending.pop((part.topic, part.partition), None)
        withdrawn = len(batch) - len(kept)
        batch = kept
        if not batch:
            log.info("AlterPartition: %d ISR shrinks withdrawn (their followers fetched meanwhile)", withdrawn)
            return
        items = [{"topic": part.topic, "partition": part.partition, "leader_epoch": part.leader_epoch,
                  "partition_epoch": asked_epoch, "new_isr": list(new_isr),
                  "new_isr_broker_epochs": part.broker_epochs(new_isr)}
                 for part, new_isr, asked_epoch in batch]
        shrinks = [(part, [r for r in part.isr if r not in new_isr]) for part, new_isr, _ in batch
                   if any(r not in new_isr for r in part.isr)]
        # why: the first shrink's dropped member with the times the rules judged (before the answer)
        example = self.rm.describe_follower(shrinks[0][0], shrinks[0][1][0]) if shrinks else None
        try:
            answers = await self.client.alter_partitions(self.config.broker_id, epoch, items)
        except Exception as e:  # noqa: BLE001 - refused whole or unknown outcome: ask again next check
            log.info("AlterPartition of %d partitions failed: %s", len(batch), e)
            for part, _, _ in batch:
                pending.pop((part.topic, part.partition), None)
            return
        changed = 0
        refused: list = []
        for (part, new_isr, asked_epoch), answer in zip(batch, answers):
            err = KraftlogError.from_body(answer, ignore=("topic", "partition"))
            if err is None:
                changed += 1
                log.debug("%s-%s: ISR %s -> %s", part.topic, part.partition, part.isr, new_isr)
            else:
                # one summary line below, not one per partition (thousands after a failure)
                self._isr_refused(part, new_isr, asked_epoch, err, pending, level=logging.DEBUG)
                refused.append((part, new_isr, err))
        log.info("AlterPartition: ISR of %d partitions changed in one request (%d refused; %d shrinks, %d "
                 "expansions; %d shrinks withdrawn)%s", changed, len(batch) - changed, len(shrinks),
                 len(batch) - len(shrinks), withdrawn, f"; e.g. {example}" if example else "")
        if refused:
            part, new_isr, err = refused[0]
            log.info("AlterPartition refused for %d partitions, e.g. %s-%s -> %s: %s", len(refused),
                     part.topic, part.partition, new_isr, err)

    @staticmethod
    def _isr_refused(part, new_isr: list, asked_epoch: int, e: KraftlogError, pending: dict, *,
                     level: int = logging.INFO) -> None:
        log.log(level, "AlterPartition %s-%s -> %s failed: %s", part.topic, part.partition, new_isr, e)
        if e.code is ErrorCode.INELIGIBLE_REPLICA:
            # refused at this very partition epoch (checked before eligibility).
            # Not on INVALID_UPDATE_VERSION: an earlier try may have committed it
            part.isr_change_rejected(asked_epoch)
        if e.code is ErrorCode.INVALID_UPDATE_VERSION:
            # our partition epoch is behind the controller's: asking again before the metadata
            # brings the new one is refused again (Kafka waits for the metadata too). Keep the
            # mark: a new partition epoch asks at once, else ALTER_PARTITION_RETRY_MS does
            # (issue 25: thousands refused every check, 300 ms apart, while a create applied)
            return
        pending.pop((part.topic, part.partition), None)   # ask again at the next check

    async def _periodic(self, interval_ms: int, fn) -> None:
        while True:
            await asyncio.sleep(interval_ms / 1000)
            try:
                await self._blocking(fn)
            except Exception:
                log.exception("periodic %s failed", getattr(fn, "__name__", fn))

    async def stop(self) -> None:
        """Controlled shutdown, then close everything (clean-shutdown marker last)."""
        log.info("broker %s shutting down", self.config.broker_id)
        if self.lifecycle is not None and self.lifecycle.broker_epoch is not None:
            try:
                ok = await self.lifecycle.controlled_shutdown(CONTROLLED_SHUTDOWN_TIMEOUT_S)
                log.info("controlled shutdown %s", "completed" if ok else "timed out")
            except Exception as e:
                log.warning("controlled shutdown failed: %s", e)
        if self.lifecycle is not None:
            await self.lifecycle.stop()   # the heartbeat thread too, whatever the shutdown did
        if self.follower is not None:
            self.follower.stop()
        if getattr(self, "rm", None) is not None:
            self.rm.begin_shutdown()
        if getattr(self, "fetcher", None) is not None:
            await self.fetcher.close()
            await self.replica_transport.close()
        for t in self.tasks:
            t.cancel()
        for t in self.tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        if self.tls is not None:
            self.tls.stop()
        if self.kafka is not None:
            await self.kafka.stop()
            await self.kafka.apis.stop()
        if self.runner is not None:
            await self.runner.cleanup()
        if self.http_session is not None:
            await self.http_session.close()
        if self.client is not None:
            await self.client.close()
        if getattr(self, "log_scheduler", None) is not None:
            await self._blocking(self.log_scheduler.stop)
        if self.log_manager is not None:
            await self._blocking(self.log_manager.close)
        self.executor.shutdown(wait=True)
        log.info("broker %s stopped cleanly", self.config.broker_id)


def _lock_dir(path: str) -> int:
    """Hold an exclusive lock on <path>/.broker.lock: two brokers must never share logs."""
    import fcntl
    fd = os.open(os.path.join(path, ".broker.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise SystemExit(f"another broker is using {path}; stop it first or give this one its own data dir")
    return fd


async def run_broker_async(config: BrokerConfig, stop: Optional[asyncio.Event] = None) -> None:
    broker = Broker(config)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
    start = asyncio.create_task(broker.start())
    stopper = asyncio.create_task(stop.wait())
    await asyncio.wait({start, stopper}, return_when=asyncio.FIRST_COMPLETED)
    if start.done() and start.exception() is not None:
        stopper.cancel()
        await broker.stop()
        raise start.exception()
    if not start.done():
        start.cancel()
        try:
            await start
        except (asyncio.CancelledError, Exception):
            pass
    else:
        await stopper
    await broker.stop()


def run_broker(config: BrokerConfig) -> None:
    """Blocking entry point (uvloop when available) until SIGINT/SIGTERM."""
    from http_api.broker import malloc_tuning
    malloc_tuning.apply(config.malloc_mmap_threshold_bytes, config.malloc_trim_threshold_bytes)
    try:
        import uvloop
        uvloop.run(run_broker_async(config))
    except ImportError:
        asyncio.run(run_broker_async(config))


def build_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m http_api.broker.server", description="Run one kraftlog broker.")
    p.add_argument("--config-json", help="BrokerConfig fields as a JSON object")
    p.add_argument("--broker-id", type=int)
    p.add_argument("--http-host")
    p.add_argument("--http-port", type=int)
    p.add_argument("--log-dir", action="append", dest="log_dirs")
    p.add_argument("--state-dir")
    p.add_argument("--controller-url", action="append", dest="controller_urls")
    p.add_argument("--log-level", default="INFO")
    return p


def main(argv: Optional[list] = None) -> None:
    args = build_arg_parser().parse_args(argv)
    logging.basicConfig(level=getattr(logging, args.log_level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    values = json.loads(args.config_json) if args.config_json else {}
    for name in ("broker_id", "http_host", "http_port", "log_dirs", "state_dir", "controller_urls"):
        v = getattr(args, name)
        if v is not None:
            values[name] = v
    try:
        config = BrokerConfig.from_dict(values)  # flat or nested by group; old names warn
    except ValueError as e:
        raise SystemExit(str(e)) from None
    # the raft secret ($KRAFTLOG_RAFT_PASSWORD) guards /internal/ only without authentication
    if config.security.secured and (config.cluster_secret or os.environ.get(CLUSTER_SECRET_ENV)):
        log.warning("ignoring the cluster secret: with [security] authentication on, brokers are cluster "
                    "principals and the raft secret belongs to the controllers only; stop passing it")
    config.cluster_secret = broker_cluster_secret(config.security, config.cluster_secret)
    run_broker(config)


if __name__ == "__main__":
    main()
