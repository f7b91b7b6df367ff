"""Throttler: keeps a byte stream under a rate by sleeping (Kafka's `kafka.utils.Throttler`,
used by the log cleaner for `log.cleaner.io.max.bytes.per.second`).

Bytes are counted over periods of at least `check_interval_ms` (or shorter ones that
already hold more than an interval's worth of bytes); when a period went faster than
`max_bytes_per_second`, the caller sleeps until the period would have taken as long as
the limit allows. Clock and sleep are injected, so tests drive it without waiting.
"""
from __future__ import annotations

import math
import time
from typing import Callable

THROTTLE_CHECK_INTERVAL_MS = 300


class Throttler:
    """See module docstring. `max_bytes_per_second` <= 0 or infinite: never sleeps."""

    def __init__(self, max_bytes_per_second: float, check_interval_ms: int = THROTTLE_CHECK_INTERVAL_MS,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        self.max_bytes_per_second = max_bytes_per_second
        self.enabled = 0 < max_bytes_per_second < math.inf
        self.check_interval_s = check_interval_ms / 1000
        self._clock = clock
        self._sleep = sleep
        self._period_start = clock()
        self._observed = 0
        self.throttled_s = 0.0   # total time slept

    def maybe_throttle(self, nbytes: int) -> None:
        if not self.enabled:
            return
        self._observed += nbytes
        now = self._clock()
        elapsed = now - self._period_start
        if elapsed < self.check_interval_s and self._observed < self.max_bytes_per_second * self.check_interval_s:
            return
        allowed_s = self._observed / self.max_bytes_per_second
        if allowed_s > elapsed:
            self._sleep(allowed_s - elapsed)
            self.throttled_s += allowed_s - elapsed
        self._period_start = self._clock()
        self._observed = 0
