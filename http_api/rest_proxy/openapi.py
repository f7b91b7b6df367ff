"""OpenAPI entries of the Confluent REST Proxy v2 routes (merged into the broker's /openapi.json).

Errors a handler answers are Confluent's (`application/vnd.kafka.v2+json`, an integer
`error_code`); those of the broker's edge (authentication, body limits) are kraftlog's
(`application/json`), so an error status lists both."""
from __future__ import annotations

V2 = "application/vnd.kafka.v2+json"
_PROXY_ERROR = {"type": "object", "required": ["error_code", "message"],
                "properties": {"error_code": {"type": "integer"}, "message": {"type": "string"}}}
_KRAFTLOG_ERROR = {"$ref": "#/components/schemas/Error"}


def _err(desc: str) -> dict:
    return {"description": desc, "content": {V2: {"schema": _PROXY_ERROR}, "application/json": {"schema": _KRAFTLOG_ERROR}}}


_ERRORS = {
    "400": _err("malformed JSON body, bad parameters"),
    "401": _err("no or bad credentials (authentication on)"),
    "403": _err("40301: the principal lacks the ACL, or the consumer instance is another principal's"),
    "404": _err("40401 topic not found, 40402 partition not found, 40403 consumer instance not found"),
    "406": _err("406: an Accept this route does not answer; 40601: records in another embedded format than the "
                "instance's"),
    "409": _err("40902 consumer instance already exists, 40903 illegal state (subscription and assignment mixed, "
                "no assignment for a partition)"),
    "413": _err("the body is over socket_request_max_bytes"),
    "415": _err("415: an unsupported Content-Type (or embedded format: avro, protobuf, jsonschema)"),
    "422": _err("42203 a key/value not in the embedded format, 42204 invalid consumer configuration, 422 invalid "
                "input"),
    "500": _err("50002 Kafka error, 50003 retriable Kafka error"),
}
_T = {"name": "topic", "in": "path", "required": True, "schema": {"type": "string"}}
_P = {"name": "partition", "in": "path", "required": True, "schema": {"type": "integer", "minimum": 0}}
_G = {"name": "group", "in": "path", "required": True, "schema": {"type": "string"}}
_I = {"name": "instance", "in": "path", "required": True, "schema": {"type": "string"}}
_OBJ = {"type": "object"}


def _ok(desc: str, schema: dict | None = None, types: tuple = (V2,)) -> dict:
    return {"description": desc, "content": {t: {"schema": schema or _OBJ} for t in types}}


def _op(summary: str, ok: dict, status: str = "200", body: dict | None = None, **extra) -> dict:
    op = {"summary": summary, "responses": {status: ok, **_ERRORS}, **extra}
    if body is not None:
        op["requestBody"] = body
    return op


def _body(schema: dict, types=(V2,), required: bool = True) -> dict:
    return {"required": required, "content": {t: {"schema": schema} for t in types}}


_NO_CONTENT = {"description": "done"}
_PARTITIONS = {"type": "object", "properties": {"partitions": {"type": "array", "items": {
    "type": "object", "properties": {"topic": {"type": "string"}, "partition": {"type": "integer"}}}}}}
_OFFSETS = {"type": "object", "properties": {"offsets": {"type": "array", "items": {
    "type": "object", "properties": {"topic": {"type": "string"}, "partition": {"type": "integer"},
                                     "offset": {"type": "integer"}}}}}}
_PRODUCE = _body({"type": "object", "required": ["records"], "properties": {"records": {"type": "array", "items": {
    "type": "object", "properties": {"key": {}, "value": {}, "partition": {"type": "integer"}}}}}},
    ("application/vnd.kafka.json.v2+json", "application/vnd.kafka.binary.v2+json"))
_PRODUCED = _ok("{offsets: [{partition, offset, error_code, error}], key_schema_id: null, value_schema_id: null}")
_INSTANCE = "/consumers/{group}/instances/{instance}"

OPENAPI_PATHS = {
    "/topics": {"get": _op("REST Proxy v2: topic names", _ok("[name, ...]", {"type": "array",
                                                                            "items": {"type": "string"}}))},
    "/topics/{topic}": {"parameters": [_T],
                        "get": _op("REST Proxy v2: a topic", _ok("{name, configs, partitions}")),
                        "post": _op("REST Proxy v2: produce (json or binary embedded format)", _PRODUCED,
                                    body=_PRODUCE)},
    "/topics/{topic}/partitions": {"parameters": [_T], "get": _op(
        "REST Proxy v2: partitions", _ok("[{partition, leader, replicas: [{broker, leader, in_sync}]}]",
                                         {"type": "array", "items": _OBJ}))},
    "/topics/{topic}/partitions/{partition}": {
        "parameters": [_T, _P],
        "get": _op("REST Proxy v2: a partition", _ok("{partition, leader, replicas}")),
        "post": _op("REST Proxy v2: produce to a partition", _PRODUCED, body=_PRODUCE)},
    "/consumers/{group}": {"parameters": [_G], "post": _op(
        "REST Proxy v2: create a consumer instance {name?, format? binary|json, auto.offset.reset?, "
        "auto.commit.enable?, consumer.request.timeout.ms?}", _ok("{instance_id, base_uri}"),
        body=_body(_OBJ, required=False))},
    _INSTANCE: {"parameters": [_G, _I], "delete": _op("REST Proxy v2: delete the instance (commits with auto "
                                                      "commit, leaves the group)", _NO_CONTENT, "204")},
    _INSTANCE + "/subscription": {
        "parameters": [_G, _I],
        "post": _op("subscribe {topics} or {topic_pattern}", _NO_CONTENT, "204", body=_body(_OBJ)),
        "get": _op("the subscribed topics", _ok("{topics}")),
        "delete": _op("unsubscribe", _NO_CONTENT, "204")},
    _INSTANCE + "/assignments": {
        "parameters": [_G, _I],
        "post": _op("assign partitions by hand", _NO_CONTENT, "204", body=_body(_PARTITIONS)),
        "get": _op("the assigned partitions", _ok("{partitions}"))},
    _INSTANCE + "/positions": {"parameters": [_G, _I], "post": _op("seek", _NO_CONTENT, "204", body=_body(_OFFSETS))},
    _INSTANCE + "/positions/beginning": {"parameters": [_G, _I], "post": _op(
        "seek to the log start", _NO_CONTENT, "204", body=_body(_PARTITIONS))},
    _INSTANCE + "/positions/end": {"parameters": [_G, _I], "post": _op(
        "seek to the end", _NO_CONTENT, "204", body=_body(_PARTITIONS))},
    _INSTANCE + "/records": {"parameters": [_G, _I], "get": _op(
        "poll: [{topic, key, value, partition, offset}] in the instance's embedded format",
        _ok("records", {"type": "array", "items": _OBJ},
            ("application/vnd.kafka.binary.v2+json", "application/vnd.kafka.json.v2+json")),
        parameters=[{"name": "timeout", "in": "query", "schema": {"type": "integer"}},
                    {"name": "max_bytes", "in": "query", "schema": {"type": "integer"}}])},
    _INSTANCE + "/offsets": {
        "parameters": [_G, _I],
        "post": _op("commit {offsets} (each the last consumed: offset + 1 is committed), or with no body the "
                    "positions of what was read", _ok("{offsets: []}"), body=_body(_OFFSETS, required=False)),
        "get": _op("committed offsets of body {partitions}", _ok("{offsets: [{topic, partition, offset, metadata}]}"))},
}
