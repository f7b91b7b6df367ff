"""The Python Producer with several requests in flight per partition
(max_in_flight_requests_per_connection, Kafka's max.in.flight.requests.per.connection) keeps
the records in send order with idempotence when requests are lost before or after the
leader wrote them and overtake each other; send_batch() columns keep their place too.

The leader here is a stand-in with Kafka's idempotent-producer rules (partitions/log/
producer_state.py): a sequence that does not follow the last written one is
OUT_OF_ORDER_SEQUENCE_NUMBER, a resend of one of the last 5 batches is answered with its
original offset and not written again."""
import asyncio
import json
import random

import pytest

from http_api.client.producer import Producer, columns_batch
from partitions.errors import ErrorCode, KraftlogError
from partitions.log import record_batch as rb


def _doc() -> dict:
    return {"cluster_id": "c", "controller_id": 1,
            "brokers": [{"id": 1, "url": "http://b1:1", "rack": None, "fenced": False}],
            "topics": [{"name": "t", "partitions": [{"partition": 0, "leader": 1, "leader_epoch": 0,
                                                     "replicas": [1], "isr": [1]}]}]}


class FakeLeader:
    """One partition's leader: the log, the idempotence check, injected failures and delays."""

    def __init__(self, seed: int, lose_before: float = 0.0, lose_after: float = 0.0) -> None:
        self.rng = random.Random(seed)
        self.lose_before = lose_before
        self.lose_after = lose_after
        self.log: list[bytes] = []
        self.last_seq: dict[int, int] = {}
        self.recent: dict[int, list[tuple[int, int, int]]] = {}   # pid -> [(first, last, offset)] last 5
        self.in_flight = 0
        self.max_in_flight = 0
        self.requests = 0
        self.out_of_order = 0
        self.lost_after_write = 0
        self.slow_lost_sequence: int | None = None
        self.jitter = 1.0

    async def meta_one(self, url: str) -> dict:
        return _doc()

    def _write(self, payload: bytes) -> int:
        (header, _), = list(rb.iter_batches(payload))
        values = [r.value for r in rb.decode_batches(payload)]
        pid, first, last = header.producer_id, header.base_sequence, header.base_sequence + header.record_count - 1
        for f, l, off in self.recent.get(pid, []):
            if (f, l) == (first, last):
                return off                                        # duplicate: original offset
        expected = self.last_seq.get(pid, -1) + 1
        if last < expected:
            return -1                                             # older than the 5 cached: offset unknown
        if first != expected:
            self.out_of_order += 1
            raise KraftlogError(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, f"expected {expected}, got {first}")
        off = len(self.log)
        self.log.extend(values)
        self.last_seq[pid] = last
        self.recent[pid] = (self.recent.get(pid, []) + [(first, last, off)])[-5:]
        return off

    async def attempt(self, tp, url: str, payload: bytes):
        (header, _), = list(rb.iter_batches(payload))
        if header.base_sequence == self.slow_lost_sequence:
            self.slow_lost_sequence = None   # once: written, answered late, and the answer lost
            self._write(payload)
            await asyncio.sleep(0.05)
            self.lost_after_write += 1
            raise KraftlogError(ErrorCode.BROKER_NOT_AVAILABLE, "connection reset after the append")
        self.requests += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            # requests overtake each other; a few are slow while later ones complete
            await asyncio.sleep(self.jitter * self.rng.random() * (0.03 if self.rng.random() < 0.1 else 0.004))
            if self.rng.random() < self.lose_before:
                raise KraftlogError(ErrorCode.BROKER_NOT_AVAILABLE, "connection reset before the append")
            off = self._write(payload)
            # the answer: a few are slow, so later batches are written before it is lost
            await asyncio.sleep(self.jitter * self.rng.random() * (0.03 if self.rng.random() < 0.1 else 0.002))
            if self.rng.random() < self.lose_after:
                self.lost_after_write += 1
                raise KraftlogError(ErrorCode.BROKER_NOT_AVAILABLE, "connection reset after the append")
            return 200, {}, json.dumps({"offsets": [{"partition": 0, "offset": off}]}).encode()
        finally:
            self.in_flight -= 1


def _producer(leader: FakeLeader, in_flight: int) -> Producer:
    p = Producer("http://b1:1", acks="all", linger_ms=0, batch_size_bytes=64, producer_id=7, producer_epoch=0,
                 retry_backoff_ms=1, retry_backoff_max_ms=2, max_in_flight_requests_per_connection=in_flight)
    p.meta._one = leader.meta_one
    p._attempt = leader.attempt
    return p


async def _produce(p: Producer, n: int) -> list:
    futs = []
    for i in range(n):
        futs.append(await p.send("t", b"%d" % i, partition=0))
        if i % 3 == 0:
            await asyncio.sleep(0)   # let the sender dispatch while records keep coming
    await p.flush()
    return futs


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_five_in_flight_keep_send_order_across_lost_requests_without_duplicates(seed):
    leader = FakeLeader(seed, lose_before=0.15, lose_after=0.15)
    p = _producer(leader, 5)
    try:
        futs = await _produce(p, 300)
    finally:
        await p.close()
    assert leader.max_in_flight > 1                        # really pipelined
    assert leader.lost_after_write > 0 and leader.out_of_order > 0   # the hard cases happened
    assert leader.log == [b"%d" % i for i in range(300)]   # in order, nothing twice, nothing lost
    assert [f.result().offset for f in futs] == list(range(300))


async def test_a_batch_resent_late_is_still_among_the_5_the_leader_remembers():
    """Slots of the in-flight window free in send order: while batch 0 (written, its answer
    lost late) waits for its resend, batches 5.. are not sent, so the leader still has
    batch 0 among a producer's last 5 and answers its original offset."""
    leader = FakeLeader(7)
    leader.jitter = 0.0   # the others are answered at once
    leader.slow_lost_sequence = 0
    p = _producer(leader, 5)
    p.batch_size_bytes = 1   # one record per batch
    try:
        futs = await _produce(p, 12)
    finally:
        await p.close()
    assert leader.lost_after_write == 1
    assert leader.log == [b"%d" % i for i in range(12)]
    assert [f.result().offset for f in futs] == list(range(12))


async def test_one_in_flight_sends_one_request_at_a_time():
    leader = FakeLeader(4)
    p = _producer(leader, 1)
    try:
        await _produce(p, 60)
    finally:
        await p.close()
    assert leader.max_in_flight == 1 and leader.log == [b"%d" % i for i in range(60)]


async def test_futures_resolve_in_send_order():
    leader = FakeLeader(5)
    p = _producer(leader, 5)
    order = []
    try:
        futs = []
        for i in range(100):
            f = await p.send("t", b"%d" % i, partition=0)
            f.add_done_callback(lambda _f, i=i: order.append(i))
            futs.append(f)
        await p.flush()
    finally:
        await p.close()
    assert order == list(range(100))


async def test_send_batch_columns_keep_their_place_among_send_records():
    leader = FakeLeader(6, lose_before=0.1, lose_after=0.1)
    p = _producer(leader, 5)
    try:
        a = await p.send("t", b"a", partition=0)
        cols = await p.send_batch("t", [b"b%d" % i for i in range(50)], partition=0)
        c = await p.send("t", b"c", partition=0)
        cols2 = await p.send_batch("t", [b"k-value", None], keys=[b"k", None], partition=0)
        await p.flush()
    finally:
        await p.close()
    assert leader.log == [b"a"] + [b"b%d" % i for i in range(50)] + [b"c", b"k-value", None]
    assert (a.result().offset, cols.result().offset, c.result().offset, cols2.result().offset) == (0, 1, 51, 52)


def test_columns_batch_writes_the_bytes_build_batch_writes():
    values = [b"v%d" % i for i in range(20)] + [None]
    for keys in (None, [b"k%d" % i for i in range(21)], [None] * 20 + [b"x"]):
        recs = [rb.Record(None if keys is None else keys[i], v, (), 1234) for i, v in enumerate(values)]
        assert columns_batch(values, keys, timestamp_ms=1234, producer_id=3, producer_epoch=1,
                             base_sequence=9) == rb.build_batch(recs, producer_id=3, producer_epoch=1,
                                                                base_sequence=9)
    got = [(r.key, r.value) for r in rb.decode_batches(columns_batch([b"a"], [b"k"], compression=rb.Compression.ZSTD))]
    assert got == [(b"k", b"a")]


def test_more_than_five_in_flight_with_idempotence_is_refused():
    with pytest.raises(ValueError, match="<= 5"):
        Producer("http://b1:1", acks="all", max_in_flight_requests_per_connection=6)
    Producer("http://b1:1", acks="1", max_in_flight_requests_per_connection=6)


async def test_records_with_headers_or_own_timestamps_keep_them_among_plain_ones():
    sent = []

    async def attempt(tp, url, payload):
        sent.append(payload)
        return 200, {}, json.dumps({"offsets": [{"partition": 0, "offset": 0}]}).encode()

    p = Producer("http://b1:1", acks="1", linger_ms=50)
    p.meta._one = FakeLeader(0).meta_one
    p._attempt = attempt
    try:
        await p.send("t", b"plain", key=b"k1", partition=0)
        await p.send("t", b"with-headers", headers={"h": "v"}, partition=0)
        await p.send("t", b"with-ts", timestamp=42, partition=0)
        await p.flush()
    finally:
        await p.close()
    assert len(sent) == 1
    got = [(r.key, r.value, tuple(r.headers), r.timestamp == 42) for r in rb.decode_batches(sent[0])]
    assert got == [(b"k1", b"plain", (), False), (None, b"with-headers", (("h", b"v"),), False),
                   (None, b"with-ts", (), True)]
