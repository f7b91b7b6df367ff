"""A replica fetch that times out keeps its fetch session (issue 25): the follower re-sends
the same session epoch naming every partition that differs from its last answered request.
Resetting on every timeout made a busy leader (its loop held 2-4 s at 100,000 partitions)
take a full fetch of tens of thousands of partitions after each one, which made it busier.
- The lost request never reached the leader: the re-send is accepted, no full fetch, and
  what the lost request named (here: new records to fetch) is fetched.
- The leader answered it but the answer was lost: it is one epoch ahead, answers
  INVALID_FETCH_SESSION_EPOCH, and the follower starts over with a full fetch (as before).
- A refused connection (the leader's process is gone) still resets the session."""
from __future__ import annotations

import pytest

from partitions.errors import ErrorCode, KraftlogError
from partitions.replication.fetch_session import INVALID_EPOCH
from tests.unit.replication.test_replica_fetch_session import SessionTransport, caught_up, leader_and_follower
from tests.unit.replication.test_replica_fetcher import batch, image, wait_for


class FlakyTransport(SessionTransport):
    """`lose` = "request": the next fetch fails before reaching the leader; "answer": the
    leader handles it, then the answer is lost. `refused`: the failure says nothing listens."""

    def __init__(self, leaders: dict) -> None:
        super().__init__(leaders)
        self.lose: str | None = None
        self.refused = False

    async def fetch(self, url, replica_id, broker_epoch, partitions, **kw):
        lose, self.lose = self.lose, None
        if lose == "request":
            raise KraftlogError(ErrorCode.BROKER_NOT_AVAILABLE, "leader unreachable: timed out", refused=self.refused)
        answer = await super().fetch(url, replica_id, broker_epoch, partitions, **kw)
        if lose == "answer":
            raise KraftlogError(ErrorCode.BROKER_NOT_AVAILABLE, "leader unreachable: timed out")
        return answer


@pytest.fixture
async def flaky(tmp_path):
    async with leader_and_follower(tmp_path, FlakyTransport, fetch_wait_max_ms=200) as (rms, fetchers, transport, apply):
        await apply(image(leader=1, epoch=1, partitions=6))
        yield rms, fetchers, transport


async def _round(rms, transport, lose, value: bytes, refused: bool = False):
    transport.refused = refused
    transport.lose = lose
    await wait_for(lambda: transport.lose is None, timeout=5)   # the next request took the loss
    for p in range(6):
        await rms[1].append("t", p, batch(value), acks=1)
    await caught_up(rms, range(6))


async def test_a_lost_request_is_re_sent_in_the_same_session(flaky):
    rms, fetchers, transport = flaky
    await _round(rms, transport, None, b"a")
    session = fetchers[2].fetchers[1].session
    assert session.full_fetches == 1
    await _round(rms, transport, "request", b"b")
    assert session.full_fetches == 1 and session.resent_fetches >= 1
    assert fetchers[2].fetchers[1].unanswered_requests == 1   # counted for the rate-limited log line
    assert transport.session_errors == []
    for p in range(6):
        assert rms[2].logs[("t", p)].log_end_offset == rms[1].logs[("t", p)].log_end_offset == 2


async def test_a_lost_answer_costs_one_full_fetch_as_before(flaky):
    rms, fetchers, transport = flaky
    await _round(rms, transport, None, b"a")
    session = fetchers[2].fetchers[1].session
    await _round(rms, transport, "answer", b"b")
    assert INVALID_EPOCH in transport.session_errors
    assert session.full_fetches == 2
    for p in range(6):
        assert rms[2].logs[("t", p)].log_end_offset == rms[1].logs[("t", p)].log_end_offset == 2


async def test_a_refused_connection_still_starts_over(flaky):
    rms, fetchers, transport = flaky
    await _round(rms, transport, None, b"a")
    session = fetchers[2].fetchers[1].session
    await _round(rms, transport, "request", b"b", refused=True)
    assert session.full_fetches == 2 and session.resent_fetches == 0
    assert fetchers[2].fetchers[1].unanswered_requests == 0   # a refusal is not an unanswered request
