"""invariant(): the storage ladder's checks raise InvariantViolation, also under `python -O`."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from partitions.invariants import InvariantViolation, invariant
from partitions.log.append import BatchEntry
from partitions.log.config import LogConfig
from partitions.log.log import Log
from partitions.log.record_batch import Record, build_batch

ROOT = Path(__file__).resolve().parents[2]


def _batch(n: int = 3) -> bytes:
    return build_batch([Record(b"k", b"v%d" % i, timestamp=1000 + i) for i in range(n)])


def test_invariant_raises_with_the_formatted_message_only_when_false():
    invariant(True, "never formatted: %d", object())  # a true check formats nothing
    with pytest.raises(InvariantViolation, match=r"^log end 7 < high watermark 9$") as exc:
        invariant(7 >= 9, "log end %d < high watermark %d", 7, 9)
    assert isinstance(exc.value, AssertionError)


def test_the_log_checks_its_offsets_after_a_mutation(tmp_path):
    lg = Log.open(tmp_path / "t-0", LogConfig())
    lg.append_as_leader(_batch(), leader_epoch=0)
    lg._high_watermark = lg.log_end_offset + 1  # a bug elsewhere broke HW <= LEO
    with pytest.raises(InvariantViolation, match="high watermark 4, log end 3"):
        lg.update_high_watermark(0)
    lg._high_watermark = 3
    lg._recovery_point = 10  # recovery point beyond the log end
    with pytest.raises(InvariantViolation, match="recovery point 10"):
        lg.flush()
    lg.close_without_flush()


def test_a_segment_refuses_offsets_that_do_not_increase(tmp_path):
    lg = Log.open(tmp_path / "t-0", LogConfig())
    lg.append_as_leader(_batch(), leader_epoch=0)
    seg = lg.active_segment
    with pytest.raises(InvariantViolation, match="offsets must increase"):
        seg.append(b"", [BatchEntry(0, 1, 4, 0, 1000)])  # offset 1 again, after next offset 3
    lg.close_without_flush()


def test_invariants_fire_under_python_O(tmp_path):
    script = textwrap.dedent(f"""
        import sys
        assert False, "asserts are stripped under -O: never raised"
        from partitions.invariants import InvariantViolation
        from partitions.log.config import LogConfig
        from partitions.log.log import Log
        from partitions.log.record_batch import Record, build_batch

        assert sys.flags.optimize >= 1
        lg = Log.open({str(tmp_path / "t-0")!r}, LogConfig())
        lg.append_as_leader(build_batch([Record(b"k", b"v", timestamp=1)]), leader_epoch=0)
        lg._high_watermark = lg.log_end_offset + 5
        try:
            lg.update_high_watermark(0)
        except InvariantViolation as exc:
            print("fired:", exc)
        else:
            print("did not fire")
        lg.close_without_flush()
    """)
    out = subprocess.run([sys.executable, "-O", "-c", script], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("fired:") and "high watermark 6, log end 1" in out.stdout, out.stdout
