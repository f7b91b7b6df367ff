"""The error vocabulary (partitions.errors) and its HTTP mapping (http_api.wire.errors)."""
from __future__ import annotations

import pytest

from http_api.wire.errors import HTTP_STATUS, http_status
from partitions.errors import ErrorCode, KraftlogError


def test_every_code_has_an_http_status_and_members_are_distinct():
    assert set(HTTP_STATUS) == set(ErrorCode)
    # same retriability must not make two names aliases of one member
    assert len({c.name for c in ErrorCode}) == len(ErrorCode.__members__)
    assert ErrorCode.INVALID_TOPIC_EXCEPTION is not ErrorCode.CORRUPT_MESSAGE


@pytest.mark.parametrize("code,status,retriable", [
    (ErrorCode.NOT_LEADER_OR_FOLLOWER, 421, True),
    (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, 404, True),
    (ErrorCode.OFFSET_OUT_OF_RANGE, 416, False),
    (ErrorCode.MESSAGE_TOO_LARGE, 413, False),
    (ErrorCode.CLUSTER_AUTHORIZATION_FAILED, 403, False),   # authenticated, not allowed (API.md Security)
    (ErrorCode.SASL_AUTHENTICATION_FAILED, 401, False),
])
def test_status_and_retriability(code, status, retriable):
    assert http_status(code) == status and http_status(KraftlogError(code, "x")) == status
    assert code.retriable is retriable


def test_from_body_round_trips_and_keeps_extra():
    err = KraftlogError(ErrorCode.NOT_LEADER_OR_FOLLOWER, "moved", leader_id=2, leader_url="http://b2")
    back = KraftlogError.from_body(err.to_body())
    assert back.code is ErrorCode.NOT_LEADER_OR_FOLLOWER and back.message == "moved"
    assert back.extra == {"leader_id": 2, "leader_url": "http://b2"}


def test_from_body_ignores_entry_keys_and_unknown_names():
    entry = {"topic": "t", "partition": 3, "error_code": "NO_SUCH_CODE_YET", "message": "m", "x": 1}
    err = KraftlogError.from_body(entry, ignore=("topic", "partition"))
    assert err.code is ErrorCode.UNKNOWN_SERVER_ERROR and err.extra == {"x": 1}


@pytest.mark.parametrize("body", [None, [], "oops", {"message": "no code"}])
def test_from_body_without_an_error_is_none(body):
    assert KraftlogError.from_body(body) is None
