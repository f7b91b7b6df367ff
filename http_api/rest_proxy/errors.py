"""Confluent REST Proxy v2 error answers: `{"error_code": N, "message": ...}` where N is
Confluent's code (HTTP status * 100 + a subcode, or the bare HTTP status), as
io.confluent.kafkarest.Errors names them; kraftlog's own errors are mapped onto them."""
from __future__ import annotations

import json

from aiohttp import web

from http_api.wire.errors import http_status
from partitions.errors import ErrorCode, KraftlogError

# Confluent's codes (Errors.java) -> HTTP status
TOPIC_NOT_FOUND = 40401
PARTITION_NOT_FOUND = 40402
CONSUMER_INSTANCE_NOT_FOUND = 40403
LEADER_NOT_AVAILABLE = 40404
CONSUMER_FORMAT_MISMATCH = 40601
CONSUMER_ALREADY_SUBSCRIBED = 40901
CONSUMER_ALREADY_EXISTS = 40902
ILLEGAL_STATE = 40903
JSON_CONVERSION = 42203
INVALID_CONSUMER_CONFIG = 42204
INVALID_PAYLOAD = 42206
KAFKA_ERROR = 50002
KAFKA_RETRIABLE_ERROR = 50003

PROXY_CONTENT_TYPE = "application/vnd.kafka.v2+json"


class RestProxyError(Exception):
    """An error answered in Confluent's shape; `status` is the HTTP status."""

    def __init__(self, error_code: int, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.message = message
        self.status = status if status is not None else (error_code // 100 if error_code >= 1000 else error_code)

    def response(self) -> web.Response:
        return web.Response(body=json.dumps({"error_code": self.error_code, "message": self.message}).encode(),
                            status=self.status, content_type=PROXY_CONTENT_TYPE)


def from_kraftlog(e: KraftlogError) -> RestProxyError:
    """A kraftlog error as the Confluent proxy would answer the same Kafka error."""
    msg = f"{e.code.name}: {e.message}"
    if e.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
        return RestProxyError(TOPIC_NOT_FOUND, f"Topic not found. ({msg})")
    if e.code in (ErrorCode.LEADER_NOT_AVAILABLE,):
        return RestProxyError(LEADER_NOT_AVAILABLE, f"Leader not available. ({msg})")
    status = http_status(e)
    if status in (401, 403):
        return RestProxyError(status * 100 + 1, msg, status)     # 40101 / 40301: Kafka authentication / authorization
    if status in (400, 404, 409, 413, 415, 422):
        return RestProxyError(status, msg, status)
    if e.code.retriable:
        return RestProxyError(KAFKA_RETRIABLE_ERROR, f"Kafka retriable error: {msg}")
    return RestProxyError(KAFKA_ERROR, f"Kafka error: {msg}")


def topic_not_found(topic: str) -> RestProxyError:
    return RestProxyError(TOPIC_NOT_FOUND, f"Topic not found. (topic {topic!r} does not exist)")


def partition_not_found(topic: str, partition) -> RestProxyError:
    return RestProxyError(PARTITION_NOT_FOUND, f"Partition not found. ({topic}-{partition} does not exist)")


def instance_not_found(group: str, instance: str) -> RestProxyError:
    return RestProxyError(CONSUMER_INSTANCE_NOT_FOUND,
                          f"Consumer instance not found. (no instance {instance!r} in group {group!r} on this "
                          "proxy: it was deleted or expired; create one with POST /consumers/{group})")


def invalid(message: str) -> RestProxyError:
    return RestProxyError(422, message, 422)
