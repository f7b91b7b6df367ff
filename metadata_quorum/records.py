"""Metadata records: the only things the controller writes to the metadata log.

Each record is a frozen dataclass with a stable `TYPE` name. `to_dict()` gives plain data
(str/int/bool/None/list/dict only) that pysyncobj pickles and the metadata feed sends as
JSON; `record_from_dict()` is its inverse. Records are facts decided by the active
controller: every id, timestamp and epoch is stamped in before proposing, so replay is a
pure function of the record sequence.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Optional

from metadata_quorum.security.records import SECURITY_RECORDS

NO_LEADER = -1


@dataclass(frozen=True)
class RegisterBrokerRecord:
    """A broker process (broker_id, incarnation_id) joined. Its broker epoch is the metadata
    offset of this record; the image stamps it on replay (proposers send -1)."""

    TYPE: ClassVar[str] = "RegisterBroker"
    broker_id: int
    incarnation_id: str
    broker_epoch: int
    url: str
    rack: Optional[str] = None
    fenced: bool = True
    timestamp_ms: int = 0
    kafka_address: Optional[str] = None   # "host:port" of its Kafka listener (None: none)


@dataclass(frozen=True)
class BrokerRegistrationChangeRecord:
    """Changes flags of the registration with this broker epoch (None = unchanged)."""

    TYPE: ClassVar[str] = "BrokerRegistrationChange"
    broker_id: int
    broker_epoch: int
    fenced: Optional[bool] = None
    in_controlled_shutdown: Optional[bool] = None


@dataclass(frozen=True)
class FenceBrokerRecord:
    TYPE: ClassVar[str] = "FenceBroker"
    broker_id: int
    broker_epoch: int


@dataclass(frozen=True)
class UnfenceBrokerRecord:
    TYPE: ClassVar[str] = "UnfenceBroker"
    broker_id: int
    broker_epoch: int


@dataclass(frozen=True)
class TopicRecord:
    TYPE: ClassVar[str] = "Topic"
    name: str
    topic_id: str


@dataclass(frozen=True)
class PartitionRecord:
    TYPE: ClassVar[str] = "Partition"
    topic: str
    topic_id: str
    partition: int
    replicas: tuple
    isr: tuple
    leader: int
    leader_epoch: int = 0
    partition_epoch: int = 0
    adding_replicas: tuple = ()    # a reassignment (KIP-455) in flight, see PartitionChangeRecord
    removing_replicas: tuple = ()


@dataclass(frozen=True)
class PartitionChangeRecord:
    """The full new state of one partition. `partition_epoch` is the previous one + 1 (the
    state machine rejects the batch otherwise: optimistic concurrency); `leader_epoch` is
    bumped exactly when the leader changes. `elr` / `last_known_elr` default to empty, so
    records written before they existed replay unchanged. `adding_replicas` /
    `removing_replicas` (KIP-455): while a reassignment runs, `replicas` is the target
    replicas followed by the removing ones; the target is `replicas` minus `removing_replicas`,
    the original `replicas` minus `adding_replicas` (both empty when nothing moves)."""

    TYPE: ClassVar[str] = "PartitionChange"
    topic: str
    topic_id: str
    partition: int
    replicas: tuple
    isr: tuple
    leader: int
    leader_epoch: int
    partition_epoch: int
    elr: tuple = ()               # eligible leader replicas (KIP-966), see PartitionRegistration
    last_known_elr: tuple = ()
    adding_replicas: tuple = ()
    removing_replicas: tuple = ()


@dataclass(frozen=True)
class RemoveTopicRecord:
    TYPE: ClassVar[str] = "RemoveTopic"
    name: str
    topic_id: str


@dataclass(frozen=True)
class ConfigRecord:
    """Sets (value is a str) or deletes (value None) one config key of a topic or broker."""

    TYPE: ClassVar[str] = "Config"
    resource_type: str  # "topic" | "broker"
    resource_name: str
    key: str
    value: Optional[str]


@dataclass(frozen=True)
class ProducerIdsRecord:
    """A block of producer ids [next_producer_id - block, next_producer_id) was handed to a
    broker; `next_producer_id` is the first id of the next block."""

    TYPE: ClassVar[str] = "ProducerIds"
    broker_id: int
    broker_epoch: int
    next_producer_id: int


@dataclass(frozen=True)
class LeaderChangeRecord:
    """The active controller changed: `leader_id` is its node id, `epoch` the raft term."""

    TYPE: ClassVar[str] = "LeaderChange"
    leader_id: int
    epoch: int


@dataclass(frozen=True)
class BrokerMembershipRecord:
    """A broker's membership state (Redpanda's decommission): "active" (takes new
    replicas), "draining" (cordoned: no new placements, its replicas are being moved away)
    or "decommissioned" (no replicas left: its registration is removed and it may not
    register again until recommissioned)."""

    TYPE: ClassVar[str] = "BrokerMembership"
    broker_id: int
    state: str


BROKER_STATES = ("active", "draining", "decommissioned")


@dataclass(frozen=True)
class NoOpRecord:
    TYPE: ClassVar[str] = "NoOp"


RECORD_TYPES: dict[str, type] = {
    cls.TYPE: cls
    for cls in (
        RegisterBrokerRecord,
        BrokerRegistrationChangeRecord,
        FenceBrokerRecord,
        UnfenceBrokerRecord,
        TopicRecord,
        PartitionRecord,
        PartitionChangeRecord,
        RemoveTopicRecord,
        ConfigRecord,
        ProducerIdsRecord,
        LeaderChangeRecord,
        BrokerMembershipRecord,
        NoOpRecord,
        *SECURITY_RECORDS,   # users, delegation tokens, ACLs (metadata_quorum/security/records.py)
    )
}

_TUPLE_FIELDS = {"replicas", "isr", "elr", "last_known_elr", "adding_replicas", "removing_replicas"}
# Partition fields left out of the plain-data form while empty (their default): a broker's
# fencing changes every partition it is a replica of (100,000 records at 100,000 partitions
# on 3 brokers), and these four are empty in nearly all of them. Readers fill in the default
# (record_from_dict), as for records written before the fields existed.
_OMITTED_WHEN_EMPTY = frozenset({"elr", "last_known_elr", "adding_replicas", "removing_replicas"})


_FIELD_NAMES: dict[type, tuple] = {cls: tuple(f.name for f in dataclasses.fields(cls)) for cls in RECORD_TYPES.values()}
_FIELD_SETS: dict[type, frozenset] = {cls: frozenset(names) for cls, names in _FIELD_NAMES.items()}


def record_to_dict(record: Any) -> dict:
    """Plain-data form: {"type": TYPE, field: value, ...} with lists instead of tuples; the
    partition fields of `_OMITTED_WHEN_EMPTY` are left out while empty."""
    encode = _ENCODERS.get(type(record))
    return _general_to_dict(record) if encode is None else encode(record)


_MISSING = object()
_DEFAULTS: dict[type, dict] = {cls: {f.name: f.default for f in dataclasses.fields(cls)
                                     if f.default is not dataclasses.MISSING}
                               for cls in RECORD_TYPES.values()}


def frozen_instance(cls: type, values: dict) -> Any:
    """An instance of the frozen dataclass `cls` with `values` (every field, in field order)
    as its fields, without its __init__: a frozen dataclass's __init__ sets each field
    through object.__setattr__, which is most of the cost of building one. Only for
    classes without __post_init__ or field validation (the records and registrations)."""
    obj = object.__new__(cls)
    obj.__dict__.update(values)
    return obj


def record_from_dict(data: dict) -> Any:
    """Inverse of `record_to_dict`; raises ValueError for an unknown type or missing field.
    Absent fields take their default; keys that are not fields of the type (a newer
    writer's) are ignored. Runs on the raft thread for every record of every committed
    entry (10,000 for a 10,000-partition create), hence the compiled per-type decoders
    (`_compile_codecs`, built like `frozen_instance`)."""
    try:
        decode = _DECODERS.get(data["type"])
    except (KeyError, TypeError) as exc:
        raise ValueError(f"unknown metadata record {data!r}") from exc
    if decode is None:
        return _general_from_dict(data)   # raises ValueError for an unknown type
    return decode(data)


# ---------------------------------------------------------------- feed runs
# A feed answer may carry consecutive partition records of one topic in their compact form
# (every field but the four omitted while empty) as one "run" of columns (issue 25: a
# fencing at 100,000 partitions is 33,334 such records, 7.7 MB of JSON of which a broker's
# json.loads took 0.1-0.5 s; as runs, about a seventh of that). Only the encoding differs:
# each record keeps its own offset (the run's first offset + its index).
RUN_TYPES = frozenset({"Partition", "PartitionChange"})
RUN_COLUMNS = ("partition", "replicas", "isr", "leader", "leader_epoch", "partition_epoch")


def records_of_run(run: Any) -> list:
    """The records of one feed run {"type", "topic", "topic_id", and a list per RUN_COLUMNS,
    all of one length}: equal to `record_from_dict` of each record's plain-data form. Raises
    ValueError for a malformed run. Equal replica and ISR tuples are shared."""
    try:
        cls = RECORD_TYPES[run["type"]] if run["type"] in RUN_TYPES else None
        topic, topic_id = run["topic"], run["topic_id"]
        columns = [run[c] for c in RUN_COLUMNS]
    except (KeyError, TypeError) as exc:
        raise ValueError(f"malformed feed run: {exc!r} (want type, topic, topic_id and {RUN_COLUMNS})") from None
    if cls is None:
        raise ValueError(f"a feed run of {run['type']!r} records (only {sorted(RUN_TYPES)} come in runs)")
    if any(type(c) is not list for c in columns) or len({len(c) for c in columns}) != 1:
        raise ValueError(f"malformed feed run of {topic!r}: its columns {RUN_COLUMNS} must be lists of one length")
    rest = {name: default for name, default in _DEFAULTS[cls].items()
            if name not in RUN_COLUMNS}   # the fields left out while empty, in field order
    shared: dict = {}
    new = object.__new__
    out = []
    append = out.append
    try:
        for partition, replicas, isr, leader, leader_epoch, partition_epoch in zip(*columns):
            replicas = tuple(replicas)
            replicas = shared.setdefault(replicas, replicas)
            isr = tuple(isr)
            isr = shared.setdefault(isr, isr)
            obj = new(cls)
            obj.__dict__.update({"topic": topic, "topic_id": topic_id, "partition": partition,
                                 "replicas": replicas, "isr": isr, "leader": leader, "leader_epoch": leader_epoch,
                                 "partition_epoch": partition_epoch, **rest})
            append(obj)
    except TypeError as exc:   # a replica list that is not a list of ints (unhashable)
        raise ValueError(f"malformed feed run of {topic!r}: {exc}") from None
    return out


def compact_partition_record(record: Any) -> bool:
    """`record` (a record object) is a partition record whose plain data is the compact form
    (its four `_OMITTED_WHEN_EMPTY` fields empty, replicas and ISR tuples): it can go in a run."""
    empty = _RUN_EMPTY_FIELDS.get(type(record))
    if empty is None:
        return False
    values = record.__dict__
    if type(values["replicas"]) is not tuple or type(values["isr"]) is not tuple:
        return False
    for name in empty:
        if values[name]:
            return False
    return True


# the run types' fields left out of their plain data while empty
_RUN_EMPTY_FIELDS = {RECORD_TYPES[t]: tuple(n for n in _FIELD_NAMES[RECORD_TYPES[t]] if n in _OMITTED_WHEN_EMPTY)
                     for t in RUN_TYPES}
_RUN_MIN_RECORDS = 2   # a lone partition record stays a plain record


def group_runs(records: list) -> list:
    """`records` cut into stretches: (run key (type, topic, topic_id), the records) for each
    stretch of consecutive compact partition records (`compact_partition_record`) of one
    type and topic, (None, [record]) for every other record. Order kept."""
    out: list = []
    key = None
    stretch: list = []
    for record in records:
        if compact_partition_record(record):
            k = (record.TYPE, record.topic, record.topic_id)
            if k != key:
                stretch = []
                key = k
                out.append((k, stretch))
            stretch.append(record)
        else:
            key = None
            out.append((None, [record]))
    return out


def run_of(key: tuple, records: list) -> dict:
    """The run (`records_of_run`'s input) of `records`, one stretch of `group_runs` with its
    key: a list per RUN_COLUMNS (replica and ISR tuples as they are: JSON writes them as
    arrays, pickle keeps them)."""
    rtype, topic, topic_id = key
    return {"type": rtype, "topic": topic, "topic_id": topic_id,
            **{c: [r.__dict__[c] for r in records] for c in RUN_COLUMNS}}


def entry_items(records: list) -> list:
    """The plain data of a raft entry's records: each stretch of at least two consecutive
    compact partition records of one topic as {"run": run} (`run_of`), any other record as `record_to_dict` (issue 25: a fencing at 100,000
    partitions is 33,335 records; as 33,335 dicts the active controller built them, pickled
    them and each controller unpickled and decoded them one by one on the failover's
    critical path). `entry_records` reads it back; entries written record by record (older
    journals, tests) read the same way."""
    out: list = []
    for key, stretch in group_runs(records):
        if key is not None and len(stretch) >= _RUN_MIN_RECORDS:
            out.append({"run": run_of(key, stretch)})
        else:
            out.extend(record_to_dict(r) for r in stretch)
    return out


def entry_records(items: list) -> list:
    """The records of a raft entry's plain data (`entry_items`, or one dict per record).
    Raises ValueError for a malformed item."""
    out: list = []
    for item in items:
        run = item.get("run") if type(item) is dict else None
        if run is not None:
            out.extend(records_of_run(run))
        else:
            out.append(record_from_dict(item))
    return out


def entry_record_count(items: Any) -> int:
    """How many records a raft entry's plain data holds (a run counts each of its records)."""
    n = 0
    for item in items or ():
        run = item.get("run") if type(item) is dict else None
        n += len(run.get("partition") or ()) if type(run) is dict else 1
    return n


# ---------------------------------------------------------------- per-type codecs
# record_to_dict / record_from_dict run for every record of every entry: on the active
# controller (propose), on each controller's raft apply, and on each broker's FeedState (a
# fencing at 100,000 partitions: 33,334 records on each of 5 processes). Each type gets a
# function compiled from its field list that does exactly what the general loops above do,
# without the loop: 1.7 -> 1.0 us per partition record decoded.
def _general_to_dict(record: Any) -> dict:
    out: dict = {"type": record.TYPE}
    values = record.__dict__
    for name in _FIELD_NAMES[type(record)]:
        value = values[name]
        if type(value) is tuple:
            if not value and name in _OMITTED_WHEN_EMPTY:
                continue
            value = list(value)
        out[name] = value
    return out


def _general_from_dict(data: dict) -> Any:
    try:
        cls = RECORD_TYPES[data["type"]]
    except (KeyError, TypeError) as exc:
        raise ValueError(f"unknown metadata record {data!r}") from exc
    defaults = _DEFAULTS[cls]
    values = {}
    for name in _FIELD_NAMES[cls]:
        value = data.get(name, _MISSING)
        if value is _MISSING:
            value = defaults.get(name, _MISSING)
            if value is _MISSING:
                raise ValueError(f"malformed {cls.TYPE} record {data!r}: the field {name!r} is missing")
        elif name in _TUPLE_FIELDS and value is not None:
            value = tuple(value)
        values[name] = value
    return frozen_instance(cls, values)


def _missing_field(cls: type, data: dict, name: str) -> None:
    raise ValueError(f"malformed {cls.TYPE} record {data!r}: the field {name!r} is missing")


def _compile_codecs(cls: type) -> tuple:
    """(to_dict, from_dict) of `cls`, equal to `_general_to_dict` / `_general_from_dict`."""
    names = _FIELD_NAMES[cls]
    defaults = _DEFAULTS[cls]
    env: dict = {"cls": cls, "new": object.__new__, "MISSING": _MISSING, "missing": _missing_field,
                 "tuple": tuple, "list": list}
    enc = ["def to_dict(record):", "    v = record.__dict__", f"    out = {{'type': {cls.TYPE!r}}}"]
    dec = ["def from_dict(data):", "    get = data.get"]
    for i, name in enumerate(names):
        enc.append(f"    x = v[{name!r}]")
        enc.append("    if x.__class__ is tuple:")
        if name in _OMITTED_WHEN_EMPTY:
            enc.append(f"        if x:\n            out[{name!r}] = list(x)")
            enc.append(f"    else:\n        out[{name!r}] = x")
        else:
            enc.append("        x = list(x)")
            enc.append(f"    out[{name!r}] = x")
        if name in defaults:
            env[f"d{i}"] = defaults[name]
            dec.append(f"    x{i} = get({name!r}, MISSING)")
            dec.append(f"    if x{i} is MISSING:\n        x{i} = d{i}")
            if name in _TUPLE_FIELDS:
                dec.append(f"    elif x{i} is not None:\n        x{i} = tuple(x{i})")
        else:
            dec.append(f"    x{i} = get({name!r}, MISSING)")
            dec.append(f"    if x{i} is MISSING:\n        missing(cls, data, {name!r})")
            if name in _TUPLE_FIELDS:
                dec.append(f"    elif x{i} is not None:\n        x{i} = tuple(x{i})")
    enc.append("    return out")
    dec.append("    obj = new(cls)")
    dec.append("    obj.__dict__.update({" + ", ".join(f"{n!r}: x{i}" for i, n in enumerate(names)) + "})")
    dec.append("    return obj")
    exec("\n".join(enc) + "\n\n" + "\n".join(dec), env)   # noqa: S102 - our own field names only
    return env["to_dict"], env["from_dict"]


_ENCODERS: dict[type, Any] = {}
_DECODERS: dict[str, Any] = {}
for _cls in RECORD_TYPES.values():
    _ENCODERS[_cls], _DECODERS[_cls.TYPE] = _compile_codecs(_cls)



def _to_dict(self) -> dict:
    return record_to_dict(self)


for _cls in RECORD_TYPES.values():
    _cls.to_dict = _to_dict  # type: ignore[attr-defined]
    _cls.from_dict = staticmethod(record_from_dict)  # type: ignore[attr-defined]
