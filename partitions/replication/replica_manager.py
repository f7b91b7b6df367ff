"""ReplicaManager: the broker's local partition replicas (the asyncio shell over `ReplicaState`).

Every replication decision (roles, the high watermark, follower progress, ISR proposals,
which acks=all waiters complete or fail) is made by the pure core
`partitions/replication/replica_state.py`; this shell owns what the core must not touch:

- apply metadata images: create the local log of every partition this broker replicates
  (in the executor), hand each partition's registration to the core, delete logs of
  removed topics;
- produce: append raw batches on the leader with acks 0/1/all; acks=all parks an asyncio
  future the core keeps as an opaque waiter and answers through `Effects` (committed,
  NOT_ENOUGH_REPLICAS_AFTER_APPEND, leadership moved) or a timeout;
- fetch: long polls park futures keyed by partition; the core's `Effects.wake_fetches`
  resolves them (no sleep loops);
- run blocking file work (log creation/deletion, flush, checkpoints) in an executor, never
  on the event loop. Appends themselves are page-cache writes made on the loop, like Kafka
  request handler threads do; fsync is left to the flush policy off the loop.

Invariants: a partition answers produce/fetch only while it is leader; the high watermark
exposed to consumers never goes backwards within a leader epoch (the core checks both
offset invariants after every mutation).
"""
from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import time
from dataclasses import dataclass
from typing import Callable

from metadata_quorum.feed import MetadataDelta, describe_records
from metadata_quorum.image import MetadataImage
from partitions.clock import SYSTEM_CLOCK, Clock
from partitions.errors import ErrorCode, KraftlogError
from partitions.log import errors as log_errors
from partitions.log.config import LogConfig
from partitions.log.protocols import LogDirectory, PartitionLog
from partitions.log.protocols import TopicPartition
from partitions.replication.fetch_session import (FETCH_SESSION_REFRESH_MS, NO_SESSION, SESSION_NOT_FOUND,
                                                   FetchSession, FetchSessionCache)
from partitions.replication.loop_share import LoopSlice
from partitions.replication.partition import Partition
from partitions.replication.replication_throttle import ReplicationThrottle
from partitions.replication.replica_state import (Effects, FetchResult, ReplicaFetchRequest, ReplicaState,
                                                  leader_and_isr)

log = logging.getLogger(__name__)

# applying metadata (issue 25): role changes between looks at the clock (the loop gets a
# turn every LoopSlice), logs per executor call, executor calls at once (their fsyncs overlap)
APPLY_CHUNK_PARTITIONS = 64
READ_CHUNK_PARTITIONS = 256   # partitions a replica fetch reads per turn of the event loop
SESSION_ADD_CHUNK_PARTITIONS = 512   # a full fetch's partitions added to its new session per clock read
ISR_CHECK_CHUNK_PARTITIONS = 512     # partitions the ISR check judges between two looks at the loop's slice
CREATE_BATCH_PARTITIONS = 512
CREATE_PARALLELISM = 3
# creating at least this many logs at once: no full (generation 2) garbage collection while
# they are made, then gc.freeze() moves them out of later full collections. A full
# collection walks every object (400,000 at 10,000 partitions): 0.3-0.8 s with the event
# loop held, again each time the heap grew by a quarter
GC_FREEZE_MIN_LOGS = 1000

ACKS_NONE = 0
ACKS_LEADER = 1
ACKS_ALL = -1


def parse_acks(value: str | int | None) -> int:
    """`0`, `1`, `all` / `-1` -> 0, 1, -1; anything else is 400 INVALID_REQUIRED_ACKS."""
    if value is None:
        return ACKS_ALL
    v = str(value).strip().lower()
    if v in ("all", "-1"):
        return ACKS_ALL
    if v == "0":
        return ACKS_NONE
    if v == "1":
        return ACKS_LEADER
    raise KraftlogError(ErrorCode.INVALID_REQUIRED_ACKS, f"acks={value!r} is not valid; use 0, 1 or all")


@dataclass
class AppendResult:
    """Where the appended batches landed."""

    first_offset: int
    last_offset: int
    log_append_time_ms: int
    log_start_offset: int
    duplicate: bool = False  # an idempotent retry: nothing appended, offsets -1 when unknown


class ReplicaManager:
    """The asyncio shell over the broker's `ReplicaState` (see the module docstring): it
    owns the futures, the event loop, the executor and the files; every replication
    decision is the core's, and the `Effects` it returns are carried out here."""

    def __init__(self, broker_id: int, log_manager: LogDirectory, *, min_insync_replicas: int = 1,
                 request_timeout_ms: int = 30_000, max_concurrent_long_polls: int = 1024,
                 default_log_config_factory: Callable[[dict], LogConfig | None] | None = None,
                 executor=None, clock: Clock = SYSTEM_CLOCK,
                 topic_ids_path: str | None = None, incarnation_id: str | None = None,
                 replica_fetch_silence_max_ms: int | None = None) -> None:
        self.broker_id = broker_id
        # a follower silent this long while acks=all produces wait for it leaves the ISR
        # (None: only replica.lag.time.max.ms applies)
        self.replica_fetch_silence_max_ms = replica_fetch_silence_max_ms
        self.log_manager = log_manager
        self.min_insync_replicas = min_insync_replicas
        self.request_timeout_ms = request_timeout_ms
        self.max_concurrent_long_polls = max_concurrent_long_polls
        self._config_factory = default_log_config_factory
        self._executor = executor
        self._clock_ms = clock.now_ms
        self.core = ReplicaState(broker_id, min_isr_for=self.min_isr_for)
        # reassignment copies (adding replicas outside the ISR) limited to the throttle in metadata
        self.throttle = ReplicationThrottle(broker_id)
        # callables (topic, partition, start_offset) run after a follower restarted empty
        self.follower_reset_listeners: list[Callable[[str, int, int], None]] = []
        # callables ([(topic, partition), ...]) run during a metadata apply when this broker
        # took up those leaderships, before the image is published (MetadataView wakes the
        # produces held for them: issue 25)
        self.leadership_listeners: list[Callable[[list], None]] = []
        self._monotonic_ms = clock.monotonic_ms
        # the core's maps (read-only here): (topic, partition) -> Partition / its log
        self.partitions: dict[TopicPartition, Partition] = self.core.partitions
        self.logs: dict[TopicPartition, PartitionLog] = self.core.logs
        self._topic_ids: dict[str, str] = {}
        self._topic_configs: dict[str, dict] = {}
        self._fetch_waiters: dict[tuple[str, int], list[asyncio.Future]] = {}
        # incremental replica fetch sessions (KIP-227) and the long poll parked on each
        self.fetch_sessions = FetchSessionCache()
        self.fetch_session_refresh_ms = FETCH_SESSION_REFRESH_MS
        self._session_waiters: dict[int, asyncio.Future] = {}
        self.restate_visits = 0   # partitions restated one by one (tests, benchmarks)
        self.isr_check_busy_s = 0.0   # the last ISR check's own time, without the loop's turns
        self._long_polls = 0
        self.replica_fetches_waiting = 0   # follower long polls parked here (metrics)
        self._closing = False
        # this process's registration; leaderships in metadata that does not contain it yet
        # belong to the previous incarnation (None: no such check, e.g. in-process tests)
        self.incarnation_id = incarnation_id
        self._flushing: dict[tuple[str, int], asyncio.Future] = {}
        self._image: MetadataImage | None = None
        self._metadata_lock = asyncio.Lock()
        # topic id of each local log ("topic-p" -> id), like Kafka's partition.metadata
        self._topic_ids_path = topic_ids_path
        self._log_topic_ids: dict[str, str] = _read_json(topic_ids_path) if topic_ids_path else {}

    # ---- helpers ------------------------------------------------------------------------

    async def _run_blocking(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _log_config(self, configs: dict) -> LogConfig | None:
        if self._config_factory is not None:
            return self._config_factory(configs)
        return LogConfig.from_topic_configs(configs)

    def topic_config(self, topic: str) -> dict:
        return self._topic_configs.get(topic, {})

    def min_isr_for(self, topic: str) -> int:
        raw = self._topic_configs.get(topic, {}).get("min.insync.replicas")
        try:
            return int(raw) if raw is not None else self.min_insync_replicas
        except ValueError:
            return self.min_insync_replicas

    @property
    def long_polls_waiting(self) -> int:
        return self._long_polls

    # ---- metadata ----------------------------------------------------------------------

    async def apply_metadata(self, image: MetadataImage, changed: list | None = None) -> None:
        """Make local replicas match `image`: create/delete logs, become leader/follower.
        `changed`: the records of the change that made `image` (issue 25): only the
        partitions and topics they touch are looked at (a change of this broker's own
        registration, or records that cannot be itemized, look at everything); None: the
        whole image."""
        async with self._metadata_lock:
            delta = None
            if changed is not None and self._image is not None:
                delta = describe_records(changed)
                if delta.everything or self.broker_id in delta.brokers:
                    delta = None
            self.core.set_fenced_brokers(b for b, reg in image.brokers.items() if reg.fenced)
            await self._apply(image, delta)
            self._image = image

    def _announce_taken(self, keys: list) -> None:
        """Tell `leadership_listeners` that this broker now leads `keys`, before the change
        that made it so is published (the broker's MetadataView wakes the produces held for
        them). A listener that raises is logged and does not stop the apply."""
        for fn in self.leadership_listeners:
            try:
                fn(keys)
            except Exception:  # noqa: BLE001 - a listener's bug must not leave the change half applied
                log.exception("leadership listener failed")

    def leads(self, key: tuple[str, int]) -> bool:
        """True when the local replica of `key` (topic, partition) is its leader now."""
        part = self.partitions.get(key)
        return part is not None and part.is_leader

    async def _apply(self, image: MetadataImage, delta: MetadataDelta | None = None) -> None:
        """Apply `image` (everything, or what `delta` names). New logs are created in
        batches off the loop (several executor threads at once: their fsyncs overlap), role
        changes run on the loop in slices of METADATA_LOOP_SLICE_MS (loop_share.LoopSlice,
        the clock read every APPLY_CHUNK_PARTITIONS) with a turn of the loop between them,
        so produce and fetch of other partitions wait that long at most. Leaderships this
        broker takes up go first, and are announced (`leadership_listeners`) slice by slice."""
        now = self._clock_ms()
        registered = self._registered_in(image)
        wanted: set[tuple[str, int]] = set()
        if delta is None:
            visit: dict = {name: None for name in image.topics}
            gone = [n for n in self._topic_ids if n not in image.topics]
            config_topics = set(image.topics)
        else:
            visit = dict(delta.partitions)
            for name in delta.topics_configs:
                visit.setdefault(name, set())
            gone = [n for n in delta.removed_topics if n in self._topic_ids and n not in image.topics]
            config_topics = delta.topics_configs
        for name in gone:
            await self._delete_partitions_local([k for k in self.logs if k[0] == name])
            self._topic_ids.pop(name, None)
            self._topic_configs.pop(name, None)
        to_create: list = []      # (key, topic image)
        to_apply: list = []       # (key, registration)
        to_delete: list = []
        for name, parts in visit.items():
            topic = image.topics.get(name)
            if topic is None:
                continue
            old_id = self._topic_ids.get(name)
            if old_id is not None and old_id != topic.topic_id:
                await self._delete_topic_local(name)  # deleted and re-created under the same name
                parts = None
            self._topic_ids[name] = topic.topic_id
            if name in config_topics or name not in self._topic_configs:
                configs = dict(topic.configs)
                # first sight too: logs opened at startup (LogManager.open_all) have the
                # default config until their topic's configs arrive (a compacted replica
                # stayed `delete` after a restart: issue 24)
                if self._topic_configs.get(name) != configs:
                    try:
                        self.log_manager.update_config(name, self._log_config(configs))
                    except (ValueError, KeyError):
                        log.exception("topic %s has invalid configs %s; keeping the old ones", name, configs)
                self._topic_configs[name] = configs
            regs = topic.partitions
            items = list(regs.items()) if parts is None else [(p, regs[p]) for p in parts if p in regs]
            for p, reg in items:
                key = (name, p)
                if self.broker_id not in reg.replicas:
                    if delta is not None and key in self.logs:
                        to_delete.append(key)   # replica moved away
                    continue
                wanted.add(key)
                if key not in self.logs:
                    to_create.append((key, topic))
                to_apply.append((key, reg))
        if to_create:
            await self._create_logs(to_create)
        # leaderships this broker takes up first: after a fencing they are what producers wait
        # for, and the change also carries thousands of ISR-only changes (issue 25)
        me = self.broker_id
        taking = [kr for kr in to_apply if kr[1].leader == me and not self.leads(kr[0])]
        if taking and len(taking) < len(to_apply):
            taking_keys = {kr[0] for kr in taking}
            to_apply = taking + [kr for kr in to_apply if kr[0] not in taking_keys]
        turns = LoopSlice()
        taken: list = []   # leaderships taken up since the listeners last heard
        for i, (key, reg) in enumerate(to_apply):
            if i and i % APPLY_CHUNK_PARTITIONS == 0:
                if taken:
                    self._announce_taken(taken)
                    taken = []
                await turns.maybe_yield()   # let produce/fetch of other partitions run
            tp = TopicPartition(*key)
            if key not in self.partitions:
                self.core.add_replica(tp, self.logs[key])
            # a leadership in metadata without our registration is our previous
            # incarnation's (we restarted, maybe with a shorter log): the core never takes
            # it up; the controller moves it away when it applies our registration
            self._carry_out(self.core.apply_leader_and_isr(tp, leader_and_isr(reg), now_ms=now,
                                                           registered=registered))
            if i < len(taking) and self.leads(key):
                taken.append(key)
        if taken:
            self._announce_taken(taken)
        if delta is None:   # replicas no longer hosted here (topic deleted or replica moved away)
            to_delete = [k for k in self.logs if k not in wanted]
            for name in [n for n in self._topic_ids if n not in image.topics]:
                self._topic_ids.pop(name, None)
                self._topic_configs.pop(name, None)
        if to_delete:
            await self._delete_partitions_local(to_delete)

    async def _create_logs(self, to_create: list) -> None:
        """Create the local logs of [(key, topic image)] in parallel batches off the loop
        (a stale log of an older topic id under the same name is deleted first)."""
        specs = []
        configs: dict = {}
        for (name, p), topic in to_create:
            recorded = self._log_topic_ids.get(f"{name}-{p}")
            if recorded is not None and recorded != topic.topic_id:
                # a log left by an older topic of the same name (deleted while we were down)
                log.info("deleting stale log %s-%s of an older topic id %s", name, p, recorded)
                await self._run_blocking(self.log_manager.delete_log, name, p)
            if name not in configs:
                configs[name] = self._log_config(dict(topic.configs))
            specs.append((name, p, configs[name]))
        big = len(specs) >= GC_FREEZE_MIN_LOGS
        thresholds = gc.get_threshold()
        if big:
            gc.set_threshold(thresholds[0], thresholds[1], 1 << 30)
        try:
            await self._create_log_batches(specs)
        finally:
            if big:
                gc.freeze()   # long-lived from now on; unfrozen when many partitions are deleted
                gc.set_threshold(*thresholds)

    async def _create_log_batches(self, specs: list) -> None:
        size = max(1, min(CREATE_BATCH_PARTITIONS, -(-len(specs) // CREATE_PARALLELISM)))
        batches = [specs[i:i + size] for i in range(0, len(specs), size)]
        ids_changed = False
        create = getattr(self.log_manager, "create_logs", None)   # a LogDirectory without it: one by one
        if create is None:
            def create(batch: list) -> list:
                return [self.log_manager.get_or_create(*spec) for spec in batch]
        for i in range(0, len(batches), CREATE_PARALLELISM):
            group = batches[i:i + CREATE_PARALLELISM]
            results = await asyncio.gather(*(self._run_blocking(create, b) for b in group))
            for batch, logs in zip(group, results):
                for (name, p, _), lg in zip(batch, logs):
                    self.core.add_replica(TopicPartition(name, p), lg)
                    tid = self._topic_ids.get(name)
                    if tid is not None and self._log_topic_ids.get(f"{name}-{p}") != tid:
                        self._log_topic_ids[f"{name}-{p}"] = tid
                        ids_changed = True
        if ids_changed:
            await self._save_topic_ids()

    def _registered_in(self, image: MetadataImage) -> bool:
        if self.incarnation_id is None:
            return True
        b = image.brokers.get(self.broker_id)
        return b is not None and b.incarnation_id == self.incarnation_id

    async def _save_topic_ids(self) -> None:
        if self._topic_ids_path is None:
            return
        snapshot = dict(self._log_topic_ids)
        await self._run_blocking(_write_json_atomic, self._topic_ids_path, snapshot)

    async def remove_stray_logs(self, image: MetadataImage) -> list[tuple[str, int]]:
        """Delete local logs the (caught-up) metadata does not assign to this broker: topics
        deleted or partitions moved while the broker was down. Call only once the broker's
        metadata has caught up (e.g. once the controller unfenced it)."""
        async with self._metadata_lock:
            stray = []
            for name, p in list(self.log_manager.partitions()):
                reg = image.partition(name, p)
                if reg is None or self.broker_id not in reg.replicas:
                    stray.append((name, p))
            for key in stray:
                log.info("deleting stray log %s-%s (not assigned to broker %s)", key[0], key[1], self.broker_id)
                if key in self.logs:
                    await self._delete_partition_local(key)
                else:
                    await self._run_blocking(self.log_manager.delete_log, key[0], key[1])
                self._log_topic_ids.pop(f"{key[0]}-{key[1]}", None)
            if stray:
                await self._save_topic_ids()
            return stray

    async def _delete_topic_local(self, name: str) -> None:
        await self._delete_partitions_local([k for k in self.logs if k[0] == name])

    async def _delete_partition_local(self, key: tuple[str, int]) -> None:
        await self._delete_partitions_local([key])

    async def _delete_partitions_local(self, keys: list) -> None:
        """Stop hosting `keys` and delete their logs: one executor call and one topic-ids
        write for the whole list."""
        if not keys:
            return
        for key in keys:
            self._carry_out(self.core.remove_replica(key))

        def delete_all() -> None:
            for topic, partition in keys:
                try:
                    self.log_manager.delete_log(topic, partition)
                except Exception:  # already gone is fine; anything else is logged, not fatal
                    log.exception("deleting local log %s-%s failed", topic, partition)
        await self._run_blocking(delete_all)
        if len(keys) >= GC_FREEZE_MIN_LOGS:
            gc.unfreeze()   # the deleted logs may sit in frozen reference cycles: let them go
        ids_changed = False
        for topic, partition in keys:
            ids_changed = self._log_topic_ids.pop(f"{topic}-{partition}", None) is not None or ids_changed
        if ids_changed:
            await self._save_topic_ids()

    # ---- lookups -----------------------------------------------------------------------

    def leader_info(self, topic: str, partition: int) -> tuple[int, str | None]:
        """(leader_id, leader_url) from the latest image, for 421 answers."""
        img = self._image
        if img is None:
            return -1, None
        reg = img.partition(topic, partition)
        if reg is None:
            return -1, None
        b = img.brokers.get(reg.leader)
        return reg.leader, (b.url if b is not None else None)

    def no_leader_message(self, topic: str, partition: int) -> str:
        """What a client of a leaderless partition should know: which brokers it waits for
        (ISR / ELR / last known ELR, KIP-966) and the way out if they are gone for good."""
        img = self._image
        reg = img.partition(topic, partition) if img is not None else None
        if reg is not None and reg.leader < 0:
            # fenced ISR members (KIP-966 keeps the last ones), the ELR, else the last known ELR
            waiting = sorted(set(reg.isr) | set(reg.elr)) or sorted(reg.last_known_elr)
            return (f"{topic}-{partition} has no leader: it waits for brokers {waiting}, the replicas that may "
                    "hold every committed record, to come back (and, after unclean shutdowns, to report "
                    "their logs); retry shortly. If they are gone for good, setting the topic config "
                    "unclean.leader.election.enable=true elects another replica (committed records may be lost)")
        return f"{topic}-{partition} has no leader right now; retry shortly"

    def leader_partition(self, topic: str, partition: int) -> tuple[Partition, PartitionLog]:
        """The local leader replica, else UNKNOWN_TOPIC_OR_PARTITION / NOT_LEADER_OR_FOLLOWER."""
        key = (topic, partition)
        part = self.partitions.get(key)
        if part is not None and part.is_leader:
            self.core.check_not_suspended(TopicPartition(topic, partition))
            return part, self.logs[key]
        img = self._image
        if img is None or img.partition(topic, partition) is None:
            if img is not None and topic in img.topics:
                n = len(img.topics[topic].partitions)
                raise KraftlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                    f"topic {topic!r} has partitions 0..{n - 1}, not {partition}")
            raise KraftlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                f"topic {topic!r} does not exist; create it first (POST /v1/topics)")
        leader_id, leader_url = self.leader_info(topic, partition)
        if leader_id < 0:
            raise KraftlogError(ErrorCode.LEADER_NOT_AVAILABLE, self.no_leader_message(topic, partition),
                                leader_id=leader_id, leader_url=leader_url)
        raise KraftlogError(ErrorCode.NOT_LEADER_OR_FOLLOWER,
                            f"broker {self.broker_id} is not the leader of {topic}-{partition}; "
                            f"send the request to broker {leader_id} at {leader_url}",
                            leader_id=leader_id, leader_url=leader_url)

    # ---- produce -----------------------------------------------------------------------

    async def append(self, topic: str, partition: int, batches: bytes, *, acks: int,
                     timeout_ms: int | None = None) -> AppendResult:
        """Append validated raw batches as leader; with acks=all wait for the high watermark."""
        part, lg = self.leader_partition(topic, partition)
        key = TopicPartition(topic, partition)
        info, effects = self.core.append_as_leader(
            key, batches, required_min_isr=self.min_isr_for(topic) if acks == ACKS_ALL else None)
        self._carry_out(effects)
        if lg.needs_flush():
            await self._flush(key, lg, info.last_offset + 1)
        result = AppendResult(info.first_offset, info.last_offset, info.log_append_time_ms or -1,
                              lg.log_start_offset, info.duplicate)
        # a duplicate with unknown offsets was appended somewhere below the log end
        wait_for = info.last_offset if info.last_offset >= 0 else lg.log_end_offset - 1
        if acks == ACKS_ALL and part.high_watermark <= wait_for:
            await self._await_high_watermark(key, wait_for, timeout_ms)
        return result

    async def _flush(self, key, lg, up_to: int) -> None:
        """Group commit: one fsync in flight per log, off the event loop; returns once the
        log's recovery point covers `up_to`."""
        while lg.recovery_point < min(up_to, lg.log_end_offset):  # truncated meanwhile: less to wait for
            fut = self._flushing.get(key)
            if fut is None:
                fut = asyncio.ensure_future(self._run_blocking(lg.flush))
                self._flushing[key] = fut
                fut.add_done_callback(lambda f, k=key: self._flushing.pop(k, None)
                                      if self._flushing.get(k) is f else None)
            try:
                await asyncio.shield(fut)
            except OSError as e:
                raise KraftlogError(ErrorCode.KAFKA_STORAGE_ERROR,
                                    f"fsync of {key[0]}-{key[1]} failed: {e}; check the log dir") from None
            if lg.closed:
                return

    async def _await_high_watermark(self, key: TopicPartition, last_offset: int, timeout_ms: int | None) -> None:
        fut = asyncio.get_running_loop().create_future()
        self._carry_out(self.core.add_ack_waiter(key, fut, last_offset))
        timeout = (timeout_ms if timeout_ms is not None else self.request_timeout_ms) / 1000
        try:
            await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            raise KraftlogError(
                ErrorCode.REQUEST_TIMED_OUT,
                f"{key[0]}-{key[1]}: the in-sync replicas did not acknowledge offset {last_offset} "
                f"within {timeout * 1000:.0f} ms; the records are written on the leader and may "
                "still be committed; retry (idempotently) or use acks=1") from None
        finally:
            self.core.remove_ack_waiter(key, fut)

    def _carry_out(self, effects: Effects) -> None:
        """Do what the core decided: answer acks=all waiters, wake parked fetches."""
        for fut in effects.completed:
            if not fut.done():
                fut.set_result(None)
        for fut, error in effects.failed:
            if not fut.done():
                fut.set_exception(error)
        for key in effects.wake_fetches:
            self._wake_fetchers(key)

    def follower_fetched(self, topic: str, partition: int, replica_id: int, fetch_offset: int,
                         broker_epoch: int = -1) -> None:
        """A follower (registration `broker_epoch`) fetched at `fetch_offset`: update its
        LEO; the HW may move."""
        self.leader_partition(topic, partition)
        self._carry_out(self.core.follower_fetched(TopicPartition(topic, partition), replica_id, fetch_offset,
                                                   self._clock_ms(), broker_epoch))

    # ---- fetch -------------------------------------------------------------------------

    @property
    def closing(self) -> bool:
        """True once begin_shutdown ran (the broker is stopping)."""
        return self._closing

    def begin_shutdown(self) -> None:
        """Answer every waiting long poll now (with what it has) and stop parking new ones."""
        self._closing = True
        for key in list(self._fetch_waiters):
            self._wake_fetchers(key)
        for fut in list(self._session_waiters.values()):
            _resolve(fut)

    def _wake_fetchers(self, key) -> None:
        waiters = self._fetch_waiters.pop(key, None)
        if waiters:
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)
        for sid in self.fetch_sessions.partition_changed(key):
            fut = self._session_waiters.get(sid)
            if fut is not None and not fut.done():
                fut.set_result(None)

    def _read_committed(self, topic: str, partition: int, offset: int, max_bytes: int) -> FetchResult:
        self.leader_partition(topic, partition)
        return self.core.read_committed(TopicPartition(topic, partition), offset, max_bytes)

    async def fetch(self, topic: str, partition: int, offset: int, *, max_bytes: int,
                    min_bytes: int = 1, max_wait_ms: int = 0) -> FetchResult:
        """Committed batches from `offset`; waits up to max_wait_ms for min_bytes."""
        result = self._read_committed(topic, partition, offset, max_bytes)
        if len(result.records) >= min_bytes or max_wait_ms <= 0 or self._closing:
            return result
        if self._long_polls >= self.max_concurrent_long_polls:
            raise KraftlogError(ErrorCode.THROTTLING_QUOTA_EXCEEDED,
                                f"{self._long_polls} fetches are already waiting (long_poll_max_requests="
                                f"{self.max_concurrent_long_polls}); retry later or poll with max_wait_ms=0")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max_wait_ms / 1000
        key = (topic, partition)
        self._long_polls += 1
        try:
            while True:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return result
                fut = loop.create_future()
                self._fetch_waiters.setdefault(key, []).append(fut)
                handle = loop.call_later(remaining, _resolve, fut)
                try:
                    await fut
                finally:
                    handle.cancel()
                    lst = self._fetch_waiters.get(key)
                    if lst is not None and fut in lst:
                        lst.remove(fut)
                result = self._read_committed(topic, partition, offset, max_bytes)
                if len(result.records) >= min_bytes or self._closing:
                    return result
        finally:
            self._long_polls -= 1

    # ---- replication: leader side ------------------------------------------------------

    def _replica_read(self, topic: str, partition: int, *, replica_id: int, offset: int, leader_epoch: int,
                      max_bytes: int, record: bool, broker_epoch: int = -1) -> FetchResult:
        """One partition of a replica fetch (see ReplicaState.replica_read)."""
        self.leader_partition(topic, partition)
        result, effects = self.core.replica_read(
            TopicPartition(topic, partition), replica_id=replica_id, offset=offset, leader_epoch=leader_epoch,
            max_bytes=max_bytes, now_ms=self._clock_ms(), broker_epoch=broker_epoch, record=record)
        self._carry_out(effects)
        return result

    async def replica_fetch(self, replica_id: int, requests: list[ReplicaFetchRequest], *,
                            max_bytes: int, partition_max_bytes: int, max_wait_ms: int = 0,
                            broker_epoch: int = -1) -> list[FetchResult | KraftlogError]:
        """A follower's fetch for every partition it follows from this leader, in one long
        poll (one `ReplicaFetchRequest` per partition).
        The fetch offset is the follower's LEO, which acknowledges everything below it, so
        the HW may move (completing acks=all produces). Answers at once when some
        partition has data (or an error), else waits up to max_wait_ms for an append on any
        of them; the answer always carries the current HW (how followers learn it). One entry per request: the
        result or the partition's error (FENCED_LEADER_EPOCH, NOT_LEADER_OR_FOLLOWER, ...)."""
        self.core.fetch_request_from(replica_id, self._clock_ms())   # its broker is alive (silence rules)
        requests = [ReplicaFetchRequest(*r) for r in requests]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max_wait_ms / 1000
        record = True
        while True:
            out: list[FetchResult | KraftlogError] = []
            budget = max_bytes
            news = False
            now = self._monotonic_ms()
            self.throttle.update(self._image, now)
            for req in requests:
                try:
                    limit = self.throttle.leader_limit(req.topic, req.partition, replica_id, now)
                    res = self._replica_read(req.topic, req.partition, replica_id=replica_id,
                                             offset=req.fetch_offset, leader_epoch=req.leader_epoch,
                                             max_bytes=min(partition_max_bytes, budget,
                                                           budget if limit is None else limit),
                                             record=record, broker_epoch=broker_epoch)
                    budget -= len(res.records)
                    if limit is not None:
                        self.throttle.leader_sent(len(res.records), now)
                    # only data answers early (Kafka's replica.fetch.min.bytes=1): answering a HW
                    # move alone would cost every follower a round trip per commit; the follower
                    # learns the HW with the next data or when max_wait_ms ends
                    if res.records:
                        news = True
                    out.append(res)
                except KraftlogError as e:
                    news = True
                    out.append(e)
                except log_errors.OffsetOutOfRangeError as e:  # retention raced with us
                    news = True
                    out.append(KraftlogError(ErrorCode.OFFSET_OUT_OF_RANGE, str(e)))
            record = False
            remaining = deadline - loop.time()
            if news or remaining <= 0 or self._closing or not requests:
                return out
            fut = loop.create_future()
            keys = [TopicPartition(r.topic, r.partition) for r in requests]
            for key in keys:
                self._fetch_waiters.setdefault(key, []).append(fut)
            try:
                await self._park(fut, remaining)
            finally:
                for key in keys:
                    lst = self._fetch_waiters.get(key)
                    if lst is not None and fut in lst:
                        lst.remove(fut)

    async def _park(self, fut: asyncio.Future, remaining_s: float) -> None:
        """A follower's long poll waits: until `fut` is woken by an append (the caller
        registered it) or `remaining_s` passes; counted in `replica_fetches_waiting`."""
        handle = asyncio.get_running_loop().call_later(remaining_s, _resolve, fut)
        self.replica_fetches_waiting += 1
        try:
            await fut
        finally:
            self.replica_fetches_waiting -= 1
            handle.cancel()

    async def replica_fetch_session(self, replica_id: int, session_id: int, session_epoch: int,
                                    requests: list[ReplicaFetchRequest], forgotten: list[tuple[str, int]], *,
                                    max_bytes: int, partition_max_bytes: int, max_wait_ms: int = 0,
                                    broker_epoch: int = -1
                                    ) -> tuple[int, str | None, list[tuple[TopicPartition, FetchResult | KraftlogError]]]:
        """A follower's fetch within an incremental fetch session (KIP-227,
        `partitions/replication/fetch_session.py`): `session_id` 0 starts a new session
        holding `requests`; otherwise `requests` are the partitions added or changed since
        the session's last request and `forgotten` those it no longer fetches. Reads only
        the named partitions and those that changed here since the last answer; answers
        only partitions with records, an error or news of the HW / log start offset. Parks
        like `replica_fetch` when nothing has data; an append to any session partition
        wakes it. -> (session id, session error or None, [(partition, result or error)])."""
        # the follower is alive while we work on its request: the ISR rules count it heard
        # until we answer (`ReplicaState.fetch_request_started`)
        self.core.fetch_request_started(replica_id, self._clock_ms())
        try:
            return await self._replica_fetch_session(replica_id, session_id, session_epoch, requests, forgotten,
                                                     max_bytes=max_bytes, partition_max_bytes=partition_max_bytes,
                                                     max_wait_ms=max_wait_ms, broker_epoch=broker_epoch)
        finally:
            self.core.fetch_request_ended(replica_id, self._clock_ms())

    async def _replica_fetch_session(self, replica_id: int, session_id: int, session_epoch: int,
                                     requests: list[ReplicaFetchRequest], forgotten: list[tuple[str, int]], *,
                                     max_bytes: int, partition_max_bytes: int, max_wait_ms: int,
                                     broker_epoch: int
                                     ) -> tuple[int, str | None, list[tuple[TopicPartition, FetchResult | KraftlogError]]]:
        cache = self.fetch_sessions
        mono = self._monotonic_ms()
        if session_id == NO_SESSION:
            # a full fetch: the new session is filled in slices of the loop's time (issue 25:
            # 30,000-60,000 partitions in one go held a leader's loop 2-4 s, long enough for
            # other followers' requests to time out and start full fetches of their own)
            s = cache.new_session(replica_id, (), mono, liveness=self.core.open_liveness(replica_id, broker_epoch))
            keys = []
            async for chunk in LoopSlice().chunks(requests, SESSION_ADD_CHUNK_PARTITIONS):
                named = [(TopicPartition(r.topic, r.partition), r.fetch_offset, r.leader_epoch) for r in chunk]
                if not cache.add_partitions(s, named):
                    return NO_SESSION, SESSION_NOT_FOUND, []   # replaced by this replica's next full fetch
                keys.extend(k for k, _, _ in named)
            keys = cache.take_dirty(s, keys)
        else:
            found = cache.lookup(session_id, session_epoch, replica_id, mono)
            if isinstance(found, str):
                return NO_SESSION, found, []
            s = found
            named = [(TopicPartition(r.topic, r.partition), r.fetch_offset, r.leader_epoch) for r in requests]
            keys = cache.update(s, named, [TopicPartition(*k) for k in forgotten])
        if s.due_for_refresh(mono, self.fetch_session_refresh_ms):
            keys += self._restate_session_progress(s, set(keys), replica_id, broker_epoch)
        if len(keys) > 1:   # rotate: the byte budget is filled in this order, so no partition starves
            r = s.epoch % len(keys)
            keys = keys[r:] + keys[:r]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max_wait_ms / 1000
        results: dict = {}
        record = True
        while True:
            news, budget = False, max_bytes
            # a full fetch reads thousands of partitions: in chunks, the loop serves between them
            for i in range(0, len(keys), READ_CHUNK_PARTITIONS):
                if i:
                    await asyncio.sleep(0)
                chunk_news, budget = self._read_session_partitions(
                    s, keys[i:i + READ_CHUNK_PARTITIONS], results, replica_id, broker_epoch, record,
                    budget, partition_max_bytes)
                news = news or chunk_news
            record = False
            remaining = deadline - loop.time()
            if news or remaining <= 0 or self._closing or not s.partitions:
                break
            if s.dirty and len(keys) > READ_CHUNK_PARTITIONS:
                keys = cache.take_dirty(s)   # changed while the loop served between chunks: read, do not park
                continue
            fut = loop.create_future()
            self._session_waiters[s.session_id] = fut
            try:
                await self._park(fut, remaining)
            finally:
                if self._session_waiters.get(s.session_id) is fut:
                    del self._session_waiters[s.session_id]
            keys = cache.take_dirty(s)
        out = []
        for key, res in results.items():
            if isinstance(res, KraftlogError):
                out.append((key, res))
            elif s.wants_answer(key, has_records=bool(res.records), error=False, high_watermark=res.high_watermark,
                                log_start_offset=res.log_start_offset):
                s.told(key, res.high_watermark, res.log_start_offset)
                out.append((key, res))
        cache.answered(s)
        return s.session_id, None, out

    def _restate_session_progress(self, s: FetchSession, skip: set, replica_id: int, broker_epoch: int) -> list:
        """The session's partitions not read in this request keep their fetch offsets:
        record them as fetched now (follower liveness for the ISR and silence rules). ->
        partitions whose leadership changed under the session (read them: the follower
        gets their error).

        Issue 25: the caught-up, unchanged partitions are attached to the session's clock
        (`FollowerLiveness`) and restated by moving it; only the others (`loose`: lagging,
        changed, just added, stale) are visited, and those that are caught up afterwards
        attach."""
        now = self._clock_ms()
        stale = []
        suspended = self.core.suspended
        lv = s.liveness
        if lv is None:
            items = [(key, c) for key, c in s.partitions.items() if key not in skip]
        else:
            if broker_epoch != lv.broker_epoch:   # another registration: restate each one
                lv.detach_all()
                lv.broker_epoch = broker_epoch
            for key in skip:
                lv.detach(key)   # read by this request instead
            lv.heard(now)
            items = []
            for key in list(lv.loose):
                c = s.partitions.get(key)
                if c is None:
                    lv.loose.discard(key)
                elif key not in skip:
                    items.append((key, c))
        self.restate_visits += len(items)
        for key, c in items:
            part = self.partitions.get(key)
            if part is None or not part.is_leader or part.leader_epoch != c.leader_epoch or key in suspended:
                stale.append(key)
                continue
            if replica_id not in part.isr:
                self.core.loud.add(key)   # it may rejoin now (`ReplicaState._quiet`)
            if not part.restate_follower_fetch(replica_id, c.fetch_offset, now, broker_epoch):
                try:
                    self._carry_out(self.core.follower_fetched(key, replica_id, c.fetch_offset, now, broker_epoch))
                except KraftlogError:
                    stale.append(key)
                    continue
            if lv is not None:
                state = part.remote_replicas.get(replica_id)
                if (state is not None and state.log_end_offset == c.fetch_offset >= part.local_log_end_offset
                        and state.last_fetch_leader_log_end_offset == part.local_log_end_offset
                        and state.broker_epoch == broker_epoch
                        and state.last_fetch_time_ms == now == state.last_caught_up_time_ms):
                    lv.attach(key, state)
        return stale

    def _read_session_partitions(self, s: FetchSession, keys: list, results: dict, replica_id: int,
                                 broker_epoch: int, record: bool, budget: int,
                                 partition_max_bytes: int) -> tuple[bool, int]:
        """Read `keys` of session `s` into `results` within `budget` bytes; -> (True when one
        has records or an error, the budget left)."""
        news = False
        now = self._monotonic_ms()
        self.throttle.update(self._image, now)
        for key in keys:
            c = s.partitions.get(key)
            if c is None:
                continue
            try:
                limit = self.throttle.leader_limit(key[0], key[1], replica_id, now)
                res = self._replica_read(key[0], key[1], replica_id=replica_id, offset=c.fetch_offset,
                                         leader_epoch=c.leader_epoch,
                                         max_bytes=min(partition_max_bytes, budget, budget if limit is None else limit),
                                         record=record, broker_epoch=broker_epoch)
                budget -= len(res.records)
                if limit is not None:
                    self.throttle.leader_sent(len(res.records), now)
                if res.records:
                    news = True
                elif res.fetch_offset < res.log_end_offset:
                    s.still_changed(key)   # the budget or the throttle held it back: read it again next time
                results[key] = res
            except KraftlogError as e:
                news = True
                results[key] = e
            except log_errors.OffsetOutOfRangeError as e:  # retention raced with us
                news = True
                results[key] = KraftlogError(ErrorCode.OFFSET_OUT_OF_RANGE, str(e))
        return news, budget

    def shrink_still_due(self, part: Partition, new_isr: list[int], replica_lag_time_max_ms: int) -> bool:
        """`ReplicaState.shrink_still_due` now, with this manager's rules' settings."""
        return self.core.shrink_still_due(
            part, new_isr, self._clock_ms(), self.replica_lag_time_max_ms(part.topic, replica_lag_time_max_ms),
            replica_fetch_silence_max_ms=self.replica_fetch_silence_max_ms)

    def describe_follower(self, part, replica_id: int) -> str:
        """`ReplicaState.describe_follower` now (an ISR shrink's log line), with what the
        follower's fetch session holds for the partition: the offset and leader epoch it
        last named (a restate skips a partition whose cached epoch is not the leader's), and
        the clock its state reads from."""
        out = self.core.describe_follower(part, replica_id, self._clock_ms())
        key = TopicPartition(part.topic, part.partition)
        s = self.fetch_sessions.session_of(replica_id)
        sid = s.session_id if s is not None else None
        c = s.partitions.get(key) if s is not None else None
        st = part.remote_replicas.get(replica_id)
        lv = st.liveness if st is not None else None
        clock = ("none" if lv is None else "the session's" if s is not None and lv is s.liveness
                 else f"another (closed={lv.closed})")
        held = "not held" if c is None else f"offset {c.fetch_offset} epoch {c.leader_epoch}"
        return f"{out}; session {sid}: {held} (leader epoch {part.leader_epoch}); clock: {clock}"

    def epoch_end_offset(self, topic: str, partition: int, epoch: int,
                         leader_epoch: int | None = None) -> tuple[int, int]:
        """OffsetsForLeaderEpoch on the leader: (largest epoch <= `epoch`, its end offset).
        `leader_epoch` = the epoch the follower follows under (stale: FENCED_LEADER_EPOCH)."""
        self.leader_partition(topic, partition)
        return self.core.epoch_end_offset(TopicPartition(topic, partition), epoch, leader_epoch)

    def update_isolation(self, heartbeat_silence_ms: int | None, *, leader_lease_ms: int,
                         replica_silence_report_ms: int, now_ms: int | None = None,
                         silent_partitions: set | None = None) -> None:
        """Suspend or resume led partitions by the isolation rule (issue 24 part D,
        `ReplicaState.update_isolation`; `silent_partitions` from `ReplicaState.silence_scan`
        at `now_ms`, when the caller has them)."""
        before = set(self.core.suspended)
        self._carry_out(self.core.update_isolation(self._clock_ms() if now_ms is None else now_ms,
                                                   heartbeat_silence_ms, leader_lease_ms=leader_lease_ms,
                                                   replica_silence_report_ms=replica_silence_report_ms,
                                                   silent_partitions=silent_partitions))
        if self.core.suspended - before:
            log.warning("broker %s: leaderships suspended (no heartbeat succeeded for %s ms and followers silent): "
                        "%s", self.broker_id, heartbeat_silence_ms, _some(self.core.suspended - before))
        if before - self.core.suspended:
            log.warning("broker %s: leaderships resumed (a heartbeat succeeded or a follower fetched again): %s",
                        self.broker_id, _some(before - self.core.suspended))

    def replica_lag_time_max_ms(self, topic: str, default_ms: int) -> int:
        """The topic's `replica.lag.time.max.ms`, else the broker's."""
        return self.replica_lag_time_max_ms_of(self._topic_configs.get(topic, {}).get("replica.lag.time.max.ms"),
                                               default_ms)

    @staticmethod
    def replica_lag_time_max_ms_of(raw, default_ms: int) -> int:
        try:
            return int(raw) if raw is not None else default_ms
        except ValueError:
            return default_ms

    def _lag_floor_ms(self, replica_lag_time_max_ms: int) -> int:
        floor = replica_lag_time_max_ms
        for configs in self._topic_configs.values():
            raw = configs.get("replica.lag.time.max.ms")
            if raw is not None:
                floor = min(floor, self.replica_lag_time_max_ms_of(raw, replica_lag_time_max_ms))
        return floor

    def isr_changes(self, replica_lag_time_max_ms: int) -> list[tuple[Partition, list[int]]]:
        """(partition, proposed ISR) for every led partition whose ISR should shrink (lagging
        or silent followers while acks=all produces wait, see `replica_fetch_silence_max_ms`)
        or expand (caught-up replicas); the caller sends AlterPartition with
        `part.broker_epochs(new_isr)` (KIP-903).
        `replica_lag_time_max_ms` is the broker default; a topic config overrides it."""
        return self.core.isr_changes(self._clock_ms(),
                                     lambda topic: self.replica_lag_time_max_ms(topic, replica_lag_time_max_ms),
                                     replica_fetch_silence_max_ms=self.replica_fetch_silence_max_ms,
                                     lag_floor_ms=self._lag_floor_ms(replica_lag_time_max_ms))

    async def isr_changes_sliced(self, replica_lag_time_max_ms: int) -> list[tuple[Partition, list[int]]]:
        """`isr_changes`, the partitions judged in slices of ISR_CHECK_CHUNK_PARTITIONS with
        turns of the loop between them (issue 25: after a kill -9 at 100,000 partitions every
        partition the dead broker followed is looked at, and one synchronous pass held a
        survivor's loop 1-3 s at a time while it applied the new leaderships).
        `isr_check_busy_s` is the time the check itself took, without the turns."""
        started = time.perf_counter()
        now = self._clock_ms()
        candidates = self.core.rule_partitions(now, self._lag_floor_ms(replica_lag_time_max_ms), isr_check=True)
        busy = time.perf_counter() - started
        out: list = []
        async for chunk in LoopSlice().chunks(candidates, ISR_CHECK_CHUNK_PARTITIONS):
            t0 = time.perf_counter()
            out.extend(self.core.propose_isr_changes(
                chunk, now, lambda topic: self.replica_lag_time_max_ms(topic, replica_lag_time_max_ms),
                replica_fetch_silence_max_ms=self.replica_fetch_silence_max_ms, skip_due=True))
            busy += time.perf_counter() - t0
        self.isr_check_busy_s = busy
        return out

    # ---- replication: follower side ----------------------------------------------------

    def follower_partition(self, topic: str, partition: int, leader_epoch: int) -> tuple[Partition, PartitionLog]:
        """The local follower replica still following under `leader_epoch`, else a
        retriable error (the fetcher stops; metadata will restart it)."""
        return self.core.follower(TopicPartition(topic, partition), leader_epoch)

    def follower_append(self, topic: str, partition: int, leader_epoch: int, data: bytes,
                        leader_high_watermark: int, leader_log_start_offset: int) -> int:
        """Append the leader's batches (offsets kept); adopt its HW. Returns the new LEO."""
        return self.core.follower_append(TopicPartition(topic, partition), leader_epoch, data,
                                         leader_high_watermark, leader_log_start_offset)

    async def follower_flush_if_needed(self, topic: str, partition: int) -> None:
        """A follower honours the topic's flush policy (flush.messages / flush.ms) before its
        next fetch acknowledges the records, so acks=all on such a topic means fsync'd on
        every ISR member, as on the leader. Off the event loop, one fsync at a time."""
        key = (topic, partition)
        lg = self.logs.get(key)
        if lg is not None and lg.needs_flush():
            await self._flush(key, lg, lg.log_end_offset)

    def follower_truncate(self, topic: str, partition: int, leader_epoch: int, offset: int) -> int:
        """Truncate to the divergence point the leader gave (never to our own HW)."""
        return self.core.follower_truncate(TopicPartition(topic, partition), leader_epoch, offset)

    def follower_reset(self, topic: str, partition: int, leader_epoch: int, start_offset: int) -> int:
        """Our log is below the leader's log start: start over empty at `start_offset`, then
        tell the follower-reset listeners (tiered storage restores producer state from the
        store: http_api/broker/tiering.py)."""
        out = self.core.follower_reset(TopicPartition(topic, partition), leader_epoch, start_offset)
        for listener in list(self.follower_reset_listeners):
            listener(topic, partition, start_offset)
        return out

    def followed_partitions(self) -> list[tuple[str, int, int, int]]:
        """(topic, partition, leader_id, leader_epoch) of every local follower with a leader."""
        return self.core.followed_partitions()

    # ---- offsets & admin ---------------------------------------------------------------

    def offsets(self, topic: str, partition: int) -> dict:
        part, lg = self.leader_partition(topic, partition)
        return {"log_start_offset": lg.log_start_offset, "high_watermark": part.high_watermark}

    def offset_for_timestamp(self, topic: str, partition: int, timestamp_ms: int) -> int:
        """First offset whose timestamp >= timestamp_ms; the high watermark when none yet."""
        part, lg = self.leader_partition(topic, partition)
        found = lg.offset_for_timestamp(timestamp_ms)
        if found is None:
            return part.high_watermark
        if found < 0 or found > part.high_watermark:
            return part.high_watermark
        return found

    async def delete_records(self, topic: str, partition: int, before_offset: int) -> int:
        """Advance the log start offset to before_offset (-1 = the high watermark)."""
        part, lg = self.leader_partition(topic, partition)
        hw = part.high_watermark
        if before_offset == -1:
            before_offset = hw
        if before_offset < 0 or before_offset > hw:
            raise KraftlogError(ErrorCode.OFFSET_OUT_OF_RANGE,
                                f"before_offset {before_offset} is outside [0, {hw}] (high watermark) "
                                f"of {topic}-{partition}; use an offset at or below the high watermark",
                                high_watermark=hw)
        if before_offset <= lg.log_start_offset:
            return lg.log_start_offset
        await self._run_blocking(lg.delete_records, before_offset)
        self._wake_fetchers((topic, partition))
        return lg.log_start_offset

    def under_replicated_count(self) -> int:
        """Led partitions whose ISR is smaller than their replica set (Kafka's URP metric)."""
        return sum(1 for p in self.core.led.values() if len(p.isr) < len(p.replicas))

    def local_partition_counts(self) -> tuple[int, int]:
        """(partitions hosted, partitions led) for metrics."""
        return len(self.partitions), len(self.core.led)


def _some(keys: set, shown: int = 10) -> str:
    """`keys` for a log line: how many, and the first few (thousands at scale)."""
    first = sorted(keys)[:shown] if len(keys) <= 1000 else sorted(list(keys)[:shown])
    more = f" and {len(keys) - shown} more" if len(keys) > shown else ""
    return f"{len(keys)} partition(s): " + ", ".join(f"{k[0]}-{k[1]}" for k in first) + more


def _read_json(path: str) -> dict:
    try:
        with open(path, "rb") as f:
            return dict(json.load(f))
    except FileNotFoundError:
        return {}


def _write_json_atomic(path: str, doc: dict) -> None:
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _resolve(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)
