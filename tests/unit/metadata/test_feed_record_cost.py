"""The metadata path's CPU per record on a failover's critical path (issue 25, failover at
100,000 partitions; docs/METADATA_FEED.md). These tests count work (encoder calls, full
garbage collections) or check that a cheaper path gives exactly what the general one gave.
Pure: state machine, records, image and FeedState, no raft, no sockets."""
from __future__ import annotations

import dataclasses
import json

from metadata_quorum import state_machine as sm_module
from metadata_quorum.controller_server import feed_page_text
from metadata_quorum.records import PartitionChangeRecord, PartitionRecord, TopicRecord, record_to_dict
from metadata_quorum.state_machine import record_item_text
from tests.unit.metadata.metadata_harness import Harness


def _item_encodes(monkeypatch) -> list:
    calls = []
    real = sm_module.json.dumps

    def counting(obj, *a, **kw):
        if isinstance(obj, dict) and "record" in obj:   # a feed item through the general encoder
            calls.append(obj["record"]["type"])
        return real(obj, *a, **kw)
    monkeypatch.setattr(sm_module.json, "dumps", counting)
    return calls


def test_a_fencings_feed_page_formats_its_partition_records_without_the_json_encoder(monkeypatch):
    h = Harness()
    h.create("test", partitions=200, rf=3)
    h.create("other", partitions=100, rf=2)
    h.now = 10 ** 9
    base = h.sm.image.offset
    fenced = h.run(h.controller.fence_broker(h.image, 2))
    assert sum(isinstance(r, PartitionChangeRecord) for r in fenced) > 100
    before = json.dumps({"cluster_id": h.sm.image.cluster_id, "records": h.sm.records_since(base, 5000),
                         "metadata_offset": h.sm.image.offset})
    calls = _item_encodes(monkeypatch)
    texts = h.sm.records_since_json(base, 5000)
    assert feed_page_text(h.sm.image.cluster_id, texts, h.sm.image.offset) == before
    assert "PartitionChange" not in calls and "Partition" not in calls, calls
    assert len(calls) == len(fenced) - sum(isinstance(r, PartitionChangeRecord) for r in fenced)


def test_record_item_text_is_exactly_json_dumps_of_the_plain_data_for_every_shape():
    base = PartitionChangeRecord("t", "id-\u2603", 3, (1, 2, 3), (1, 3), 1, 4, 9)
    shapes = [
        base,
        PartitionChangeRecord("t\"\\\n", "x", 0, (2,), (), -1, 0, 1),   # leaderless, escapes
        PartitionRecord("big", "id", 10 ** 12, (1, 2), (1, 2), 2, 2 ** 40, 7),
        PartitionChangeRecord("t", "x", 0, (1, 2), (1,), 1, 2, 3, elr=(2,)),   # longer form
        dataclasses.replace(base, isr=(True, 3)),        # not plain ints: json writes true
        dataclasses.replace(base, leader=1.5),
        dataclasses.replace(base, replicas=[1, 2, 3]),   # not a tuple: the general encoder's business
        dataclasses.replace(base, topic=None),
        TopicRecord("t", "x"),
    ]
    for record in shapes:
        for offset in (0, 7, 123456789):
            assert record_item_text(offset, record) == json.dumps(
                {"offset": offset, "record": record_to_dict(record)}), record


# ---------------------------------------------------------------- broker: full collections
import asyncio   # noqa: E402
import gc   # noqa: E402

import pytest   # noqa: E402

from metadata_quorum.client import MetadataFollower   # noqa: E402

_HELD = 1 << 30


@pytest.fixture
def unfrozen():
    gc.unfreeze()
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()   # do not leave this process's objects frozen for the next tests
    left = gc.get_threshold()
    gc.set_threshold(*thresholds)   # nor full collections off, should a test fail half-way
    assert left == thresholds


class _PagedFeed:
    """A controller feed of `sm`'s records in pages of `page` records; notes the gen-2
    collection threshold at every request."""

    def __init__(self, sm, page: int) -> None:
        self.sm, self.page, self.thresholds = sm, page, []

    async def metadata_records(self, after, max_wait_ms=0, max_records=None, broker_id=None):
        self.thresholds.append(gc.get_threshold()[2])
        return {"cluster_id": "c", "records": self.sm.records_since(after, self.page),
                "metadata_offset": self.sm.image.offset}


def _follower(feed, min_records, seen):
    def on_change(image, records):
        seen.append((len(records) if records is not None else None, gc.get_threshold()[2],
                     gc.get_freeze_count()))
    return MetadataFollower(feed, on_change, max_wait_ms=0, gc_freeze_min_records=min_records)


def _catch_up(follower, sm) -> None:
    async def go():
        while follower.offset < sm.image.offset:
            await follower.poll_once()
    asyncio.run(go())


def test_a_large_change_is_fetched_built_and_applied_without_full_collections_then_frozen(unfrozen):
    h = Harness()
    h.create("small", partitions=10, rf=3)
    feed = _PagedFeed(h.sm, 500)
    seen: list = []
    follower = _follower(feed, 1000, seen)
    _catch_up(follower, h.sm)
    assert seen[-1][1] != _HELD and gc.get_freeze_count() == 0   # 1,000+ records, but in small changes
    feed.thresholds.clear()
    h.create("big", partitions=1500, rf=3)   # one change of 1,501 records, in 4 pages of 500
    _catch_up(follower, h.sm)
    assert follower.image.partition_count() == 1510
    assert seen[-1] == (1501, _HELD, 0), seen   # applied (the replica manager) held, frozen once published
    assert feed.thresholds[0] != _HELD and feed.thresholds[1:] == [_HELD] * 3, feed.thresholds   # pages 2-4 held
    assert gc.get_freeze_count() > 1500        # the new image is out of later full collections
    assert gc.get_threshold()[2] != _HELD


def test_small_changes_and_the_zero_setting_leave_the_collector_alone(unfrozen):
    h = Harness()
    h.create("small", partitions=10, rf=3)
    seen: list = []
    _catch_up(_follower(_PagedFeed(h.sm, 500), 1000, seen), h.sm)
    h.create("big", partitions=1500, rf=3)
    _catch_up(_follower(_PagedFeed(h.sm, 500), 0, seen), h.sm)
    assert seen and all(s[1] != _HELD for s in seen), seen
    assert gc.get_freeze_count() == 0


# ---------------------------------------------------------------- record codecs
import dataclasses   # noqa: E402

from metadata_quorum import records as records_module   # noqa: E402
from metadata_quorum.records import RECORD_TYPES, record_from_dict   # noqa: E402

_SAMPLES = {"int": 7, "str": "s\u00e9", "bool": True, "tuple": (3, 1, 2), "Optional[str]": "o", "Optional[int]": 9,
            "Optional[bool]": False}


def _instances(cls):
    """Instances of a record type: defaults, every default changed, None and empty tuples."""
    fields = dataclasses.fields(cls)
    required = {f.name: _SAMPLES.get(f.type, "v") for f in fields if f.default is dataclasses.MISSING}
    yield cls(**required)
    yield cls(**required, **{f.name: _SAMPLES.get(f.type, "w") for f in fields if f.default is not dataclasses.MISSING})
    yield cls(**{f.name: (() if f.type == "tuple" else None) for f in fields})


def test_compiled_record_codecs_equal_the_general_loops_for_every_record_type():
    general_to, general_from = records_module._general_to_dict, records_module._general_from_dict
    assert set(records_module._DECODERS) == set(RECORD_TYPES)
    checked = 0
    for cls in RECORD_TYPES.values():
        for record in _instances(cls):
            as_dict = record.to_dict()
            assert list(as_dict.items()) == list(general_to(record).items()), record   # same keys, same order
            variants = [as_dict, {**as_dict, "newer_field": 1},
                        {k: (list(v) if isinstance(v, list) else v) for k, v in as_dict.items()},
                        {k: v for k, v in as_dict.items() if k == "type" or k in records_module._DEFAULTS[cls]}]
            for data in variants:
                try:
                    want = general_from(data)
                except ValueError as exc:
                    try:
                        record_from_dict(data)
                    except ValueError as got:
                        assert str(got) == str(exc)
                        continue
                    raise AssertionError(f"{data!r} decoded, the general loop raised {exc}")
                got = record_from_dict(data)
                assert type(got) is cls and got == want and got.__dict__ == want.__dict__, data
                assert list(got.__dict__) == list(want.__dict__)
                checked += 1
    assert checked > 3 * len(RECORD_TYPES)
    for bad in ({"type": "Nope"}, {}, None, [], {"type": ["x"]}):
        try:
            record_from_dict(bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad!r} decoded")


class _FailingOnce(_PagedFeed):
    """Fails the second and third requests (the controller went away in the middle of a
    change: the follower's prefetch of page 2 and its own request for it both fail)."""

    def __init__(self, sm, page: int) -> None:
        super().__init__(sm, page)
        self.calls = 0

    def active_changed(self):
        return asyncio.Event()

    async def metadata_records(self, after, max_wait_ms=0, max_records=None, broker_id=None):
        self.calls += 1
        if self.calls in (2, 3):
            self.thresholds.append(gc.get_threshold()[2])
            raise RuntimeError("controller unreachable")
        return await super().metadata_records(after, max_wait_ms, max_records)


def test_a_failed_feed_request_in_the_middle_of_a_change_turns_full_collections_back_on(unfrozen):
    h = Harness()
    follower_seen: list = []
    feed = _FailingOnce(h.sm, 500)
    follower = _follower(feed, 1000, follower_seen)
    follower.error_backoff_ms = 1
    _catch_up(follower, h.sm)
    feed.thresholds.clear()
    feed.calls = 0
    h.create("big", partitions=1500, rf=3)

    def on_change(image, records):
        if image.offset == h.sm.image.offset:
            follower.stop()
    follower.on_change = on_change

    async def go():
        await asyncio.wait_for(follower.run(), 30)
    asyncio.run(go())
    assert follower.image.partition_count() == 1500
    # 4 pages. Request 1 (page 1): not held yet; 2 (the prefetch of page 2, sent before
    # page 1 is taken in; fails): not held; 3 (page 2 again; fails): held; 4 (page 2, after
    # the failure): released; 5 (the prefetch of page 3, sent before page 2 is taken in
    # again): not held; 6 (the prefetch of page 4): held
    t = feed.thresholds[0]
    assert t != _HELD and feed.thresholds == [t, t, _HELD, t, t, _HELD], feed.thresholds
    assert gc.get_threshold()[2] != _HELD
