"""kill -9 a process while it appends to and compacts a log, at random moments, several
times over the same log: every reopen (recovery) gives a consistent log: offsets
ascending, only records that were written, the latest value of every key present, the
same key -> value view as a replay of everything written below the log end, no leftover
`.cleaned` files, no overlapping segments."""
import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from log_cleaner_crash_proc import BATCH_RECORDS, CFG, batch_items, written_until  # noqa: E402

from partitions.log.log import Log  # noqa: E402
from partitions.log.record_batch import Record, build_batch, decode_batches  # noqa: E402

pytestmark = pytest.mark.integration
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def _replay(items):
    state = {}
    for _, k, v in items:
        if v is None:
            state.pop(k, None)
        else:
            state[k] = v
    return state


def _check(log_dir):
    lg = Log.open(log_dir, CFG, clean_shutdown=False)
    try:
        leo = lg.log_end_offset
        got = [(r.offset, r.key, r.value) for r in decode_batches(lg.read(0, 1 << 26).records)]
        written = written_until(leo)
        by_offset = {o: (k, v) for o, k, v in written}
        offsets = [o for o, _, _ in got]
        assert offsets == sorted(set(offsets)), "offsets not ascending"
        assert all(by_offset.get(o) == (k, v) for o, k, v in got), "a record that was never written"
        assert _replay(got) == _replay(written), "key -> value view differs from the replay"
        latest = {}
        for o, k, v in written:
            latest[k] = (o, v)
        present = set(offsets)
        assert all(o in present or v is None for o, v in latest.values()), "a key's latest value is missing"
        segs = lg.segments
        assert all(a.next_offset <= b.base_offset for a, b in zip(segs, segs[1:])), "overlapping segments"
        assert not [p for p in os.listdir(log_dir) if p.endswith(".cleaned")]
        return leo
    finally:
        lg.close()


def test_kill_9_during_cleaning_recovers_a_consistent_log(tmp_path):
    log_dir = str(tmp_path / "crash-0")
    rng = random.Random(int(os.environ.get("CRASH_SEED", "6")))
    passes = 0
    leo = 0
    for trial in range(8):
        proc = subprocess.Popen([sys.executable, os.path.join(HERE, "log_cleaner_crash_proc.py"), log_dir],
                                stdout=subprocess.PIPE, text=True, cwd=ROOT,
                                env=dict(os.environ, PYTHONPATH=ROOT))
        lines = []
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
        reader.start()
        try:
            deadline = time.monotonic() + 20
            while not lines and time.monotonic() < deadline:
                time.sleep(0.01)
            assert lines and lines[0].startswith("ready"), f"helper did not start: {lines}"
            time.sleep(rng.uniform(0.05, 0.6))   # a random moment of the cleaning passes: the kill point
        finally:
            proc.kill()
            proc.wait(10)
            reader.join(5)
        done = [ln.split() for ln in lines if ln.startswith("pass")]
        passes += sum(int(d[2]) > 0 for d in done)
        new_leo = _check(log_dir)
        assert new_leo >= leo  # fsynced rounds survive
        leo = new_leo
    assert passes > 3 and leo > 0  # the kills did land among real cleaning passes


def _run_once(log_dir, crash_after=None) -> tuple[int, int]:
    """One cleaning pass in a forked child (cheap: no interpreter start), dying before its
    (crash_after + 1)th file-system operation if given. (exit code, operations counted)."""
    from log_cleaner_crash_proc import clean_once

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 1
        try:
            os.close(r)
            if crash_after is not None:
                os.environ["CRASH_AFTER_FS_OPS"] = str(crash_after)
            ops = clean_once(log_dir, quiet=True)
            os.write(w, str(ops).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r) as f:
        ops = f.read()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), int(ops or -1)


def test_death_at_every_step_of_a_pass_recovers_a_consistent_log(tmp_path):
    """Deterministic crash points: a process dies (os._exit: for the file system the same
    as kill -9) before each file-system operation of one pass in turn (swaps: index
    removal, renames, deletions, directory fsyncs; checkpoint writes)."""
    import shutil

    prepared = str(tmp_path / "prepared-0")
    lg = Log.open(prepared, CFG)
    for i in range(12):
        lg.append_as_leader(build_batch([Record(k, v) for k, v in batch_items(i)]), 0)
    lg.roll()
    lg.close()
    assert lg.log_end_offset == 12 * BATCH_RECORDS and lg.segment_count >= 4  # 3 closed segments
    probe = str(tmp_path / "probe-0")
    shutil.copytree(prepared, probe)
    code, total = _run_once(probe)
    assert code == 0
    assert total > 15
    _check(probe)
    step = max(1, total // 40)  # every operation of a small log
    for n in sorted(set(range(0, total, step)) | {total - 1}):
        d = str(tmp_path / f"crash-{n}-0")
        shutil.copytree(prepared, d)
        code, _ = _run_once(d, n)
        assert code == 137, n
        assert _check(d) == 12 * BATCH_RECORDS
        assert _run_once(d)[0] == 0  # and cleaning resumes from whatever state was left
        _check(d)
    print(f"{total} file-system operations in one pass, crashed before each")
