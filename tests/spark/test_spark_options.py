"""Pure parts of the connector: option parsing, offset JSON, admission control, range splits,
and the Arrow codec checked against the shared reference codec. No Spark, no sockets."""
from __future__ import annotations

import json
import random

import pyarrow as pa
import pytest

from partitions.log import record_batch as rb
from pipelines import arrow_codec
from pipelines import options as opt

URL = {"kraftlog.bootstrap.servers": "http://127.0.0.1:1, 127.0.0.1:2/"}


def test_options_are_case_insensitive_and_validated():
    o = opt.parse_source_options({**URL, "SUBSCRIBE": "b,a", "maxoffsetspertrigger": "5",
                                  "FailOnDataLoss": "false"}, streaming=True)
    assert o.bootstrap_servers == ("http://127.0.0.1:1", "http://127.0.0.1:2")
    assert o.subscribe == ("a", "b") and o.max_offsets_per_trigger == 5 and not o.fail_on_data_loss
    assert o.starting.kind == "latest"
    assert opt.parse_source_options({**URL, "subscribe": "a"}, streaming=False).starting.kind == "earliest"
    with pytest.raises(opt.OptionError, match="exactly one of"):
        opt.parse_source_options({**URL, "subscribe": "a", "assign": '{"a": [0]}'}, streaming=False)
    with pytest.raises(opt.OptionError, match="bootstrap"):
        opt.parse_source_options({"subscribe": "a"}, streaming=False)
    with pytest.raises(opt.OptionError, match="endingOffsets"):
        opt.parse_source_options({**URL, "subscribe": "a", "endingOffsets": "latest"}, streaming=True)
    with pytest.raises(opt.OptionError, match="-2"):
        opt.parse_source_options({**URL, "subscribe": "a", "endingOffsets": '{"a": {"0": -2}}'}, streaming=False)


def test_offset_json_and_assign_parsing():
    spec = opt.parse_offset_spec({"startingoffsets": '{"t": {"1": -2, "0": 23}}'}, "startingOffsets", "latest")
    assert spec.offset_map() == {("t", 0): 23, ("t", 1): -2}
    assert opt.parse_assign('{"b": [1, 0], "a": [3]}') == (("a", 3), ("b", 0), ("b", 1))


def test_offset_json_is_deterministic_with_string_keys():
    a = opt.to_offset_json({("b", 10): 1, ("b", 2): 5, ("a", 0): 7})
    assert json.dumps(a) == '{"a": {"0": 7}, "b": {"2": 5, "10": 1}}'
    assert opt.from_offset_json(a) == {("b", 10): 1, ("b", 2): 5, ("a", 0): 7}


def test_rate_limit_is_proportional_exact_and_makes_progress():
    start = {("t", 0): 0, ("t", 1): 100}
    latest = {("t", 0): 70, ("t", 1): 130}
    end = opt.rate_limit(start, latest, 30)
    assert sum(end[tp] - start[tp] for tp in end) == 30
    assert end == {("t", 0): 21, ("t", 1): 109}
    assert opt.rate_limit(start, latest, 1000) == latest
    assert sum(v - start[k] for k, v in opt.rate_limit(start, latest, 1).items()) == 1
    rnd = random.Random(7)
    for _ in range(200):
        tps = [("t", i) for i in range(rnd.randint(1, 5))]
        s = {tp: rnd.randint(0, 50) for tp in tps}
        l = {tp: s[tp] + rnd.randint(0, 50) for tp in tps}
        n = rnd.randint(1, 120)
        e = opt.rate_limit(s, l, n)
        assert all(s[tp] <= e[tp] <= l[tp] for tp in tps)
        assert sum(e[tp] - s[tp] for tp in tps) == min(n, sum(l[tp] - s[tp] for tp in tps))


def test_split_range():
    assert opt.split_range(10, 20, 7) == [(10, 15), (15, 20)]
    pieces = opt.split_range(0, 50, 7)
    assert len(pieces) == 8 and all(hi - lo <= 7 for lo, hi in pieces)
    assert [lo for lo, _ in pieces[1:]] == [hi for _, hi in pieces[:-1]] and pieces[0][0] == 0 and pieces[-1][1] == 50
    assert opt.split_range(5, 5, 7) == []
    assert len(opt.split_range(0, 10, 100, pieces=3)) == 3


def _random_records(rnd, n):
    recs = []
    for i in range(n):
        key = None if rnd.random() < 0.3 else rnd.randbytes(rnd.randint(0, 12))
        value = None if rnd.random() < 0.1 else rnd.randbytes(rnd.randint(0, 40))
        headers = tuple((f"h{j}", rnd.randbytes(3)) for j in range(rnd.randint(0, 2))) if rnd.random() < 0.3 else ()
        recs.append(rb.Record(key=key, value=value, headers=headers, timestamp=1_000 + rnd.randint(0, 5)))
    return recs


@pytest.mark.parametrize("seed", range(5))
def test_arrow_decode_matches_reference_codec(seed):
    rnd = random.Random(seed)
    buf, base, types = b"", 0, []
    for i in range(4):
        recs = _random_records(rnd, rnd.randint(1, 30))
        batch = bytearray(rb.build_batch(recs, compression=rnd.choice(["none", "zstd", "lz4", "gzip"])))
        rb.stamp_batch(batch, base, 0)
        log_append = i % 2 == 1  # LogAppendTime topics: the broker's time for every record
        if log_append:
            rb.set_log_append_time(batch, 9_000_000 + base)
        types += [int(log_append)] * len(recs)
        base += len(recs)
        buf += bytes(batch)
    start, end = rnd.randint(0, base // 2), rnd.randint(base // 2, base)
    cols, next_offset = arrow_codec.decode_fetch(buf, start, end, want_headers=True)
    ref = [r for r in rb.decode_batches(buf) if start <= r.offset < end]
    assert cols.offsets.tolist() == [r.offset for r in ref]
    assert cols.keys.to_pylist() == [r.key for r in ref]
    assert cols.values.to_pylist() == [r.value for r in ref]
    assert cols.timestamps_ms.tolist() == [r.timestamp for r in ref]
    assert cols.timestamp_types.tolist() == types[start:end]
    assert cols.headers == [r.headers for r in ref]
    assert next_offset == end


@pytest.mark.parametrize("seed", range(5))
def test_arrow_encode_is_read_by_reference_codec(seed):
    rnd = random.Random(100 + seed)
    recs = _random_records(rnd, 40)
    keys = pa.array([r.key for r in recs], pa.binary())
    values = pa.array([r.value for r in recs], pa.binary())
    lo, hi = rnd.randint(0, 10), rnd.randint(20, 40)   # sliced arrays, as Spark hands them over
    batch = arrow_codec.encode_batch(keys.slice(lo, hi - lo), values.slice(lo, hi - lo),
                                     [r.headers for r in recs[lo:hi]], timestamp_ms=42,
                                     compression=rnd.choice(["none", "zstd"]),
                                     producer_id=7, producer_epoch=1, base_sequence=11)
    header = rb.validate_batch(batch)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7, 1, 11)
    got = [(r.key, r.value, r.headers, r.timestamp) for r in rb.decode_batches(batch)]
    assert got == [(r.key, r.value, r.headers, 42) for r in recs[lo:hi]]


def test_arrow_encode_accepts_strings_and_no_keys():
    batch = arrow_codec.encode_batch(None, pa.array(["a", "bé", None]))
    assert [(r.key, r.value) for r in rb.decode_batches(batch)] == [(None, b"a"), (None, "bé".encode()), (None, None)]


# ---- planning (driver side) without a broker: high watermarks are stubbed ----------------

def _stream_reader(monkeypatch, hws: dict, **options):
    from pipelines.source import KraftlogStreamReader, schema_for

    o = opt.parse_source_options({**URL, "subscribe": "t", **options}, streaming=True)
    reader = KraftlogStreamReader(o, schema_for(False))
    monkeypatch.setattr(reader, "_high_watermarks", lambda: dict(hws))
    return reader


def test_latest_offset_admission_control_and_available_now(monkeypatch):
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    hws = {("t", 0): 70, ("t", 1): 30}
    reader = _stream_reader(monkeypatch, hws, maxOffsetsPerTrigger="30")
    assert reader.getDefaultReadLimit() == ReadMaxRows(30)
    start = {"t": {"0": 0, "1": 0}}
    assert reader.latestOffset(start, ReadMaxRows(30)) == {"t": {"0": 21, "1": 9}}
    assert reader.latestOffset(start, ReadAllAvailable()) == {"t": {"0": 70, "1": 30}}
    reader.prepareForTriggerAvailableNow()
    hws.update({("t", 0): 500, ("t", 1): 500, ("t", 2): 9})   # data and a partition arrive later
    assert reader.latestOffset(start, ReadAllAvailable()) == {"t": {"0": 70, "1": 30}}
    assert reader.latestOffset({"t": {"0": 70, "1": 30}}, ReadMaxRows(30)) == {"t": {"0": 70, "1": 30}}


def test_new_partitions_are_read_from_the_start(monkeypatch):
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    reader = _stream_reader(monkeypatch, {("t", 0): 5, ("t", 1): 4})
    end = reader.latestOffset({"t": {"0": 5}}, ReadAllAvailable())
    assert end == {"t": {"0": 5, "1": 4}}
    (rng,) = reader.partitions({"t": {"0": 5}}, end)
    assert (rng.partition, rng.start, rng.end, rng.fail_on_data_loss) == (1, 0, 4, False)


def test_offsets_going_backwards_fail_or_skip(monkeypatch):
    from pipelines.source import DataLossError

    strict = _stream_reader(monkeypatch, {})
    with pytest.raises(DataLossError, match="failOnDataLoss"):
        strict.partitions({"t": {"0": 50}}, {"t": {"0": 10}})
    lenient = _stream_reader(monkeypatch, {}, failOnDataLoss="false")
    assert lenient.partitions({"t": {"0": 50, "1": 0}}, {"t": {"0": 10, "1": 3}})[0].partition == 1


def test_batch_ranges_never_go_beyond_the_high_watermark(monkeypatch):
    from pipelines.source import KraftlogBatchReader, _Planner, schema_for

    monkeypatch.setattr(_Planner, "topic_partitions", lambda self: [("t", 0), ("t", 1)])
    monkeypatch.setattr(_Planner, "bounds", lambda self, tps: {("t", 0): (0, 40), ("t", 1): (5, 12)})
    o = opt.parse_source_options({**URL, "subscribe": "t", "endingOffsets": '{"t": {"0": 1000, "1": -1}}'},
                                 streaming=False)
    ranges = KraftlogBatchReader(o, schema_for(False)).partitions()
    assert [(r.partition, r.start, r.end) for r in ranges] == [(0, 0, 40), (1, 5, 12)]


def test_min_partitions_splits_in_proportion_to_the_backlog():
    from pipelines.source import _Planner

    planner = _Planner(opt.parse_source_options({**URL, "subscribe": "t", "minPartitions": "4"}, streaming=False))
    ranges = planner.ranges({("t", 0): 0, ("t", 1): 0}, {("t", 0): 30, ("t", 1): 10})
    assert [(r.partition, r.start, r.end) for r in ranges] == [(0, 0, 10), (0, 10, 20), (0, 20, 30), (1, 0, 10)]


def test_sink_is_idempotent_unless_turned_off():
    """Idempotent writes are safe for reordered retries (canonical order + content check), so on by default."""
    from pipelines import options as opt
    base = {"kraftlog.bootstrap.servers": "http://127.0.0.1:1", "topic": "t"}
    parsed = opt.parse_sink_options(base)
    assert parsed.idempotence is True and parsed.idempotence_buffer_max_bytes == 512 * 1024 * 1024
    assert opt.parse_sink_options({**base, "kraftlog.enable.idempotence": "false"}).idempotence is False
    assert opt.parse_sink_options({**base, "checkpointLocation": "/x"}).checkpoint_location == "/x"
    with pytest.raises(opt.OptionError):
        opt.parse_sink_options({**base, "kraftlog.idempotence.buffer.max.bytes": "10"})
