"""Hand-tuned encoder of the Fetch response (versions 4-12), the Kafka listener's largest
answer: the records of each partition are not copied into the frame but passed on as their
own buffers (`writer.writelines`), and no kio entity is built per partition.

Byte for byte the frame kio writes for the same answer (tests/unit/test_kafka_fetch_codec.py
compares them over every served version). It serves the answers the Fetch handler builds
without tagged fields (no `current_leader`: that is only set on a not-leader / fenced error,
rare; those answers go through kio, `encode_fetch_response` returns None).
"""
from __future__ import annotations

import struct

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_HEAD = struct.Struct(">ii")            # size, correlation id
_TOP_V7 = struct.Struct(">ihi")         # throttle time, error code, session id
_PART_V4 = struct.Struct(">ihqq")       # partition index, error code, high watermark, last stable offset
_PART_V5 = struct.Struct(">ihqqq")      # ... log start offset
_ABORTED = struct.Struct(">qq")         # producer id, first offset

FETCH_MIN_VERSION, FETCH_MAX_VERSION = 4, 12


def _uvarint(v: int) -> bytes:
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def encode_fetch_response(version: int, correlation_id: int, doc: dict) -> list | None:
    """The size-prefixed Fetch response frame as a list of buffers (records unjoined), or
    None when this encoder does not serve the answer (a version outside 4-12, or a partition
    with `current_leader`, a tagged field: kio encodes those)."""
    if not FETCH_MIN_VERSION <= version <= FETCH_MAX_VERSION:
        return None
    flexible = version >= 12
    parts: list = []
    head = bytearray()
    ap = parts.append
    if version >= 7:
        head += _TOP_V7.pack(int(doc.get("throttle_time", 0)), int(doc.get("error_code", 0)),
                             int(doc.get("session_id", 0)))
    else:
        head += _I32.pack(int(doc.get("throttle_time", 0)))
    topics = doc["responses"]
    head += _uvarint(len(topics) + 1) if flexible else _I32.pack(len(topics))
    for t in topics:
        name = t["topic"].encode("utf-8")
        head += (_uvarint(len(name) + 1) if flexible else _I16.pack(len(name))) + name
        partitions = t["partitions"]
        head += _uvarint(len(partitions) + 1) if flexible else _I32.pack(len(partitions))
        for p in partitions:
            if p.get("current_leader") is not None:
                return None
            if version >= 5:
                head += _PART_V5.pack(p["partition_index"], int(p["error_code"]), p["high_watermark"],
                                      p["last_stable_offset"], p["log_start_offset"])
            else:
                head += _PART_V4.pack(p["partition_index"], int(p["error_code"]), p["high_watermark"],
                                      p["last_stable_offset"])
            aborted = p.get("aborted_transactions")
            if aborted is None:
                head += b"\x00" if flexible else b"\xff\xff\xff\xff"
            else:
                head += _uvarint(len(aborted) + 1) if flexible else _I32.pack(len(aborted))
                for a in aborted:
                    head += _ABORTED.pack(a["producer_id"], a["first_offset"])
                    if flexible:
                        head += b"\x00"
            if version >= 11:
                head += _I32.pack(p.get("preferred_read_replica", -1))
            records = p.get("records")
            if records is None:
                head += b"\x00" if flexible else b"\xff\xff\xff\xff"
            else:
                head += _uvarint(len(records) + 1) if flexible else _I32.pack(len(records))
                if records:
                    ap(bytes(head))
                    ap(records)
                    head = bytearray()
            if flexible:
                head += b"\x00"   # the partition's tagged fields: none
        if flexible:
            head += b"\x00"       # the topic's
    if flexible:
        head += b"\x00"           # the response's
    ap(bytes(head))
    size = sum(map(len, parts)) + 4 + (1 if flexible else 0)
    parts.insert(0, _HEAD.pack(size, correlation_id) + (b"\x00" if flexible else b""))   # header v1: no tags
    return parts
