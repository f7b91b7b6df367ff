"""Periodic checks hold a bounded share of the event loop (issue 25, partitions/replication/
loop_share.py): a silence scan or ISR check that takes long (thousands of partitions whose
follower broker died) runs less often; a cheap one keeps its interval."""
import asyncio
import time
from types import SimpleNamespace

from partitions.replication.loop_share import PERIODIC_CHECK_LOOP_SHARE_MAX, next_wait_s
from partitions.replication.silence_reporter import SILENCE_SCAN_LOOP_SHARE_MAX, PeerSilenceReporter


def test_next_wait_keeps_the_interval_for_cheap_checks_and_bounds_the_share_of_slow_ones():
    assert next_wait_s(0.125, 0.001) == 0.125
    assert next_wait_s(0.125, 0.0) == 0.125
    slow = next_wait_s(0.125, 0.2)
    assert abs(0.2 / (0.2 + slow) - PERIODIC_CHECK_LOOP_SHARE_MAX) < 1e-9
    assert next_wait_s(0.3, 0.05, share_max=0.5) == 0.3


async def test_a_slow_silence_scan_runs_less_often():
    scans = []

    def slow_scan(now_ms, limit_ms):
        scans.append(time.monotonic())
        time.sleep(0.05)          # a scan of many partitions, holding the loop
        return {}, set()
    rm = SimpleNamespace(core=SimpleNamespace(silence_scan=slow_scan, silent_followers=lambda *a: {},
                                               silent_followers_by_clock=lambda *a: slow_scan(*a)[0]),
                         _clock_ms=lambda: int(time.monotonic() * 1000))
    fetchers = SimpleNamespace(silent_leaders=lambda limit: {})

    async def report(target, ms):
        return {}
    reporter = PeerSilenceReporter(rm, fetchers, 1, report, lambda b: True, replica_silence_report_ms=400)
    task = asyncio.ensure_future(reporter.run())   # interval 50 ms (400 / 8)
    try:
        await asyncio.sleep(1.6)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    gaps = [b - a for a, b in zip(scans, scans[1:])]
    # a 0.05 s scan, then a wait of >= 0.45 s (SILENCE_SCAN_LOOP_SHARE_MAX: 10% of the loop
    # at most; the other periodic checks may take 25%)
    assert SILENCE_SCAN_LOOP_SHARE_MAX <= 0.1
    assert gaps and min(gaps) >= 0.05 * (1 + (1 - SILENCE_SCAN_LOOP_SHARE_MAX) / SILENCE_SCAN_LOOP_SHARE_MAX) - 0.01, gaps
