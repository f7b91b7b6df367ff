"""Node configuration for `kraftlog serve`: named defaults, a config file, CLI overrides.

Precedence: built-in defaults < `--config FILE` (TOML, INI `[kraftlog]` section, or JSON;
keys are the flat names of `NodeConfig.setting_names()`, `-` and `.` accepted for `_`) < command-line flags.
"""
from __future__ import annotations

import configparser
import dataclasses
import json
import os
import tomllib
from dataclasses import dataclass, field
from typing import Any

from http_api.broker.config import GROUPS, BrokerConfig, ListenerConfig, renamed
from metadata_quorum.controller import ControllerSettings

PROCESS_ROLES = ("broker", "controller")
# BrokerConfig fields the node derives from its own settings (not keys of the node config)
DERIVED_BROKER_SETTINGS = {
    "broker_id": "node_id", "state_dir": "data_dir", "controller_urls": "controller_quorum_voters",
    "advertised_url": "advertised_host", "cluster_secret": "password",
}
# ControllerSettings a node config sets (each reaches the controller process as a flag);
# min_insync_replicas is the broker's, copied
CONTROLLER_SETTINGS = ("broker_session_timeout_ms", "broker_heartbeat_interval_ms",
                       "leader_imbalance_check_interval_ms",
                       # fencing from fetch silence (issue 24, docs/AVAILABILITY.md part B)
                       "broker_silence_fence_ms", "broker_silence_report_max_age_ms")


@dataclass(frozen=True)
class NodeConfig:
    """One node in combined mode: a controller and a broker with the same node id.

    Node-level settings, then `broker` (BrokerConfig) and `controller` (ControllerSettings).
    Invariants (`__post_init__`): `broker` carries this node's identity (broker id, listeners,
    state dir, controller URLs; log dirs default under the data dir) and
    `controller.min_insync_replicas == broker.min_insync_replicas`.
    """

    node_id: int = 1
    process_roles: tuple[str, ...] = PROCESS_ROLES   # Kafka process.roles; combined mode only
    data_dir: str = "./data"
    # "id@host:raft_port:controller_port,..."; default: this node alone
    controller_quorum_voters: str | None = None
    password: str | None = None           # raft port password; default: generated in the data dir
    # the controller joins a running quorum (kraftlog quorum add-controller): with an empty raft
    # log it starts no election before the leader has added it (controller_server --join)
    controller_quorum_join: bool = False
    log_level: str = "INFO"
    listeners: ListenerConfig = field(default_factory=ListenerConfig)
    broker: BrokerConfig = field(default_factory=BrokerConfig)
    controller: ControllerSettings = field(default_factory=ControllerSettings)

    def __post_init__(self) -> None:
        self.validate()
        b = self.broker
        state = self.broker_state_dir()
        log_dirs = b.log_dirs
        if b.state_dir != state and log_dirs == [os.path.join(b.state_dir, "logs")]:
            log_dirs = [os.path.join(state, "logs")]   # still the default: under this node's data dir
        object.__setattr__(self, "broker", dataclasses.replace(
            b, broker_id=self.node_id, listeners=self.listeners, state_dir=state, log_dirs=list(log_dirs),
            controller_urls=self.controller_urls()))
        if self.controller.min_insync_replicas != self.broker.min_insync_replicas:
            object.__setattr__(self, "controller", dataclasses.replace(
                self.controller, min_insync_replicas=self.broker.min_insync_replicas))

    def validate(self) -> None:
        if self.node_id < 0:
            raise ValueError(f"node_id must be >= 0, got {self.node_id}; fix node_id in the config")
        if tuple(sorted(self.process_roles)) != PROCESS_ROLES:
            raise ValueError(f"process_roles must be broker,controller (combined mode), got "
                             f"{','.join(self.process_roles)}; kraftlog serve runs both roles")
        if not self.data_dir:
            raise ValueError("data_dir must be a directory; set data_dir or --data-dir")

    # ---- derived ----------------------------------------------------------------------

    @property
    def http_host(self) -> str:
        return self.listeners.http_host

    @property
    def http_port(self) -> int:
        return self.listeners.http_port

    @property
    def controller_port(self) -> int:
        return self.listeners.controller_port

    @property
    def raft_port(self) -> int:
        return self.listeners.raft_port

    @property
    def raft_bind_host(self) -> str | None:
        return self.listeners.raft_bind_host

    @property
    def cluster_id(self) -> str:
        return self.broker.cluster_id

    @property
    def host(self) -> str:
        return self.listeners.host

    @property
    def scheme(self) -> str:
        """https when the node's [security] section turns TLS on (every listener)."""
        return self.broker.security.scheme

    @property
    def broker_url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.http_port}"

    @property
    def controller_url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.controller_port}"

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
            urls.append(f"{self.scheme}://{host}:{cport}")
        return urls

    def controller_data_dir(self) -> str:
        return os.path.join(self.data_dir, f"controller-{self.node_id}")

    def broker_state_dir(self) -> str:
        return os.path.join(self.data_dir, f"broker-{self.node_id}")

    def broker_config(self) -> BrokerConfig:
        """The broker's config (`self.broker`)."""
        return self.broker

    # ---- loading ----------------------------------------------------------------------

    @classmethod
    def setting_names(cls) -> list[str]:
        """Every key a config file or flag may set (flat names)."""
        node = [f.name for f in dataclasses.fields(cls) if f.name not in ("listeners", "broker", "controller")]
        listeners = [f.name for f in dataclasses.fields(ListenerConfig)]
        broker = [n for n in BrokerConfig.setting_names() if n not in DERIVED_BROKER_SETTINGS and n not in listeners]
        return node + listeners + broker + list(CONTROLLER_SETTINGS)

    @classmethod
    def load(cls, path: str | None = None, overrides: dict[str, Any] | None = None) -> "NodeConfig":
        """Defaults, then the file at `path`, then non-None `overrides`."""
        values: dict[str, Any] = {}
        if path:
            values.update(_normalized(read_config_file(path), path))
        for k, v in _normalized(overrides or {}, "command line").items():
            if v is not None:
                values[k] = v
        return cls.from_dict(values, source=path or "command line")

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "config") -> "NodeConfig":
        """Flat settings (keys as in `setting_names()`, `-` and `.` accepted for `_`, old names
        accepted with a DeprecatedSettingWarning) -> the node with its broker and controller."""
        node_fields = {f.name: f for f in dataclasses.fields(cls)}
        listener_fields = {f.name: f for f in dataclasses.fields(ListenerConfig)}
        broker_fields = {f.name: f for f in dataclasses.fields(BrokerConfig)}
        for g, group_cls in GROUPS.items():
            broker_fields.update({f.name: f for f in dataclasses.fields(group_cls)})
        controller_fields = {f.name: f for f in dataclasses.fields(ControllerSettings)}
        node: dict[str, Any] = {}
        listeners: dict[str, Any] = {}
        broker: dict[str, Any] = {}
        controller: dict[str, Any] = {}
        for raw_key, raw in _normalized(values, source).items():
            key = raw_key
            if key in ("listeners", "broker", "controller") or key in GROUPS:
                raise ValueError(f"{source}: {raw_key!r} is a group; give its settings as flat keys "
                                 f"(e.g. http_port, fetch_max_bytes)")
            if key in node_fields:
                node[key] = _coerce(node_fields[key], raw, source, raw_key)
            elif key in listener_fields:
                listeners[key] = _coerce(listener_fields[key], raw, source, raw_key)
            elif key in DERIVED_BROKER_SETTINGS:
                raise ValueError(f"{source}: {raw_key!r} is derived from the node config; set "
                                 f"{DERIVED_BROKER_SETTINGS[key]!r} instead")
            elif key in CONTROLLER_SETTINGS:
                controller[key] = _coerce(controller_fields[key], raw, source, raw_key)
            elif key in broker_fields and key not in GROUPS:
                broker[key] = _coerce(broker_fields[key], raw, source, raw_key)
            else:
                raise ValueError(f"{source}: unknown setting {raw_key!r}; known settings: "
                                 f"{', '.join(sorted(cls.setting_names()))}")
        node_id = node.get("node_id", node_fields["node_id"].default)
        data_dir = node.get("data_dir", node_fields["data_dir"].default)
        state = os.path.join(data_dir, f"broker-{node_id}")
        broker.setdefault("log_dirs", [])
        if not broker["log_dirs"]:
            broker["log_dirs"] = [os.path.join(state, "logs")]
        return cls(**node, listeners=ListenerConfig(**listeners),
                   broker=BrokerConfig(state_dir=state, **broker), controller=ControllerSettings(**controller))


def _normalized(values: dict[str, Any], source: str) -> dict[str, Any]:
    """Keys with `-` and `.` read as `_`, old names replaced by the new ones (with a warning)."""
    out: dict[str, Any] = {}
    given_as: dict[str, str] = {}
    for raw_key, v in values.items():
        key = renamed(raw_key.replace("-", "_").replace(".", "_"), source)
        if key in given_as:
            raise ValueError(f"{source}: {given_as[key]!r} and {raw_key!r} both set {key!r}; keep only {key!r}")
        given_as[key] = raw_key
        out[key] = v
    return out


def _coerce(f: dataclasses.Field, raw: Any, source: str, key: str) -> Any:
    t = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
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
        if t.startswith("tuple"):
            parts = raw.split(",") if isinstance(raw, str) else raw
            return tuple(str(p).strip() for p in parts if str(p).strip())
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
    section = doc.pop("remote_storage", None) if isinstance(doc.get("remote_storage"), dict) else None
    if section is not None:   # TOML/JSON [remote_storage] table: enable, s3_endpoint, ... = remote_storage_<key>
        for k, v in section.items():
            flat = k if k.startswith(("remote_storage_", "remote_log_", "remote_fetch_", "remote_index_")) \
                else f"remote_storage_{k}"
            if flat in doc:
                raise ValueError(f"config file {path!r}: {flat!r} is set both at top level and in [remote_storage]; "
                                 f"keep one")
            doc[flat] = v
    section = doc.pop("security", None) if isinstance(doc.get("security"), dict) else None
    if section is not None:   # TOML/JSON [security] table: its keys are flat settings (tls_cert_file, ...)
        for k, v in section.items():
            if k in doc:
                raise ValueError(f"config file {path!r}: {k!r} is set both at top level and in [security]; keep one")
            doc[k] = v
    return doc
