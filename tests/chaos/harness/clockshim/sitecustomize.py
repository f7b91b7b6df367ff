"""Test-only wall-clock offset for chaos runs (imported automatically by Python when this
directory is on PYTHONPATH of a cluster process).

With KRAFTLOG_CHAOS_CLOCK_FILE set, time.time() and time.time_ns() return the real wall
clock plus the offset (seconds, a float) written in that file, re-read every 100 ms by a
daemon thread: the harness makes a node's clock jump forwards or backwards at run time.
time.monotonic() is left alone (it never jumps on a real machine either).
"""
import os
import threading
import time

_path = os.environ.get("KRAFTLOG_CHAOS_CLOCK_FILE")
if _path:
    _real_time, _real_time_ns = time.time, time.time_ns
    _offset = [0.0]

    def _read() -> None:
        try:
            with open(_path) as f:
                _offset[0] = float(f.read().strip() or 0.0)
        except (OSError, ValueError):
            pass

    def _poll() -> None:
        while True:
            _read()
            time.sleep(0.1)

    def _time() -> float:
        return _real_time() + _offset[0]

    def _time_ns() -> int:
        return _real_time_ns() + int(_offset[0] * 1e9)

    _read()
    time.time, time.time_ns = _time, _time_ns
    threading.Thread(target=_poll, name="chaos-clock", daemon=True).start()
