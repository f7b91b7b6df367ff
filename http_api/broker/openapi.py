"""OpenAPI 3 description of the broker HTTP API v1 (served at GET /openapi.json)."""
from __future__ import annotations

from http_api.broker.reassignments import OPENAPI_PATHS as REASSIGNMENT_PATHS
from http_api.broker.streaming import OPENAPI_PATHS as STREAMING_PATHS
from http_api.console.pages import OPENAPI_PATHS as CONSOLE_PATHS
from http_api.rest_proxy.openapi import OPENAPI_PATHS as REST_PROXY_PATHS


def _err(desc: str) -> dict:
    return {"description": desc, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}


def _json(schema_ref: str, desc: str = "OK") -> dict:
    return {"description": desc, "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema_ref}"}}}}


def _obj(desc: str) -> dict:  # consumer group routes
    return {"description": desc, "content": {"application/json": {"schema": {"type": "object"}}}}


def _obj_body() -> dict:
    return {"required": True, "content": {"application/json": {"schema": {"type": "object"}}}}


_HEARTBEAT = "{member_id, member_epoch, heartbeat_interval_ms, session_timeout_ms, assignment: [{topic, partition}]}"
_T = {"name": "topic", "in": "path", "required": True, "schema": {"type": "string"}}
_P = {"name": "partition", "in": "path", "required": True, "schema": {"type": "integer", "minimum": 0}}
_G = {"name": "group", "in": "path", "required": True, "schema": {"type": "string"}}
_ACKS = {"name": "acks", "in": "query", "schema": {"type": "string", "enum": ["0", "1", "all"], "default": "all"}}
_RECORDS_BODY = {
    "required": True,
    "content": {
        "application/json": {"schema": {"$ref": "#/components/schemas/ProduceRequest"}},
        "application/cbor": {"schema": {"$ref": "#/components/schemas/ProduceRequest"}},
    },
}


_ACL = {"type": "object", "required": ["principal", "resource_type", "operation"], "properties": {
    "principal": {"type": "string", "description": "User:NAME or User:*"},
    "resource_type": {"type": "string", "enum": ["TOPIC", "GROUP", "CLUSTER", "TRANSACTIONAL_ID"]},
    "resource_name": {"type": "string", "description": "a name, a prefix (PREFIXED) or *; CLUSTER: kafka-cluster"},
    "pattern_type": {"type": "string", "enum": ["LITERAL", "PREFIXED"], "default": "LITERAL"},
    "operation": {"type": "string", "enum": ["ALL", "READ", "WRITE", "CREATE", "DELETE", "ALTER", "DESCRIBE",
                                             "DESCRIBE_CONFIGS", "ALTER_CONFIGS", "CLUSTER_ACTION",
                                             "IDEMPOTENT_WRITE"]},
    "permission": {"type": "string", "enum": ["ALLOW", "DENY"], "default": "ALLOW"},
    "host": {"type": "string", "default": "*"}}}
_ACL_BODY = {"required": True, "content": {"application/json": {"schema": {"oneOf": [
    _ACL, {"type": "object", "required": ["acls"], "properties": {"acls": {"type": "array", "items": _ACL}}}]}}}}
_CREDENTIAL = {"type": "object", "description": "a precomputed SCRAM-SHA-256 credential (base64 fields)",
               "properties": {"salt": {"type": "string"}, "iterations": {"type": "integer"},
                              "stored_key": {"type": "string"}, "server_key": {"type": "string"}}}
_USER_BODY = {"required": True, "content": {"application/json": {"schema": {"type": "object", "properties": {
    "name": {"type": "string"}, "password": {"type": "string"}, "credential": _CREDENTIAL,
    "iterations": {"type": "integer", "minimum": 4096, "maximum": 16384}}}}}}
_X = {"name": "txid", "in": "path", "required": True, "schema": {"type": "string"}}
_TXN_ERRORS = {"400": _err("PRODUCER_FENCED (a newer init of the id) / INVALID_PRODUCER_ID_MAPPING / "
                           "INVALID_TRANSACTION_TIMEOUT / INVALID_REQUEST"),
               "404": _err("UNKNOWN_TOPIC_OR_PARTITION (a record's topic or partition)"),
               "409": _err("CONCURRENT_TRANSACTIONS (retry) / INVALID_TXN_STATE / OUT_OF_ORDER_SEQUENCE_NUMBER "
                           "(records with sequences: a gap)"),
               "421": _err("NOT_COORDINATOR with coordinator_id, coordinator_url (retry)")}
# transactions (http_api/broker/transactions.py, API.md "Transactions")
_TRANSACTION_PATHS = {
    "/v1/transactions/{txid}/init": {"parameters": [_X], "post": {
        "summary": "Initialise a transactional id: {transaction_timeout_ms?}; bumps the epoch, fences older "
                   "producers and aborts what they left open", "requestBody": _obj_body(),
        "responses": {"200": _obj("{producer_id, producer_epoch}"), **_TXN_ERRORS}}},
    "/v1/transactions/{txid}/records": {"parameters": [_X], "post": {
        "summary": "Write records in the open transaction (which begins with its first write): "
                   "{producer_id, producer_epoch, records: [{topic, partition?, key?, value, headers?}], "
                   "sequences?: [{topic, partition, base_sequence}]} (with the client's per-partition sequences "
                   "a resent request is answered with its original offsets; a gap is 409 "
                   "OUT_OF_ORDER_SEQUENCE_NUMBER)",
        "requestBody": _obj_body(),
        "responses": {"200": _obj("{offsets: [{topic, partition, offset}]}"), **_TXN_ERRORS}}},
    "/v1/transactions/{txid}/offsets": {"parameters": [_X], "post": {
        "summary": "Send group offsets to the transaction (committed with it): "
                   "{producer_id, producer_epoch, group, offsets: [{topic, partition, offset}]}",
        "requestBody": _obj_body(), "responses": {"200": _obj("{}"), **_TXN_ERRORS}}},
    "/v1/transactions/{txid}/commit": {"parameters": [_X], "post": {
        "summary": "Commit: {producer_id, producer_epoch}; 200 once the decision is durable",
        "requestBody": _obj_body(), "responses": {"200": _obj("{state}"), **_TXN_ERRORS}}},
    "/v1/transactions/{txid}/abort": {"parameters": [_X], "post": {
        "summary": "Abort: {producer_id, producer_epoch}; 200 once the decision is durable",
        "requestBody": _obj_body(), "responses": {"200": _obj("{state}"), **_TXN_ERRORS}}},
    "/internal/v1/txn-markers": {"post": {
        "summary": "Broker-to-broker: write COMMIT/ABORT markers on partitions led here (WriteTxnMarkers)",
        "requestBody": _obj_body(),
        "responses": {"200": _obj("{results: [{topic, partition, error}]}"),
                      "401": _err("SASL_AUTHENTICATION_FAILED: without the token of the cluster secret (brokers only)")}}},
    "/internal/v1/transactions/{txid}/verify": {"parameters": [_X], "post": {
        "summary": "Broker-to-broker (KIP-890 part 1, AddPartitionsToTxn verifyOnly): are these partitions in "
                   "the producer's ongoing transaction? {producer_id, producer_epoch, partitions: [{topic, partition}]}",
        "requestBody": _obj_body(),
        "responses": {"200": _obj("{results: [{topic, partition, error_code}]}"),
                      "401": _err("SASL_AUTHENTICATION_FAILED: without the token of the cluster secret (brokers only)")}}},
}
_AUTH = {"401": _err("SASL_AUTHENTICATION_FAILED (security on)"),
         "403": _err("CLUSTER_AUTHORIZATION_FAILED (security on)"),
         "503": _err("BROKER_NOT_AVAILABLE: metadata not loaded yet"), "504": _err("REQUEST_TIMED_OUT")}
# users, bearer tokens, ACLs (http_api/broker/security_admin.py)
_SECURITY_ADMIN_PATHS = {
    "/v1/admin/users": {
        "get": {"summary": "List SCRAM-SHA-256 users (names, never keys)",
                "responses": {"200": _obj("{users: [{name, mechanism, iterations}]}"), **_AUTH}},
        "post": {"summary": "Create a user from a password (or a precomputed credential); only the salted "
                            "SCRAM credential is stored", "requestBody": _USER_BODY,
                 "responses": {"201": _obj("{name, mechanism, iterations}"), "400": _err("INVALID_REQUEST"),
                               "409": _err("DUPLICATE_RESOURCE"), **_AUTH}}},
    "/v1/admin/users/{name}": {
        "parameters": [{"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}],
        "put": {"summary": "Change (or create) a user's credential", "requestBody": _USER_BODY,
                "responses": {"200": _obj("{name, mechanism, iterations}"), "400": _err("INVALID_REQUEST"),
                              **_AUTH}},
        "delete": {"summary": "Delete a user", "responses": {"204": {"description": "Deleted"},
                                                             "400": _err("INVALID_REQUEST"),
                                                             "404": _err("RESOURCE_NOT_FOUND"), **_AUTH}}},
    "/v1/admin/tokens": {
        "get": {"summary": "List bearer tokens (ids, principals, expiry; never the token)",
                "parameters": [{"name": "principal", "in": "query", "schema": {"type": "string"}}],
                "responses": {"200": _obj("{tokens: [{token_id, principal, issue_timestamp_ms, "
                                          "expiry_timestamp_ms}]}"), **_AUTH}},
        "post": {"summary": "Create a bearer token for a principal; the token is in this answer only",
                 "requestBody": {"required": True, "content": {"application/json": {"schema": {
                     "type": "object", "required": ["principal"], "properties": {
                         "principal": {"type": "string"}, "lifetime_ms": {"type": "integer", "minimum": 1}}}}}},
                 "responses": {"201": _obj("{token, token_id, principal, expiry_timestamp_ms}"),
                               "400": _err("INVALID_REQUEST"), **_AUTH}}},
    "/v1/admin/tokens/{token_id}": {
        "parameters": [{"name": "token_id", "in": "path", "required": True, "schema": {"type": "string"}}],
        "delete": {"summary": "Delete a bearer token", "responses": {"204": {"description": "Deleted"},
                                                                     "404": _err("RESOURCE_NOT_FOUND"), **_AUTH}}},
    "/v1/admin/acls": {
        "get": {"summary": "List ACLs (filters: exact field values)",
                "parameters": [{"name": n, "in": "query", "schema": {"type": "string"}}
                               for n in ("principal", "resource_type", "resource_name", "pattern_type")],
                "responses": {"200": _obj("{acls: [binding]}"), "400": _err("INVALID_REQUEST"), **_AUTH}},
        "post": {"summary": "Add ACLs (one binding or {acls: [...]}, all or none)", "requestBody": _ACL_BODY,
                 "responses": {"201": _obj("{acls: [binding]}"), "400": _err("INVALID_REQUEST"),
                               "409": _err("DUPLICATE_RESOURCE"), **_AUTH}}},
    "/v1/admin/quorum": {   # the controller quorum (http_api/broker/quorum_admin.py)
        "get": {"summary": "Controller voters, the leader and each voter's lag (entries behind the commit index)",
                "responses": {"200": _obj("{leader_id, voters: [{id, address, lag, url, state}], pending_change, "
                                          "removed}"), **_AUTH}}},
    "/v1/admin/quorum/voters": {
        "post": {"summary": "Add a controller (started with --join) to the quorum; one change at a time",
                 "requestBody": {"required": True, "content": {"application/json": {"schema": {
                     "type": "object", "required": ["id", "raft_address", "url", "incarnation"], "properties": {
                         "id": {"type": "integer", "minimum": 0}, "raft_address": {"type": "string"},
                         "url": {"type": "string"}, "incarnation": {"type": "string"}}}}}},
                 "responses": {"200": _obj("{leader_id, voters, added, caught_up}"),
                               "400": _err("INVALID_REQUEST or POLICY_VIOLATION (a change in flight)"),
                               "409": _err("DUPLICATE_VOTER / INVALID_VOTER_KEY"), **_AUTH}}},
    "/v1/admin/quorum/voters/{id}": {
        "parameters": [{"name": "id", "in": "path", "required": True, "schema": {"type": "integer"}}],
        "delete": {"summary": "Remove a controller voter (the active one hands leadership over first)",
                   "responses": {"200": _obj("{leader_id, voters, removed_id}"),
                                 "400": _err("POLICY_VIOLATION (a change in flight, or the last voter)"),
                                 "404": _err("VOTER_NOT_FOUND"), **_AUTH}}},
    "/v1/admin/acls/delete": {
        "post": {"summary": "Remove ACLs (exact bindings, all or none)", "requestBody": _ACL_BODY,
                 "responses": {"200": _obj("{deleted: [binding]}"), "400": _err("INVALID_REQUEST"),
                               "404": _err("RESOURCE_NOT_FOUND"), **_AUTH}}},
}


# Statuses every route may answer besides its own (API.md: errors are {error_code, message}):
# the HTTP edge (http_api/wire/hardening.py) and the error middleware answer them for any path.
_COMMON_ERRORS = {
    "400": "INVALID_REQUEST (malformed HTTP, parameters or body) or another request error: "
           "INVALID_TOPIC_EXCEPTION, POLICY_VIOLATION (internal topics), INVALID_CONFIG, ...",
    "401": "SASL_AUTHENTICATION_FAILED: no or bad credentials (authentication on), with WWW-Authenticate",
    "403": "TOPIC/GROUP/CLUSTER_AUTHORIZATION_FAILED: the principal lacks the ACL (authorizer on)",
    "429": "THROTTLING_QUOTA_EXCEEDED: too many connections from this address (connections_max_per_ip) "
           "or in total, too many long polls, or authentication failures",
    "500": "UNKNOWN_SERVER_ERROR: a bug; the broker log has the details",
    "503": "BROKER_NOT_AVAILABLE (metadata not loaded yet), LEADER_NOT_AVAILABLE, NOT_ENOUGH_REPLICAS, "
           "COORDINATOR_NOT_AVAILABLE, KAFKA_STORAGE_ERROR: retry",
}
_BODY_ERRORS = {   # routes that read a request body
    "408": "the request body was not received within request_body_timeout_ms",
    "413": "RECORD_LIST_TOO_LARGE / MESSAGE_TOO_LARGE: over socket_request_max_bytes or max.message.bytes",
    "415": "UNSUPPORTED_MEDIA_TYPE: a Content-Type this route does not read",
}
_PATH_ERRORS = {   # by path parameter
    "{topic}": {"404": "UNKNOWN_TOPIC_OR_PARTITION"},
    "{partition}": {"404": "UNKNOWN_TOPIC_OR_PARTITION",
                    "409": "FENCED_LEADER_EPOCH / OUT_OF_ORDER_SEQUENCE_NUMBER / INVALID_PRODUCER_EPOCH",
                    "416": "OFFSET_OUT_OF_RANGE",
                    "421": "NOT_LEADER_OR_FOLLOWER, with leader_id and leader_url"},
    "{group}": {"404": "GROUP_ID_NOT_FOUND", "409": "UNKNOWN_MEMBER_ID / FENCED_MEMBER_EPOCH / NON_EMPTY_GROUP",
                "421": "NOT_COORDINATOR"},
    "{name}": {"404": "RESOURCE_NOT_FOUND"},
    "{token_id}": {"404": "RESOURCE_NOT_FOUND"},
}
_METHODS = ("get", "put", "post", "delete", "patch")


def _complete_responses(paths: dict) -> dict:
    """Every operation lists every status it may answer: its own, `_COMMON_ERRORS`, the body
    errors when it reads one, the errors of its path parameters, and 504 REQUEST_TIMED_OUT
    for writes (they wait for the controller, the coordinator or acks)."""
    for path, item in paths.items():
        for method in _METHODS:
            op = item.get(method)
            if op is None:
                continue
            extra = dict(_COMMON_ERRORS)
            if "requestBody" in op or method in ("post", "put"):
                extra.update(_BODY_ERRORS)
            for param, errors in _PATH_ERRORS.items():
                if param in path:
                    extra.update(errors)
            if method != "get" or "{partition}" in path:
                extra["504"] = "REQUEST_TIMED_OUT: the write or long poll did not finish in time; retry"
            responses = op.setdefault("responses", {})
            for status, desc in extra.items():
                responses.setdefault(status, _err(desc))
    return paths


def openapi_document(server_url: str) -> dict:
    """The OpenAPI 3.0 document; every route of the broker app is listed, each with every
    status it may answer (`_complete_responses`)."""
    produce_partition_body = {
        "required": True,
        "content": dict(_RECORDS_BODY["content"], **{
            "application/vnd.kraftlog.batch": {
                "schema": {"type": "string", "format": "binary",
                           "description": "concatenated record batches (partitions/log/record_batch.py)"}}}),
    }
    return {
        "openapi": "3.0.3",
        "info": {"title": "kraftlog broker API", "version": "1",
                 "description": "Kafka-style replicated commit log over HTTP. Errors are "
                                "{error_code, message} with Kafka error names."},
        "servers": [{"url": server_url}],
        "paths": _complete_responses({
            "/v1/metadata": {"get": {"summary": "Cluster metadata", "responses": {"200": _json("Metadata")}}},
            "/v1/topics": {
                "get": {"summary": "List topics", "responses": {"200": _json("TopicList")}},
                "post": {"summary": "Create a topic",
                         "requestBody": {"required": True, "content": {"application/json": {
                             "schema": {"$ref": "#/components/schemas/CreateTopic"}}}},
                         "responses": {"201": _json("Topic", "Created"), "400": _err("Invalid name/partitions/RF/config"),
                                       "409": _err("TOPIC_ALREADY_EXISTS")}},
            },
            "/v1/topics/{topic}": {
                "parameters": [_T],
                "get": {"summary": "Describe a topic (with configs)",
                        "parameters": [{"name": "allow_auto_create", "in": "query", "required": False,
                                        "schema": {"type": "boolean"},
                                        "description": "create a missing topic with the broker's defaults "
                                                       "if auto.create.topics.enable is on (what producers send)"}],
                        "responses": {"200": _json("Topic"), "404": _err("UNKNOWN_TOPIC_OR_PARTITION")}},
                "delete": {"summary": "Delete a topic", "responses": {"204": {"description": "Deleted"},
                                                                       "404": _err("UNKNOWN_TOPIC_OR_PARTITION")}},
            },
            "/v1/topics/{topic}/partitions": {
                "parameters": [_T],
                "post": {"summary": "Increase the partition count",
                         "requestBody": {"required": True, "content": {"application/json": {"schema": {
                             "type": "object", "properties": {"partitions": {"type": "integer"}}}}}},
                         "responses": {"200": _json("Topic"), "400": _err("INVALID_PARTITIONS")}},
            },
            "/v1/topics/{topic}/configs": {
                "parameters": [_T],
                "post": {"summary": "Set (or reset with null) topic configs",
                         "requestBody": {"required": True, "content": {"application/json": {"schema": {
                             "type": "object", "properties": {"configs": {"type": "object"}}}}}},
                         "responses": {"200": _json("Topic"), "400": _err("INVALID_CONFIG")}},
            },
            "/v1/topics/{topic}/records": {
                "parameters": [_T, _ACKS],
                "post": {"summary": "Produce to a topic (any broker; routed to partition leaders)",
                         "requestBody": _RECORDS_BODY,
                         "responses": {"200": _json("ProduceResponse"), "202": {"description": "acks=0"},
                                       "400": _err("Invalid request/record"), "413": _err("Too large"),
                                       "503": _err("NOT_ENOUGH_REPLICAS / LEADER_NOT_AVAILABLE")}},
            },
            "/v1/topics/{topic}/partitions/{partition}/records": {
                "parameters": [_T, _P],
                "post": {"summary": "Produce to one partition (leader only)",
                         "parameters": [_ACKS], "requestBody": produce_partition_body,
                         "responses": {"200": _json("ProduceResponse"), "202": {"description": "acks=0"},
                                       "421": _err("NOT_LEADER_OR_FOLLOWER with leader_id, leader_url")}},
                "get": {"summary": "Fetch committed records (long poll)",
                        "parameters": [
                            {"name": "offset", "in": "query", "required": True, "schema": {"type": "integer"}},
                            {"name": "max_bytes", "in": "query", "schema": {"type": "integer"}},
                            {"name": "min_bytes", "in": "query", "schema": {"type": "integer", "default": 1}},
                            {"name": "max_wait_ms", "in": "query", "schema": {"type": "integer", "default": 0}},
                            {"name": "isolation_level", "in": "query", "schema": {
                                "type": "string", "enum": ["read_uncommitted", "read_committed"],
                                "default": "read_uncommitted"}}],
                        "responses": {"200": {"description": "Records (JSON/CBOR) or raw batches with "
                                                             "X-Kraftlog-High-Watermark, X-Kraftlog-Next-Offset, "
                                                             "X-Kraftlog-Log-Start-Offset headers",
                                              "content": {"application/json": {"schema": {
                                                  "$ref": "#/components/schemas/FetchResponse"}},
                                                  "application/cbor": {"schema": {
                                                      "$ref": "#/components/schemas/FetchResponse"}},
                                                  "application/vnd.kraftlog.batch": {"schema": {
                                                      "type": "string", "format": "binary"}}}},
                                      "416": _err("OFFSET_OUT_OF_RANGE"), "421": _err("NOT_LEADER_OR_FOLLOWER"),
                                      "429": _err("THROTTLING_QUOTA_EXCEEDED (too many long polls)")}},
            },
            "/v1/topics/{topic}/partitions/{partition}/offsets": {
                "parameters": [_T, _P, {"name": "timestamp", "in": "query", "schema": {"type": "integer"}}],
                "get": {"summary": "Log start offset and high watermark, or the offset for a timestamp",
                        "responses": {"200": {"description": "{log_start_offset, local_log_start_offset, high_watermark} or {offset}",
                                              "content": {"application/json": {"schema": {"type": "object"}}}}}},
            },
            "/v1/topics/{topic}/partitions/{partition}/delete-records": {
                "parameters": [_T, _P],
                "post": {"summary": "Advance the log start offset",
                         "requestBody": {"required": True, "content": {"application/json": {"schema": {
                             "type": "object", "properties": {"before_offset": {"type": "integer"}}}}}},
                         "responses": {"200": {"description": "{log_start_offset}",
                                               "content": {"application/json": {"schema": {"type": "object"}}}},
                                       "416": _err("OFFSET_OUT_OF_RANGE")}},
            },
            "/v1/groups/{group}/offsets": {
                "parameters": [_G],
                "post": {"summary": "Commit group offsets (offset = next record to read)",
                         "requestBody": {"required": True, "content": {"application/json": {"schema": {
                             "$ref": "#/components/schemas/GroupOffsets"}}}},
                         "responses": {"200": _json("GroupOffsets")}},
                "get": {"summary": "Committed group offsets", "responses": {"200": _json("GroupOffsets")}},
            },
            # consumer groups (http_api/broker/groups.py): any broker answers, forwarding to the coordinator
            "/v1/groups": {"get": {"summary": "List groups (every coordinator)", "responses": {"200": _obj(
                "{groups: [{group_id, state, members, coordinator_id}]}")}}},
            "/v1/groups/{group}": {"parameters": [_G], "get": {
                "summary": "Describe a group: members, assignments, per-partition committed offset, "
                           "high_watermark, log_end_offset, lag", "responses": {
                    "200": _obj("{group_id, state, assignor, group_epoch, members, partitions, total_lag}"),
                    "404": _err("GROUP_ID_NOT_FOUND")}},
                "delete": {"summary": "Delete an empty group and its committed offsets", "responses": {
                    "204": {"description": "Deleted"}, "404": _err("GROUP_ID_NOT_FOUND"),
                    "409": _err("NON_EMPTY_GROUP")}}},
            "/v1/groups/{group}/coordinator": {"parameters": [_G], "get": {
                "summary": "The group's coordinator", "responses": {"200": _obj(
                    "{group_id, partition, coordinator_id, coordinator_url}")}}},
            "/v1/groups/{group}/join": {"parameters": [_G], "post": {
                "summary": "Join: {subscribed_topics, member_id?, session_timeout_ms?, rebalance_timeout_ms?, "
                           "assignor? (range|roundrobin|sticky), client_id?}",
                "requestBody": _obj_body(), "responses": {"200": _obj(_HEARTBEAT),
                                                          "400": _err("INVALID_SESSION_TIMEOUT / UNSUPPORTED_ASSIGNOR")}}},
            "/v1/groups/{group}/heartbeat": {"parameters": [_G], "post": {
                "summary": "Heartbeat: {member_id, member_epoch, owned?: [{topic, partition}], "
                           "subscribed_topics?}; answers the current assignment",
                "requestBody": _obj_body(), "responses": {"200": _obj(_HEARTBEAT), "409": _err(
                    "UNKNOWN_MEMBER_ID / FENCED_MEMBER_EPOCH: rejoin with member_epoch 0")}}},
            "/v1/groups/{group}/leave": {"parameters": [_G], "post": {
                "summary": "Leave: {member_id}", "requestBody": _obj_body(),
                "responses": {"200": _obj("{member_id, member_epoch: -1}")}}},
            "/internal/v1/groups": {"get": {"summary": "Broker-to-broker: groups of this coordinator",
                                            "responses": {"200": _obj("{groups}"), "401": _err("SASL_AUTHENTICATION_FAILED: without the token of the cluster secret (brokers only)")}}},
            "/v1/producer-ids": {
                "post": {"summary": "A producer id for an idempotent producer (sequence numbers per partition)",
                         "responses": {"200": {"description": "{producer_id, producer_epoch}",
                                               "content": {"application/json": {"schema": {"type": "object"}}}}}},
            },
            "/internal/v1/replica-fetch": {
                "post": {"summary": "Broker-to-broker: a follower's batched long poll of every partition it "
                                    "follows from this leader (see http_api/broker/replica_client.py)",
                         "responses": {"200": {"description": "4-byte header length, JSON header, raw batches",
                                               "content": {"application/vnd.kraftlog.replica-fetch": {"schema": {
                                                   "type": "string", "format": "binary"}}}},
                                       "401": _err("SASL_AUTHENTICATION_FAILED: without the token of the cluster secret (brokers only)")}},
            },
            "/internal/v1/epoch-end-offsets": {
                "post": {"summary": "Broker-to-broker: OffsetsForLeaderEpoch (divergence point for truncation)",
                         "responses": {"200": {"description": "{partitions: [{topic, partition, epoch, end_offset}]}",
                                               "content": {"application/json": {"schema": {"type": "object"}}}},
                                       "401": _err("SASL_AUTHENTICATION_FAILED: without the token of the cluster secret (brokers only)")}},
            },
            "/admin/v1/log-cleaner/run": {"post": {  # http_api/broker/log_cleaner.py
                "summary": "Run retention and/or compaction now (waits for it); body optional: "
                           "{topic?, compaction?: bool, retention?: bool, force?: bool (ignore dirty ratio)}",
                "requestBody": {"required": False, "content": {"application/json": {"schema": {"type": "object"}}}},
                "responses": {"200": _obj("{cleaned: [{topic, partition, first_dirty_offset, end_offset, "
                                          "segments_cleaned, bytes_read, bytes_written, tombstones_removed, "
                                          "elapsed_s, aborted, ...}], retention: {segments_deleted, logs}}"),
                              "400": _err("INVALID_REQUEST")}}},
            "/admin/v1/log-cleaner": {"get": {"summary": "Log cleaner counters and dirty ratio per compacted log",
                                              "responses": {"200": _obj("counters, dirty_ratio: [{topic, "
                                                                        "partition, dirty_ratio}]")}}},
            **_SECURITY_ADMIN_PATHS,
            **_TRANSACTION_PATHS,
            **REASSIGNMENT_PATHS,   # http_api/broker/reassignments.py
            **STREAMING_PATHS,      # SSE: http_api/broker/streaming.py
            **REST_PROXY_PATHS,     # Confluent REST Proxy v2: http_api/rest_proxy/
            **CONSOLE_PATHS,        # web console: http_api/console/
            "/healthz": {"get": {"summary": "Liveness (open even with security on)",
                                 "responses": {"200": _obj("{status: ok, ...}"),
                                               "503": _obj("{status: starting, ...}: not ready yet")}}},
            "/metrics": {"get": {"summary": "Prometheus metrics", "responses": {"200": {"description": "text"}}}},
            "/openapi.json": {"get": {"summary": "This document", "responses": {"200": {"description": "OpenAPI"}}}},
        }),
        "components": {"schemas": {
            "Error": {"type": "object", "required": ["error_code", "message"],
                      "properties": {"error_code": {"type": "string"}, "message": {"type": "string"}}},
            "Partition": {"type": "object", "properties": {
                "partition": {"type": "integer"}, "leader": {"type": "integer"},
                "leader_epoch": {"type": "integer"},
                "replicas": {"type": "array", "items": {"type": "integer"}},
                "isr": {"type": "array", "items": {"type": "integer"}},
                "adding_replicas": {"type": "array", "items": {"type": "integer"}},
                "removing_replicas": {"type": "array", "items": {"type": "integer"}}}},
            "Topic": {"type": "object", "properties": {
                "name": {"type": "string"},
                "partitions": {"type": "array", "items": {"$ref": "#/components/schemas/Partition"}},
                "configs": {"type": "object", "additionalProperties": {"type": "string"}}}},
            "TopicList": {"type": "object", "properties": {"topics": {"type": "array", "items": {"type": "string"}}}},
            "CreateTopic": {"type": "object", "required": ["name"], "properties": {
                "name": {"type": "string"}, "partitions": {"type": "integer", "minimum": 1},
                "replication_factor": {"type": "integer", "minimum": 1},
                "configs": {"type": "object", "additionalProperties": {"type": "string"}}}},
            "Metadata": {"type": "object", "properties": {
                "cluster_id": {"type": "string"}, "controller_id": {"type": "integer"},
                "brokers": {"type": "array", "items": {"type": "object", "properties": {
                    "id": {"type": "integer"}, "url": {"type": "string"}, "rack": {"type": "string", "nullable": True},
                    "fenced": {"type": "boolean"}}}},
                "topics": {"type": "array", "items": {"$ref": "#/components/schemas/Topic"}}}},
            "Record": {"type": "object", "properties": {
                "key": {"type": "string", "nullable": True}, "value": {"type": "string", "nullable": True},
                "key_b64": {"type": "string"}, "value_b64": {"type": "string"},
                "headers": {"type": "object", "additionalProperties": {"type": "string"}},
                "partition": {"type": "integer"}, "timestamp": {"type": "integer"}}},
            "ProduceRequest": {"type": "object", "required": ["records"], "properties": {
                "records": {"type": "array", "items": {"$ref": "#/components/schemas/Record"}}}},
            "ProduceResponse": {"type": "object", "properties": {"offsets": {"type": "array", "items": {
                "type": "object", "properties": {"partition": {"type": "integer"}, "offset": {"type": "integer"},
                                                 "error_code": {"type": "string"}}}}}},
            "FetchResponse": {"type": "object", "properties": {
                "records": {"type": "array", "items": {"allOf": [
                    {"$ref": "#/components/schemas/Record"},
                    {"type": "object", "properties": {"offset": {"type": "integer"}}}]}},
                "next_offset": {"type": "integer"}, "high_watermark": {"type": "integer"},
                "last_stable_offset": {"type": "integer"},
                "log_start_offset": {"type": "integer"}}},
            "GroupOffsets": {"type": "object", "properties": {"offsets": {"type": "array", "items": {
                "type": "object", "properties": {"topic": {"type": "string"}, "partition": {"type": "integer"},
                                                 "offset": {"type": "integer"}}}}}},
        }},
    }
