"""Idle cost of replication on a leader, in-process (issue 25): no sockets, no cluster.

Broker 1 leads N partitions (replicas 1, 2, 3, the whole ISR, in-memory logs); followers 2
and 3 fetch them in incremental fetch sessions (KIP-227) and are caught up. Nothing is
produced. On a fake clock the bench runs what an idle broker does per second, at the
broker's default cadences:

- the ISR check (`ReplicaManager.isr_changes`) every 300 ms (min(1 s, lag / 2,
  replica_fetch_silence_max_ms / 5) with the defaults 30 s and 1.5 s);
- the silence scan and isolation update (`PeerSilenceReporter.check_once`'s core calls)
  every replica_silence_report_ms / 8 = 125 ms;
- one fetch-session poll per follower per replica_fetch_wait_max_ms = 500 ms (the idle
  long poll answered when its wait ends; the wait itself costs no CPU and is not run).

`--follower-down`: follower 3 has stopped and the controller took it out of every ISR (a
follower broker down, e.g. after a kill -9); follower 2 keeps fetching.

It prints the CPU time (process time) per simulated second of idle: the share of a core
the leader side of replication costs while doing nothing.

    .venv/bin/python -m bench.replication_idle_bench --partitions 10000 33334
    git worktree add /tmp/before <commit>
    .venv/bin/python -m bench.replication_idle_bench --partitions 10000 33334 --before /tmp/before --rounds 3

`--before DIR` alternates rounds between the code in DIR (a worktree of an older commit,
run as a child process with PYTHONPATH=DIR) and this tree, and prints the ratio per N.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time

ISR_CHECK_MS = 300
SILENCE_SCAN_MS = 125
FOLLOWER_POLL_MS = 500
LAG_MS = 30_000
SILENCE_REPORT_MS = 1000
FOLLOWERS = (2, 3)


async def _poll(rm, state: dict, follower: int, broker_epoch: int = 7) -> None:
    """One session request of `follower`: a full fetch first, then incremental ones naming
    nothing (it is caught up and nothing was appended)."""
    from partitions.replication.replica_state import ReplicaFetchRequest
    sid, epoch, keys = state.get(follower, (0, 0, None))
    reqs = [ReplicaFetchRequest(t, p, 0, 0) for t, p in keys] if sid == 0 else []
    new_sid, error, _ = await rm.replica_fetch_session(follower, sid, epoch, reqs, [], max_bytes=1 << 20,
                                                       partition_max_bytes=1 << 20, max_wait_ms=0,
                                                       broker_epoch=broker_epoch)
    if error:
        raise RuntimeError(f"session error {error}")
    state[follower] = (new_sid, epoch + 1 if new_sid == sid else 1, keys)


async def measure(n: int, seconds: int, follower_down: bool = False) -> dict:
    """CPU ms per simulated idle second with `n` led partitions (`follower_down`: follower 3
    stopped and the controller took it out of every ISR before the measurement)."""
    from partitions.clock import ManualClock
    from partitions.log.protocols import TopicPartition
    from partitions.replication.replica_manager import ReplicaManager
    from partitions.replication.replica_state import LeaderAndIsr
    from tests.unit.replication.fake_log import MemoryLogManager
    clock = ManualClock()
    rm = ReplicaManager(1, MemoryLogManager(), clock=clock, replica_fetch_silence_max_ms=1500)
    keys = [("t", p) for p in range(n)]
    for t, p in keys:
        tp = TopicPartition(t, p)
        rm.core.add_replica(tp, rm.log_manager.get_or_create(t, p))
        rm.core.apply_leader_and_isr(tp, LeaderAndIsr(1, 0, (1, 2, 3), (1, 2, 3), 0), now_ms=clock.now_ms())
    sessions: dict = {f: (0, 0, keys) for f in FOLLOWERS}
    for _ in range(2):   # the full fetch, then the first restate of every partition
        for f in FOLLOWERS:
            await _poll(rm, sessions, f)
        clock.advance(FOLLOWER_POLL_MS)
    polling = FOLLOWERS
    if follower_down:
        polling = FOLLOWERS[:1]
        for t, p in keys:
            rm.core.apply_leader_and_isr(TopicPartition(t, p), LeaderAndIsr(1, 0, (1, 2, 3), (1, 2), 1),
                                         now_ms=clock.now_ms())
    step = 25
    isr_checks = scans = polls = 0
    t0 = None
    for ms in range(step, (seconds + 1) * 1000 + 1, step):   # the first second is a warm-up
        if ms == 1000 + step:
            t0 = time.process_time()
            isr_checks = scans = polls = 0
        clock.advance(step)
        if ms % ISR_CHECK_MS == 0:
            changes = rm.isr_changes(LAG_MS)
            assert not changes, "an idle ISR must not change"
            isr_checks += 1
        if ms % SILENCE_SCAN_MS == 0:
            now = clock.now_ms()
            silent, parts = rm.core.silence_scan(now, SILENCE_REPORT_MS)
            assert not silent, f"no follower is silent: {silent}"
            rm.update_isolation(None, leader_lease_ms=5000, replica_silence_report_ms=SILENCE_REPORT_MS,
                                now_ms=now, silent_partitions=parts)
            scans += 1
        for i, f in enumerate(polling):   # staggered, as real followers are
            if (ms + i * FOLLOWER_POLL_MS // len(FOLLOWERS)) % FOLLOWER_POLL_MS == 0:
                await _poll(rm, sessions, f)
                polls += 1
    cpu_ms = (time.process_time() - t0) * 1000
    return {"partitions": n, "seconds": seconds, "cpu_ms_per_s": cpu_ms / seconds,
            "isr_checks": isr_checks, "scans": scans, "polls": polls}


def _child(n: int, seconds: int, follower_down: bool) -> None:
    print(json.dumps(asyncio.run(measure(n, seconds, follower_down))))


def _run(code_dir: str | None, n: int, seconds: int, follower_down: bool = False) -> float:
    env = dict(os.environ)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = code_dir if code_dir else here
    extra = ["--follower-down"] if follower_down else []
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", str(n), "--seconds", str(seconds)]
                         + extra,
                         env=env, capture_output=True, text=True, check=True, cwd=code_dir or here)
    return json.loads(out.stdout.strip().splitlines()[-1])["cpu_ms_per_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--partitions", type=int, nargs="+", default=[10_000, 33_334])
    ap.add_argument("--seconds", type=int, default=10, help="simulated idle seconds per measurement")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--before", metavar="DIR", help="a worktree of the older code: alternate rounds, print ratios")
    ap.add_argument("--follower-down", action="store_true",
                    help="follower 3 stopped and out of every ISR (a follower broker down), 2 still fetching")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args.child, args.seconds, args.follower_down)
        return
    print(f"load average at start: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    for n in args.partitions:
        before, after = [], []
        for _ in range(args.rounds):
            if args.before:
                before.append(_run(args.before, n, args.seconds, args.follower_down))
            after.append(_run(None, n, args.seconds, args.follower_down))
        who = "1 follower fetching, 1 down" if args.follower_down else "2 followers"
        line = f"{n:>7} led partitions, {who}: after {statistics.median(after):8.1f} CPU ms per idle s"
        if before:
            b, a = statistics.median(before), statistics.median(after)
            line += (f"   before {b:8.1f}   ratio {b / a:6.1f}x   (rounds before {[round(x, 1) for x in before]}, "
                     f"after {[round(x, 1) for x in after]})")
        print(line, flush=True)
    print(f"load average at end: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")


if __name__ == "__main__":
    main()
