"""Broker configuration: small frozen groups of named limits, composed by `BrokerConfig`.

Naming rule: Kafka's broker setting name in snake_case where Kafka has the setting
(`replica_lag_time_max_ms`, `message_max_bytes`, `num_partitions`), the unit last for every
limit (`<scope>_max_<unit>`), one name per limit. Renamed settings stay accepted under their
old name (`RENAMED_SETTINGS`) with a `DeprecatedSettingWarning` naming the new one.

Each group checks itself in `validate()` (called on construction) and raises `ValueError`
naming the setting and what to do. `BrokerConfig` reads and builds flat: `config.fetch_max_bytes`
is `config.limits.fetch_max_bytes`, and `BrokerConfig(fetch_max_bytes=...)` fills that group.
"""
from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping

from metadata_quorum.controller import MinInsyncReplicasDefault
from metadata_quorum.security.config import SecurityConfig
from partitions.log.remote.config import RemoteStorageConfig

MiB = 1024 * 1024

# old name -> new name (the old name is accepted with a DeprecatedSettingWarning)
RENAMED_SETTINGS: dict[str, str] = {
    "max_request_bytes": "socket_request_max_bytes",      # Kafka socket.request.max.bytes
    "max_message_bytes": "message_max_bytes",             # Kafka message.max.bytes (broker-wide)
    "max_records_per_request": "request_max_records",     # unit last
    "max_concurrent_long_polls": "long_poll_max_requests",  # unit last
}


class DeprecatedSettingWarning(FutureWarning):
    """A setting was given under its old name; the message names the new one."""


def renamed(key: str, source: str = "config") -> str:
    """The current name of setting `key`, warning when `key` is an old name."""
    new = RENAMED_SETTINGS.get(key)
    if new is None:
        return key
    warnings.warn(f"{source}: setting {key!r} is deprecated, use {new!r} instead (same meaning and unit)",
                  DeprecatedSettingWarning, stacklevel=3)
    return new


def _check(ok: bool, setting: str, what: str, value: Any) -> None:
    if not ok:
        raise ValueError(f"{setting} must be {what}, got {value!r}; fix {setting} in the config")


def _positive(group: Any, *names: str) -> None:
    for n in names:
        v = getattr(group, n)
        _check(v > 0, n, "> 0", v)


def _non_negative(group: Any, *names: str) -> None:
    for n in names:
        v = getattr(group, n)
        _check(v >= 0, n, ">= 0", v)


class _Group:
    """Mixin of the frozen setting groups: validated on construction."""

    def __post_init__(self) -> None:
        self.validate()  # type: ignore[attr-defined]


@dataclass(frozen=True)
class ListenerConfig(_Group):
    """Where this node listens (broker API, controller API, raft) and the host it hands out."""

    http_host: str = "127.0.0.1"
    http_port: int = 8082                 # broker public API
    advertised_host: str | None = None    # host in URLs handed to others (default http_host)
    controller_port: int = 9093           # controller HTTP API
    raft_port: int = 9193                 # metadata quorum (pysyncobj)
    raft_bind_host: str | None = None     # interface raft listens on (default: all)
    # Kafka wire protocol listener (http_api/kafka/); 0: none. It binds kafka_host (default
    # http_host) and hands out kafka_advertised_host (default the HTTP advertised host) in
    # Kafka metadata. A port already in use is logged and the broker serves HTTP only
    kafka_port: int = 9092
    kafka_host: str | None = None
    kafka_advertised_host: str | None = None

    def validate(self) -> None:
        _check(bool(self.http_host), "http_host", "a host name or address (0.0.0.0 for every interface)",
               self.http_host)
        for n in ("http_port", "controller_port", "raft_port", "kafka_port"):
            v = getattr(self, n)
            _check(0 <= v <= 65535, n, "a TCP port in 0..65535", v)

    @property
    def host(self) -> str:
        return self.advertised_host or self.http_host

    @property
    def kafka_bind_host(self) -> str:
        return self.kafka_host or self.http_host

    @property
    def kafka_host_advertised(self) -> str:
        """The host Kafka clients are told to connect to."""
        return self.kafka_advertised_host or self.advertised_host or (
            "127.0.0.1" if self.kafka_bind_host in ("0.0.0.0", "::", "") else self.kafka_bind_host)


@dataclass(frozen=True)
class RequestLimits(_Group):
    """Size, count and time bounds of client requests (413 / 429 / 504 beyond them)."""

    socket_request_max_bytes: int = 8 * MiB   # whole HTTP body; 413 RECORD_LIST_TOO_LARGE
    request_max_records: int = 100_000        # records in one produce request; 413 RECORD_LIST_TOO_LARGE
    message_max_bytes: int = 1 * MiB + 12     # one record batch, default of topics' max.message.bytes; 413 MESSAGE_TOO_LARGE
    fetch_max_bytes: int = 8 * MiB            # cap on a fetch's max_bytes
    fetch_default_max_bytes: int = 1 * MiB    # max_bytes when the request has none
    fetch_max_wait_ms: int = 30_000           # cap on a fetch's max_wait_ms
    kafka_request_max_bytes: int = 8 * MiB    # one Kafka request frame; larger: the connection is closed
    kafka_connections_max_idle_ms: int = 600_000   # Kafka connections.max.idle.ms: idle Kafka connections closed; 0: never
    long_poll_max_requests: int = 1024        # waiting fetches at once; 429 THROTTLING_QUOTA_EXCEEDED
    request_timeout_ms: int = 30_000          # acks=all wait bound; forwarded requests
    metadata_wait_ms: int = 10_000            # how long admin calls wait for the broker to see their result
    # /healthz answers 503 once this broker's published metadata has been behind the
    # controller's applied offset for longer than this (issue 25); 0: never
    metadata_lag_max_ms: int = 30_000
    # one try of a controller request (connect included); then the other controllers at once.
    # Capped at the broker heartbeat interval the controller announces: a silent controller
    # costs a heartbeat at most one interval, well inside broker_session_timeout_ms
    controller_request_timeout_ms: int = 2_000
    controller_long_poll_margin_ms: int = 1_000   # metadata feed try bound: its max wait plus this
    controller_retry_backoff_ms: int = 100        # pause after every controller failed once
    # a controller request unanswered this long asks the other controllers whom they follow,
    # and moves at once to a new leader they name (then, and again every this long)
    controller_leader_check_after_ms: int = 500
    # heartbeats go out from a thread of their own (metadata_quorum/heartbeat_thread.py), held
    # while the event loop has not turned for this long: a wedged broker loses its lease
    heartbeat_loop_stall_max_ms: int = 5_000
    # the HTTP edge (http_api/wire/hardening.py; 0 turns one off): slowloris deadlines for
    # receiving a request's head and body (not for answering it: long polls wait after both),
    # connection caps (Kafka max.connections, max.connections.per.ip; 429 beyond) and the
    # budget of log lines about rejected requests
    request_header_timeout_ms: int = 10_000
    request_body_timeout_ms: int = 30_000
    connections_max: int = 10_000
    connections_max_per_ip: int = 1_000
    rejected_request_logs_per_second: int = 10
    # SSE consume (http_api/broker/streaming.py): unsent answer bytes one stream may hold,
    # and the comment line sent while idle
    stream_buffer_bytes: int = 1 * MiB
    stream_heartbeat_ms: int = 15_000
    # Confluent REST Proxy v2 consumer instances idle this long are closed (Confluent's
    # consumer.instance.timeout.ms)
    consumer_instance_timeout_ms: int = 300_000

    def validate(self) -> None:
        _non_negative(self, "request_header_timeout_ms", "request_body_timeout_ms", "connections_max",
                      "connections_max_per_ip", "rejected_request_logs_per_second")
        _positive(self, "socket_request_max_bytes", "request_max_records", "message_max_bytes",
                  "fetch_max_bytes", "fetch_default_max_bytes", "long_poll_max_requests", "request_timeout_ms",
                  "kafka_request_max_bytes",
                  "controller_request_timeout_ms", "controller_long_poll_margin_ms", "heartbeat_loop_stall_max_ms")
        _non_negative(self, "controller_retry_backoff_ms", "controller_leader_check_after_ms")
        _non_negative(self, "fetch_max_wait_ms", "metadata_wait_ms", "kafka_connections_max_idle_ms",
                      "metadata_lag_max_ms")
        _positive(self, "stream_heartbeat_ms", "consumer_instance_timeout_ms")
        _check(self.stream_buffer_bytes >= 2, "stream_buffer_bytes", ">= 2", self.stream_buffer_bytes)


@dataclass(frozen=True)
class ReplicationConfig(MinInsyncReplicasDefault, _Group):
    """Replication defaults of new topics (with the inherited `min_insync_replicas`, which
    the controller gets too) and the follower fetch loop."""

    default_replication_factor: int = 1
    replica_lag_time_max_ms: int = 30_000     # a follower not caught up for this long leaves the ISR
    replica_fetch_wait_max_ms: int = 500      # follower long poll on its leader
    replica_fetch_backoff_ms: int = 200       # after a failed replica fetch
    # a follower that sent no fetch for this long while acks=all produces wait for it leaves
    # the ISR (AlterPartition) at once, not after replica_lag_time_max_ms; 0 turns it off.
    # Must stay well above replica_fetch_wait_max_ms (a healthy follower's longest silence)
    replica_fetch_silence_max_ms: int = 1500
    # a peer silent this long (no fetch from a follower of ours, no answer from a leader we
    # follow) is reported to the controller, which fences it once its own heartbeats and a
    # probe agree (docs/AVAILABILITY.md part B); 0 turns it off. At least twice
    # replica_fetch_wait_max_ms (a healthy leader answers within that wait)
    replica_silence_report_ms: int = 1000

    def validate(self) -> None:
        _positive(self, "default_replication_factor", "min_insync_replicas", "replica_lag_time_max_ms")
        _non_negative(self, "replica_fetch_wait_max_ms", "replica_fetch_backoff_ms", "replica_fetch_silence_max_ms")
        if 0 < self.replica_fetch_silence_max_ms < 2 * self.replica_fetch_wait_max_ms:
            raise ValueError(f"replica_fetch_silence_max_ms={self.replica_fetch_silence_max_ms} must be at least "
                             f"twice replica_fetch_wait_max_ms={self.replica_fetch_wait_max_ms} (a healthy "
                             "follower is silent for up to one long poll), or 0 to turn the rule off")
        _non_negative(self, "replica_silence_report_ms")
        if 0 < self.replica_silence_report_ms < 2 * self.replica_fetch_wait_max_ms:
            raise ValueError(f"replica_silence_report_ms={self.replica_silence_report_ms} must be at least "
                             f"twice replica_fetch_wait_max_ms={self.replica_fetch_wait_max_ms} (a healthy "
                             "peer is silent for up to one long poll), or 0 to turn the reports off")


@dataclass(frozen=True)
class LogDefaults(_Group):
    """Topic creation defaults and the periodic jobs over every log."""

    auto_create_topics_enable: bool = True
    num_partitions: int = 1
    log_retention_check_interval_ms: int = 300_000
    offset_checkpoint_interval_ms: int = 60_000     # recovery point, log start and HW checkpoints
    log_flush_scheduler_interval_ms: int = 1_000    # how often flush.ms policies are checked

    def validate(self) -> None:
        _positive(self, "num_partitions", "log_retention_check_interval_ms", "offset_checkpoint_interval_ms",
                  "log_flush_scheduler_interval_ms")


@dataclass(frozen=True)
class LogCleanerConfig(_Group):
    """Compaction of cleanup.policy=compact topics (partitions/log/log_scheduler.py)."""

    log_cleaner_enable: bool = True
    log_cleaner_threads: int = 1
    log_cleaner_backoff_ms: int = 15_000      # a cleaner thread with nothing to clean sleeps this long
    log_cleaner_dedupe_buffer_size_bytes: int = 128 * MiB  # key -> offset map of one pass (all threads share it)
    log_cleaner_process: bool = True          # the CPU-heavy part of a pass in a child process (no GIL contention)
    log_cleaner_io_max_bytes_per_second: float = -1  # read + write IO of all cleaner threads together; -1: no limit

    def validate(self) -> None:
        _positive(self, "log_cleaner_threads", "log_cleaner_dedupe_buffer_size_bytes")
        _non_negative(self, "log_cleaner_backoff_ms")
        v = self.log_cleaner_io_max_bytes_per_second
        _check(v > 0 or v == -1, "log_cleaner_io_max_bytes_per_second", "> 0, or -1 for no limit", v)


@dataclass(frozen=True)
class GroupCoordinatorConfig(_Group):
    """Consumer groups (http_api/broker/groups.py; Kafka's offsets.topic.* and group.* settings)."""

    offsets_topic_num_partitions: int = 10     # __consumer_offsets partitions (fixed once created)
    offsets_topic_replication_factor: int = 3  # capped at the number of live brokers when created
    offsets_commit_timeout_ms: int = 5_000     # acks=all wait for a commit / group change
    group_min_session_timeout_ms: int = 1_000  # joins outside [min, max] get INVALID_SESSION_TIMEOUT
    group_max_session_timeout_ms: int = 300_000
    group_session_timeout_ms: int = 45_000     # session.timeout.ms when the member gives none
    group_heartbeat_interval_ms: int = 3_000   # capped at a third of the member's session timeout
    group_rebalance_timeout_ms: int = 60_000   # a member must revoke within this, else it is removed
    offsets_retention_minutes: int = 10_080    # committed offsets of groups without members kept this long (7 days)
    offsets_retention_check_interval_ms: int = 600_000  # how often expired offsets are looked for
    # transactions (http_api/broker/transactions.py; Kafka's transaction.* settings)
    transaction_max_timeout_ms: int = 900_000  # a longer transaction_timeout_ms is INVALID_TRANSACTION_TIMEOUT
    transaction_state_num_partitions: int = 10  # __transaction_state partitions (fixed once created)
    transaction_state_replication_factor: int = 3  # capped at the number of live brokers when created
    transaction_abort_timed_out_check_interval_ms: int = 10_000  # how often timed-out transactions are aborted

    def validate(self) -> None:
        _positive(self, "transaction_max_timeout_ms", "transaction_state_num_partitions",
                  "transaction_state_replication_factor", "transaction_abort_timed_out_check_interval_ms")
        _positive(self, "offsets_topic_num_partitions", "offsets_topic_replication_factor",
                  "offsets_commit_timeout_ms", "group_min_session_timeout_ms", "group_session_timeout_ms",
                  "group_heartbeat_interval_ms", "group_rebalance_timeout_ms", "offsets_retention_minutes",
                  "offsets_retention_check_interval_ms")
        _check(self.group_max_session_timeout_ms >= self.group_min_session_timeout_ms,
               "group_max_session_timeout_ms", f">= group_min_session_timeout_ms ({self.group_min_session_timeout_ms})",
               self.group_max_session_timeout_ms)


@dataclass(frozen=True)
class MemoryConfig(_Group):
    """glibc malloc tuning at broker start (http_api/broker/malloc_tuning.py; 0 keeps glibc's default)."""

    malloc_mmap_threshold_bytes: int = 64 * MiB    # buffers below this come from the heap, not fresh mmaps
    malloc_trim_threshold_bytes: int = 256 * MiB   # freed heap kept for reuse up to this much

    def validate(self) -> None:
        _non_negative(self, "malloc_mmap_threshold_bytes", "malloc_trim_threshold_bytes")


# BrokerConfig field name -> group class (the order of the groups in BrokerConfig)
GROUPS: dict[str, type] = {
    "listeners": ListenerConfig,
    "limits": RequestLimits,
    "replication": ReplicationConfig,
    "log": LogDefaults,
    "cleaner": LogCleanerConfig,
    "groups": GroupCoordinatorConfig,
    "memory": MemoryConfig,
    "security": SecurityConfig,   # [security]: TLS, authentication, authorizer (API.md, Security)
    "remote_storage": RemoteStorageConfig,  # [remote_storage]: tiered storage (API.md, Tiered storage)
}
# setting name -> the group field holding it
SETTING_GROUP: dict[str, str] = {f.name: g for g, cls in GROUPS.items() for f in dataclasses.fields(cls)}


@dataclass(init=False)
class BrokerConfig:
    """Settings of one broker process: its identity and the setting groups.

    Built from group objects, flat setting names, or both (`BrokerConfig(broker_id=2,
    fetch_max_bytes=1024)`); every group is validated. Settings read flat too
    (`config.fetch_max_bytes`). deploy/config.py derives the identity from the node config.
    """

    broker_id: int = 1
    cluster_id: str = "kraftlog-local"
    rack: str | None = None
    log_dirs: list[str] = field(default_factory=lambda: ["./data/broker-1/logs"])
    state_dir: str = "./data/broker-1"         # group offsets, broker meta
    controller_urls: list[str] = field(default_factory=lambda: ["http://127.0.0.1:9093"])
    advertised_url: str | None = None          # default http(s)://{advertised_host or http_host}:{http_port}
    # the cluster secret (the node config's `password`, passed as $KRAFTLOG_RAFT_PASSWORD, never
    # on the command line): when set, /internal/ routes need its token (http_api/broker/internal_auth.py)
    cluster_secret: str | None = None
    listeners: ListenerConfig = field(default_factory=ListenerConfig)
    limits: RequestLimits = field(default_factory=RequestLimits)
    replication: ReplicationConfig = field(default_factory=ReplicationConfig)
    log: LogDefaults = field(default_factory=LogDefaults)
    cleaner: LogCleanerConfig = field(default_factory=LogCleanerConfig)
    groups: GroupCoordinatorConfig = field(default_factory=GroupCoordinatorConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    remote_storage: RemoteStorageConfig = field(default_factory=RemoteStorageConfig)

    def __init__(self, **settings: Any) -> None:
        own = {f.name: f for f in dataclasses.fields(self)}
        flat: dict[str, dict[str, Any]] = {g: {} for g in GROUPS}
        for raw_key, value in settings.items():
            key = renamed(raw_key, "BrokerConfig")
            if key in GROUPS:
                if isinstance(value, Mapping):  # nested form, e.g. from dataclasses.asdict()
                    flat[key].update(value)
                else:
                    setattr(self, key, value)
            elif key in SETTING_GROUP:
                flat[SETTING_GROUP[key]][key] = value
            elif key in own:
                setattr(self, key, list(value) if key in ("log_dirs", "controller_urls") else value)
            else:
                raise TypeError(f"unknown broker setting {raw_key!r}; known: {', '.join(sorted(self.setting_names()))}")
        for name, f in own.items():
            if name not in self.__dict__:
                setattr(self, name, f.default_factory() if f.default_factory is not dataclasses.MISSING  # type: ignore[misc]
                        else f.default)
        for g, values in flat.items():
            if values:
                setattr(self, g, dataclasses.replace(getattr(self, g), **values))
        self.validate()

    def validate(self) -> None:
        _check(self.broker_id >= 0, "broker_id", ">= 0", self.broker_id)
        _check(bool(self.log_dirs), "log_dirs", "at least one directory", self.log_dirs)
        _check(bool(self.controller_urls), "controller_urls", "at least one controller URL", self.controller_urls)
        for g in GROUPS:
            getattr(self, g).validate()

    @classmethod
    def setting_names(cls) -> list[str]:
        """Every setting, flat: the identity fields and each group's settings."""
        return [f.name for f in dataclasses.fields(cls) if f.name not in GROUPS] + list(SETTING_GROUP)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "BrokerConfig":
        """Flat or nested (group name -> dict) settings, old names accepted; ValueError on unknown keys."""
        try:
            return cls(**dict(values))
        except TypeError as e:
            raise ValueError(str(e)) from None

    def to_dict(self) -> dict[str, Any]:
        """Flat settings (what `from_dict` and `python -m http_api.broker.server --config-json` take)."""
        return {name: getattr(self, name) for name in self.setting_names()}

    @property
    def url(self) -> str:
        return self.advertised_url or f"{self.security.scheme}://{self.listeners.host}:{self.listeners.http_port}"


def _flat_property(group: str, name: str) -> property:
    def get(self: BrokerConfig) -> Any:
        return getattr(getattr(self, group), name)

    get.__name__ = name
    get.__doc__ = f"`{group}.{name}`"
    return property(get)


for _name, _group in SETTING_GROUP.items():
    setattr(BrokerConfig, _name, _flat_property(_group, _name))
del _name, _group
