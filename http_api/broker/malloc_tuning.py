"""glibc malloc tuning for broker processes.

Why: a broker moves its data through large, short-lived buffers (produce bodies, fetch
responses of hundreds of KiB). With glibc's defaults those come from fresh `mmap`s (or a
heap that is trimmed back after every burst), so every byte is first touched on a new page:
measured on this machine, ~500 minor page faults per MB replicated, about 40% of a broker's
CPU at RF=3 (bench/replication_bench.py). Raising the mmap threshold keeps such buffers on
the heap, and a high trim threshold keeps freed heap memory for the next request: faults
drop to ~1 per MB. The cost is resident memory: up to `malloc_trim_threshold_bytes` of
freed heap is kept rather than returned to the OS.

`apply()` is a no-op where glibc is absent (musl, macOS) or a threshold is 0 (keep glibc's
defaults); the environment variables MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ win
when set, since the operator asked for them explicitly.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger(__name__)

# mallopt parameter numbers from glibc's malloc.h
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3


def apply(mmap_threshold_bytes: int, trim_threshold_bytes: int) -> dict[str, int]:
    """Set glibc's mmap and trim thresholds in this process. Returns what was set."""
    done: dict[str, int] = {}
    if mmap_threshold_bytes <= 0 and trim_threshold_bytes <= 0:
        return done
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        log.info("malloc tuning skipped: no glibc mallopt in this process")
        return done
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    wanted = [("mmap_threshold_bytes", M_MMAP_THRESHOLD, mmap_threshold_bytes, "MALLOC_MMAP_THRESHOLD_"),
              ("trim_threshold_bytes", M_TRIM_THRESHOLD, trim_threshold_bytes, "MALLOC_TRIM_THRESHOLD_")]
    for label, param, value, env in wanted:
        if value <= 0 or env in os.environ:
            continue
        value = min(value, 2**31 - 1)
        if mallopt(param, value) == 1:
            done[label] = value
        else:
            log.warning("mallopt(%s, %d) refused; keeping glibc's default", label, value)
    return done
