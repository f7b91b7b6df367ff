"""Kafka-style error codes shared by the broker, the controller API and the client.

Every error that crosses HTTP is `{"error_code": "<NAME>", "message": "..."}` with the
HTTP status given here. `retriable` tells clients whether retrying (after a metadata
refresh where relevant) can succeed.
"""
from __future__ import annotations

import enum


class ErrorCode(enum.Enum):
    """(http_status, retriable) per Kafka error name.

    Members with the same (status, retriable) must stay distinct (an Enum would otherwise
    make INVALID_TOPIC_EXCEPTION an alias of CORRUPT_MESSAGE and report the wrong name), so
    each value gets its definition index as a third, tie-breaking element.
    """

    def __new__(cls, http_status: int, retriable: bool):
        obj = object.__new__(cls)
        obj._value_ = (http_status, retriable, len(cls.__members__))
        return obj

    UNKNOWN_SERVER_ERROR = (500, False)
    CORRUPT_MESSAGE = (400, False)
    INVALID_REQUEST = (400, False)
    INVALID_RECORD = (400, False)
    INVALID_TOPIC_EXCEPTION = (400, False)
    INVALID_PARTITIONS = (400, False)
    INVALID_REPLICATION_FACTOR = (400, False)
    INVALID_CONFIG = (400, False)
    INVALID_REQUIRED_ACKS = (400, False)
    UNSUPPORTED_COMPRESSION_TYPE = (400, False)
    UNSUPPORTED_MEDIA_TYPE = (415, False)
    MESSAGE_TOO_LARGE = (413, False)
    RECORD_LIST_TOO_LARGE = (413, False)
    UNKNOWN_TOPIC_OR_PARTITION = (404, True)
    TOPIC_ALREADY_EXISTS = (409, False)
    OFFSET_OUT_OF_RANGE = (416, False)
    NOT_LEADER_OR_FOLLOWER = (421, True)
    LEADER_NOT_AVAILABLE = (503, True)
    NOT_CONTROLLER = (421, True)
    NOT_ENOUGH_REPLICAS = (503, True)
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = (503, True)
    REQUEST_TIMED_OUT = (504, True)
    BROKER_NOT_AVAILABLE = (503, True)
    STALE_BROKER_EPOCH = (409, False)
    STALE_CONTROLLER_EPOCH = (409, False)
    FENCED_LEADER_EPOCH = (409, True)
    UNKNOWN_LEADER_EPOCH = (409, True)
    INVALID_UPDATE_VERSION = (409, False)
    INELIGIBLE_REPLICA = (409, False)
    DUPLICATE_BROKER_REGISTRATION = (409, False)
    OUT_OF_ORDER_SEQUENCE_NUMBER = (409, False)
    DUPLICATE_SEQUENCE_NUMBER = (409, False)
    INVALID_PRODUCER_EPOCH = (409, False)
    UNKNOWN_PRODUCER_ID = (409, True)
    POLICY_VIOLATION = (400, False)
    THROTTLING_QUOTA_EXCEEDED = (429, True)
    KAFKA_STORAGE_ERROR = (503, True)
    GROUP_ID_NOT_FOUND = (404, False)
    ILLEGAL_GENERATION = (409, False)
    UNKNOWN_MEMBER_ID = (409, False)
    FENCED_MEMBER_EPOCH = (409, False)
    COORDINATOR_NOT_AVAILABLE = (503, True)
    NOT_COORDINATOR = (421, True)
    # consumer groups (partitions/groups, http_api/group_routes.py)
    COORDINATOR_LOAD_IN_PROGRESS = (503, True)
    INVALID_SESSION_TIMEOUT = (400, False)
    UNSUPPORTED_ASSIGNOR = (400, False)
    INCONSISTENT_GROUP_PROTOCOL = (409, False)
    GROUP_MAX_SIZE_REACHED = (409, False)
    OFFSET_METADATA_TOO_LARGE = (400, False)
    NON_EMPTY_GROUP = (409, False)
    CLUSTER_AUTHORIZATION_FAILED = (401, False)   # /internal/ routes without the cluster token

    @property
    def http_status(self) -> int:
        return self.value[0]

    @property
    def retriable(self) -> bool:
        return self.value[1]


class KraftlogError(Exception):
    """An error with a Kafka error code; `extra` is merged into the JSON error body."""

    def __init__(self, code: ErrorCode, message: str, **extra):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.extra = extra

    def to_body(self) -> dict:
        body = {"error_code": self.code.name, "message": self.message}
        body.update(self.extra)
        return body

    @property
    def http_status(self) -> int:
        return self.code.http_status
