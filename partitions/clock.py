"""One injected clock for every component that reads the time.

A component that needs the time takes a `Clock` (default `SYSTEM_CLOCK`) instead of calling
`time.time()` itself, so a test can drive it with a `ManualClock` and a simulation with its own
virtual time. `now_ms()` is wall-clock time in milliseconds since the epoch (what Kafka
stamps on records and compares with `retention.ms`); `monotonic_ms()` never goes backwards
and is for measuring durations and deadlines only. This module imports nothing of the project.
"""
from __future__ import annotations

import time
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """A source of time in milliseconds."""

    def now_ms(self) -> int:
        """Wall-clock milliseconds since the Unix epoch."""
        ...

    def monotonic_ms(self) -> int:
        """Milliseconds from an arbitrary origin; never decreases."""
        ...


class SystemClock:
    """The machine's clocks (`time.time()`, `time.monotonic()`)."""

    __slots__ = ()

    def now_ms(self) -> int:
        return int(time.time() * 1000)

    def monotonic_ms(self) -> int:
        return int(time.monotonic() * 1000)

    def __reduce__(self):  # the one SYSTEM_CLOCK survives pickling (cleaner processes)
        return "SYSTEM_CLOCK"

    def __repr__(self) -> str:
        return "SYSTEM_CLOCK"


SYSTEM_CLOCK = SystemClock()


class ManualClock:
    """A clock that moves only when told to (tests, simulations).

    `now_ms()` and `monotonic_ms()` advance together; `set_ms()` may move the wall clock
    backwards (a clock step, as NTP can do) but never the monotonic one.
    """

    def __init__(self, now_ms: int = 1_000_000):
        self._now_ms = int(now_ms)
        self._monotonic_ms = 0

    def now_ms(self) -> int:
        return self._now_ms

    def monotonic_ms(self) -> int:
        return self._monotonic_ms

    def advance(self, ms: int) -> int:
        """Move both clocks forward by `ms` (>= 0); returns the new `now_ms()`."""
        if ms < 0:
            raise ValueError(f"cannot advance a clock by {ms} ms: use set_ms() to step the wall clock back")
        self._now_ms += int(ms)
        self._monotonic_ms += int(ms)
        return self._now_ms

    def set_ms(self, now_ms: int) -> None:
        """Set the wall clock; the monotonic clock moves forward by the step, if it is one."""
        step = int(now_ms) - self._now_ms
        if step > 0:
            self._monotonic_ms += step
        self._now_ms = int(now_ms)

    def __repr__(self) -> str:
        return f"ManualClock(now_ms={self._now_ms})"
