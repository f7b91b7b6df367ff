"""Node configuration for `kraftlog serve`: named defaults, a config file, CLI overrides.

Precedence: built-in defaults < `--config FILE` (TOML, INI `[kraftlog]` section, or JSON;
keys are the field names below, `-` and `.` accepted for `_`) < command-line flags.
"""
from __future__ import annotations

import configparser
import dataclasses
import json
import os
import tomllib
from dataclasses import dataclass, field
from typing import Any

from http_api.config import BrokerConfig

MiB = 1024 * 1024


@dataclass
class NodeConfig:
    """One node in combined mode: a controller and a broker with the same node id."""

    node_id: int = 1
    data_dir: str = "./data"
    http_host: str = "127.0.0.1"
    http_port: int = 8082                 # broker public API
    controller_port: int = 9093           # controller HTTP API
    raft_port: int = 9193                 # pysyncobj
    raft_bind_host: str | None = None     # interface raft listens on (default: all)
    advertised_host: str | None = None    # host in URLs handed to others (default http_host)
    cluster_id: str = "kraftlog-local"
    # "id@host:raft_port:controller_port,..."; default: this node alone
    controller_quorum_voters: str | None = None
    password: str | None = None           # raft port password; default: derived from cluster_id + data dir
    log_dirs: list[str] = field(default_factory=list)   # default: <data_dir>/broker-<id>/logs
    rack: str | None = None
    # broker limits (see http_api/config.py for meanings)
    max_request_bytes: int = 8 * MiB
    max_records_per_request: int = 100_000
    max_message_bytes: int = 1 * MiB + 12
    fetch_max_bytes: int = 8 * MiB
    fetch_max_wait_ms: int = 30_000
    max_concurrent_long_polls: int = 1024
    request_timeout_ms: int = 30_000
    auto_create_topics_enable: bool = True
    num_partitions: int = 1
    default_replication_factor: int = 1
    min_insync_replicas: int = 1
    replica_lag_time_max_ms: int = 30_000   # a follower not caught up for this long leaves the ISR
    log_retention_check_interval_ms: int = 300_000
    log_cleaner_enable: bool = True         # compaction of cleanup.policy=compact topics
    log_cleaner_threads: int = 1
    log_cleaner_dedupe_buffer_size_bytes: int = 128 * MiB
    log_cleaner_io_max_bytes_per_second: float = -1   # read + write IO of the cleaner; -1: no limit
    # consumer groups (offsets.topic.num.partitions, group.min.session.timeout.ms, ...)
    offsets_topic_num_partitions: int = 10
    offsets_topic_replication_factor: int = 3
    group_min_session_timeout_ms: int = 1_000
    group_max_session_timeout_ms: int = 300_000
    offsets_retention_minutes: int = 10_080   # committed offsets of groups without members kept this long
    log_level: str = "INFO"

    # ---- derived ----------------------------------------------------------------------

    @property
    def host(self) -> str:
        return self.advertised_host or self.http_host

    @property
    def broker_url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    @property
    def controller_url(self) -> str:
        return f"http://{self.host}:{self.controller_port}"

    @property
    def voters(self) -> str:
        return self.controller_quorum_voters or f"{self.node_id}@{self.host}:{self.raft_port}:{self.controller_port}"

    def controller_urls(self) -> list[str]:
        """HTTP URLs of every controller in the quorum."""
        urls = []
        for v in self.voters.split(","):
            v = v.strip()
            if not v:
                continue
            _, _, addr = v.partition("@")
            parts = addr.split(":")
            host, cport = parts[0], parts[-1] if len(parts) >= 3 else str(self.controller_port)
            urls.append(f"http://{host}:{cport}")
        return urls

    def controller_data_dir(self) -> str:
        return os.path.join(self.data_dir, f"controller-{self.node_id}")

    def broker_state_dir(self) -> str:
        return os.path.join(self.data_dir, f"broker-{self.node_id}")

    def broker_config(self) -> BrokerConfig:
        state = self.broker_state_dir()
        return BrokerConfig(
            broker_id=self.node_id, cluster_id=self.cluster_id, http_host=self.http_host,
            http_port=self.http_port, advertised_url=self.broker_url, rack=self.rack,
            log_dirs=list(self.log_dirs) or [os.path.join(state, "logs")], state_dir=state,
            controller_urls=self.controller_urls(), max_request_bytes=self.max_request_bytes,
            max_records_per_request=self.max_records_per_request, max_message_bytes=self.max_message_bytes,
            fetch_max_bytes=self.fetch_max_bytes, fetch_max_wait_ms=self.fetch_max_wait_ms,
            max_concurrent_long_polls=self.max_concurrent_long_polls,
            request_timeout_ms=self.request_timeout_ms,
            auto_create_topics_enable=self.auto_create_topics_enable, num_partitions=self.num_partitions,
            default_replication_factor=self.default_replication_factor,
            min_insync_replicas=self.min_insync_replicas,
            replica_lag_time_max_ms=self.replica_lag_time_max_ms,
            log_retention_check_interval_ms=self.log_retention_check_interval_ms,
            log_cleaner_enable=self.log_cleaner_enable, log_cleaner_threads=self.log_cleaner_threads,
            log_cleaner_dedupe_buffer_size_bytes=self.log_cleaner_dedupe_buffer_size_bytes,
            log_cleaner_io_max_bytes_per_second=self.log_cleaner_io_max_bytes_per_second,
            offsets_retention_minutes=self.offsets_retention_minutes,
            offsets_topic_num_partitions=self.offsets_topic_num_partitions,
            offsets_topic_replication_factor=self.offsets_topic_replication_factor,
            group_min_session_timeout_ms=self.group_min_session_timeout_ms,
            group_max_session_timeout_ms=self.group_max_session_timeout_ms,
        )

    # ---- loading ----------------------------------------------------------------------

    @classmethod
    def load(cls, path: str | None = None, overrides: dict[str, Any] | None = None) -> "NodeConfig":
        """Defaults, then the file at `path`, then non-None `overrides`."""
        values: dict[str, Any] = {}
        if path:
            values.update(read_config_file(path))
        for k, v in (overrides or {}).items():
            if v is not None:
                values[k] = v
        return cls.from_dict(values, source=path or "command line")

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "config") -> "NodeConfig":
        fields = {f.name: f for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for raw_key, raw in values.items():
            key = raw_key.replace("-", "_").replace(".", "_")
            if key not in fields:
                raise ValueError(f"{source}: unknown setting {raw_key!r}; known settings: "
                                 f"{', '.join(sorted(fields))}")
            kwargs[key] = _coerce(fields[key], raw, source, raw_key)
        return cls(**kwargs)


def _coerce(f: dataclasses.Field, raw: Any, source: str, key: str) -> Any:
    t = str(f.type)
    try:
        if t.startswith("int"):
            if isinstance(raw, bool):
                raise ValueError
            return int(raw)
        if t.startswith("float"):
            if isinstance(raw, bool):
                raise ValueError
            return float(raw)
        if t.startswith("bool"):
            if isinstance(raw, bool):
                return raw
            s = str(raw).strip().lower()
            if s in ("true", "1", "yes", "on"):
                return True
            if s in ("false", "0", "no", "off"):
                return False
            raise ValueError
        if t.startswith("list"):
            if isinstance(raw, str):
                return [p.strip() for p in raw.split(",") if p.strip()]
            return [str(x) for x in raw]
        return None if raw is None else str(raw)
    except (TypeError, ValueError):
        raise ValueError(f"{source}: setting {key!r} must be of type {t}, got {raw!r}") from None


def read_config_file(path: str) -> dict[str, Any]:
    """TOML (.toml), JSON (.json) or INI (anything else; section [kraftlog] or [node])."""
    if not os.path.exists(path):
        raise ValueError(f"config file {path!r} does not exist; check the --config path")
    with open(path, "rb") as f:
        data = f.read()
    lower = path.lower()
    try:
        if lower.endswith(".toml"):
            doc = tomllib.loads(data.decode())
        elif lower.endswith(".json"):
            doc = json.loads(data)
        else:
            cp = configparser.ConfigParser()
            cp.read_string(data.decode())
            section = next((s for s in ("kraftlog", "node") if cp.has_section(s)), None)
            if section is None:
                raise ValueError("an INI config needs a [kraftlog] section")
            doc = dict(cp.items(section))
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, configparser.Error, UnicodeDecodeError) as e:
        raise ValueError(f"config file {path!r} cannot be parsed: {e}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"config file {path!r} must hold a table/object of settings")
    if "kraftlog" in doc and isinstance(doc["kraftlog"], dict):
        doc = doc["kraftlog"]
    return doc
