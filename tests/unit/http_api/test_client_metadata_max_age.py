"""The Python client's metadata cache honours metadata_max_age_ms (Kafka's metadata.max.age.ms):
older metadata is refreshed before the next lookup, so partitions added to a topic are used
(producer partitioning, leader lookups) without an error; a failed refresh keeps the cache."""
import pytest

from http_api.client.producer import Producer
from http_api.client.transport import DEFAULT_METADATA_MAX_AGE_MS, MetadataCache, Transport
from partitions.errors import ErrorCode, KraftlogError


def _doc(partitions: int) -> dict:
    return {"cluster_id": "c", "controller_id": 1,
            "brokers": [{"id": 1, "url": "http://b1:1", "rack": None, "fenced": False}],
            "topics": [{"name": "t", "partitions": [{"partition": p, "leader": 1, "leader_epoch": 0,
                                                     "replicas": [1], "isr": [1]} for p in range(partitions)]}]}


class _Brokers:
    """Stands in for the brokers' /v1/metadata answers."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self.calls = 0
        self.down = False

    async def one(self, url: str) -> dict:
        self.calls += 1
        if self.down:
            raise KraftlogError(ErrorCode.BROKER_NOT_AVAILABLE, "down")
        return _doc(self.partitions)


def _cache(brokers: _Brokers, max_age_ms: int) -> MetadataCache:
    m = MetadataCache(Transport("http://b1:1", client_id="x", request_timeout_ms=30_000), max_age_ms)
    m._one = brokers.one
    return m


async def test_partitions_added_since_are_seen_once_the_metadata_is_older_than_max_age():
    brokers = _Brokers(2)
    m = _cache(brokers, 60_000)
    assert await m.partitions("t") == 2
    brokers.partitions = 4
    assert await m.partitions("t") == 2 and brokers.calls == 1     # fresh: served from the cache
    m.fetched_at -= 61                                               # a minute later
    assert await m.partitions("t") == 4 and brokers.calls == 2


async def test_a_leader_lookup_of_a_partition_added_since_refreshes_at_once():
    brokers = _Brokers(2)
    m = _cache(brokers, DEFAULT_METADATA_MAX_AGE_MS)
    assert await m.leader_url("t", 1) == "http://b1:1"
    brokers.partitions = 3
    assert await m.leader_url("t", 2) == "http://b1:1"


async def test_a_failed_refresh_of_stale_metadata_keeps_serving_the_cache():
    brokers = _Brokers(2)
    m = _cache(brokers, 10)
    assert await m.partitions("t") == 2
    brokers.down = True
    m.fetched_at -= 1
    assert await m.partitions("t") == 2 and await m.leader_url("t", 0) == "http://b1:1"


async def test_keyless_records_spread_onto_added_partitions_once_the_metadata_ages():
    brokers = _Brokers(1)
    producer = Producer("http://b1:1", metadata_max_age_ms=1_000)
    producer.meta._one = brokers.one
    try:
        assert producer.meta.metadata_max_age_ms == 1_000
        assert {await producer._partition_for("t", None, None) for _ in range(5)} == {0}
        brokers.partitions = 8
        producer.meta.fetched_at -= 2
        seen = set()
        for _ in range(200):
            p = await producer._partition_for("t", None, None)
            seen.add(p)
            producer._sticky.pop("t", None)     # as after each sealed batch
        assert seen - {0}, seen
    finally:
        await producer.t.close()


def test_the_default_is_kafkas_five_minutes_and_negative_ages_are_refused():
    assert DEFAULT_METADATA_MAX_AGE_MS == 300_000
    with pytest.raises(ValueError, match="metadata_max_age_ms"):
        MetadataCache(Transport("http://b1:1", client_id="x", request_timeout_ms=30_000), -1)
