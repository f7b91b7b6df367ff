"""The storage engine and the replication tests' fake satisfy the same typed seams
(partitions/log/protocols.py): every member of the protocol exists on both, with the same
parameter names, kinds and defaults, so the replica manager needs no `getattr` hedge."""
from __future__ import annotations

import inspect

import pytest

from partitions.log.config import LogConfig
from partitions.log.log import AppendInfo, FetchDataInfo, Log
from partitions.log.log_manager import LogManager
from partitions.log.protocols import AppendedBatches, FetchedBatches, LogDirectory, PartitionLog, TopicPartition
from partitions.log.record_batch import Record, build_batch
from tests.unit.replication import fake_log


def _members(protocol: type) -> dict[str, object]:
    out = {}
    for name, value in vars(protocol).items():
        if name.startswith("_"):
            continue
        out[name] = value
    for name in getattr(protocol, "__annotations__", {}):
        out.setdefault(name, None)   # a plain attribute
    return out


def _params(fn) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


PAIRS = [
    (PartitionLog, Log, fake_log.MemoryLog),
    (LogDirectory, LogManager, fake_log.MemoryLogManager),
]


@pytest.mark.parametrize("protocol,real,fake", PAIRS, ids=["PartitionLog", "LogDirectory"])
def test_the_engine_and_the_fake_have_the_protocol_methods_with_its_signatures(protocol, real, fake):
    for name, value in _members(protocol).items():
        if not callable(value) or isinstance(value, property):
            continue
        want = _params(value)
        for impl in (real, fake):
            got = getattr(impl, name, None)
            assert got is not None, f"{impl.__name__} lacks {protocol.__name__}.{name}"
            assert _params(got) == want, f"{impl.__name__}.{name}{inspect.signature(got)} differs from " \
                                         f"{protocol.__name__}.{name}{inspect.signature(value)}"


def test_instances_satisfy_the_runtime_checkable_protocols(tmp_path):
    lg = Log.open(tmp_path / "t-0", LogConfig())
    try:
        mem = fake_log.MemoryLog()
        for impl in (lg, mem):
            assert isinstance(impl, PartitionLog)
            # the properties, too (runtime_checkable checks only that they exist)
            for name in ("log_start_offset", "log_end_offset", "high_watermark", "recovery_point",
                         "latest_epoch"):
                assert isinstance(getattr(impl, name), int), (impl, name)
            assert getattr(impl, "closed") is False
            batch = build_batch([Record(None, b"v", timestamp=1)])
            info = impl.append_as_leader(batch, 0)
            assert isinstance(info, AppendedBatches) and info.duplicate is False
            assert impl.update_high_watermark(5) == 1       # clamped to the log end
            read = impl.read(0, 1 << 20)
            assert isinstance(read, FetchedBatches) and read.next_offset == 1
        assert isinstance(AppendInfo(0, 0, 0, -1, 1, 1), AppendedBatches)
        assert isinstance(FetchDataInfo(b"", 0, 0), FetchedBatches)
    finally:
        lg.close()
    mgr = LogManager([tmp_path / "dir"], LogConfig())
    try:
        assert isinstance(mgr, LogDirectory) and isinstance(fake_log.MemoryLogManager(), LogDirectory)
    finally:
        mgr.close()


def test_a_shape_the_protocol_does_not_have_is_refused():
    class NoTruncation:
        def read(self, start_offset, max_bytes): ...

    assert not isinstance(NoTruncation(), PartitionLog)


def test_topic_partition_is_a_tuple_key():
    tp = TopicPartition("orders", 3)
    assert tp == ("orders", 3) and {("orders", 3): 1}[tp] == 1 and str(tp) == "orders-3"
