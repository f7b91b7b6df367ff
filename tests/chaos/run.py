"""Run a chaos schedule against a real 3-node cluster and write a report.

    python -m tests.chaos.run --minutes 30 --report out/chaos [--seed N] [--kinds kill-broker,lost-tail]
    python -m tests.chaos.run --faults 13 --report out/short

The workload (tests/chaos/harness/workload.py) runs throughout; a nemesis thread injects
one fault at a time (hold, then heal, then a quiet period); at the end everything is
healed, the partitions are read in full and the history goes through the checker.
Exit status 0 = no anomaly. The report directory gets report.md, report.json,
history.jsonl and throughput_latency.svg.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from typing import Optional

from tests.chaos.harness.checker import check
from tests.chaos.harness.cluster import ChaosCluster, ClusterSettings
from tests.chaos.harness.history import History
from tests.chaos.harness.nemesis import ALL_NEMESES, Schedule
from tests.chaos.harness.report import write_report
from tests.chaos.harness.settle import AckTracker
from tests.chaos.harness.workload import Workload


CLEANER_COUNTERS = ("passes_total", "passes_aborted_total", "bytes_read_total", "bytes_written_total",
                    "records_removed_total", "tombstones_removed_total", "cleaning_seconds_total",
                    "retention_runs_total", "segments_deleted_by_retention_total")


class CleanerStatsPoller:
    """Samples every live broker's log cleaner counters (GET /admin/v1/log-cleaner): they
    live in the broker process, so the last sample of each process incarnation (broker id,
    pid) is kept and the incarnations summed: a lower bound of what the cleaner did."""

    def __init__(self, cluster):
        self.c = cluster
        self.samples: dict[tuple[int, int], dict] = {}

    def poll_once(self) -> None:
        for i in self.c.ids:
            spec = self.c.procs[("broker", i)]
            if not spec.alive() or spec.paused:
                continue
            snap = self.c.get_json(self.c.direct_url(i) + "/admin/v1/log-cleaner", timeout=1.0)
            if snap:
                self.samples[(i, spec.pid)] = snap

    def totals(self) -> dict:
        out = {k: 0 for k in CLEANER_COUNTERS}
        for snap in self.samples.values():
            for k in CLEANER_COUNTERS:
                out[k] += snap.get(k, 0)
        out["cleaning_seconds_total"] = round(out["cleaning_seconds_total"], 3)
        out["broker_processes_sampled"] = len(self.samples)
        return out


def cleaned_logs_on_disk(cluster) -> dict:
    """{topic: [partition replicas, as "broker/partition", whose cleaner checkpoint is past 0]}:
    which logs a cleaning pass finished on."""
    from partitions.log.cleaner_checkpoint import read_cleaner_checkpoint
    out: dict[str, list] = {}
    for i in cluster.ids:
        root = cluster.broker_log_dir(i)
        for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
            topic, _, part = name.rpartition("-")
            if not part.isdigit():
                continue
            cp = read_cleaner_checkpoint(os.path.join(root, name))
            if cp:
                out.setdefault(topic, []).append(f"{i}/{part}")
    return out


async def run_chaos(root: str, seed: int, *, minutes: Optional[float] = None, fault_count: Optional[int] = None,
                    kinds: Optional[list] = None, partitions: int = 3, hold_s=(2.0, 5.0), quiet_s=(2.0, 4.0),
                    warmup_s: float = 2.0, out_dir: Optional[str] = None, log=print,
                    log_level: str = "WARNING", secure: bool = False,
                    transactions: bool = False, raft_prevote: bool = False,
                    settle_max_s: float = 60.0, raft_options: Optional[dict] = None) -> tuple[dict, object]:
    """`secure`: TLS, authentication and ACLs on (ClusterSettings.secure; the workload is the
    super user admin). `raft_prevote`: the controllers run raft pre-vote. `settle_max_s`:
    before the next fault, wait at most this long for the cluster to recover from the last
    one (Schedule.settle; 0 = only the quiet time). `raft_options`: more controller raft flags
    (ClusterSettings.raft_options). `warmup_s`: workload alone before the first fault."""
    kinds = kinds or list(ALL_NEMESES)
    cluster = ChaosCluster(root, ClusterSettings(log_level=log_level, secure=secure, raft_prevote=raft_prevote,
                                                 raft_options=dict(raft_options or {})))
    history = History()
    schedule = Schedule(seed, kinds=kinds, hold_s=hold_s, quiet_s=quiet_s, settle_max_s=settle_max_s)
    rng = random.Random(seed)
    t0 = time.monotonic()
    poller = CleanerStatsPoller(cluster)
    sampling = threading.Event()

    def sample_thread():
        while not sampling.wait(2.0):
            poller.poll_once()

    sampler = threading.Thread(target=sample_thread, name="cleaner-stats", daemon=True)
    cleaned_on_disk: dict = {}
    anonymous = None
    try:
        await asyncio.get_running_loop().run_in_executor(None, cluster.start)
        log(f"cluster up in {time.monotonic() - t0:.1f}s under {root}")
        anonymous = cluster.anonymous_status(cluster.ids[0])
        log(f"{cluster.scheme}; a request without credentials: HTTP {anonymous}")
        sampler.start()
        async with Workload(cluster, history, partitions=partitions, seed=seed, transactions=transactions) as wl:
            await wl.create_topic()
            await wl.configure_offsets_topic()
            wl.start()
            await asyncio.sleep(warmup_s)
            stop_faults = threading.Event()
            acks = AckTracker(history)

            def nemesis_thread():
                deadline = time.monotonic() + minutes * 60 if minutes else None
                plan = schedule.plan(fault_count or 100_000)
                for n, kind in enumerate(plan):
                    if stop_faults.is_set() or (deadline and time.monotonic() > deadline):
                        break
                    rec = schedule.run_one(cluster, kind, rng, history.now, time.sleep)
                    schedule.settle(cluster, rec, rng.uniform(*quiet_s), history.now, stop_faults.wait,
                                    writes=acks.missing_since)
                    settled = (f"settled {rec.recovery_s:.2f}s after the heal" if rec.settled
                               else f"NOT settled within {settle_max_s:g}s: {'; '.join(rec.unsettled)}"
                               if rec.settled is False else "no settle wait")
                    log(f"[{rec.start:7.1f}s] fault {n + 1}: {rec.kind}: {rec.description}"
                        f"{' ERROR ' + rec.error if rec.error else ''} ({settled}; load {rec.load1})")
                schedule.heal_all(cluster)

            try:
                await asyncio.get_running_loop().run_in_executor(None, nemesis_thread)
            finally:
                stop_faults.set()
            log(f"[{history.now():7.1f}s] faults done; healing")
            await asyncio.get_running_loop().run_in_executor(None, cluster.wait_ready, 90.0)
            await asyncio.sleep(2.0)   # a little healed traffic
            await wl.stop()
            counts = await wl.final_reads()
            committed = await wl.final_committed_reads()
            log(f"[{history.now():7.1f}s] final reads: {counts}; committed offsets {committed}")
            sampling.set()
            await asyncio.get_running_loop().run_in_executor(None, poller.poll_once)
    finally:
        sampling.set()
        await asyncio.get_running_loop().run_in_executor(None, cluster.stop)
        if sampler.is_alive():
            sampler.join(5)
        try:
            cleaned_on_disk = cleaned_logs_on_disk(cluster)
        except OSError:
            pass
    cleaner = dict(poller.totals(), cleaned_logs=cleaned_on_disk)
    log(f"log cleaner: {cleaner}")
    result = check(history)
    meta = {"seed": seed, "minutes": minutes, "fault_count": fault_count, "kinds": kinds,
            "partitions": partitions, "duration_s": round(time.monotonic() - t0, 1), "root": root,
            "secure": secure, "transactions": transactions, "hold_s": list(hold_s), "quiet_s": list(quiet_s),
            "settle_max_s": settle_max_s,
            "raft_prevote": raft_prevote, "raft_options": dict(raft_options or {}),
            "history_wall_t0": round(time.time() - history.now(), 3)}   # raft_timeline.py matches logs to faults
    if out_dir:
        figs = write_report(out_dir, history, result, schedule.faults, meta, log_cleaner=cleaner)
    else:
        from tests.chaos.harness.report import figures
        figs = figures(history, result, schedule.faults)
        figs["meta"] = meta
        figs["log_cleaner"] = cleaner
    figs["_faults"] = schedule.faults
    figs["proxy_faults"] = cluster.proxy_faults()
    figs["anonymous_status"] = anonymous
    return figs, result


def _range(text: str) -> tuple:
    lo, _, hi = text.partition(",")
    return float(lo), float(hi or lo)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.chaos.run", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=None, help="run faults for this long")
    p.add_argument("--faults", type=int, default=None, help="or inject this many faults")
    p.add_argument("--per-kind", type=int, default=None,
                   help="or inject this many faults of every kind (whole rounds of all kinds)")
    p.add_argument("--report", default="out/chaos", help="report directory")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--kinds", default=None, help=f"comma-separated subset of {','.join(ALL_NEMESES)}")
    p.add_argument("--partitions", type=int, default=3)
    p.add_argument("--hold", default="2,5", help="seconds a fault stays, MIN,MAX (default 2,5)")
    p.add_argument("--quiet", default="2,4", help="healed seconds between faults, MIN,MAX (default 2,4)")
    p.add_argument("--settle-max", type=float, default=60.0,
                   help="before each fault wait up to this many seconds for the cluster to recover from the "
                        "last one (processes up, brokers unfenced, full ISRs, an active controller); 0 = no wait")
    p.add_argument("--log-level", default="WARNING", help="of the cluster processes (INFO shows replication)")
    p.add_argument("--secure", action="store_true",
                   help="TLS, authentication and ACLs on, as `kraftlog cluster up --secure` (clients: admin)")
    p.add_argument("--transactions", action="store_true",
                   help="add the transactional workload (harness/txn_workload.py; issue 18)")
    p.add_argument("--raft-prevote", action="store_true", help="the controllers run raft pre-vote (raft/prevote.py)")
    p.add_argument("--raft-option", action="append", default=[], metavar="FLAG=VALUE",
                   help="a controller raft flag, e.g. --raft-option=--raft-election-backoff-max-s=1.0 (repeatable)")
    p.add_argument("--warmup", type=float, default=2.0,
                   help="seconds of workload before the first fault (an idle stretch under load)")
    p.add_argument("--data-dir", default=None, help="cluster data (default: a temp dir, removed on success)")
    args = p.parse_args(argv)
    if args.per_kind is not None:
        args.faults = args.per_kind * len(args.kinds.split(",") if args.kinds else ALL_NEMESES)
    if args.minutes is None and args.faults is None:
        args.minutes = 30.0
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    kinds = args.kinds.split(",") if args.kinds else None
    for k in kinds or []:
        if k not in ALL_NEMESES:
            p.error(f"unknown fault kind {k!r}; choose from {', '.join(ALL_NEMESES)}")
    root = args.data_dir or tempfile.mkdtemp(prefix=f"kraftlog-chaos-{seed}-")
    print(f"chaos seed {seed} (replay: python -m tests.chaos.run --seed {seed} ...), data in {root}", flush=True)
    figs, result = asyncio.run(run_chaos(root, seed, minutes=args.minutes, fault_count=args.faults, kinds=kinds,
                                         partitions=args.partitions, out_dir=args.report, log_level=args.log_level,
                                         hold_s=_range(args.hold), quiet_s=_range(args.quiet),
                                         log=lambda m: print(m, flush=True), secure=args.secure,
                                         transactions=args.transactions, raft_prevote=args.raft_prevote,
                                         settle_max_s=args.settle_max, warmup_s=args.warmup,
                                         raft_options=dict(o.rsplit("=", 1) for o in args.raft_option)))
    figs.pop("_faults", None)
    print(json.dumps({k: v for k, v in figs.items() if k != "checker_stats"}, indent=1))
    print(result.summary(limit=20))
    print(f"report: {os.path.abspath(args.report)}/report.md")
    if result.valid and not args.data_dir:
        shutil.rmtree(root, ignore_errors=True)
    return 0 if result.valid else 1


if __name__ == "__main__":
    sys.exit(main())
