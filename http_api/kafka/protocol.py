"""Kafka wire protocol plumbing over `kio`'s generated codecs: the API versions this
listener serves, request header parsing, response encoding, and `build()`, which turns plain
dicts into kio's per-version response entities (fields a version lacks are dropped, so one
handler serves every version of its API).

Versions (DESIGN.md section 10): ranges every client we test accepts, all name-based (no
topic ids). ApiVersions answers always use response header v0; other answers use header v1
when their version is flexible.
"""
from __future__ import annotations

import dataclasses
import datetime
import importlib
import io
import struct
import typing
from functools import lru_cache
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode as KafkaErrorCode
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i32Timedelta, i64Timedelta

from partitions.errors import ErrorCode, KraftlogError

# API key -> (name, min version, max version)
API_VERSIONS: dict[int, tuple[str, int, int]] = {
    0: ("Produce", 3, 11),
    1: ("Fetch", 4, 12),
    2: ("ListOffsets", 1, 7),
    3: ("Metadata", 0, 12),
    8: ("OffsetCommit", 2, 8),
    9: ("OffsetFetch", 1, 7),
    10: ("FindCoordinator", 0, 3),
    11: ("JoinGroup", 0, 7),
    12: ("Heartbeat", 0, 4),
    13: ("LeaveGroup", 0, 4),
    14: ("SyncGroup", 0, 5),
    15: ("DescribeGroups", 0, 5),
    16: ("ListGroups", 0, 4),
    17: ("SaslHandshake", 0, 1),        # only with SASL on; after v0, unframed tokens (KIP-43)
    18: ("ApiVersions", 0, 3),
    19: ("CreateTopics", 2, 7),
    20: ("DeleteTopics", 1, 5),
    21: ("DeleteRecords", 0, 2),
    22: ("InitProducerId", 0, 4),
    23: ("OffsetForLeaderEpoch", 2, 4),
    24: ("AddPartitionsToTxn", 0, 3),   # v4+: KIP-890's broker-to-broker batches, not served
    25: ("AddOffsetsToTxn", 0, 3),
    26: ("EndTxn", 0, 3),               # v4+: KIP-890 transaction version 2, not served
    28: ("TxnOffsetCommit", 0, 3),
    32: ("DescribeConfigs", 1, 4),
    36: ("SaslAuthenticate", 0, 2),     # only with SASL on
    37: ("CreatePartitions", 0, 3),
    42: ("DeleteGroups", 0, 2),
    44: ("IncrementalAlterConfigs", 0, 1),
    60: ("DescribeCluster", 0, 1),
}
API_VERSIONS_KEY = 18
PRODUCE_KEY = 0

_H = struct.Struct(">hhi")   # api_key, api_version, correlation_id
_I16 = struct.Struct(">h")


class FrameError(Exception):
    """A request this listener cannot even frame or parse: the connection is closed."""


@dataclasses.dataclass(slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body_offset: int
    principal: str | None = None   # the SASL-authenticated principal (None: authentication off)


def peek_header(frame: bytes) -> tuple[int, int, int]:
    """(api_key, api_version, correlation_id) of a request frame (FrameError when shorter)."""
    if len(frame) < 8:
        raise FrameError(f"request of {len(frame)} bytes is shorter than a request header")
    return _H.unpack_from(frame, 0)


def _read_uvarint(buf, pos: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        if pos >= len(buf):
            raise FrameError("truncated unsigned varint in the request header")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
        if shift > 35:
            raise FrameError("unsigned varint too long in the request header")


def parse_header(frame: bytes, flexible: bool) -> RequestHeader:
    """Request header v1 (v2 when the request version is flexible: tagged fields follow)."""
    api_key, api_version, correlation_id = peek_header(frame)
    pos = 8
    if len(frame) < pos + 2:
        raise FrameError("truncated client_id in the request header")
    (n,) = _I16.unpack_from(frame, pos)
    pos += 2
    client_id = None
    if n >= 0:
        if len(frame) < pos + n:
            raise FrameError("truncated client_id in the request header")
        client_id = bytes(frame[pos:pos + n]).decode("utf-8", "replace")
        pos += n
    if flexible:
        count, pos = _read_uvarint(frame, pos)
        for _ in range(count):
            _tag, pos = _read_uvarint(frame, pos)
            size, pos = _read_uvarint(frame, pos)
            pos += size
        if pos > len(frame):
            raise FrameError("truncated tagged fields in the request header")
    return RequestHeader(api_key, api_version, correlation_id, client_id, pos)


@lru_cache(maxsize=None)
def request_type(api_key: int, version: int):
    return load_request_schema(api_key, version)


@lru_cache(maxsize=None)
def response_type(api_key: int, version: int):
    return load_response_schema(api_key, version)


@lru_cache(maxsize=None)
def _reader(cls):
    return entity_reader(cls)


@lru_cache(maxsize=None)
def _writer(cls):
    return entity_writer(cls)


def decode_request(frame: bytes, header: RequestHeader) -> Any:
    """The request body as kio's entity (FrameError when it does not parse)."""
    cls = request_type(header.api_key, header.api_version)
    try:
        entity, _size = _reader(cls)(memoryview(frame)[header.body_offset:], 0)
    except Exception as e:  # noqa: BLE001 - kio raises several error types for bad input
        raise FrameError(f"cannot decode {cls.__name__} v{header.api_version}: {type(e).__name__}: {e}") from None
    return entity


def encode_response(api_key: int, version: int, correlation_id: int, entity: Any) -> bytes:
    """Size-prefixed response frame: header v0 (ApiVersions, non-flexible) or v1, then the body."""
    cls = response_type(api_key, version)
    buf = io.BytesIO()
    buf.write(b"\x00\x00\x00\x00")
    buf.write(struct.pack(">i", correlation_id))
    if cls.__flexible__ and api_key != API_VERSIONS_KEY:
        buf.write(b"\x00")
    _writer(cls)(buf, entity)
    out = buf.getbuffer()
    struct.pack_into(">i", out, 0, len(out) - 4)
    return bytes(out)


# ---------------------------------------------------------------------- building answers

_DEFAULT = object()
_ZERO_MS = datetime.timedelta(0)


@lru_cache(maxsize=None)
def _fields(cls) -> tuple:
    out = []
    for f in dataclasses.fields(cls):
        t = f.type
        kind = "plain"
        elem = None
        nullable = type(None) in typing.get_args(t)
        has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        if t in (i32Timedelta, i64Timedelta):
            kind = "ms"
        elif t is KafkaErrorCode:
            kind = "error"
        else:
            origin = typing.get_origin(t)
            args = typing.get_args(t)
            if origin is typing.Union or str(origin) == "<class 'types.UnionType'>":
                args = tuple(a for a in args if a is not type(None))
                t2 = args[0] if args else t
                origin, args = typing.get_origin(t2), typing.get_args(t2)
                t = t2
            if origin is tuple and args and dataclasses.is_dataclass(args[0]):
                kind, elem = "entities", args[0]
            elif dataclasses.is_dataclass(t):
                kind, elem = "entity", t
            elif t in (i32Timedelta, i64Timedelta):
                kind = "ms"
        required_tuple = (f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
                          and typing.get_origin(f.type) is tuple)
        if nullable:
            fill = None
        elif has_default:
            fill = _DEFAULT
        elif t is str or (isinstance(t, type) and issubclass(t, str)):
            fill = ""
        elif typing.get_origin(t) is tuple:
            fill = ()
        else:
            fill = None
        out.append((f.name, kind, elem, required_tuple, fill))
    return tuple(out)


def build(cls, values: dict) -> Any:
    """kio entity `cls` from a dict; keys the version lacks are ignored, required lists not
    given are empty, nested entities may be dicts (or lists of dicts), ints become ErrorCode /
    timedelta where the schema says so."""
    kw = {}
    for name, kind, elem, required_tuple, fill in _fields(cls):
        if name not in values:
            if required_tuple:   # a list the answer has nothing for: empty
                kw[name] = ()
            elif kind == "ms" and fill is not _DEFAULT:   # throttle_time and the like
                kw[name] = _ZERO_MS
            continue
        v = values[name]
        if v is None:
            if fill is not _DEFAULT:   # None where the version has no null: "" / () / the default
                kw[name] = fill
        elif kind == "plain":
            kw[name] = v
        elif kind == "error":
            kw[name] = v if isinstance(v, KafkaErrorCode) else KafkaErrorCode(int(v))
        elif kind == "ms":
            kw[name] = v if isinstance(v, datetime.timedelta) else datetime.timedelta(milliseconds=int(v))
        elif kind == "entities":
            kw[name] = tuple(x if not isinstance(x, dict) else build(elem, x) for x in v)
        else:
            kw[name] = v if not isinstance(v, dict) else build(elem, v)
    return cls(**kw)


def response_module(api_key: int, version: int):
    return importlib.import_module(response_type(api_key, version).__module__)


# ---------------------------------------------------------------------- errors

_BY_NAME = {e.name.upper(): e for e in KafkaErrorCode}


class Denied(KraftlogError):
    """An ACL denial on the Kafka listener: Kafka's *_AUTHORIZATION_FAILED of the resource type
    (a transactional id has its own code, TRANSACTIONAL_ID_AUTHORIZATION_FAILED)."""

    _KAFKA = {"TOPIC": KafkaErrorCode.topic_authorization_failed, "GROUP": KafkaErrorCode.group_authorization_failed,
              "CLUSTER": KafkaErrorCode.cluster_authorization_failed,
              "TRANSACTIONAL_ID": KafkaErrorCode.transactional_id_authorization_failed}

    def __init__(self, resource_type, message: str) -> None:
        name = getattr(resource_type, "name", str(resource_type))
        code = {"TOPIC": ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                "GROUP": ErrorCode.GROUP_AUTHORIZATION_FAILED}.get(name, ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
        super().__init__(code, message)
        self.kafka_code = self._KAFKA[name]


def kafka_error(code: ErrorCode | KraftlogError | None) -> KafkaErrorCode:
    """Kafka's numeric error for one of kraftlog's codes (kraftlog uses Kafka's names;
    UNSUPPORTED_MEDIA_TYPE, an HTTP-only code, is INVALID_REQUEST; UNKNOWN_SERVER_ERROR when
    Kafka has no such name)."""
    if code is None:
        return KafkaErrorCode.none
    if isinstance(code, Denied):
        return code.kafka_code
    if isinstance(code, KraftlogError):
        code = code.code
    if code is ErrorCode.UNSUPPORTED_MEDIA_TYPE:
        return KafkaErrorCode.invalid_request
    return _BY_NAME.get(code.name, KafkaErrorCode.unknown_server_error)
