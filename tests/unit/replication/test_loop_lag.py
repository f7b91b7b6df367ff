"""EventLoopLagMonitor / LagWindow (issue 25): the broker's longest event-loop stall."""
import asyncio
import time

from http_api.broker.loop_lag import EventLoopLagMonitor, LagWindow


def test_window_keeps_the_largest_stall_of_this_and_the_previous_window():
    w = LagWindow(window_ms=1000)
    w.record(0, 5)
    w.record(500, 120)
    w.record(900, 7)
    assert w.max_ms(950) == 120
    w.record(1200, 3)              # next window: the previous one's 120 still shows
    assert w.max_ms(1300) == 120
    w.record(2100, 9)              # two windows on: 120 is gone
    assert w.max_ms(2150) == 9
    assert w.max_ms(5000) == 0     # long quiet: both windows stale


def test_monitor_measures_a_blocking_callback():
    async def main():
        m = EventLoopLagMonitor(interval_ms=10)
        t = asyncio.create_task(m.run())
        try:
            await asyncio.sleep(0.05)
            time.sleep(0.3)        # the stall under test: hold the loop 300 ms
            deadline = time.monotonic() + 10
            while m.lag_ms() < 250 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            return m.lag_ms()
        finally:
            t.cancel()
    assert asyncio.run(main()) >= 250


def test_watchdog_logs_the_stack_of_the_step_holding_the_loop(caplog):
    def hold_the_loop_for_a_while():
        time.sleep(0.6)

    async def main():
        m = EventLoopLagMonitor(interval_ms=10, warn_ms=200)
        t = asyncio.create_task(m.run())
        try:
            await asyncio.sleep(0.05)
            hold_the_loop_for_a_while()
            await asyncio.sleep(0.05)
            return m.watchdog.stacks_logged
        finally:
            t.cancel()
    with caplog.at_level("WARNING", logger="http_api.broker.loop_lag"):
        logged = asyncio.run(main())
    assert logged >= 1
    assert any("hold_the_loop_for_a_while" in r.getMessage() for r in caplog.records)


def test_watchdog_notes_the_process_alive_from_its_thread_while_the_loop_is_held():
    """`on_stall` (the broker's `POST /controller/v1/brokers/alive`) is called from the
    watchdog thread while the loop is held, every `on_stall_every_ms`, and not while it turns."""
    import threading

    notes: list = []

    def note(stalled_ms: float) -> None:
        notes.append((threading.get_ident(), stalled_ms))

    async def main():
        m = EventLoopLagMonitor(interval_ms=10, warn_ms=5000, on_stall=note)
        t = asyncio.create_task(m.run())
        try:
            await asyncio.sleep(0.6)           # a turning loop: no note
            quiet = len(notes)
            m.watchdog.on_stall_every_ms = 200
            m.watchdog.congested_lag_ms = 10_000   # the stall path alone (congestion: the next test)
            time.sleep(1.0)                    # held 1 s: notes at ~200, ~400, ... ms
            await asyncio.sleep(0.05)
            return quiet, threading.get_ident()
        finally:
            t.cancel()
    quiet, loop_thread = asyncio.run(main())
    assert quiet == 0
    assert len(notes) >= 2, notes
    assert all(tid != loop_thread for tid, _ in notes)
    assert all(ms > 200 for _, ms in notes)


def test_watchdog_notes_the_process_alive_while_the_loop_is_congested_without_one_long_stall():
    """A loop that turns, but every turn holds it 300 ms (a survivor applying a fencing at
    100,000 partitions among its held produces), never stalls `on_stall_every_ms` at once,
    yet answers nothing within a second: the notes go out while it is congested, and stop
    `congested_hold_ms` after it is calm again."""
    notes: list = []

    async def main():
        m = EventLoopLagMonitor(interval_ms=10, warn_ms=5000, on_stall=lambda ms: notes.append(time.monotonic()))
        t = asyncio.create_task(m.run())
        try:
            await asyncio.sleep(0.1)
            m.watchdog.on_stall_every_ms = 400
            m.watchdog.congested_lag_ms = 150
            m.watchdog.congested_hold_ms = 300
            await asyncio.sleep(0.5)
            calm = len(notes)
            end = time.monotonic() + 1.5
            while time.monotonic() < end:      # congested: 250 ms holds, a turn between them
                time.sleep(0.25)
                await asyncio.sleep(0.02)
            congested = len(notes)
            await asyncio.sleep(1.0)           # calm again
            return calm, congested, len(notes), m.watchdog.congested(time.monotonic())
        finally:
            t.cancel()
    calm, congested, after, still = asyncio.run(main())
    assert calm == 0
    assert congested - calm >= 2, notes
    assert after - congested <= 1 and not still
