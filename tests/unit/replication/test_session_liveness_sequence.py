"""Issue 25 (the ISR collapse seen once at 100,000 partitions): a follower's fetch session
must keep every partition it holds live on the leader through the metadata changes a large
create brings (ISR shrink, expansion, a new leader epoch, leadership moving away and back,
new topics), whichever broker applies a change first and even when one broker skips an
image (it applies the next one): once both are caught up, the leader's fetch and caught-up
times for every partition move with the session's requests. A partition the session holds
but no request restates would be dropped by the lag rule 30 s later."""
import asyncio
import random

import pytest

from metadata_quorum.image import MetadataImage
from metadata_quorum.records import PartitionRecord, RegisterBrokerRecord, TopicRecord
from tests.unit.replication.test_replica_fetch_session import leader_and_follower
from tests.unit.replication.test_replica_fetcher import batch, wait_for

PARTITIONS = 40


def image(states: dict) -> MetadataImage:
    """states: partition of topic "t" -> (isr, leader, leader_epoch, partition_epoch)."""
    return topics_image({"t": states})


async def all_heard_after(rm, since_ms: int, timeout: float = 5.0) -> None:
    def fresh():
        return all(rm.partitions[("t", p)].remote_replicas[2].last_fetch_time_ms > since_ms
                   for p in range(PARTITIONS))
    try:
        await wait_for(fresh, timeout=timeout)
    except AssertionError:
        stuck = {p: rm.describe_follower(rm.partitions[("t", p)], 2) for p in range(PARTITIONS)
                 if rm.partitions[("t", p)].remote_replicas[2].last_fetch_time_ms <= since_ms}
        raise AssertionError(f"{len(stuck)} partitions not heard since {since_ms}: "
                             f"{list(stuck.items())[:3]}") from None


@pytest.mark.parametrize("order", ["leader first", "follower first"])
async def test_a_session_keeps_every_partition_live_through_isr_and_leader_changes(tmp_path, order):
    async with leader_and_follower(tmp_path, fetch_wait_max_ms=100) as (rms, fetchers, transport, _):
        async def apply(img):
            first, second = (1, 2) if order == "leader first" else (2, 1)
            for i, b in enumerate((first, second)):
                if i:
                    await asyncio.sleep(0.25)   # the other broker applies the change later
                await rms[b].apply_metadata(img)
                fetchers[b].sync(img)

        for rm in rms.values():
            rm.fetch_session_refresh_ms = 0
        states = {p: ((1, 2), 1, 1, 1) for p in range(PARTITIONS)}
        await apply(image(states))
        for p in range(PARTITIONS):
            await rms[1].append("t", p, batch(b"x"), acks=1)
        await wait_for(lambda: all(rms[2].logs[("t", p)].log_end_offset == 1 for p in range(PARTITIONS)), 10)
        await all_heard_after(rms[1], rms[1]._clock_ms())

        half = range(PARTITIONS // 2)
        steps = [
            ("ISR shrink", lambda s: ((1,), 1, s[2], s[3] + 1)),
            ("ISR expansion", lambda s: ((1, 2), 1, s[2], s[3] + 1)),
            ("new leader epoch, same leader", lambda s: ((1, 2), 1, s[2] + 1, s[3] + 1)),
        ]
        for name, change in steps:
            for p in half:
                states[p] = change(states[p])
            await apply(image(states))
            await asyncio.sleep(0.05)
            await all_heard_after(rms[1], rms[1]._clock_ms())
        # leadership moves to 2 and back to 1 for half the partitions
        for p in half:
            isr, _, le, pe = states[p]
            states[p] = ((1, 2), 2, le + 1, pe + 1)
        await apply(image(states))
        await asyncio.sleep(0.3)
        for p in half:
            isr, _, le, pe = states[p]
            states[p] = ((1, 2), 1, le + 1, pe + 1)
        await apply(image(states))
        await asyncio.sleep(0.05)
        await all_heard_after(rms[1], rms[1]._clock_ms())


def topics_image(topics: dict) -> MetadataImage:
    """topics: name -> {partition: (isr, leader, leader_epoch, partition_epoch)}."""
    img = MetadataImage("c")
    img.replay(RegisterBrokerRecord(1, "i1", -1, "http://b1", None, False))
    img.replay(RegisterBrokerRecord(2, "i2", -1, "http://b2", None, False))
    for t, parts in topics.items():
        img.replay(TopicRecord(t, "id-" + t))
        for p, (isr, leader, le, pe) in parts.items():
            img.replay(PartitionRecord(t, "id-" + t, p, (1, 2), tuple(isr), leader, le, pe))
    return img


@pytest.mark.parametrize("seed", [3])
async def test_random_metadata_sequences_leave_no_session_partition_unheard(tmp_path, seed):
    rnd = random.Random(seed)
    async with leader_and_follower(tmp_path, fetch_wait_max_ms=100) as (rms, fetchers, transport, _):
        for rm in rms.values():
            rm.fetch_session_refresh_ms = 0

        async def apply(img, lag_s: float, may_skip: bool) -> None:
            order = [1, 2]
            rnd.shuffle(order)
            for i, b in enumerate(order):
                if i:
                    await asyncio.sleep(lag_s)
                    if may_skip and rnd.random() < 0.25:
                        continue   # this broker applies the next image instead
                await rms[b].apply_metadata(img)
                fetchers[b].sync(img)

        topics = {"t0": {p: ((1, 2), rnd.choice((1, 2)), 1, 1) for p in range(30)}}
        await apply(topics_image(topics), 0, False)
        for _ in range(20):
            keys = [(t, p) for t in topics for p in topics[t]]
            for t, p in rnd.sample(keys, k=rnd.randint(1, 15)):
                isr, leader, le, pe = topics[t][p]
                op = rnd.choice(["shrink", "expand", "bump", "move", "append", "append"])
                if op == "shrink":
                    topics[t][p] = ((leader,), leader, le, pe + 1)
                elif op == "expand":
                    topics[t][p] = ((1, 2), leader, le, pe + 1)
                elif op == "bump":
                    topics[t][p] = (isr, leader, le + 1, pe + 1)
                elif op == "move" and 3 - leader in isr:
                    topics[t][p] = ((1, 2), 3 - leader, le + 1, pe + 1)
                elif op == "append" and rms[leader].partitions.get((t, p)) is not None \
                        and rms[leader].partitions[(t, p)].is_leader:
                    await rms[leader].append(t, p, batch(b"x" * rnd.randint(1, 50)), acks=1)
            if rnd.random() < 0.2:
                topics[f"t{len(topics)}"] = {p: ((1, 2), rnd.choice((1, 2)), 1, 1) for p in range(rnd.randint(5, 40))}
            await apply(topics_image(topics), rnd.choice([0, 0, 0.05, 0.2]), True)
            await asyncio.sleep(rnd.choice([0, 0.01, 0.1]))
        await apply(topics_image(topics), 0, False)
        every = [(t, p, leader) for t in topics for p, (_, leader, _, _) in topics[t].items()]
        await wait_for(lambda: all(rms[3 - l].logs[(t, p)].log_end_offset == rms[l].logs[(t, p)].log_end_offset
                                   for t, p, l in every), 10)
        since = {b: rms[b]._clock_ms() for b in (1, 2)}

        def unheard():
            out = []
            for t, p, leader in every:
                part = rms[leader].partitions[(t, p)]
                st = part.remote_replicas[3 - leader]
                if min(st.last_fetch_time_ms, st.last_caught_up_time_ms) <= since[leader]:
                    out.append(((t, p), rms[leader].describe_follower(part, 3 - leader)))
            return out
        try:
            await wait_for(lambda: not unheard(), 5)
        except AssertionError:
            stuck = unheard()
            raise AssertionError(f"{len(stuck)} partitions unheard: {stuck[:3]}") from None
