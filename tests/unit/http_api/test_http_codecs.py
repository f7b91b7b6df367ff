"""Codecs: strict parsing of JSON/CBOR produce bodies, raw batch validation, rendering."""
import base64
import json

import cbor2
import pytest

from http_api.wire import codecs
from http_api.wire.errors import ErrorCode, KraftlogError, http_status
from partitions.log import record_batch as rb


def parse(doc, ct=codecs.JSON, max_records=1000):
    body = json.dumps(doc).encode() if ct == codecs.JSON else cbor2.dumps(doc)
    return codecs.parse_produce_body(ct, body, max_records=max_records)


def err(fn, *a, **kw) -> KraftlogError:
    with pytest.raises(KraftlogError) as e:
        fn(*a, **kw)
    return e.value


def test_json_records_parse_text_b64_headers_partition():
    recs = parse({"records": [
        {"key": "k", "value": "v", "headers": {"h": "x"}, "partition": 2, "timestamp": 5},
        {"key_b64": base64.b64encode(b"\xff").decode(), "value_b64": base64.b64encode(b"\x00\x01").decode()},
        {"value": None},
    ]})
    assert recs[0].key == b"k" and recs[0].value == b"v" and recs[0].headers == [("h", b"x")]
    assert recs[0].partition == 2 and recs[0].timestamp == 5
    assert recs[1].key == b"\xff" and recs[1].value == b"\x00\x01"
    assert recs[2].value is None and recs[2].key is None


def test_cbor_accepts_byte_strings():
    recs = parse({"records": [{"key": b"\xfe", "value": b"\x00", "headers": {"a": b"\x01"}}]}, codecs.CBOR)
    assert recs[0].key == b"\xfe" and recs[0].value == b"\x00" and recs[0].headers == [("a", b"\x01")]


@pytest.mark.parametrize("doc, field, code", [
    ([], None, ErrorCode.INVALID_REQUEST),
    ({"records": "x"}, "records", ErrorCode.INVALID_REQUEST),
    ({"records": []}, "records", ErrorCode.INVALID_REQUEST),
    ({"records": [1]}, "records[0]", ErrorCode.INVALID_RECORD),
    ({"records": [{"value": 5}]}, "records[0].value", ErrorCode.INVALID_RECORD),
    ({"records": [{"value": "a", "key": ["x"]}]}, "records[0].key", ErrorCode.INVALID_RECORD),
    ({"records": [{"value": "a", "partition": -1}]}, "records[0].partition", ErrorCode.INVALID_RECORD),
    ({"records": [{"value": "a", "partition": True}]}, "records[0].partition", ErrorCode.INVALID_RECORD),
    ({"records": [{"value": "a", "partition": "1"}]}, "records[0].partition", ErrorCode.INVALID_RECORD),
    ({"records": [{"value": "a", "headers": {"h": 1}}]}, "records[0].headers.h", ErrorCode.INVALID_RECORD),
    ({"records": [{"value": "a", "headers": ["h"]}]}, "records[0].headers", ErrorCode.INVALID_RECORD),
    ({"records": [{"value_b64": "!!!"}]}, "records[0].value_b64", ErrorCode.INVALID_RECORD),
    ({"records": [{"value": "a", "value_b64": "YQ=="}]}, "records[0].value", ErrorCode.INVALID_RECORD),
    ({"records": [{"key": "a"}]}, "records[0].value", ErrorCode.INVALID_RECORD),
    ({"records": [{"value": "a", "colour": "red"}]}, "records[0]", ErrorCode.INVALID_RECORD),
])
def test_bad_json_is_400_naming_the_field(doc, field, code):
    e = err(parse, doc)
    assert e.code is code and http_status(e) == 400
    if field:
        assert field in e.message


def test_json_bytes_are_rejected_outside_cbor():
    # a JSON string can't carry raw bytes; but CBOR bytes must not be accepted by the JSON path
    e = err(codecs.parse_records, {"records": [{"value": b"x"}]}, binary_ok=False, max_records=10)
    assert "value_b64" in e.message


def test_malformed_json_and_cbor():
    assert err(codecs.parse_produce_body, codecs.JSON, b"{", max_records=5).code is ErrorCode.INVALID_REQUEST
    assert err(codecs.parse_produce_body, codecs.CBOR, b"\xff\xff", max_records=5).code is ErrorCode.INVALID_REQUEST
    e = err(codecs.parse_produce_body, "text/plain", b"hi", max_records=5)
    assert e.code is ErrorCode.UNSUPPORTED_MEDIA_TYPE and http_status(e) == 415


def test_too_many_records_is_413():
    e = err(parse, {"records": [{"value": "a"}] * 3}, max_records=2)
    assert e.code is ErrorCode.RECORD_LIST_TOO_LARGE and http_status(e) == 413


def test_raw_batches_validated_by_crc_and_size():
    b1 = rb.build_batch([rb.Record(b"k", b"v")])
    b2 = rb.build_batch([rb.Record(None, b"w" * 100), rb.Record(None, b"z")])
    headers = codecs.validate_raw_batches(b1 + b2, max_message_bytes=10_000, max_records=10)
    assert [h.record_count for h in headers] == [1, 2]
    corrupt = bytearray(b1)
    corrupt[-1] ^= 0xFF
    assert err(codecs.validate_raw_batches, bytes(corrupt), max_message_bytes=10_000,
               max_records=10).code is ErrorCode.CORRUPT_MESSAGE
    assert err(codecs.validate_raw_batches, b1[:-3], max_message_bytes=10_000,
               max_records=10).code is ErrorCode.CORRUPT_MESSAGE
    assert err(codecs.validate_raw_batches, b2, max_message_bytes=100,
               max_records=10).code is ErrorCode.MESSAGE_TOO_LARGE
    assert err(codecs.validate_raw_batches, b1 + b2, max_message_bytes=10_000,
               max_records=2).code is ErrorCode.RECORD_LIST_TOO_LARGE


def test_build_batches_splits_at_max_message_bytes_and_rejects_huge_records():
    recs = [codecs.ProduceRecord(None, b"x" * 100) for _ in range(30)]
    batches = codecs.build_batches(recs, max_message_bytes=1000)
    assert len(batches) > 1 and all(len(b) <= 1000 for b in batches)
    assert sum(len(rb.decode_records(b)) for b in batches) == 30
    e = err(codecs.build_batches, [codecs.ProduceRecord(None, b"x" * 2000)], max_message_bytes=1000)
    assert e.code is ErrorCode.MESSAGE_TOO_LARGE


def test_decode_fetched_skips_below_start_and_renders_b64():
    b = bytearray(rb.build_batch([rb.Record(b"a", b"\xff\xfe", (("h", b"v"),), 7), rb.Record(None, b"t", (), 8)]))
    rb.stamp_batch(b, 10, 0)
    recs, nxt = codecs.decode_fetched(bytes(b), 11, binary=False)
    assert nxt == 12
    assert recs == [{"offset": 11, "timestamp": 8, "key": None, "value": "t", "headers": {}}]
    recs, _ = codecs.decode_fetched(bytes(b), 10, binary=False)
    assert recs[0]["value_b64"] == base64.b64encode(b"\xff\xfe").decode() and "value" not in recs[0]
    assert recs[0]["key"] == "a" and recs[0]["headers"] == {"h": "v"}
    recs, _ = codecs.decode_fetched(bytes(b), 10, binary=True)
    assert recs[0]["value"] == b"\xff\xfe"


def test_negotiation():
    assert codecs.negotiate_response_type("application/cbor") == codecs.CBOR
    assert codecs.negotiate_response_type(None, codecs.CBOR) == codecs.CBOR
    assert codecs.negotiate_response_type("*/*", codecs.RAW_BATCH) == codecs.JSON
    assert codecs.negotiate_response_type("application/vnd.kraftlog.batch, */*") == codecs.RAW_BATCH


def test_curl_default_content_type_is_read_as_json():
    recs = codecs.parse_produce_body("application/x-www-form-urlencoded", b'{"records": [{"value": "a"}]}',
                                     max_records=5)
    assert recs[0].value == b"a"


def test_deeply_nested_documents_are_400_not_a_crash():
    for ct, body in ((codecs.JSON, b"[" * 100_000 + b"]" * 100_000),
                     (codecs.CBOR, b"\x81" * 100_000 + b"\x00")):
        e = err(codecs.parse_produce_body, ct, body, max_records=5)
        assert http_status(e) == 400


def test_raw_framing_check_without_crc():
    b1 = rb.build_batch([rb.Record(b"k", b"v")])
    assert len(codecs.validate_raw_batches(b1 + b1, max_message_bytes=10_000, max_records=10, check_crc=False)) == 2
    for body, code in ((b1[:-3], ErrorCode.CORRUPT_MESSAGE), (b1 + b"\x00" * 5, ErrorCode.CORRUPT_MESSAGE)):
        assert err(codecs.validate_raw_batches, body, max_message_bytes=10_000, max_records=10,
                   check_crc=False).code is code
    assert err(codecs.validate_raw_batches, b1, max_message_bytes=20, max_records=10,
               check_crc=False).code is ErrorCode.MESSAGE_TOO_LARGE
