"""Per-topic log configuration with Kafka's names, defaults and validation rules.

Pure module (no IO): the controller imports it to validate CreateTopics / AlterConfigs
requests, the broker to build each partition's `LogConfig`.

`TOPIC_CONFIG_KEYS` maps each Kafka topic config name to a `ConfigKey` (field name,
parser/validator, documentation). `validate_topic_configs` raises
`ValueError("<key>: <what is wrong and what is allowed>")`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

GiB = 1 << 30
MiB = 1 << 20
DAY_MS = 24 * 60 * 60 * 1000

CLEANUP_POLICIES = ("delete", "compact", "compact,delete")
TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")
COMPRESSION_TYPES = ("producer", "uncompressed", "none", "gzip", "lz4", "zstd")


@dataclass(frozen=True)
class LogConfig:
    """Settings of one partition log (Kafka topic-level semantics, unit last).

    Invariants (checked in __post_init__): sizes positive, times non-negative except the
    -1 = infinite sentinels of retention, policy/timestamp type from the allowed sets.
    """

    segment_bytes: int = GiB
    segment_ms: int = 7 * DAY_MS
    segment_index_bytes: int = 10 * MiB
    index_interval_bytes: int = 4096
    retention_ms: int = 7 * DAY_MS  # -1 = infinite
    retention_bytes: int = -1  # -1 = infinite
    max_message_bytes: int = 1048588
    flush_messages: int | None = None  # None = never fsync per N messages
    flush_ms: int | None = None  # None = never fsync per elapsed time
    cleanup_policy: str = "delete"
    message_timestamp_type: str = "CreateTime"
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int | None = None  # None = no upper bound
    delete_retention_ms: int = DAY_MS
    file_delete_delay_ms: int = 60000
    preallocate: bool = True  # reserve blocks ahead of the active segment's end (segment.py)
    # Partition-level settings carried here so one object describes a topic's configs;
    # the log itself does not use them (replication and the producer path do).
    min_insync_replicas: int = 1
    unclean_leader_election_enable: bool = False
    compression_type: str = "producer"
    # tiered storage (KIP-405; partitions/log/remote/): closed segments copied to the remote
    # store; the local log keeps local.retention.* (-2 = the total retention.* value)
    remote_storage_enable: bool = False
    local_retention_ms: int = -2  # -2 = retention.ms, -1 = keep forever
    local_retention_bytes: int = -2  # -2 = retention.bytes, -1 = no size limit

    def __post_init__(self) -> None:
        for key in TOPIC_CONFIG_KEYS.values():
            key.check_value(getattr(self, key.field))

    @property
    def compact(self) -> bool:
        return "compact" in self.cleanup_policy

    @property
    def delete(self) -> bool:
        return "delete" in self.cleanup_policy

    @property
    def effective_local_retention_ms(self) -> int:
        """local.retention.ms with -2 resolved to retention.ms."""
        return self.retention_ms if self.local_retention_ms == -2 else self.local_retention_ms

    @property
    def effective_local_retention_bytes(self) -> int:
        """local.retention.bytes with -2 resolved to retention.bytes."""
        return self.retention_bytes if self.local_retention_bytes == -2 else self.local_retention_bytes

    @property
    def log_append_time(self) -> bool:
        return self.message_timestamp_type == "LogAppendTime"

    @classmethod
    def from_topic_configs(cls, configs: Mapping[str, Any], base: "LogConfig | None" = None) -> "LogConfig":
        """`base` (default: the defaults) overridden by Kafka-named `configs`."""
        validate_topic_configs(configs)
        changes = {TOPIC_CONFIG_KEYS[name].field: TOPIC_CONFIG_KEYS[name].parse(value) for name, value in configs.items()}
        return dataclasses.replace(base or cls(), **changes)

    def to_topic_configs(self) -> dict[str, str]:
        """Kafka-named string values of every setting (for DescribeConfigs)."""
        out = {}
        for name, key in TOPIC_CONFIG_KEYS.items():
            out[name] = key.render(getattr(self, key.field))
        return out

    def replace(self, **changes: Any) -> "LogConfig":
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class ConfigKey:
    """One topic config: Kafka name, LogConfig field, parser and allowed values."""

    name: str
    field: str
    kind: str  # "int", "float", "bool", "choice", "optional_int"
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    doc: str = ""

    def allowed(self) -> str:
        if self.kind == "choice":
            return "one of " + ", ".join(self.choices)
        if self.kind == "bool":
            return "true or false"
        lo = "" if self.minimum is None else f" >= {self.minimum:g}"
        hi = "" if self.maximum is None else f" <= {self.maximum:g}"
        what = "a number" if self.kind == "float" else "an integer"
        extra = " (or empty for none)" if self.kind == "optional_int" else ""
        return f"{what}{lo}{' and' if lo and hi else ''}{hi}{extra}"

    def _fail(self, value: Any, why: str = "") -> ValueError:
        return ValueError(f"{self.name}: {why or 'invalid value'} {value!r}; allowed: {self.allowed()}")

    def parse(self, raw: Any) -> Any:
        """Parse a config value (string as sent by clients, or an already typed value)."""
        if self.kind == "bool":
            if isinstance(raw, bool):
                value = raw
            else:
                text = str(raw).strip().lower()
                if text not in ("true", "false"):
                    raise self._fail(raw)
                value = text == "true"
        elif self.kind == "choice":
            text = str(raw).strip()
            if self.name == "cleanup.policy":
                parts = sorted({p.strip().lower() for p in text.split(",") if p.strip()})
                text = ",".join(parts)
            elif self.name == "compression.type":
                text = text.lower()
            if text not in self.choices:
                raise self._fail(raw)
            value = text
        elif self.kind == "float":
            try:
                value = float(raw)
            except (TypeError, ValueError):
                raise self._fail(raw, "not a number") from None
        else:
            if raw is None or (self.kind == "optional_int" and str(raw).strip().lower() in ("", "none", "null")):
                if self.kind == "optional_int":
                    return None
                raise self._fail(raw, "missing value")
            if isinstance(raw, bool):
                raise self._fail(raw, "not an integer")
            try:
                value = int(str(raw).strip()) if not isinstance(raw, int) else raw
            except ValueError:
                raise self._fail(raw, "not an integer") from None
        self.check_value(value)
        return value

    def check_value(self, value: Any) -> None:
        if self.kind in ("int", "optional_int", "float"):
            if value is None and self.kind == "optional_int":
                return
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise self._fail(value, "wrong type")
            if self.minimum is not None and value < self.minimum:
                raise self._fail(value, "too small:")
            if self.maximum is not None and value > self.maximum:
                raise self._fail(value, "too large:")
        elif self.kind == "choice":
            if value not in self.choices:
                raise self._fail(value)
        elif self.kind == "bool":
            if not isinstance(value, bool):
                raise self._fail(value, "wrong type")

    def render(self, value: Any) -> str:
        if value is None:
            return ""
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)


_INT32_MAX = 2**31 - 1
_INT64_MAX = 2**63 - 1

TOPIC_CONFIG_KEYS: dict[str, ConfigKey] = {
    k.name: k
    for k in [
        ConfigKey("segment.bytes", "segment_bytes", "int", 14, _INT32_MAX, doc="roll a segment at this size"),
        ConfigKey("segment.ms", "segment_ms", "int", 1, _INT64_MAX, doc="roll a segment after this age"),
        ConfigKey("segment.index.bytes", "segment_index_bytes", "int", 8, _INT32_MAX, doc="max offset index size"),
        ConfigKey("index.interval.bytes", "index_interval_bytes", "int", 0, _INT32_MAX, doc="bytes between index entries"),
        ConfigKey("retention.ms", "retention_ms", "int", -1, _INT64_MAX, doc="-1 = keep forever"),
        ConfigKey("retention.bytes", "retention_bytes", "int", -1, _INT64_MAX, doc="-1 = no size limit"),
        ConfigKey("max.message.bytes", "max_message_bytes", "int", 0, _INT32_MAX, doc="largest batch accepted"),
        ConfigKey("flush.messages", "flush_messages", "optional_int", 1, _INT64_MAX, doc="fsync every N messages"),
        ConfigKey("flush.ms", "flush_ms", "optional_int", 0, _INT64_MAX, doc="fsync every N ms"),
        ConfigKey("cleanup.policy", "cleanup_policy", "choice", choices=CLEANUP_POLICIES),
        ConfigKey("message.timestamp.type", "message_timestamp_type", "choice", choices=TIMESTAMP_TYPES),
        ConfigKey("min.cleanable.dirty.ratio", "min_cleanable_dirty_ratio", "float", 0, 1),
        ConfigKey("min.compaction.lag.ms", "min_compaction_lag_ms", "int", 0, _INT64_MAX),
        ConfigKey("max.compaction.lag.ms", "max_compaction_lag_ms", "optional_int", 1, _INT64_MAX),
        ConfigKey("delete.retention.ms", "delete_retention_ms", "int", 0, _INT64_MAX),
        ConfigKey("file.delete.delay.ms", "file_delete_delay_ms", "int", 0, _INT64_MAX),
        ConfigKey("preallocate", "preallocate", "bool",
                  doc="reserve disk blocks ahead of the active segment's end (file length unchanged)"),
        ConfigKey("min.insync.replicas", "min_insync_replicas", "int", 1, _INT32_MAX),
        ConfigKey("unclean.leader.election.enable", "unclean_leader_election_enable", "bool"),
        ConfigKey("compression.type", "compression_type", "choice", choices=COMPRESSION_TYPES),
        ConfigKey("remote.storage.enable", "remote_storage_enable", "bool",
                  doc="tiered storage: copy closed segments to the remote store (not for compacted topics)"),
        ConfigKey("local.retention.ms", "local_retention_ms", "int", -2, _INT64_MAX,
                  doc="local tail of a tiered topic by age; -2 = retention.ms, -1 = forever"),
        ConfigKey("local.retention.bytes", "local_retention_bytes", "int", -2, _INT64_MAX,
                  doc="local tail of a tiered topic by size; -2 = retention.bytes, -1 = no limit"),
    ]
}


def validate_topic_configs(configs: Mapping[str, Any]) -> None:
    """Raise ValueError("<key>: ...") for an unknown key or a bad value."""
    for name, raw in configs.items():
        key = TOPIC_CONFIG_KEYS.get(name)
        if key is None:
            raise ValueError(f"{name}: unknown topic config; allowed keys: {', '.join(sorted(TOPIC_CONFIG_KEYS))}")
        key.parse(raw)
    # cross-field rule (Kafka): min.compaction.lag.ms <= max.compaction.lag.ms
    lo = configs.get("min.compaction.lag.ms")
    hi = configs.get("max.compaction.lag.ms")
    if lo is not None and hi not in (None, ""):
        lo_v = TOPIC_CONFIG_KEYS["min.compaction.lag.ms"].parse(lo)
        hi_v = TOPIC_CONFIG_KEYS["max.compaction.lag.ms"].parse(hi)
        if hi_v is not None and lo_v > hi_v:
            raise ValueError(
                f"min.compaction.lag.ms: {lo_v} is larger than max.compaction.lag.ms {hi_v}; it must be <= it"
            )
    _validate_tiering(configs)


def _validate_tiering(configs: Mapping[str, Any]) -> None:
    """Kafka's tiered storage rules: compacted topics are never tiered; the local tail is no
    longer than the total retention (both when given in the same mapping)."""
    if "remote.storage.enable" not in configs:
        return
    enabled = TOPIC_CONFIG_KEYS["remote.storage.enable"].parse(configs["remote.storage.enable"])
    policy = configs.get("cleanup.policy")
    if enabled and policy is not None and "compact" in TOPIC_CONFIG_KEYS["cleanup.policy"].parse(policy):
        raise ValueError(
            "remote.storage.enable: compacted topics (cleanup.policy containing compact) cannot use tiered "
            "storage, as in Kafka; use cleanup.policy=delete or leave remote.storage.enable=false")
    if not enabled:
        return
    for local_name, total_name in (("local.retention.ms", "retention.ms"), ("local.retention.bytes", "retention.bytes")):
        if local_name not in configs or total_name not in configs:
            continue
        local_v = TOPIC_CONFIG_KEYS[local_name].parse(configs[local_name])
        total_v = TOPIC_CONFIG_KEYS[total_name].parse(configs[total_name])
        if local_v == -2 or total_v == -1:
            continue
        if local_v == -1 or local_v > total_v:
            raise ValueError(f"{local_name}: {local_v} is larger than {total_name} {total_v}; the local tail "
                             f"must not outlive the total retention (use -2 for the same value)")


__all__ = ["LogConfig", "ConfigKey", "TOPIC_CONFIG_KEYS", "validate_topic_configs"]
