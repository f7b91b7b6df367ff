"""Compacted topics through the broker's HTTP API: null keys refused, the admin cleaner
route and its metrics, reads after compaction equal a dict replay (property test),
retention driven through the scheduler, a follower copying a compacted leader."""
from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings, strategies as st

from fake_controller import FakeControllerClient
from broker_harness import start_broker, stop_broker
from http_api.broker.app import BROKER_KEY
from http_api.broker.log_cleaner import scheduler_for
from partitions.log import record_batch as rb

COMPACT = {"cleanup.policy": "compact", "segment.bytes": "300", "delete.retention.ms": "0",
           "min.cleanable.dirty.ratio": "0.01"}


async def create(c, name, configs, rf=1):
    r = await c.post("/v1/topics", json={"name": name, "partitions": 1, "replication_factor": rf,
                                         "configs": configs})
    assert r.status == 201, await r.text()


async def read_all(c, topic):
    """Every record of partition 0 via the JSON fetch route: [(offset, key, value)]."""
    out, offset = [], 0
    while True:
        r = await c.get(f"/v1/topics/{topic}/partitions/0/records",
                        params={"offset": str(offset), "max_bytes": "65536"})
        d = await r.json()
        assert r.status == 200, d
        out.extend((x["offset"], x["key"], x["value"]) for x in d["records"])
        if d["next_offset"] >= d["high_watermark"]:
            return out
        assert d["next_offset"] > offset
        offset = d["next_offset"]


def scheduler(h):
    return scheduler_for(h.client.server.app[BROKER_KEY].deps)


def replay(records):
    state = {}
    for _, k, v in records:
        if v is None:
            state.pop(k, None)
        else:
            state[k] = v
    return state


async def run_cleaner(c, **body):
    r = await c.post("/admin/v1/log-cleaner/run", json=body)
    d = await r.json()
    assert r.status == 200, d
    return d


async def test_null_keys_are_refused_on_compacted_topics(broker):
    c = broker.client
    await create(c, "cmp", COMPACT)
    r = await c.post("/v1/topics/cmp/records", json={"records": [{"key": "k", "value": "1"}, {"value": "2"}]})
    d = await r.json()
    assert r.status == 400 and d["error_code"] == "INVALID_RECORD" and "key" in d["message"]
    raw = rb.build_batch([rb.Record(None, b"x")])
    r = await c.post("/v1/topics/cmp/partitions/0/records", data=raw,
                     headers={"Content-Type": "application/vnd.kraftlog.batch"})
    assert r.status == 400 and (await r.json())["error_code"] == "INVALID_RECORD"
    assert (await read_all(c, "cmp")) == []
    await create(c, "plain", {})
    r = await c.post("/v1/topics/plain/records", json={"records": [{"value": "2"}]})
    assert r.status == 200


async def test_admin_cleaner_run_compacts_and_reports_metrics(broker):
    c = broker.client
    await create(c, "cmp", COMPACT)
    for i in range(60):
        r = await c.post("/v1/topics/cmp/records", json={"records": [{"key": f"k{i % 4}", "value": f"v{i}"}]})
        assert r.status == 200
    before = await read_all(c, "cmp")
    d = await run_cleaner(c)
    [p] = d["cleaned"]
    assert p["topic"] == "cmp" and p["segments_cleaned"] > 0 and p["bytes_written"] < p["bytes_read"]
    assert not p["aborted"] and d["retention"]["segments_deleted"] == 0
    after = await read_all(c, "cmp")
    assert replay(after) == replay(before) and len(after) < len(before) / 3
    text = await (await c.get("/metrics")).text()
    assert "kraftlog_log_cleaner_passes_total 1.0" in text
    assert 'kraftlog_log_dirty_ratio{partition="0",topic="cmp"}' in text
    assert "kraftlog_log_cleaner_bytes_read_total" in text and "kraftlog_log_retention_segments_deleted_total" in text
    status = await (await c.get("/admin/v1/log-cleaner")).json()
    assert status["passes_total"] == 1 and status["dirty_ratio"][0]["topic"] == "cmp"
    r = await c.post("/admin/v1/log-cleaner/run", json={"force": "yes"})
    assert r.status == 400 and (await r.json())["error_code"] == "INVALID_REQUEST"


async def test_retention_through_the_scheduler_deletes_only_closed_expired_segments(broker):
    c = broker.client
    await create(c, "del", {"segment.bytes": "300", "retention.ms": "3600000"})
    await create(c, "cmp", dict(COMPACT, **{"retention.ms": "1"}))  # compact only: never deleted by time
    for i in range(30):
        for t in ("del", "cmp"):
            r = await c.post(f"/v1/topics/{t}/records", json={"records": [{"key": f"k{i}", "value": "x" * 20}]})
            assert r.status == 200
    lg = broker.rm.logs[("del", 0)]
    n = lg.segment_count
    assert n > 3
    d = await run_cleaner(c, compaction=False)
    assert d["retention"]["segments_deleted"] == 0  # nothing older than retention.ms yet
    sched = scheduler(broker)  # the broker's own scheduler, an hour later: retention.ms passed
    later = lg.active_segment.largest_timestamp + 3_600_001
    await asyncio.get_running_loop().run_in_executor(None, lambda: sched.run_retention(now_ms=later))
    assert lg.segment_count == 1 and lg.log_start_offset == lg.active_segment.base_offset > 0
    assert broker.rm.logs[("cmp", 0)].log_start_offset == 0
    # by size: retention.bytes on a fresh log
    r = await c.post("/v1/topics/del/configs", json={"configs": {"retention.bytes": "600"}})
    assert r.status in (200, 204), await r.text()
    for i in range(30):
        await c.post("/v1/topics/del/records", json={"records": [{"key": f"k{i}", "value": "y" * 20}]})
    assert lg.segment_count > 3
    d = await run_cleaner(c, compaction=False, topic="del")
    assert d["retention"]["segments_deleted"] > 0
    assert lg.size_bytes - lg.segments[0].size < 600 and lg.active_segment.size > 0
    text = await (await c.get("/metrics")).text()
    assert "kraftlog_log_retention_segments_deleted_total" in text


async def test_follower_copying_a_compacted_leader_converges(two_brokers):
    b1, b2 = two_brokers
    r = await b1.client.post("/v1/topics", json={"name": "cmp", "partitions": 1, "replication_factor": 2,
                                                 "configs": COMPACT})
    assert r.status == 201
    leader = b1 if (await r.json())["partitions"][0]["leader"] == 1 else b2
    follower = b2 if leader is b1 else b1
    for i in range(80):
        v = None if i % 11 == 0 else f"v{i}"
        r = await leader.client.post("/v1/topics/cmp/records?acks=all",
                                     json={"records": [{"key": f"k{i % 6}", "value": v}]})
        assert r.status == 200
    # k0 and k1 end as tombstones, followed by enough records to close their segment
    for key, v in [("k0", None), ("k1", None)] + [(f"z{j % 2}", f"z{j}") for j in range(8)]:
        r = await leader.client.post("/v1/topics/cmp/records?acks=all", json={"records": [{"key": key, "value": v}]})
        assert r.status == 200
    flog, llog = follower.rm.logs[("cmp", 0)], leader.rm.logs[("cmp", 0)]
    expected = replay(await read_all(leader.client, "cmp"))
    assert "k0" not in expected and "k1" not in expected

    def cleaned_tombstones(lg):
        """Offsets of the tombstones below the active segment (the part the cleaner owns)."""
        active = lg.active_segment.base_offset
        return [r.offset for r in rb.decode_batches(lg.read(0, 1 << 24).records)
                if r.value is None and r.offset < active]

    [first] = (await run_cleaner(leader.client))["cleaned"]
    kept = cleaned_tombstones(llog)
    # the first pass over a tombstone keeps it (delete.retention.ms starts then) ...
    assert kept and first["tombstones_removed"] == 0, (kept, first)
    # ... and with delete.retention.ms=0 the next pass removes them all
    [second] = (await run_cleaner(leader.client))["cleaned"]
    assert second["tombstones_removed"] == len(kept) and cleaned_tombstones(llog) == [], second
    # the follower starts over: it fetches the compacted range, with offset gaps
    flog.truncate_fully_and_start_at(0)
    loop = asyncio.get_running_loop()
    end = loop.time() + 10
    while flog.log_end_offset < llog.log_end_offset:
        assert loop.time() < end, "follower did not catch up"
        await asyncio.sleep(0.02)

    def view(lg):
        return replay((r.offset, r.key.decode(), None if r.value is None else r.value.decode())
                      for r in rb.decode_batches(lg.read(0, 1 << 24).records))

    assert view(flog) == view(llog) == expected
    copied = rb.decode_batches(flog.read(0, 1 << 24).records)
    assert len(copied) < 20 and (flog.dir / "log-has-offset-gaps").exists()  # it copied the compacted range
    await run_cleaner(follower.client)  # replicas compact independently
    assert view(flog) == expected


# ---------------------------------------------------------------------- property test

_ops = st.lists(st.tuples(st.integers(0, 5), st.one_of(st.none(), st.text("abc", min_size=1, max_size=12))),
                min_size=1, max_size=60)


async def _scenario(root: Path, ops, passes: int) -> None:
    controller = FakeControllerClient()
    h = await start_broker(root, controller)
    try:
        c = h.client
        await create(c, "p", COMPACT)
        written = []
        for i in range(0, len(ops), 4):
            chunk = ops[i:i + 4]
            r = await c.post("/v1/topics/p/partitions/0/records",
                             json={"records": [{"key": f"k{k}", "value": v} for k, v in chunk]})
            assert r.status == 200, await r.text()
            first = (await r.json())["offsets"][0]["offset"]
            written.extend((first + j, f"k{k}", v) for j, (k, v) in enumerate(chunk))
        for _ in range(passes):
            await run_cleaner(c, force=True)
        got = await read_all(c, "p")
        offsets = [o for o, _, _ in got]
        assert offsets == sorted(set(offsets))
        by_offset = {o: (k, v) for o, k, v in written}
        assert all(by_offset[o] == (k, v) for o, k, v in got)  # nothing invented, offsets kept
        assert replay(got) == replay(written)
        latest = {}
        for o, k, v in written:
            latest[k] = (o, v)
        present = set(offsets)
        assert all(o in present or v is None for o, v in latest.values())
        # the log agrees with the HTTP view
        lg = h.rm.logs[("p", 0)]
        direct = [(r.offset, r.key.decode(), None if r.value is None else r.value.decode())
                  for r in rb.decode_batches(lg.read(0, 1 << 24).records)]
        assert direct == got
    finally:
        await stop_broker(h)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_ops, st.integers(1, 3))
def test_compacted_reads_over_http_equal_a_dict_replay(ops, passes):
    root = Path(tempfile.mkdtemp(prefix="cmp-http"))
    try:
        asyncio.run(_scenario(root, ops, passes))
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def test_cli_log_cleaner_run_and_status(broker, capsys):
    import json

    from deploy.cli import build_parser
    from deploy.log_cleaner_cli import _log_cleaner

    c = broker.client
    await create(c, "cmp", COMPACT)
    for i in range(40):
        await c.post("/v1/topics/cmp/records", json={"records": [{"key": f"k{i % 3}", "value": f"v{i}"}]})
    url = broker.config.url
    args = build_parser().parse_args(["log-cleaner", "run", "--bootstrap", url, "--force", "--output", "json"])
    assert await _log_cleaner(args) == 0
    out = json.loads(capsys.readouterr().out)
    [cleaned] = out["brokers"]["1"]["cleaned"]
    assert cleaned["topic"] == "cmp" and cleaned["segments_cleaned"] > 0
    args = build_parser().parse_args(["log-cleaner", "status", "--bootstrap", url])
    assert await _log_cleaner(args) == 0
    text = capsys.readouterr().out
    assert "passes 1" in text and "cmp-0\tdirty ratio 0.00" in text
