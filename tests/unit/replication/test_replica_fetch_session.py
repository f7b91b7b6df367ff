"""Incremental replica fetch sessions between two ReplicaManagers in one process (real logs,
the replica-fetch answer encoded and decoded as on the wire, no sockets): requests name only
changed partitions, answers hold only partitions with news, an append to one partition wakes
the parked session, idle followers stay live on the leader, and a follower whose session the
leader lost (restart) starts over and catches up."""
import asyncio
import contextlib

from http_api.broker import replica_client
from partitions.errors import KraftlogError
from partitions.replication.fetch_session import FetchSessionCache
from partitions.replication.replica_fetcher import ReplicaFetcherManager
from partitions.replication.replica_manager import ACKS_ALL, ReplicaManager
from partitions.replication.replica_state import ReplicaFetchRequest
from partitions.log.config import LogConfig
from tests.unit.replication.test_replica_fetcher import DirectTransport, DiskLogManager, batch, image, wait_for

import pytest

PARTITIONS = 12


class SessionTransport(DirectTransport):
    """DirectTransport speaking incremental fetch sessions, through the wire header."""

    supports_fetch_sessions = True

    def __init__(self, leaders: dict) -> None:
        super().__init__(leaders)
        self.answers: list[list[tuple[str, int]]] = []
        self.session_errors: list[str] = []

    async def fetch(self, url, replica_id, broker_epoch, partitions, *, max_bytes, partition_max_bytes,
                    max_wait_ms, session=None):
        if session is None:   # a keep-alive (or a sessionless fetch), as the HTTP transport sends it
            return await super().fetch(url, replica_id, broker_epoch, partitions, max_bytes=max_bytes,
                                       partition_max_bytes=partition_max_bytes, max_wait_ms=max_wait_ms)
        self.fetches.append([(p["topic"], p["partition"]) for p in partitions])
        rm = self.leaders[url]
        reqs = [ReplicaFetchRequest(p["topic"], p["partition"], p["offset"], p["leader_epoch"], p["high_watermark"])
                for p in partitions]
        sid, epoch, forgotten = session
        new_sid, error, answered = await rm.replica_fetch_session(
            replica_id, sid, epoch, reqs, [(f["topic"], f["partition"]) for f in forgotten], max_bytes=max_bytes,
            partition_max_bytes=partition_max_bytes, max_wait_ms=max_wait_ms, broker_epoch=broker_epoch)
        entries, chunks = [], []
        for (t, p), res in answered:
            if isinstance(res, KraftlogError):
                entries.append(replica_client.error_entry(t, p, res))
            else:
                entries.append({"topic": t, "partition": p, "size": len(res.records),
                                "high_watermark": res.high_watermark, "log_start_offset": res.log_start_offset,
                                "log_end_offset": res.log_end_offset})
                chunks.append(bytes(res.records))
        extra = {"session_id": new_sid}
        if error:
            extra["session_error"] = error
            self.session_errors.append(error)
        self.answers.append([(e["topic"], e["partition"]) for e in entries])
        return replica_client.decode_fetch_response(replica_client.encode_fetch_header(entries, **extra)
                                                    + b"".join(chunks))


@contextlib.asynccontextmanager
async def leader_and_follower(tmp_path, transport_cls=None, fetch_wait_max_ms: int = 5000):
    """Brokers 1 and 2 on disk logs, each with a fetcher over a `transport_cls`
    (SessionTransport) -> (replica managers, fetcher managers, transport, apply(image))."""
    (tmp_path / "1").mkdir()
    (tmp_path / "2").mkdir()
    rms = {b: ReplicaManager(b, DiskLogManager(tmp_path / str(b)), request_timeout_ms=3000,
                             default_log_config_factory=lambda c: LogConfig()) for b in (1, 2)}
    transport = (transport_cls or SessionTransport)({"http://b1": rms[1], "http://b2": rms[2]})
    fetchers = {b: ReplicaFetcherManager(rms[b], transport, b, fetch_wait_max_ms=fetch_wait_max_ms, backoff_ms=10)
                for b in (1, 2)}

    async def apply(img):
        for b in (1, 2):
            await rms[b].apply_metadata(img)
            fetchers[b].sync(img)
    try:
        yield rms, fetchers, transport, apply
    finally:
        for f in fetchers.values():
            await f.close()
        for rm in rms.values():
            rm.begin_shutdown()
            for lg in rm.log_manager.logs.values():
                lg.close()


@pytest.fixture
async def pair(tmp_path):
    # a long poll much longer than the acks=all timeouts below: only a wake-up answers in time
    async with leader_and_follower(tmp_path) as rig:
        yield rig


async def caught_up(rms, partitions=range(PARTITIONS)):
    await wait_for(lambda: all(rms[2].logs[("t", p)].log_end_offset == rms[1].logs[("t", p)].log_end_offset
                               for p in partitions), timeout=10)


async def test_requests_name_only_changed_partitions_and_answers_only_news(pair):
    rms, fetchers, transport, apply = pair
    await apply(image(leader=1, epoch=1, partitions=PARTITIONS))
    for p in range(PARTITIONS):
        await rms[1].append("t", p, batch(b"x"), acks=1)
    await caught_up(rms)
    await wait_for(lambda: all(rms[1].partitions[("t", p)].high_watermark == 1 for p in range(PARTITIONS)))
    n = len(transport.fetches)
    # an acks=all write to one partition completes through the parked session's wake-up
    await asyncio.wait_for(rms[1].append("t", 7, batch(b"y"), acks=ACKS_ALL, timeout_ms=3000), 4)
    await asyncio.wait_for(rms[1].append("t", 9, batch(b"z"), acks=ACKS_ALL, timeout_ms=3000), 4)
    later = transport.fetches[n:]
    assert later and all(len(f) <= 2 for f in later), later      # never all 12 again
    assert any(("t", 7) in f for f in later)                     # the follower's new offset, named
    assert all(len(a) <= 2 for a in transport.answers[n:]), transport.answers[n:]
    assert transport.session_errors == []
    f = fetchers[2].fetchers[1].session
    assert f.full_fetches == 1 and f.incremental_fetches >= 2
    await caught_up(rms)
    assert rms[2].logs[("t", 9)].read(0, 1 << 20).records == rms[1].logs[("t", 9)].read(0, 1 << 20).records


async def test_idle_caught_up_follower_stays_live_on_the_leader(pair):
    rms, fetchers, transport, apply = pair
    for rm in rms.values():
        rm.fetch_session_refresh_ms = 0
    fetchers[2].fetch_wait_max_ms = 50
    await apply(image(leader=1, epoch=1, partitions=PARTITIONS))
    await rms[1].append("t", 3, batch(b"x"), acks=1)
    await caught_up(rms)
    part = rms[1].partitions[("t", 10)]
    before = part.remote_replicas[2].last_fetch_time_ms
    n = len(transport.fetches)
    await wait_for(lambda: part.remote_replicas[2].last_fetch_time_ms > before + 100, timeout=5)
    assert all(("t", 10) not in f for f in transport.fetches[n:])   # progress restated, never named


async def test_follower_whose_session_the_leader_lost_starts_over_and_catches_up(pair):
    rms, fetchers, transport, apply = pair
    fetchers[2].fetch_wait_max_ms = 200   # the poll parked on the lost session ends soon
    await apply(image(leader=1, epoch=1, partitions=PARTITIONS))
    await rms[1].append("t", 0, batch(b"a"), acks=1)
    await caught_up(rms)
    rms[1].fetch_sessions = FetchSessionCache(first_id=1000)   # the leader restarted: its sessions are gone
    await asyncio.wait_for(rms[1].append("t", 5, batch(b"b"), acks=ACKS_ALL, timeout_ms=3000), 4)
    for p in range(PARTITIONS):
        await rms[1].append("t", p, batch(b"c"), acks=1)
    await caught_up(rms)
    assert transport.session_errors, "the follower's incremental fetch met the lost session"
    f = fetchers[2].fetchers[1].session
    assert f.full_fetches >= 2 and f.session_id >= 1000


async def test_a_follower_busy_appending_an_answer_keeps_its_silence_clock_fresh(pair):
    """Issue 25: after a 10,000-partition create a follower spent 2-7 s appending one answer
    (the first record of thousands of new partitions) and sent its leader nothing meanwhile;
    the leader's 1.5 s silence rule dropped it from thousands of ISRs while acks=all produces
    waited, and it rejoined them seconds later (about 40,000 ISR changes per create). A
    fetcher busy between requests lets the keep-alive speak for it: the leader keeps hearing
    the follower's broker, and acks=all is not judged on a silence that is only work."""
    from partitions.replication.replica_fetcher import REPLICA_KEEPALIVE_INTERVAL_MS
    rms, fetchers, transport, apply = pair
    await apply(image(leader=1, epoch=1, partitions=PARTITIONS))
    for p in range(PARTITIONS):
        await rms[1].append("t", p, batch(b"x"), acks=1)
    await caught_up(rms)            # every partition in the follower's session
    busy_s = 2.0
    appending = asyncio.Event()
    real_flush = rms[2].follower_flush_if_needed

    async def slow_flush(topic, p):   # the follower's answer takes seconds to work through
        appending.set()
        await asyncio.sleep(busy_s)
        await real_flush(topic, p)
    rms[2].follower_flush_if_needed = slow_flush
    sent = fetchers[2].keepalives_sent
    t = asyncio.create_task(rms[1].append("t", 0, batch(b"a"), acks=ACKS_ALL, timeout_ms=10_000))
    await asyncio.wait_for(appending.wait(), 3)
    oldest_heard_ms = 0
    loop = asyncio.get_running_loop()
    end = loop.time() + busy_s - 0.3
    while loop.time() < end:   # sampled while the follower works through the answer
        oldest_heard_ms = max(oldest_heard_ms, rms[1]._clock_ms() - rms[1].core.fetch_requests_ms[2])
        # the ISR's silence rule (1.5 s, acks=all waiting on t-0) proposes no shrink
        assert rms[1].core.isr_changes(rms[1]._clock_ms(), lambda topic: 30_000,
                                       replica_fetch_silence_max_ms=1500) == []
        await asyncio.sleep(0.05)
    assert fetchers[2].keepalives_sent - sent >= 2
    assert oldest_heard_ms <= REPLICA_KEEPALIVE_INTERVAL_MS + 400
    await asyncio.wait_for(t, 5)   # completed once the follower fetches again
    assert sorted(rms[1].partitions[("t", 0)].isr) == [1, 2]
