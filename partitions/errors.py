"""Kafka's error vocabulary, shared by every package (the ground floor of the import graph).

`ErrorCode` names an error the way Kafka does and says whether retrying (after a metadata
refresh where relevant) can succeed; `KraftlogError` carries one across layers. How an error
crosses a wire is the wire's business: the HTTP status of each code lives in
`http_api.wire.errors.HTTP_STATUS`. This module imports nothing of the project, so pure cores,
shells and clients all may import it.
"""
from __future__ import annotations

import enum
from typing import Any, Mapping


class ErrorCode(enum.Enum):
    """A Kafka error name with `retriable`.

    Each value is (retriable, definition index): the index keeps members with the same
    retriability distinct (an Enum would otherwise make them aliases of one another).
    """

    def __new__(cls, retriable: bool):
        obj = object.__new__(cls)
        obj._value_ = (retriable, len(cls.__members__))
        return obj

    UNKNOWN_SERVER_ERROR = (False,)
    CORRUPT_MESSAGE = (False,)
    INVALID_REQUEST = (False,)
    INVALID_RECORD = (False,)
    INVALID_TOPIC_EXCEPTION = (False,)
    INVALID_PARTITIONS = (False,)
    INVALID_REPLICATION_FACTOR = (False,)
    INVALID_CONFIG = (False,)
    INVALID_REQUIRED_ACKS = (False,)
    UNSUPPORTED_COMPRESSION_TYPE = (False,)
    UNSUPPORTED_MEDIA_TYPE = (False,)
    MESSAGE_TOO_LARGE = (False,)
    RECORD_LIST_TOO_LARGE = (False,)
    UNKNOWN_TOPIC_OR_PARTITION = (True,)
    TOPIC_ALREADY_EXISTS = (False,)
    OFFSET_OUT_OF_RANGE = (False,)
    NOT_LEADER_OR_FOLLOWER = (True,)
    LEADER_NOT_AVAILABLE = (True,)
    NOT_CONTROLLER = (True,)
    NOT_ENOUGH_REPLICAS = (True,)
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = (True,)
    REQUEST_TIMED_OUT = (True,)
    BROKER_NOT_AVAILABLE = (True,)
    STALE_BROKER_EPOCH = (False,)
    STALE_CONTROLLER_EPOCH = (False,)
    FENCED_LEADER_EPOCH = (True,)
    UNKNOWN_LEADER_EPOCH = (True,)
    INVALID_UPDATE_VERSION = (False,)
    INELIGIBLE_REPLICA = (False,)
    DUPLICATE_BROKER_REGISTRATION = (False,)
    OUT_OF_ORDER_SEQUENCE_NUMBER = (False,)
    DUPLICATE_SEQUENCE_NUMBER = (False,)
    INVALID_PRODUCER_EPOCH = (False,)
    UNKNOWN_PRODUCER_ID = (True,)
    POLICY_VIOLATION = (False,)
    THROTTLING_QUOTA_EXCEEDED = (True,)
    KAFKA_STORAGE_ERROR = (True,)
    GROUP_ID_NOT_FOUND = (False,)
    ILLEGAL_GENERATION = (False,)
    UNKNOWN_MEMBER_ID = (False,)
    FENCED_MEMBER_EPOCH = (False,)
    COORDINATOR_NOT_AVAILABLE = (True,)
    NOT_COORDINATOR = (True,)
    COORDINATOR_LOAD_IN_PROGRESS = (True,)
    INVALID_SESSION_TIMEOUT = (False,)
    UNSUPPORTED_ASSIGNOR = (False,)
    INCONSISTENT_GROUP_PROTOCOL = (False,)
    GROUP_MAX_SIZE_REACHED = (False,)
    OFFSET_METADATA_TOO_LARGE = (False,)
    NON_EMPTY_GROUP = (False,)
    CLUSTER_AUTHORIZATION_FAILED = (False,)   # /internal/ routes without the cluster token
    SASL_AUTHENTICATION_FAILED = (False,)     # no or bad credentials (HTTP 401 with WWW-Authenticate)
    TOPIC_AUTHORIZATION_FAILED = (False,)
    GROUP_AUTHORIZATION_FAILED = (False,)
    RESOURCE_NOT_FOUND = (False,)             # a user, token or ACL that does not exist (Kafka's RESOURCE_NOT_FOUND)
    DUPLICATE_RESOURCE = (False,)             # a user or ACL that already exists
    PRODUCER_FENCED = (False,)                # a newer producer initialised the same transactional id
    CONCURRENT_TRANSACTIONS = (True,)         # the transaction is still completing: retry
    INVALID_TXN_STATE = (False,)              # e.g. commit after abort of the same transaction
    INVALID_TRANSACTION_TIMEOUT = (False,)    # beyond transaction_max_timeout_ms
    INVALID_PRODUCER_ID_MAPPING = (False,)    # the producer id is not the transactional id's
    INVALID_VOTER_KEY = (False,)              # a controller's incarnation is not the registered one (KIP-853)
    DUPLICATE_VOTER = (False,)                # the controller id or address is a voter already (KIP-853)
    VOTER_NOT_FOUND = (False,)                # no controller voter with that id (KIP-853)

    @property
    def retriable(self) -> bool:
        return self.value[0]

    @classmethod
    def from_name(cls, name: Any) -> "ErrorCode":
        """The member called `name`; UNKNOWN_SERVER_ERROR for a name this version does not know."""
        return cls.__members__.get(name, cls.UNKNOWN_SERVER_ERROR) if isinstance(name, str) else cls.UNKNOWN_SERVER_ERROR


class KraftlogError(Exception):
    """An error with a Kafka error code; `extra` is merged into the error body on the wire."""

    def __init__(self, code: ErrorCode, message: str, **extra):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.extra = extra

    def to_body(self) -> dict:
        body = {"error_code": self.code.name, "message": self.message}
        body.update(self.extra)
        return body

    @classmethod
    def from_body(cls, body: Any, *, fallback: str = "", ignore: tuple[str, ...] = ()) -> "KraftlogError | None":
        """The error an answer body (`{"error_code": NAME, "message": ..., **extra}`) carries,
        or None when the body carries none. Keys in `ignore` (e.g. "topic", "partition" of a
        per-partition entry) are not copied into `extra`. `fallback` is the message when the
        body has none."""
        if not isinstance(body, Mapping) or "error_code" not in body:
            return None
        code = ErrorCode.from_name(body.get("error_code"))
        skip = {"error_code", "message", *ignore}
        extra = {k: v for k, v in body.items() if k not in skip}
        return cls(code, str(body.get("message", fallback)), **extra)
