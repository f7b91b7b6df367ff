"""Property test: any sequence of appends, rolls, truncations, delete_records, retention,
high watermark moves and close/reopen (clean, unclean, torn tail) keeps offsets
contiguous and reads equal to writes, checked against a simple model."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from partitions.clock import ManualClock
from partitions.log.config import LogConfig
from partitions.log.log import Log
from partitions.log.record_batch import Record, build_batch, decode_batches

# Many opens and rolls: fsync only costs time here (these test logic, not the disk).
pytestmark = pytest.mark.usefixtures("no_fsync")

CFG = LogConfig(segment_bytes=350, index_interval_bytes=64, retention_bytes=500, retention_ms=-1)


class LogMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="logprop"))
        self.dir = self.root / "p-0"
        self.clock = ManualClock()
        self.log = Log.open(self.dir, CFG, clock=self.clock)
        self.batches: list[tuple[int, int, list[bytes]]] = []  # (base, epoch, values)
        self.start = 0
        self.hw = 0
        self.empty_at = 0  # log end when there are no batches
        self.epoch = 0
        self.counter = 0

    def teardown(self):
        try:
            self.log.close()
        except Exception:
            pass
        shutil.rmtree(self.root, ignore_errors=True)

    # ---------------------------------------------------------------- model helpers
    @property
    def leo(self) -> int:
        if self.batches:
            base, _, values = self.batches[-1]
            return base + len(values)
        return self.empty_at

    def _truncate_model(self, offset: int) -> None:
        if offset >= self.leo:
            return
        if offset < self.start:
            self._fully(offset)
            return
        self.batches = [b for b in self.batches if b[0] + len(b[2]) - 1 < offset]
        if not self.batches:
            # the first segment was emptied: the log end is its base offset
            self.empty_at = self.log.segments[0].base_offset
        if self.leo < self.start:
            self._fully(self.start)
            return
        self.hw = min(self.hw, self.leo)

    def _fully(self, offset: int) -> None:
        self.batches = []
        self.start = self.hw = self.empty_at = offset

    # ---------------------------------------------------------------- rules
    @rule(n=st.integers(1, 4), size=st.integers(0, 60), bump=st.booleans())
    def append(self, n, size, bump):
        if bump:
            self.epoch += 1
        values = []
        for _ in range(n):
            self.counter += 1
            values.append(b"%d:" % self.counter + b"x" * size)
        raw = build_batch([Record(None, v, timestamp=self.counter) for v in values])
        info = self.log.append_as_leader(raw, self.epoch)
        assert info.first_offset == self.leo
        self.batches.append((info.first_offset, self.epoch, values))

    @rule()
    def roll(self):
        self.log.roll()

    @rule(data=st.data())
    def move_high_watermark(self, data):
        target = data.draw(st.integers(self.start, self.leo))
        self.hw = max(self.hw, target)
        assert self.log.update_high_watermark(target) == self.hw

    @rule(data=st.data())
    def truncate(self, data):
        target = data.draw(st.integers(max(0, self.start - 2), self.leo + 1))
        self.log.truncate_to(target)
        self._truncate_model(target)

    @rule(data=st.data())
    def delete_records(self, data):
        target = data.draw(st.integers(self.start, self.hw))
        assert self.log.delete_records(target) == max(target, self.start)
        self.start = max(self.start, target)

    @rule()
    def retention(self):
        self.log.apply_retention(now_ms=self.clock.now_ms())
        new_start = self.log.log_start_offset
        assert self.start <= new_start <= self.hw
        self.start = new_start

    @rule(clean=st.booleans())
    def reopen(self, clean):
        rp = self.log.recovery_point
        if clean:
            self.log.close()
        else:
            self.log.close_without_flush()
        self.log = Log.open(self.dir, CFG, recovery_point=rp, log_start_offset=self.start, high_watermark=self.hw,
                            clean_shutdown=clean, clock=self.clock)

    @precondition(lambda self: self.batches and self.batches[-1][0] + len(self.batches[-1][2]) > self.start)
    @rule(cut=st.integers(1, 400))
    def crash_with_torn_tail(self, cut):
        active = self.log.segments[-1]
        if active.is_empty:
            return
        last_base = self.batches[-1][0]
        found = active.translate_offset(last_base)
        assert found is not None
        pos, header = found
        cut = min(cut, header.size)
        path = active.log_path
        self.log.close_without_flush()
        os.truncate(path, pos + header.size - cut)
        self.log = Log.open(self.dir, CFG, recovery_point=0, log_start_offset=self.start, high_watermark=self.hw,
                            clean_shutdown=False, clock=self.clock)
        self.batches.pop()
        if not self.batches:
            self.empty_at = last_base  # the active segment held only that batch
        if self.leo < self.start:
            self._fully(self.start)
        self.hw = min(self.hw, self.leo)

    # ---------------------------------------------------------------- invariants
    @invariant()
    def offsets_match_the_model(self):
        lg = self.log
        assert (lg.log_start_offset, lg.log_end_offset, lg.high_watermark) == (self.start, self.leo, self.hw)
        assert lg.recovery_point <= lg.log_end_offset

    @invariant()
    def reads_equal_writes(self):
        expected = [
            (base + i, v) for base, _, values in self.batches for i, v in enumerate(values) if base + i >= self.start
        ]
        if self.start == self.leo:
            assert self.log.read(self.start, 10**6).records == b""
            return
        got = [(r.offset, r.value) for r in decode_batches(self.log.read(self.start, 10**7).records)]
        got = [g for g in got if g[0] >= self.start]
        assert got == expected
        # any offset reads from the batch containing it
        mid = (self.start + self.leo) // 2
        first = self.log.read(mid, 1).first_offset
        assert first <= mid < first + 1000

    @invariant()
    def epochs_follow_the_batches(self):
        live = [b for b in self.batches if b[0] + len(b[2]) > self.start]
        if live:
            assert self.log.latest_epoch == live[-1][1]
            assert self.log.end_offset_for_epoch(live[-1][1]) == (live[-1][1], self.leo)


TestLogMachine = LogMachine.TestCase
TestLogMachine.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)
