"""Options of the `kraftlog` Spark data source and the pure offset arithmetic behind them.

Mirrors Spark's Kafka source: `kraftlog.bootstrap.servers`, `subscribe` / `subscribePattern`
/ `assign`, `startingOffsets`, `endingOffsets`, `startingTimestamp`,
`maxOffsetsPerTrigger`, `failOnDataLoss`, `includeHeaders`, `minPartitions`,
`maxRecordsPerPartition`. Spark may hand the options over with lower-cased keys, so every
lookup here is case-insensitive. A secured cluster (API.md, Security): `kraftlog.user` with
`kraftlog.password`, or `kraftlog.token`, and `kraftlog.ca_file` for https brokers.

Offsets travel through Spark's checkpoint as JSON `{"topic": {"0": 12, "1": 40}}`: topics
sorted by name, partitions sorted numerically, string keys. Spark compares offsets by their
JSON text, so the order must be deterministic. No IO in this module.
"""
from __future__ import annotations

import dataclasses
import json
import re
from typing import Iterable, Mapping

EARLIEST = -2  # as in Kafka's JSON offsets: -2 earliest, -1 latest
LATEST = -1

max_records_per_partition_default = 2_000_000
fetch_max_bytes_default = 4 * 1024 * 1024
fetch_timeout_ms_default = 120_000
producer_batch_bytes_default = 1024 * 1024
producer_linger_records_default = 50_000
idempotence_buffer_max_bytes_default = 512 * 1024 * 1024  # rows one idempotent task may hold (sorted before sending)

TopicPartition = tuple  # (topic: str, partition: int)


@dataclasses.dataclass(frozen=True)
class ClientSecurity:
    """Credentials and CA file of the source and sink (picklable: travels to executors).
    Its repr hides the password and the token."""

    user: str | None = None
    password: str | None = None
    token: str | None = None
    ca_file: str | None = None

    def __repr__(self) -> str:
        return (f"ClientSecurity(user={self.user!r}, password={'***' if self.password else None}, "
                f"token={'***' if self.token else None}, ca_file={self.ca_file!r})")

    def headers(self) -> dict:
        """The Authorization header of every request (a token wins over user/password)."""
        import base64
        if self.token:
            return {"Authorization": f"Bearer {self.token}"}
        if self.user:
            cred = base64.b64encode(f"{self.user}:{self.password}".encode()).decode("ascii")
            return {"Authorization": f"Basic {cred}"}
        return {}


def parse_client_security(options: Mapping[str, str]) -> ClientSecurity:
    """`kraftlog.user` + `kraftlog.password`, or `kraftlog.token`; `kraftlog.ca_file`."""
    opts = _lower(options)
    sec = ClientSecurity(user=opts.get("kraftlog.user") or None, password=opts.get("kraftlog.password"),
                         token=opts.get("kraftlog.token") or None, ca_file=opts.get("kraftlog.ca_file") or None)
    if sec.user and sec.password is None and not sec.token:
        raise OptionError(f"option 'kraftlog.user' ({sec.user}) needs 'kraftlog.password' (or use 'kraftlog.token')")
    if sec.password is not None and not sec.user:
        raise OptionError("option 'kraftlog.password' needs 'kraftlog.user'")
    return sec


class OptionError(ValueError):
    """A data source option is missing or malformed; the message names the option."""


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): v for k, v in dict(options).items()}


def _bool(value, name: str) -> bool:
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise OptionError(f"option {name!r} must be true or false, got {value!r}")


def _int(value, name: str, minimum: int = 0) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        raise OptionError(f"option {name!r} must be an integer, got {value!r}") from None
    if number < minimum:
        raise OptionError(f"option {name!r} must be >= {minimum}, got {number}")
    return number


@dataclasses.dataclass(frozen=True)
class OffsetSpec:
    """Where to start or end: `kind` is 'earliest', 'latest', 'offsets' or 'timestamp'.

    For 'offsets', `offsets` maps (topic, partition) to an offset (or EARLIEST / LATEST);
    for 'timestamp', `timestamp_ms` applies to every partition and `timestamps` (from
    startingOffsetsByTimestamp) to listed ones.
    """

    kind: str
    offsets: tuple = ()  # ((topic, partition, offset), ...)
    timestamp_ms: int | None = None
    timestamps: tuple = ()  # ((topic, partition, ms), ...)

    def offset_map(self) -> dict:
        return {(t, p): o for t, p, o in self.offsets}

    def timestamp_map(self) -> dict:
        return {(t, p): ms for t, p, ms in self.timestamps}


def parse_partition_json(text: str, name: str) -> tuple:
    """`{"t": {"0": 23, "1": -2}}` -> ((t, 0, 23), (t, 1, -2)) sorted."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise OptionError(f"option {name!r} must be 'earliest', 'latest' or JSON like "
                          f'{{"topic": {{"0": 23}}}}: {exc}') from None
    if not isinstance(data, dict):
        raise OptionError(f"option {name!r} must be a JSON object of topic -> partition -> value")
    out = []
    for topic, parts in data.items():
        if not isinstance(parts, dict):
            raise OptionError(f"option {name!r}: topic {topic!r} must map partition ids to values")
        for part, value in parts.items():
            try:
                out.append((str(topic), int(part), int(value)))
            except (TypeError, ValueError):
                raise OptionError(f"option {name!r}: bad entry {topic!r}/{part!r}: {value!r}") from None
    return tuple(sorted(out))


def parse_offset_spec(options: dict, name: str, default: str) -> OffsetSpec:
    raw = options.get(name.lower())
    text = (raw if raw is not None else default).strip()
    if text.lower() in ("earliest", "latest"):
        return OffsetSpec(kind=text.lower())
    return OffsetSpec(kind="offsets", offsets=parse_partition_json(text, name))


def parse_assign(text: str) -> tuple:
    """`{"topic": [0, 1]}` -> ((topic, 0), (topic, 1))."""
    try:
        data = json.loads(text)
        pairs = sorted((str(t), int(p)) for t, parts in data.items() for p in parts)
    except (ValueError, AttributeError, TypeError) as exc:
        raise OptionError(f'option \'assign\' must be JSON like {{"topic": [0, 1]}}: {exc}') from None
    if not pairs:
        raise OptionError("option 'assign' names no partition")
    return tuple(pairs)


@dataclasses.dataclass(frozen=True)
class SourceOptions:
    """Parsed read options (picklable: travels to executors inside InputPartitions)."""

    bootstrap_servers: tuple
    subscribe: tuple = ()
    subscribe_pattern: str | None = None
    assign: tuple = ()
    starting: OffsetSpec = OffsetSpec("latest")
    ending: OffsetSpec = OffsetSpec("latest")
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    include_headers: bool = False
    min_partitions: int = 0
    max_records_per_partition: int = max_records_per_partition_default
    fetch_max_bytes: int = fetch_max_bytes_default
    fetch_timeout_ms: int = fetch_timeout_ms_default
    security: ClientSecurity = ClientSecurity()

    def wants(self, topic: str, partition: int) -> bool:
        """Whether (topic, partition) is part of this source's subscription."""
        if self.assign:
            return (topic, partition) in self.assign
        if self.subscribe:
            return topic in self.subscribe
        return re.fullmatch(self.subscribe_pattern, topic) is not None


def bootstrap_servers(options: Mapping[str, str]) -> tuple:
    opts = _lower(options)
    raw = opts.get("kraftlog.bootstrap.servers") or opts.get("bootstrap.servers")
    if not raw:
        raise OptionError("option 'kraftlog.bootstrap.servers' is required: comma-separated "
                          "broker URLs such as http://127.0.0.1:8082")
    urls = []
    for url in raw.split(","):
        url = url.strip().rstrip("/")
        if not url:
            continue
        if "://" not in url:
            url = "http://" + url
        urls.append(url)
    if not urls:
        raise OptionError("option 'kraftlog.bootstrap.servers' names no broker URL")
    return tuple(urls)


def parse_source_options(options: Mapping[str, str], streaming: bool) -> SourceOptions:
    """Validate read options; batch reads default to earliest..latest, streams to latest."""
    opts = _lower(options)
    given = [k for k in ("subscribe", "subscribepattern", "assign") if opts.get(k)]
    if len(given) != 1:
        raise OptionError("exactly one of 'subscribe', 'subscribePattern' or 'assign' must be set "
                          f"(got {given or 'none'})")
    subscribe = tuple(sorted({t.strip() for t in opts.get("subscribe", "").split(",") if t.strip()}))
    pattern = opts.get("subscribepattern")
    if pattern:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise OptionError(f"option 'subscribePattern' is not a regular expression: {exc}") from None
    assign = parse_assign(opts["assign"]) if opts.get("assign") else ()
    if opts.get("subscribe") and not subscribe:
        raise OptionError("option 'subscribe' names no topic")

    if opts.get("startingtimestamp") is not None:
        starting = OffsetSpec(kind="timestamp",
                              timestamp_ms=_int(opts["startingtimestamp"], "startingTimestamp"))
    elif opts.get("startingoffsetsbytimestamp") is not None:
        starting = OffsetSpec(kind="timestamp", timestamps=parse_partition_json(
            opts["startingoffsetsbytimestamp"], "startingOffsetsByTimestamp"))
    else:
        starting = parse_offset_spec(opts, "startingOffsets", "latest" if streaming else "earliest")
    if streaming and opts.get("endingoffsets") is not None:
        raise OptionError("option 'endingOffsets' is for batch queries only; a stream never ends")
    ending = parse_offset_spec(opts, "endingOffsets", "latest")
    if not streaming:
        if starting.kind == "latest":
            raise OptionError("startingOffsets='latest' is not valid for a batch query: "
                              "it would always be empty; use 'earliest' or explicit offsets")
        if ending.kind == "earliest":
            raise OptionError("endingOffsets='earliest' is not valid for a batch query")
        if any(o == EARLIEST for _, _, o in ending.offsets):
            raise OptionError("endingOffsets cannot use -2 (earliest); use -1 (latest) or an offset")
    max_per_trigger = opts.get("maxoffsetspertrigger")
    return SourceOptions(
        bootstrap_servers=bootstrap_servers(options),
        subscribe=subscribe,
        subscribe_pattern=pattern,
        assign=assign,
        starting=starting,
        ending=ending,
        max_offsets_per_trigger=(None if max_per_trigger is None
                                 else _int(max_per_trigger, "maxOffsetsPerTrigger", 1)),
        fail_on_data_loss=_bool(opts.get("failondataloss", "true"), "failOnDataLoss"),
        include_headers=_bool(opts.get("includeheaders", "false"), "includeHeaders"),
        min_partitions=_int(opts.get("minpartitions", 0), "minPartitions"),
        max_records_per_partition=_int(opts.get("maxrecordsperpartition",
                                                max_records_per_partition_default),
                                       "maxRecordsPerPartition", 1),
        fetch_max_bytes=_int(opts.get("kraftlog.fetch.max.bytes", fetch_max_bytes_default),
                             "kraftlog.fetch.max.bytes", 1024),
        fetch_timeout_ms=_int(opts.get("kraftlog.fetch.timeout.ms", fetch_timeout_ms_default),
                              "kraftlog.fetch.timeout.ms", 1),
        security=parse_client_security(options),
    )


@dataclasses.dataclass(frozen=True)
class SinkOptions:
    """Parsed write options: default topic, acks, compression, request size."""

    bootstrap_servers: tuple
    topic: str | None = None
    acks: str = "all"
    compression: str = "none"
    batch_bytes: int = producer_batch_bytes_default
    linger_records: int = producer_linger_records_default
    idempotence: bool = True
    idempotence_buffer_max_bytes: int = idempotence_buffer_max_bytes_default
    checkpoint_location: str | None = None    # streaming: where the writer keeps its producer id
    failpoint_fail_after_requests: int = 0    # testing: attempt 0 of each task dies after N requests
    transactional_id: str | None = None       # prefix: each task writes one transaction (pipelines/sink.py)
    security: ClientSecurity = ClientSecurity()


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    opts = _lower(options)
    acks = str(opts.get("kraftlog.acks", opts.get("acks", "all"))).strip().lower()
    if acks not in ("0", "1", "all", "-1"):
        raise OptionError(f"option 'kraftlog.acks' must be 0, 1 or all, got {acks!r}")
    compression = str(opts.get("kraftlog.compression.type", "none")).strip().lower()
    if compression not in ("none", "gzip", "lz4", "zstd", "snappy"):
        raise OptionError("option 'kraftlog.compression.type' must be none, gzip, lz4 or zstd")
    return SinkOptions(
        bootstrap_servers=bootstrap_servers(options),
        topic=opts.get("topic") or None,
        acks="all" if acks == "-1" else acks,
        compression=compression,
        batch_bytes=_int(opts.get("kraftlog.batch.size", producer_batch_bytes_default),
                         "kraftlog.batch.size", 1024),
        linger_records=_int(opts.get("kraftlog.linger.records", producer_linger_records_default),
                            "kraftlog.linger.records", 1),
        idempotence=_bool(opts.get("kraftlog.enable.idempotence", "true"), "kraftlog.enable.idempotence"),
        idempotence_buffer_max_bytes=_int(opts.get("kraftlog.idempotence.buffer.max.bytes",
                                                   idempotence_buffer_max_bytes_default),
                                          "kraftlog.idempotence.buffer.max.bytes", 1024),
        checkpoint_location=opts.get("checkpointlocation") or None,
        failpoint_fail_after_requests=_int(opts.get("kraftlog.failpoint.first.attempt.fail.after.requests", 0),
                                           "kraftlog.failpoint.first.attempt.fail.after.requests", 0),
        security=parse_client_security(options),
        transactional_id=opts.get("kraftlog.transactional.id") or None,
    )


# ---- offsets as Spark checkpoints them -------------------------------------------------

def to_offset_json(offsets: Mapping) -> dict:
    """{(topic, partition): offset} -> {"topic": {"0": o, ...}} in deterministic order."""
    out: dict = {}
    for (topic, part) in sorted(offsets):
        out.setdefault(topic, {})[str(part)] = int(offsets[(topic, part)])
    return out


def from_offset_json(data: Mapping | None) -> dict:
    """Inverse of to_offset_json; tolerates None (no offset yet)."""
    out = {}
    for topic, parts in (data or {}).items():
        for part, off in parts.items():
            out[(topic, int(part))] = int(off)
    return out


def rate_limit(start: Mapping, latest: Mapping, max_rows: int) -> dict:
    """Admission control: advance at most `max_rows` records in total past `start`.

    Like Kafka's source, each partition gets a share proportional to its backlog (floor),
    and the rounding remainder goes to partitions in (topic, partition) order, so the
    total is exactly min(max_rows, backlog) and every call makes progress when data waits.
    """
    backlog = {tp: max(0, latest[tp] - start.get(tp, latest[tp])) for tp in latest}
    total = sum(backlog.values())
    if total <= max_rows:
        return dict(latest)
    end = {}
    granted = 0
    for tp in sorted(latest):
        share = (backlog[tp] * max_rows) // total
        end[tp] = start.get(tp, latest[tp]) + share
        granted += share
    for tp in sorted(latest):
        if granted >= max_rows:
            break
        room = latest[tp] - end[tp]
        extra = min(room, max_rows - granted)
        end[tp] += extra
        granted += extra
    return end


def split_range(start: int, end: int, max_records: int, pieces: int = 1) -> list:
    """Cut [start, end) into contiguous ranges of at most `max_records`, at least `pieces`."""
    size = end - start
    if size <= 0:
        return []
    count = max(pieces, -(-size // max_records))
    count = min(count, size)
    step, extra = divmod(size, count)
    ranges, lo = [], start
    for i in range(count):
        hi = lo + step + (1 if i < extra else 0)
        ranges.append((lo, hi))
        lo = hi
    return ranges


def sorted_partitions(pairs: Iterable) -> list:
    return sorted(pairs, key=lambda tp: (tp[0], tp[1]))
