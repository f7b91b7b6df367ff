"""How Kafka's error codes cross HTTP: the status of each code, and error responses.

Every error that crosses HTTP is `{"error_code": "<NAME>", "message": "..."}` with the
HTTP status given by `HTTP_STATUS`. The vocabulary itself (`ErrorCode`, `KraftlogError`)
lives in `partitions.errors`, importable by every package; it is re-exported here for the
HTTP shells.
"""
from __future__ import annotations

from partitions.errors import ErrorCode, KraftlogError

__all__ = ["ErrorCode", "KraftlogError", "HTTP_STATUS", "http_status"]

HTTP_STATUS: dict[ErrorCode, int] = {
    ErrorCode.UNKNOWN_SERVER_ERROR: 500,
    ErrorCode.CORRUPT_MESSAGE: 400,
    ErrorCode.INVALID_REQUEST: 400,
    ErrorCode.INVALID_RECORD: 400,
    ErrorCode.INVALID_TOPIC_EXCEPTION: 400,
    ErrorCode.INVALID_PARTITIONS: 400,
    ErrorCode.INVALID_REPLICATION_FACTOR: 400,
    ErrorCode.INVALID_CONFIG: 400,
    ErrorCode.INVALID_REQUIRED_ACKS: 400,
    ErrorCode.UNSUPPORTED_COMPRESSION_TYPE: 400,
    ErrorCode.UNSUPPORTED_MEDIA_TYPE: 415,
    ErrorCode.MESSAGE_TOO_LARGE: 413,
    ErrorCode.RECORD_LIST_TOO_LARGE: 413,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: 404,
    ErrorCode.TOPIC_ALREADY_EXISTS: 409,
    ErrorCode.OFFSET_OUT_OF_RANGE: 416,
    ErrorCode.NOT_LEADER_OR_FOLLOWER: 421,
    ErrorCode.LEADER_NOT_AVAILABLE: 503,
    ErrorCode.NOT_CONTROLLER: 421,
    ErrorCode.NOT_ENOUGH_REPLICAS: 503,
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND: 503,
    ErrorCode.REQUEST_TIMED_OUT: 504,
    ErrorCode.BROKER_NOT_AVAILABLE: 503,
    ErrorCode.STALE_BROKER_EPOCH: 409,
    ErrorCode.STALE_CONTROLLER_EPOCH: 409,
    ErrorCode.FENCED_LEADER_EPOCH: 409,
    ErrorCode.UNKNOWN_LEADER_EPOCH: 409,
    ErrorCode.INVALID_UPDATE_VERSION: 409,
    ErrorCode.INELIGIBLE_REPLICA: 409,
    ErrorCode.DUPLICATE_BROKER_REGISTRATION: 409,
    ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER: 409,
    ErrorCode.DUPLICATE_SEQUENCE_NUMBER: 409,
    ErrorCode.INVALID_PRODUCER_EPOCH: 409,
    ErrorCode.PRODUCER_FENCED: 400,
    ErrorCode.CONCURRENT_TRANSACTIONS: 409,
    ErrorCode.INVALID_TXN_STATE: 409,
    ErrorCode.INVALID_TRANSACTION_TIMEOUT: 400,
    ErrorCode.INVALID_PRODUCER_ID_MAPPING: 400,
    ErrorCode.UNKNOWN_PRODUCER_ID: 409,
    ErrorCode.POLICY_VIOLATION: 400,
    ErrorCode.THROTTLING_QUOTA_EXCEEDED: 429,
    ErrorCode.KAFKA_STORAGE_ERROR: 503,
    ErrorCode.GROUP_ID_NOT_FOUND: 404,
    ErrorCode.ILLEGAL_GENERATION: 409,
    ErrorCode.UNKNOWN_MEMBER_ID: 409,
    ErrorCode.FENCED_MEMBER_EPOCH: 409,
    ErrorCode.COORDINATOR_NOT_AVAILABLE: 503,
    ErrorCode.NOT_COORDINATOR: 421,
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS: 503,
    ErrorCode.INVALID_SESSION_TIMEOUT: 400,
    ErrorCode.UNSUPPORTED_ASSIGNOR: 400,
    ErrorCode.INCONSISTENT_GROUP_PROTOCOL: 409,
    ErrorCode.GROUP_MAX_SIZE_REACHED: 409,
    ErrorCode.OFFSET_METADATA_TOO_LARGE: 400,
    ErrorCode.NON_EMPTY_GROUP: 409,
    ErrorCode.CLUSTER_AUTHORIZATION_FAILED: 403,   # authenticated but not allowed (API.md Security)
    ErrorCode.SASL_AUTHENTICATION_FAILED: 401,
    ErrorCode.TOPIC_AUTHORIZATION_FAILED: 403,
    ErrorCode.GROUP_AUTHORIZATION_FAILED: 403,
    ErrorCode.RESOURCE_NOT_FOUND: 404,
    ErrorCode.DUPLICATE_RESOURCE: 409,
    ErrorCode.INVALID_VOTER_KEY: 409,
    ErrorCode.DUPLICATE_VOTER: 409,
    ErrorCode.VOTER_NOT_FOUND: 404,
}

_missing = [c.name for c in ErrorCode if c not in HTTP_STATUS]
if _missing:  # a new ErrorCode needs its status here
    raise RuntimeError(f"error codes without an HTTP status in HTTP_STATUS: {_missing}")


def http_status(err: "KraftlogError | ErrorCode") -> int:
    """The HTTP status an error (or error code) is answered with."""
    return HTTP_STATUS[err.code if isinstance(err, KraftlogError) else err]
