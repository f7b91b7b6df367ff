"""Wire codecs of the broker HTTP API: JSON, CBOR and raw record batches.

- `parse_produce_body` turns a produce request body into `ProduceRecord`s (JSON / CBOR) or
  validated raw batch bytes (`application/vnd.kraftlog.batch`). It checks every field's
  type and names the offending field in a 400, before anything is stored.
- `render_fetch` turns stored batch bytes into the JSON / CBOR response shape, or passes the
  bytes through untouched for raw-batch clients (offsets in `X-Kraftlog-*` headers).
- Content negotiation: requests by `Content-Type`, responses by `Accept`.
"""
from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from typing import Any

import cbor2

from partitions.errors import ErrorCode, KraftlogError
from partitions.log import record_batch as rb

JSON = "application/json"
CBOR = "application/cbor"
RAW_BATCH = "application/vnd.kraftlog.batch"
FORM_URLENCODED = "application/x-www-form-urlencoded"

HEADER_HIGH_WATERMARK = "X-Kraftlog-High-Watermark"
HEADER_NEXT_OFFSET = "X-Kraftlog-Next-Offset"
HEADER_LOG_START_OFFSET = "X-Kraftlog-Log-Start-Offset"

_RECORD_FIELDS = {"key", "value", "key_b64", "value_b64", "headers", "partition", "timestamp"}


@dataclass(slots=True)
class ProduceRecord:
    """One record of a JSON/CBOR produce request, bytes already decoded."""

    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    partition: int | None = None
    timestamp: int | None = None


def media_type(content_type: str | None) -> str:
    """`application/json; charset=utf-8` -> `application/json` (empty means JSON)."""
    if not content_type:
        return JSON
    mt = content_type.split(";", 1)[0].strip().lower() or JSON
    # `curl -d '{...}'` sends this by default; the body is JSON, so treat it as such
    return JSON if mt == FORM_URLENCODED else mt


def negotiate_response_type(accept: str | None, request_type: str = JSON) -> str:
    """Pick the response media type from Accept; without one, answer like the request
    (CBOR for CBOR; JSON for JSON and raw batches)."""
    if accept:
        for part in accept.split(","):
            mt = part.split(";", 1)[0].strip().lower()
            if mt in (JSON, CBOR, RAW_BATCH):
                return mt
            if mt in ("*/*", "application/*"):
                break
    return CBOR if request_type == CBOR else JSON


def _bad(field_name: str, message: str, code: ErrorCode = ErrorCode.INVALID_RECORD) -> KraftlogError:
    return KraftlogError(code, f"{field_name}: {message}", field=field_name)


# ---- request bodies --------------------------------------------------------------------

def decode_document(content_type: str, body: bytes) -> Any:
    """Parse a JSON or CBOR request body; 400 INVALID_REQUEST when malformed."""
    mt = media_type(content_type)
    if mt == JSON:
        try:
            return json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError) as e:
            raise KraftlogError(ErrorCode.INVALID_REQUEST,
                                f"request body is not valid JSON ({e}); send a JSON object") from None
    if mt == CBOR:
        try:
            return cbor2.loads(body)
        except Exception as e:  # cbor2 raises several types on garbage
            raise KraftlogError(ErrorCode.INVALID_REQUEST,
                                f"request body is not valid CBOR ({e}); send a CBOR map") from None
    raise KraftlogError(ErrorCode.UNSUPPORTED_MEDIA_TYPE,
                        f"Content-Type {mt!r} is not supported here; use {JSON} or {CBOR}")


def _bytes_field(rec: dict, name: str, idx: int, binary_ok: bool) -> bytes | None:
    b64 = name + "_b64"
    where = f"records[{idx}]"
    if name in rec and b64 in rec:
        raise _bad(f"{where}.{name}", f"give either {name!r} or {b64!r}, not both")
    if b64 in rec:
        v = rec[b64]
        if v is None:
            return None
        if not isinstance(v, str):
            raise _bad(f"{where}.{b64}", f"must be a base64 string or null, got {type(v).__name__}")
        try:
            return base64.b64decode(v, validate=True)
        except (binascii.Error, ValueError):
            raise _bad(f"{where}.{b64}", "is not valid base64") from None
    v = rec.get(name)
    if v is None:
        return None
    if isinstance(v, str):
        return v.encode("utf-8", "surrogatepass")
    if binary_ok and isinstance(v, (bytes, bytearray)):
        return bytes(v)
    kinds = "a string, a byte string or null" if binary_ok else "a string or null (use " + b64 + " for bytes)"
    raise _bad(f"{where}.{name}", f"must be {kinds}, got {type(v).__name__}")


def _int_field(rec: dict, name: str, idx: int) -> int | None:
    v = rec.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise _bad(f"records[{idx}].{name}", f"must be an integer, got {type(v).__name__}")
    if v < 0:
        raise _bad(f"records[{idx}].{name}", f"must be >= 0, got {v}")
    return v


def parse_records(doc: Any, *, binary_ok: bool, max_records: int) -> list[ProduceRecord]:
    """Validate a decoded `{"records": [...]}` document into ProduceRecords."""
    if not isinstance(doc, dict):
        raise KraftlogError(ErrorCode.INVALID_REQUEST,
                            'body must be an object {"records": [...]}, got ' + type(doc).__name__)
    unknown = set(doc) - {"records"}
    if unknown:
        raise KraftlogError(ErrorCode.INVALID_REQUEST,
                            f"unknown field(s) {sorted(map(str, unknown))} in body; only 'records' is accepted")
    recs = doc.get("records")
    if not isinstance(recs, list):
        raise KraftlogError(ErrorCode.INVALID_REQUEST, "records: must be a list of record objects",
                            field="records")
    if not recs:
        raise KraftlogError(ErrorCode.INVALID_REQUEST, "records: must contain at least one record",
                            field="records")
    if len(recs) > max_records:
        raise KraftlogError(ErrorCode.RECORD_LIST_TOO_LARGE,
                            f"records: {len(recs)} records exceed request_max_records={max_records}; "
                            "split the request")
    out: list[ProduceRecord] = []
    for i, rec in enumerate(recs):
        if not isinstance(rec, dict):
            raise _bad(f"records[{i}]", f"must be an object, got {type(rec).__name__}")
        bad_keys = [k for k in rec if k not in _RECORD_FIELDS]
        if bad_keys:
            raise _bad(f"records[{i}]", f"unknown field(s) {sorted(map(str, bad_keys))}; "
                                        f"allowed: {sorted(_RECORD_FIELDS)}")
        if "value" not in rec and "value_b64" not in rec:
            raise _bad(f"records[{i}].value", "is required (use null for a tombstone)")
        key = _bytes_field(rec, "key", i, binary_ok)
        value = _bytes_field(rec, "value", i, binary_ok)
        headers_in = rec.get("headers")
        headers: list[tuple[str, bytes]] = []
        if headers_in is not None:
            if not isinstance(headers_in, dict):
                raise _bad(f"records[{i}].headers", f"must be an object of string to string, got "
                                                   f"{type(headers_in).__name__}")
            for hk, hv in headers_in.items():
                if not isinstance(hk, str):
                    raise _bad(f"records[{i}].headers", f"header names must be strings, got {type(hk).__name__}")
                if isinstance(hv, str):
                    headers.append((hk, hv.encode("utf-8", "surrogatepass")))
                elif binary_ok and isinstance(hv, (bytes, bytearray)):
                    headers.append((hk, bytes(hv)))
                else:
                    raise _bad(f"records[{i}].headers.{hk}", f"must be a string, got {type(hv).__name__}")
        out.append(ProduceRecord(key, value, headers, _int_field(rec, "partition", i),
                                 _int_field(rec, "timestamp", i)))
    return out


def parse_produce_body(content_type: str | None, body: bytes, *, max_records: int
                       ) -> list[ProduceRecord] | bytes:
    """JSON/CBOR -> list of ProduceRecord; raw batch type -> the body (check it with
    `validate_raw_batches`)."""
    mt = media_type(content_type)
    if mt == RAW_BATCH:
        return body
    doc = decode_document(mt, body)
    return parse_records(doc, binary_ok=(mt == CBOR), max_records=max_records)


def validate_raw_batches(body: bytes, *, max_message_bytes: int, max_records: int,
                         check_crc: bool = True) -> list:
    """Check a raw produce body (concatenated batches): framing, size per batch, CRC
    (check_crc=False when the log validates CRCs itself before writing anything).

    Returns the batch headers. Records are never decoded or recompressed here.
    """
    if not body:
        raise KraftlogError(ErrorCode.INVALID_REQUEST, "empty body: send one or more record batches")
    headers = []
    total = 0
    pos = 0
    n = len(body)
    try:
        while pos < n:
            if check_crc:
                header = rb.validate_batch(body, pos, max_batch_bytes=max_message_bytes)
            else:
                header = rb.BatchHeader.parse(body, pos)
                if header.batch_length < rb.HEADER_SIZE - rb.LOG_OVERHEAD or pos + header.size > len(body):
                    raise rb.CorruptRecordError(
                        f"batch at position {pos} has batch_length {header.batch_length} but "
                        f"{len(body) - pos} bytes remain; send whole batches")
                if header.size > max_message_bytes:
                    raise rb.RecordTooLargeError(
                        f"batch at position {pos} is {header.size} bytes, more than max_message_bytes="
                        f"{max_message_bytes}: send smaller batches")
                if header.record_count < 0:
                    raise rb.CorruptRecordError(f"batch at position {pos} has a negative record count")
            if header.is_control:
                raise KraftlogError(ErrorCode.INVALID_RECORD,
                                    "control batches cannot be produced; clear the control bit")
            if not header.attributes & rb.COLUMNAR_MASK:
                rb.check_kafka_batch(body, pos)   # Kafka's varint records (stored as sent)
            headers.append(header)
            total += header.record_count
            pos += header.size
    except rb.RecordTooLargeError as e:
        raise KraftlogError(ErrorCode.MESSAGE_TOO_LARGE, f"{e}") from None
    except rb.CorruptRecordError as e:
        raise KraftlogError(ErrorCode.CORRUPT_MESSAGE, f"invalid record batch: {e}; rebuild the batch") from None
    if total > max_records:
        raise KraftlogError(ErrorCode.RECORD_LIST_TOO_LARGE,
                            f"{total} records exceed request_max_records={max_records}; split the request")
    return headers


# ---- responses -------------------------------------------------------------------------

def _render_bytes(out: dict, name: str, data: bytes | None, binary: bool) -> None:
    if data is None:
        out[name] = None
    elif binary:
        out[name] = bytes(data)
    else:
        try:
            out[name] = bytes(data).decode("utf-8")
        except UnicodeDecodeError:
            out[name + "_b64"] = base64.b64encode(data).decode("ascii")


def render_record(record, *, binary: bool) -> dict:
    """A stored Record -> response dict (JSON: text or *_b64; CBOR: byte strings)."""
    out: dict = {"offset": record.offset, "timestamp": record.timestamp}
    _render_bytes(out, "key", record.key, binary)
    _render_bytes(out, "value", record.value, binary)
    headers: dict = {}
    headers_b64: dict = {}
    for hk, hv in record.headers or ():
        if hv is None:
            headers[hk] = None
            continue
        if binary:
            headers[hk] = bytes(hv)
            continue
        try:
            headers[hk] = bytes(hv).decode("utf-8")
        except UnicodeDecodeError:
            headers_b64[hk] = base64.b64encode(hv).decode("ascii")
    out["headers"] = headers
    if headers_b64:
        out["headers_b64"] = headers_b64
    return out


def decode_fetched(data: bytes, start_offset: int, *, binary: bool) -> tuple[list[dict], int]:
    """Decode fetched batches into response records, skipping offsets below start_offset.

    Returns (records, next_offset) where next_offset follows the last batch returned (so a
    batch whose tail was compacted away is not fetched again).
    """
    records: list[dict] = []
    next_offset = start_offset
    for header, batch in rb.iter_batches(data, validate=False):
        if header.is_control:
            next_offset = max(next_offset, header.last_offset + 1)
            continue
        for rec in rb.decode_records(batch, validate=False):
            if rec.offset >= start_offset:
                records.append(render_record(rec, binary=binary))
        next_offset = max(next_offset, header.last_offset + 1)
    return records, next_offset


def encode_document(media: str, doc: Any) -> bytes:
    if media == CBOR:
        return cbor2.dumps(doc)
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def error_body(err: KraftlogError) -> bytes:
    return json.dumps(err.to_body()).encode("utf-8")


_RECORD_OVERHEAD_BYTES = 24  # offset/timestamp/length columns per record in the batch format


def build_batches(records: list[ProduceRecord], *, max_message_bytes: int,
                  compression: rb.Compression = rb.Compression.NONE) -> list[bytes]:
    """Encode records (one partition) as few batches as possible, each within
    max_message_bytes; a single record larger than that is a 413 MESSAGE_TOO_LARGE."""
    budget = max_message_bytes - rb.HEADER_SIZE - 1
    batches: list[bytes] = []
    chunk: list[rb.Record] = []
    size = 0
    for r in records:
        rsize = (_RECORD_OVERHEAD_BYTES + len(r.key or b"") + len(r.value or b"")
                 + sum(6 + len(k) + len(v or b"") for k, v in r.headers))
        if rsize > budget:
            raise KraftlogError(ErrorCode.MESSAGE_TOO_LARGE,
                                f"a record of about {rsize} bytes exceeds max_message_bytes="
                                f"{max_message_bytes}; send smaller records")
        if chunk and size + rsize > budget:
            batches.append(rb.build_batch(chunk, compression=compression))
            chunk, size = [], 0
        chunk.append(rb.Record(r.key, r.value, tuple(r.headers), r.timestamp))
        size += rsize
    if chunk:
        batches.append(rb.build_batch(chunk, compression=compression))
    return batches
