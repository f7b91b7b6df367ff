"""PeerSilenceReporter: tells the controller about peers whose replication traffic stopped
(issue 24, docs/AVAILABILITY.md part B; asyncio shell).

Two pure rules say who is silent: `ReplicaState.silent_followers` (ISR members of partitions
this broker leads that sent no fetch request) and `ReplicaFetcherManager.silent_leaders`
(leaders that left this broker's fetch requests unanswered). A peer silent for more than
`replica_silence_report_ms` is reported (`report(target_id, silent_ms)`, at most once per
that interval per peer, one report in flight per peer) while the broker's metadata shows it
unfenced. A report is only a suspicion: the controller fences the peer once its own
heartbeats from it have stopped too and its probe cannot connect to it.

The same loop applies part D, the other side of the same silence: `isolation()` gives
(how long no heartbeat has succeeded, the leader lease), and `ReplicaManager.update_isolation`
suspends the leaderships of partitions whose followers went silent too (an isolated leader
takes no writes it cannot replicate). Both are off when `replica_silence_report_ms` is 0.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Awaitable, Callable

from partitions.clock import SYSTEM_CLOCK, Clock
from partitions.replication.loop_share import next_wait_s

if TYPE_CHECKING:
    from partitions.replication.replica_fetcher import ReplicaFetcherManager
    from partitions.replication.replica_manager import ReplicaManager

log = logging.getLogger(__name__)

# a peer silent this long gets one example partition in the log (which one, and whether its
# fetch session still restates it), at most once per SILENCE_EXAMPLE_EVERY_MS per peer
SILENCE_EXAMPLE_MIN_MS = 10_000
SILENCE_EXAMPLE_EVERY_MS = 30_000

# the largest share of the event loop the silence scan may take (less than the other periodic
# checks' PERIODIC_CHECK_LOOP_SHARE_MAX): after a kill -9 at 100,000 partitions each survivor
# leads 16,667 new partitions that stay loud until the other survivor's fetch session takes
# them up, and the scan took 9-17% of a survivor's loop for 12 s (py-spy, issue 25) while
# it applied the fencing and answered the produces waiting for it. A report is late by a
# fraction of replica_silence_report_ms at most (a scan of 50 ms: the next in 450 ms).
SILENCE_SCAN_LOOP_SHARE_MAX = 0.1


class PeerSilenceReporter:
    """Looks for silent peers every eighth of `replica_silence_report_ms` (see the module
    docstring). `is_live(broker_id)`: the broker's metadata holds it registered and unfenced."""

    def __init__(self, replica_manager: "ReplicaManager", fetchers: "ReplicaFetcherManager", broker_id: int,
                 report: Callable[[int, int], Awaitable[object]], is_live: Callable[[int], bool], *,
                 replica_silence_report_ms: int = 1000, clock: Clock = SYSTEM_CLOCK,
                 isolation: Callable[[], tuple[int | None, int]] | None = None) -> None:
        self.rm = replica_manager
        self.fetchers = fetchers
        self.broker_id = broker_id
        self.report = report
        self.is_live = is_live
        self.replica_silence_report_ms = replica_silence_report_ms
        self.clock = clock
        self.isolation = isolation
        self._last_report_ms: dict[int, int] = {}
        self._in_flight: dict[int, asyncio.Task] = {}
        self.reports_sent = 0
        self._last_example_ms: dict[int, int] = {}

    def silent_peers(self, silent_followers: dict[int, int] | None = None) -> dict[int, int]:
        """Peer broker id -> how long it has been silent (ms), both rules merged.
        `silent_followers`: `ReplicaState.silence_scan`'s first half, if the caller has it."""
        limit = self.replica_silence_report_ms
        out = dict(self.fetchers.silent_leaders(limit))
        if silent_followers is None:
            silent_followers = self.rm.core.silent_followers(self.rm._clock_ms(), limit)
        for b, ms in silent_followers.items():
            out[b] = max(out.get(b, 0), ms)
        out.pop(self.broker_id, None)
        return out

    def check_once(self) -> list[int]:
        """Report every silent live peer not reported within the interval; -> the ids reported.
        Then suspend or resume leaderships by the isolation rule (part D). One walk of the
        led partitions serves both rules (`ReplicaState.silence_scan`)."""
        scan_ms = self.rm._clock_ms()
        isolation = self.isolation() if self.isolation is not None else None
        if isolation is not None and isolation[0] is not None and isolation[0] >= isolation[1]:
            # heartbeats failing for the lease: the isolation rule needs the silent partitions
            followers, silent_parts = self.rm.core.silence_scan(scan_ms, self.replica_silence_report_ms)
        else:   # the common case: the report alone, an aged follower clock read as one answer
            followers = self.rm.core.silent_followers_by_clock(scan_ms, self.replica_silence_report_ms)
            silent_parts = set()
        if isolation is not None:
            heartbeat_silence_ms, leader_lease_ms = isolation
            self.rm.update_isolation(heartbeat_silence_ms, leader_lease_ms=leader_lease_ms,
                                     replica_silence_report_ms=self.replica_silence_report_ms,
                                     now_ms=scan_ms, silent_partitions=silent_parts)
        now = self.clock.monotonic_ms()
        sent = []
        for target, silent_ms in sorted(self.silent_peers(followers).items()):
            if not self.is_live(target):
                continue
            if now - self._last_report_ms.get(target, -10**12) < self.replica_silence_report_ms:
                continue
            t = self._in_flight.get(target)
            if t is not None and not t.done():
                continue
            self._last_report_ms[target] = now
            if silent_ms >= SILENCE_EXAMPLE_MIN_MS and now - self._last_example_ms.get(target, -10**12) >= \
                    SILENCE_EXAMPLE_EVERY_MS:
                self._last_example_ms[target] = now
                self._log_example(target, silent_ms, scan_ms)
            self._in_flight[target] = asyncio.ensure_future(self._send(target, silent_ms))
            sent.append(target)
        return sent

    def _log_example(self, target: int, silent_ms: int, scan_ms: int) -> None:
        """Which of the two rules says `target` is silent, and for a follower of ours the
        partition it has been silent on longest (with its times)."""
        limit = self.replica_silence_report_ms
        as_leader = dict(self.fetchers.silent_leaders(limit)).get(target)
        example = self.rm.core.silence_example(target, scan_ms, limit)
        log.info("broker %s silent for %d ms: as a leader we follow, %s; as a follower of ours, %s", target,
                 silent_ms, f"our fetches unanswered for {as_leader} ms" if as_leader else "it answers",
                 f"longest on {example}" if example else "it fetches")

    async def _send(self, target: int, silent_ms: int) -> None:
        try:
            res = await self.report(target, silent_ms)
            self.reports_sent += 1
            log.info("reported broker %s silent for %d ms to the controller: %s", target, silent_ms, res)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - the session timeout fences it anyway
            log.info("reporting broker %s silent failed: %s", target, e)

    async def run(self) -> None:
        if self.replica_silence_report_ms <= 0:
            return
        interval_s = max(50, self.replica_silence_report_ms // 8) / 1000
        wait_s = interval_s
        try:
            while True:
                await asyncio.sleep(wait_s)
                started = time.perf_counter()
                try:
                    self.check_once()
                except Exception:  # noqa: BLE001 - never stop looking
                    log.exception("looking for silent peers failed")
                # a scan of thousands of partitions (a follower broker died) runs less often
                wait_s = next_wait_s(interval_s, time.perf_counter() - started, SILENCE_SCAN_LOOP_SHARE_MAX)
        finally:
            for t in self._in_flight.values():
                t.cancel()
