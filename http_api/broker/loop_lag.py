"""EventLoopLagMonitor: how long the broker's event loop was held by one synchronous step
(issue 25; asyncio shell around a pure window).

A task sleeps `event_loop_lag_interval_ms` (100 ms) again and again; how much later than
asked it wakes is how long some callback held the loop. `/metrics` shows the largest such
stall of the current and the previous window of `event_loop_lag_window_ms` (10 s) as
`kraftlog_event_loop_lag_ms`; a stall above `event_loop_lag_warn_ms` (1 s) is logged. A
broker whose loop stalls for seconds misses its controller heartbeats and its followers'
long-poll answers. To say which step holds it, a watchdog thread (`StallWatchdog`) logs the
loop thread's stack while the loop has not ticked for more than `event_loop_lag_warn_ms`
(once, then every `EVENT_LOOP_STALL_STACK_EVERY_MS` while the stall lasts).

The same thread can say the process is alive while the loop is busy (`on_stall`, called
after `EVENT_LOOP_STALL_ALIVE_NOTE_MS` and then as often while the stall lasts): the broker
sends `POST /controller/v1/brokers/alive` from it, so the controller's silence fencing does
not take a busy broker for a stopped or cut-off one (a stopped process's threads stop too; a
cut-off host's note does not arrive). Kafka's brokers heartbeat from a thread of their own
for the same reason, and so do ours since (metadata_quorum/heartbeat_thread.py): the notes
still matter when the heartbeat thread holds its heartbeats for a wedged loop, and reach
the silence rule sooner than the next heartbeat. A *congested* loop needs the note as much as a stalled one: after a
kill -9 at 100,000 partitions a survivor's loop turned every 200-500 ms for seconds, never
held 500 ms at once, yet its heartbeats and its answer to the controller's probe each took
several turns (more than the probe's 1 s, twice), and it was fenced while alive. So the notes
also go out every `EVENT_LOOP_STALL_ALIVE_NOTE_MS` while one tick came more than
`EVENT_LOOP_CONGESTED_LAG_MS` late within the last `EVENT_LOOP_CONGESTED_HOLD_MS`.
"""
from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
import traceback
from typing import Callable

log = logging.getLogger(__name__)

EVENT_LOOP_LAG_INTERVAL_MS = 100
EVENT_LOOP_LAG_WINDOW_MS = 10_000
EVENT_LOOP_LAG_WARN_MS = 1_000
EVENT_LOOP_STALL_STACK_EVERY_MS = 2_000
EVENT_LOOP_STALL_ALIVE_NOTE_MS = 500   # on_stall after this long without a tick, then as often
# a tick this much later than asked marks the loop congested; notes go on this long after it
EVENT_LOOP_CONGESTED_LAG_MS = 200
EVENT_LOOP_CONGESTED_HOLD_MS = 3_000


class LagWindow:
    """Largest stall (ms) per window of `window_ms`; `max_ms(now)` covers the current and the
    previous window, so a scrape never sees a fresh, empty window only. Pure."""

    def __init__(self, window_ms: int = EVENT_LOOP_LAG_WINDOW_MS) -> None:
        self.window_ms = window_ms
        self._start_ms: float | None = None
        self._current = 0.0
        self._previous = 0.0

    def _roll(self, now_ms: float) -> None:
        if self._start_ms is None:
            self._start_ms = now_ms
            return
        elapsed = now_ms - self._start_ms
        if elapsed >= self.window_ms:
            # one window passed: the current becomes the previous; more: both are stale
            self._previous = self._current if elapsed < 2 * self.window_ms else 0.0
            self._current = 0.0
            self._start_ms = now_ms - elapsed % self.window_ms

    def record(self, now_ms: float, lag_ms: float) -> None:
        self._roll(now_ms)
        self._current = max(self._current, lag_ms)

    def max_ms(self, now_ms: float) -> float:
        self._roll(now_ms)
        return max(self._current, self._previous)


class EventLoopLagMonitor:
    """Measures the running loop's stalls into a `LagWindow` (see the module docstring)."""

    def __init__(self, *, interval_ms: int = EVENT_LOOP_LAG_INTERVAL_MS, window_ms: int = EVENT_LOOP_LAG_WINDOW_MS,
                 warn_ms: int = EVENT_LOOP_LAG_WARN_MS, clock_ms: Callable[[], float] | None = None,
                 on_stall: Callable[[float], None] | None = None) -> None:
        self.on_stall = on_stall   # the watchdog's note while the loop is stalled (StallWatchdog)
        self.interval_ms = interval_ms
        self.warn_ms = warn_ms
        self.window = LagWindow(window_ms)
        self.clock_ms = clock_ms or (lambda: time.monotonic() * 1000)
        self.max_lag_ms_ever = 0.0
        self.watchdog: StallWatchdog | None = None

    def lag_ms(self) -> float:
        """Largest stall of the current and the previous window (ms)."""
        return round(self.window.max_ms(self.clock_ms()), 1)

    async def run(self, *, watchdog: bool = True) -> None:
        if watchdog:
            self.watchdog = StallWatchdog(self.warn_ms, on_stall=self.on_stall, tick_interval_ms=self.interval_ms)
            self.watchdog.start()
        try:
            await self._measure()
        finally:
            if self.watchdog is not None:
                self.watchdog.stop()

    async def _measure(self) -> None:
        while True:
            if self.watchdog is not None:
                self.watchdog.tick()
            t0 = self.clock_ms()
            await asyncio.sleep(self.interval_ms / 1000)
            now = self.clock_ms()
            lag = max(0.0, now - t0 - self.interval_ms)
            self.window.record(now, lag)
            self.max_lag_ms_ever = max(self.max_lag_ms_ever, lag)
            if lag > self.warn_ms:
                log.warning("event loop held for %.0f ms (heartbeats and replica fetch answers wait that long; "
                            "py-spy dump --pid %d shows the step)", lag, os.getpid())


def _project_frames(frames: list, innermost: int = 3) -> list:
    """The frames of our own code (not the standard library's or site-packages'), plus the
    `innermost` frames wherever they are: what a stall report needs."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ours = [f for f in frames[:-innermost] if f.filename.startswith(root) and "site-packages" not in f.filename]
    return ours + list(frames[-innermost:])


class StallWatchdog:
    """A daemon thread logging the event-loop thread's stack while the loop is stalled (no
    `tick()` for more than `warn_ms`), and calling `on_stall` while it is stalled or
    congested (module docstring). `tick()` is called from the loop every `tick_interval_ms`
    (cheap)."""

    def __init__(self, warn_ms: int = EVENT_LOOP_LAG_WARN_MS,
                 stack_every_ms: int = EVENT_LOOP_STALL_STACK_EVERY_MS, *,
                 on_stall: Callable[[float], None] | None = None,
                 on_stall_every_ms: int = EVENT_LOOP_STALL_ALIVE_NOTE_MS,
                 tick_interval_ms: float = EVENT_LOOP_LAG_INTERVAL_MS,
                 congested_lag_ms: float = EVENT_LOOP_CONGESTED_LAG_MS,
                 congested_hold_ms: float = EVENT_LOOP_CONGESTED_HOLD_MS) -> None:
        self.warn_ms = warn_ms
        self.stack_every_ms = stack_every_ms
        # called from this thread with the stall so far (ms) once the loop has not ticked for
        # `on_stall_every_ms`, then every `on_stall_every_ms` while the stall lasts, and as
        # often while the loop is congested
        self.on_stall = on_stall
        self.on_stall_every_ms = on_stall_every_ms
        self.tick_interval_ms = tick_interval_ms
        self.congested_lag_ms = congested_lag_ms
        self.congested_hold_ms = congested_hold_ms
        self.loop_thread_id = threading.get_ident()
        self.last_tick = time.monotonic()
        self.congested_at: float | None = None   # the last tick that came congested_lag_ms late
        self.stacks_logged = 0
        self.stall_notes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def tick(self) -> None:
        now = time.monotonic()
        if (now - self.last_tick) * 1000 - self.tick_interval_ms > self.congested_lag_ms:
            self.congested_at = now
        self.last_tick = now

    def congested(self, now: float) -> bool:
        """A tick came `congested_lag_ms` late within the last `congested_hold_ms`."""
        at = self.congested_at
        return at is not None and (now - at) * 1000 < self.congested_hold_ms

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="event-loop-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        logged_for = None   # the tick whose stall was logged last, and when
        next_log = 0.0
        next_note = 0.0
        poll_ms = min(self.warn_ms, self.on_stall_every_ms) if self.on_stall is not None else self.warn_ms
        while not self._stop.wait(poll_ms / 4000):
            tick = self.last_tick
            now = time.monotonic()
            stalled_ms = (now - tick) * 1000
            if (self.on_stall is not None and (stalled_ms > self.on_stall_every_ms or self.congested(now))
                    and now >= next_note):
                next_note = now + self.on_stall_every_ms / 1000
                try:
                    self.on_stall(stalled_ms)
                    self.stall_notes += 1
                except Exception as exc:   # the next note tries again
                    log.debug("stall note failed: %s", exc)
            if stalled_ms <= self.warn_ms:
                continue
            if logged_for == tick and time.monotonic() < next_log:
                continue
            frame = sys._current_frames().get(self.loop_thread_id)
            if frame is None:
                continue
            stack = "".join(traceback.format_list(_project_frames(traceback.extract_stack(frame))))
            log.warning("event loop stalled for %.0f ms so far; the loop thread is at:\n%s", stalled_ms, stack)
            self.stacks_logged += 1
            logged_for, next_log = tick, time.monotonic() + self.stack_every_ms / 1000
